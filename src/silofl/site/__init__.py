"""Sites: everything one institution runs and keeps — its data, its models and optimizer states, its DP
mechanism, accountant and budget, its checkpoints — and the site-side steps an engine runs on it."""

from silofl.site.base import Site
from silofl.site.dpsgd import DPSGDSite

__all__ = ["Site", "DPSGDSite"]
