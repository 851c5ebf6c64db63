"""Person-level DP-SGD: the privacy unit is a person, not a row (``--id-column``).

A clinical table often holds several rows per person (visits, years). Row-level DP-SGD then protects a
row: a person with k rows is protected only at group-privacy level (about k·ε). With an id column the unit
becomes the person:

* **Poisson sampling of persons** (:meth:`PersonIndex.batch`): each person joins a batch independently
  with probability q, and then with *all* of their rows, so the subsampled Gaussian mechanism's q is over
  persons;
* **per-person clipping** (``groups`` in :mod:`silofl.privacy.grad_sample`): the gradients of a person's
  rows are summed and the sum is clipped to C, so adding or removing one person moves the clipped sum by
  at most C;
* Gaussian noise N(0, σ²C²) as for rows, the sum divided by the expected number of persons in a batch.

The accountant is fed q over persons, σ and the steps the mechanism ran: the ε it prints is per person.
Persons are counted per site (a person who is a patient of two hospitals is two units, one per site —
each site's ledger composes only its own releases).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from silofl.privacy.sampling import Sampler, uniforms

ID_WORDS = {"id", "ids", "pid", "mrn", "person", "patient", "subject", "participant", "individual"}


class PersonIndex:
    """Each training row's person (0 … P−1, every person with at least one row); draws person batches."""

    def __init__(self, index: torch.Tensor):
        index = torch.as_tensor(index, dtype=torch.long)
        if index.dim() != 1 or (len(index) and int(index.min()) < 0):
            raise ValueError("a person index is one non-negative integer per row")
        self.index = index
        self.count = int(index.max()) + 1 if len(index) else 0
        if self.count and int(torch.bincount(index, minlength=self.count).min()) == 0:
            raise ValueError("a person index must number the persons 0 … P−1 without gaps")

    @classmethod
    def from_ids(cls, ids) -> PersonIndex:
        """The index of a column of person ids (any values; equal values are one person)."""
        _, inverse = np.unique(np.asarray(ids).astype(str), return_inverse=True)
        return cls(torch.from_numpy(inverse.astype(np.int64).reshape(-1)))

    def to(self, device) -> PersonIndex:
        """The index on ``device``."""
        out = PersonIndex.__new__(PersonIndex)
        out.index, out.count = self.index.to(device), self.count
        return out

    @property
    def max_rows(self) -> int:
        """The most rows any one person has."""
        return int(torch.bincount(self.index).max()) if len(self.index) else 0

    def batch(self, sample_rate: float, rng: Sampler) -> tuple[torch.Tensor, torch.Tensor]:
        """One Poisson batch of persons: (the rows of every sampled person, in row order; each of those rows'
        person numbered 0 … b−1 among the b sampled persons). Each person is in with probability
        ``sample_rate``, independently, with all of their rows."""
        chosen = uniforms(self.count, rng).to(self.index.device) < sample_rate
        rows = torch.nonzero(chosen[self.index]).flatten()
        rank = torch.cumsum(chosen.long(), 0) - 1
        return rows, rank[self.index[rows]]


def group_pairs(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ordered pair (i, j) of rows of one group (i = j included): Σ_p k_p² pairs for groups of k_p rows.
    A group's squared gradient norm ‖Σ_{i∈p} g_i‖² is the sum of g_i·g_j over its pairs."""
    B = len(groups)
    if B == 0:
        empty = torch.zeros(0, dtype=torch.long, device=groups.device)
        return empty, empty
    order = torch.argsort(groups, stable=True)
    counts = torch.bincount(groups)
    starts = torch.cumsum(counts, 0) - counts
    g_sorted = groups[order]
    size = counts[g_sorted]  # the group size of each (sorted) row
    first = starts[g_sorted]  # the sorted position of its group's first row
    i = torch.repeat_interleave(torch.arange(B, device=groups.device), size)
    offset = torch.arange(len(i), device=groups.device) - torch.repeat_interleave(
        torch.cumsum(size, 0) - size, size
    )
    j = first[i] + offset
    return order[i], order[j]


@dataclass(frozen=True)
class UnitWarning:
    """A table loaded without ``--id-column`` with a column that looks like a person id and repeats: the ε
    is per row."""

    column: str
    max_rows: int  # the most rows one value of the column has, over the sites
    sites: list[str]

    def message(self) -> str:
        """The one-line warning."""
        return (
            f"column {self.column!r} looks like a person id and repeats (up to {self.max_rows} rows per "
            f"value, sites {', '.join(self.sites)}): without --id-column the ε is per row, so a person with "
            f"{self.max_rows} rows is protected only at group-privacy level (about {self.max_rows}·ε); "
            f"pass --id-column {self.column} to make the person the privacy unit"
        )

    def to_dict(self) -> dict:
        """``privacy_unit_warning`` in summary.json."""
        return {
            "column": self.column,
            "max_rows_per_value": self.max_rows,
            "sites": list(self.sites),
            "epsilon_unit": "row",
            "group_privacy": f"a person with k rows is protected at about k·ε (max k = {self.max_rows})",
            "message": self.message(),
        }


def id_named(name: str) -> bool:
    """Whether a column's name reads as a person id: a word of it (snake_case, camelCase, spaces) is ``id``,
    ``pid``, ``mrn``, ``patient``, ``person``, ``subject``, …"""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.strip())
    return any(w in ID_WORDS for w in re.split(r"[^a-z0-9]+", words.lower()))


def id_like(name: str, values: np.ndarray, by_name_only: bool = False) -> int:
    """The most rows one value of a column has when the column looks like a person id — its name reads as an
    id (``id``, ``*_id``, ``patient``, ``subject``, …) or it has high cardinality (at least half as many
    distinct values as rows; not with ``by_name_only``, for a feature column) — and some value repeats;
    else 0."""
    vals = np.asarray(values).astype(str)
    if len(vals) < 2:
        return 0
    uniq, counts = np.unique(vals, return_counts=True)
    k = int(counts.max())
    if k < 2:
        return 0
    looks = id_named(name) or (not by_name_only and len(uniq) >= 0.5 * len(vals))
    return k if looks else 0


def not_per_person(accounting: list[dict]) -> list:
    """The clients of a run's ``accounting`` (each site's privacy report) whose ledger did not compose this
    run per person: a report's ``run_units`` (the units of the run's ledger entries, as the site read them
    back) — or, for a site without a ledger, its ``privacy_unit`` — must all be a person. A summary says
    "person" only when this is empty."""
    out = []
    for r in accounting:
        units = r.get("run_units")
        if units is None:
            units = [r["privacy_unit"]] if r.get("privacy_unit") else []
        if not units or not all(str(u).startswith("person") for u in units):
            out.append(r.get("client"))
    return out
