"""silofl's Flower app (see silofl.deploy)."""
