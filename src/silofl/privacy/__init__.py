"""Privacy: DP-SGD gradients, Poisson sampling, noise sources, accountants and budgets."""

from silofl.privacy.accountant import ACCOUNTANT_NAMES, Accountant, Budget, epsilon_of, max_steps_within
from silofl.privacy.dpsgd import DPGradient, StepStats
from silofl.privacy.grad_sample import GhostClipper, VmapClipper, clip_factors, make_clipper
from silofl.privacy.noise import NoiseSource
from silofl.privacy.sampling import poisson_batch

__all__ = [
    "ACCOUNTANT_NAMES", "Accountant", "Budget", "epsilon_of", "max_steps_within", "DPGradient", "StepStats",
    "GhostClipper", "VmapClipper", "clip_factors", "make_clipper", "NoiseSource", "poisson_batch",
]
