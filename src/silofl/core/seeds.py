"""Per-party seeds derived from a run seed.

Every party (a site, or a coordinator role such as the averaging server) draws its model
initialisation, Poisson sampling and noise from its own generators, seeded from
``SeedSequence([run seed, party id])``: two parties never share a stream, and one party's draws do
not depend on how many others exist or in which order they run.
"""

from __future__ import annotations

import numpy as np


def client_seeds(run_seed: int, client: int, n: int = 4) -> list[int]:
    """Independent per-party seeds derived from the run seed (model init, sampling, noise, …)."""
    return [int(s) for s in np.random.SeedSequence([int(run_seed), int(client)]).generate_state(n)]
