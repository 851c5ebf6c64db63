"""Plots of a run and the report of a comparison."""

from silofl.report.plots import plot_run

__all__ = ["plot_run"]
