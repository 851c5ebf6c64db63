"""Experiments above the library: ``silofl compare`` (methods × variants × seeds), re-evaluating a run's
saved models, the PubSub-ML scenarios, and the generators of the result documents."""
