"""The audit's data: canaries, their coins, and the member / non-member / reference split.

Everything is drawn from a *pool* of examples no site trains on: the training rows the partition left
unused, then the test split (evaluation only reads it). In order, without overlap:

1. **non-members** of the membership-inference attack, drawn with the audited site's class proportions
   (so a class-skewed site is compared with examples of the same classes); members are the site's own
   real training examples;
2. a **population** of the same size and proportions (RMIA's reference points z);
3. **canaries**: ``m`` pool examples given a uniformly drawn *wrong* label (mislabelled examples are the
   input-space canaries a model must memorise to fit) — or, with ``kind="noise"``, ``m`` inputs drawn
   uniformly within the data's value range with uniformly drawn labels (out of distribution: nothing in
   the real data contradicts them, so a model fits them more readily) — each included in the audited
   site's training data independently with probability ½ (the coins of Steinke et al.'s one-run audit);
4. the training sets of the **reference models** (one per model, same size and class proportions as the
   site; they may overlap one another but never a candidate above).

The coins are drawn from their own generator after the canaries are fixed, so which canaries exist never
depends on which are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from silofl.core.errors import ConfigError


@dataclass
class Rows:
    """Examples with where they came from (``train``/``test`` row of the data set)."""

    x: torch.Tensor
    y: torch.Tensor
    source: list[str] = field(default_factory=list)
    index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.y)

    def ids(self) -> list[str]:
        """``train:123`` / ``test:45`` for each row."""
        return [f"{s}:{int(i)}" for s, i in zip(self.source, self.index, strict=True)]


@dataclass
class AuditData:
    """The canaries with their coins and true labels, and the attack's example sets."""

    canaries: Rows  # y: the canary (wrong) label
    canary_true_labels: np.ndarray
    included: np.ndarray  # bool per canary: in the audited site's training data
    nonmembers: Rows
    population: Rows
    references: list[Rows]
    notes: list[str] = field(default_factory=list)

    @property
    def canaries_in(self) -> Rows:
        """The included canaries (what the audited site trains on besides its real data)."""
        keep = torch.as_tensor(self.included, device=self.canaries.x.device)
        return Rows(self.canaries.x[keep], self.canaries.y[keep])


class Pool:
    """Examples no site trains on (module doc), taken out as they are drawn."""

    def __init__(
        self,
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        used_train: np.ndarray,
        x_test: torch.Tensor,
        y_test: torch.Tensor,
    ):
        free = np.setdiff1d(np.arange(len(y_train)), used_train)
        self.x = [x_train, x_test]
        self.y = [y_train, y_test]
        self.rows = np.concatenate(
            [
                np.stack([np.zeros_like(free), free], 1),
                np.stack([np.ones(len(y_test), dtype=np.int64), np.arange(len(y_test))], 1),
            ]
        )
        self.labels = np.concatenate([y_train.cpu().numpy()[free], y_test.cpu().numpy()]).astype(np.int64)
        self.free = np.ones(len(self.rows), dtype=bool)

    def value_range(self) -> tuple[float, float]:
        """The smallest and largest input value in the data set (its encoding's range)."""
        return (
            float(min(x.min() for x in self.x if x.numel())),
            float(max(x.max() for x in self.x if x.numel())),
        )

    def available(self) -> int:
        """How many pool rows are still free to draw."""
        return int(self.free.sum())

    def _rows(self, pos: np.ndarray) -> Rows:
        xs, ys, src, idx = [], [], [], []
        for part in (0, 1):
            sel = pos[self.rows[pos, 0] == part]
            if len(sel):
                ii = torch.as_tensor(self.rows[sel, 1])
                xs.append(self.x[part][ii])
                ys.append(self.y[part][ii])
                src += ["train" if part == 0 else "test"] * len(sel)
                idx.append(self.rows[sel, 1])
        if not xs:
            return Rows(self.x[0][:0], self.y[0][:0])
        return Rows(torch.cat(xs), torch.cat(ys), src, np.concatenate(idx))

    def stratified(
        self, n: int, proportions: np.ndarray, rng: np.random.Generator, take: bool = True
    ) -> Rows:
        """``n`` free examples with class proportions ``proportions`` (a class short of examples gives what
        it has; the rest is filled from any class). ``take``: remove them from the pool."""
        want = np.floor(proportions * n).astype(int)
        want[np.argsort(-(proportions * n - want))[: n - want.sum()]] += 1
        chosen = []
        for c, k in enumerate(want):
            cand = np.flatnonzero(self.free & (self.labels == c))
            if k and len(cand):
                chosen.append(rng.choice(cand, size=min(k, len(cand)), replace=False))
        pos = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
        short = n - len(pos)
        if short > 0:
            rest = np.setdiff1d(np.flatnonzero(self.free), pos)
            pos = np.concatenate([pos, rng.choice(rest, size=min(short, len(rest)), replace=False)])
        if take:
            self.free[pos] = False
        return self._rows(np.sort(pos))

    def uniform(self, n: int, rng: np.random.Generator) -> Rows:
        """``n`` free examples drawn uniformly, removed from the pool."""
        cand = np.flatnonzero(self.free)
        if len(cand) < n:
            raise ConfigError(
                f"the audit needs {n} more examples no site trains on, but only {len(cand)} are left: "
                "use fewer canaries, fewer non-members, or fewer examples per client"
            )
        pos = np.sort(rng.choice(cand, size=n, replace=False))
        self.free[pos] = False
        return self._rows(pos)


