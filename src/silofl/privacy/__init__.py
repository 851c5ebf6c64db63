"""Privacy: pure analysis (ε, σ calibration, steps within a budget, client-level calibration), stateful
accountants and budgets, the DP mechanisms (DP-SGD gradient, per-example norms, Poisson sampling, noise,
client-level clipping) and the guarantee a privacy mode gives a method."""

from silofl.privacy.accountant import Accountant, Budget, MechanismRun
from silofl.privacy.analysis import ACCOUNTANT_NAMES, epsilon_of, max_steps_within, noise_multiplier_for
from silofl.privacy.discrete import DiscreteMechanism, DiscreteRandom
from silofl.privacy.dpsgd import DPGradient, StepStats
from silofl.privacy.grad_sample import GhostClipper, VmapClipper, clip_factors, make_clipper
from silofl.privacy.guarantee import Guarantee, MethodTraits, effective_mode, guarantee
from silofl.privacy.noise import NoiseSource
from silofl.privacy.sampling import poisson_batch

__all__ = [
    "ACCOUNTANT_NAMES",
    "Accountant",
    "Budget",
    "MechanismRun",
    "epsilon_of",
    "max_steps_within",
    "noise_multiplier_for",
    "DPGradient",
    "StepStats",
    "GhostClipper",
    "VmapClipper",
    "clip_factors",
    "make_clipper",
    "Guarantee",
    "MethodTraits",
    "effective_mode",
    "guarantee",
    "NoiseSource",
    "poisson_batch",
    "DiscreteMechanism",
    "DiscreteRandom",
]
