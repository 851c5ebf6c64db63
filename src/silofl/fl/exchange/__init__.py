"""How shared models move between sites: gossip with PushSum, a central averaging server, a cycle,
the client-level DP server, or not at all. Each module holds both sides of its exchange: the site's
steps and the coordinator's round."""