def class_proportions(y: torch.Tensor, num_classes: int) -> np.ndarray:
    """The class frequencies of labels ``y``."""
    counts = np.bincount(y.cpu().numpy().astype(np.int64), minlength=num_classes).astype(float)
    return counts / max(1.0, counts.sum())


CANARY_KINDS = ("mislabelled", "noise")
CANARY_DESCRIPTION = {
    "mislabelled": "mislabelled examples (a pool example with a uniformly drawn wrong label)",
    "noise": "out-of-distribution examples (inputs uniform within the data's value range, uniformly drawn "
    "labels)",
}


def draw(
    pool: Pool,
    member_y: torch.Tensor,
    num_classes: int,
    *,
    canaries: int,
    nonmembers: int,
    references: int,
    reference_size: int,
    seed: int,
    kind: str = "mislabelled",
) -> AuditData:
    """Draw the audit's sets from ``pool`` (module doc); ``member_y``: the audited site's real labels.
    ``canaries`` may be 0 (a client-level audit's canaries are clients, not examples). ``kind``: mislabelled
    pool examples, or ``noise`` — inputs drawn uniformly within the data's value range, with uniformly drawn
    labels (out-of-distribution canaries, which a model can fit without contradicting its real data)."""
    if canaries < 0:
        raise ConfigError(f"the number of canaries cannot be negative, got {canaries}")
    if kind not in CANARY_KINDS:
        raise ConfigError(f"unknown canary kind {kind!r}; choose one of: {', '.join(CANARY_KINDS)}")
    if canaries and num_classes < 2:
        raise ConfigError("canaries with labels need at least two classes")
    rng_sets, rng_labels, rng_coins = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    props = class_proportions(member_y, num_classes)
    notes = []
    need = (canaries if kind == "mislabelled" else 0) + 2 * nonmembers
    if pool.available() < need:
        raise ConfigError(
            f"the audit needs {need} examples no site trains on ({canaries} canaries, {nonmembers} "
            f"non-members, {nonmembers} population points), but the data set leaves {pool.available()}: "
            "use fewer canaries or fewer examples per client"
        )
    non = pool.stratified(nonmembers, props, rng_sets)
    popn = pool.stratified(nonmembers, props, rng_sets)
    if kind == "noise":
        lo, hi = pool.value_range()
        u = torch.as_tensor(rng_labels.random((canaries, *non.x.shape[1:])), dtype=non.x.dtype)
        x = lo + (hi - lo) * u
        labels = torch.as_tensor(rng_labels.integers(0, num_classes, size=canaries), dtype=non.y.dtype)
        true = np.full(canaries, -1, dtype=np.int64)
        can = Rows(x, labels, ["noise"] * canaries, np.arange(canaries))
    else:
        can = pool.uniform(canaries, rng_sets) if canaries else Rows(non.x[:0], non.y[:0])
        true = can.y.cpu().numpy().astype(np.int64)
        wrong = (true + rng_labels.integers(1, num_classes, size=len(true))) % num_classes
        can = Rows(
            can.x, torch.as_tensor(wrong, dtype=can.y.dtype, device=can.y.device), can.source, can.index
        )
    included = rng_coins.random(canaries) < 0.5
    refs = []
    if references:
        size = min(reference_size, pool.available())
        if size < reference_size:
            notes.append(
                f"reference models train on {size} examples each (the pool left too few for "
                f"{reference_size}, the audited site's size)"
            )
        if size < 2:
            raise ConfigError(
                "no examples left to train reference models on: use --reference-models 0 or fewer canaries"
            )
        refs = [pool.stratified(size, props, rng_sets, take=False) for _ in range(references)]
    return AuditData(can, true, included, non, popn, refs, notes)
