from silofl.report.plots import plot_run
from silofl.report.run_folder import RunFolder, read_metrics

__all__ = ["plot_run", "RunFolder", "read_metrics"]
