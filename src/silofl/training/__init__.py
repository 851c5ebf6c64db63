"""Training loops: the one Poisson DP-SGD / mutual-learning epoch, vectorised local SGD of many model
copies, and evaluation."""

from silofl.training.evaluation import accuracy
from silofl.training.poisson import Partner, dml_loss, poisson_steps

__all__ = ["accuracy", "Partner", "dml_loss", "poisson_steps"]
