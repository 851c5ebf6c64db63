"""A run's plots now live beside the run (:mod:`silofl.runner.plots`: the run loop draws them, and the run
layer imports nothing above it); importable from here as before."""

from silofl.runner.plots import plot_run, plot_server_rounds, series

__all__ = ["plot_run", "plot_server_rounds", "series"]
