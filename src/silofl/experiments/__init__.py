"""Experiments above the library: ``silofl compare`` (methods × variants × seeds), ``silofl tune``,
re-evaluating a run's saved models, training a feature backbone and the PubSub-ML scenarios. The studies and
the generators of the result documents live outside the package, in the repository's ``studies/``."""
