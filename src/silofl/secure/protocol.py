"""The two roles of secure aggregation, as small state objects: :class:`Party` (a site) and
:class:`Server` (the coordinator's server role). Neither does I/O: a method carries what they return
through ``engine.call``.

Once per run (:meth:`Party.setup`): every party makes an X25519 key pair, the server relays the public
keys (and a fresh session id) to all. Every pair of parties then shares a secret (X25519 + HKDF, bound
to the session and the pair) from which each round's pairwise mask seed and the key of the channel for
shares are derived. Each round costs every party two messages:

1. :meth:`Party.mask` — the party draws a fresh self-mask seed b, sends the server its input plus the
   expansion of b plus, for every neighbour v, ± the expansion of the round's pairwise seed (+ if its
   id is below v's, − otherwise: the pairwise masks cancel in the sum), and Shamir shares of b (threshold
   t) for its neighbours, each sealed (ChaCha20-Poly1305) under the pair's channel key, addressed and
   bound to the round.
2. :meth:`Party.unmask` — the server says who survived step 1 and forwards the sealed shares of the
   survivors. The party reveals, for each neighbour, exactly one thing: its share of the neighbour's b
   if the neighbour survived, or the round's pairwise seed it shares with the neighbour if not.

The server removes the survivors' self-masks (reconstructed from ≥ t shares) and the dropped parties'
pairwise masks with survivors (revealed by those survivors) and obtains the sum of the survivors'
inputs; below the thresholds the round is abandoned and nothing is released.

Where this departs from Bonawitz et al.: a dropped party's pairwise masks are removed with *this round's*
pairwise seeds, revealed by its surviving neighbours, instead of reconstructing its long-term mask key
from Shamir shares. Revealing a key that is used for many rounds would let the server unmask every
earlier round in which the party survived (its self-masks of those rounds were revealed then); a round's
seed opens one round's mask between one pair. The price: a survivor that drops between the two steps of
a round in which one of its neighbours dropped leaves a mask the server cannot remove, and the round is
abandoned (nothing released).

Against a server that lies about who dropped: an honest party refuses a survivor set that leaves it with
more than k − t dropped neighbours, that is smaller than ``min_survivors`` (the noise calibration's
minimum), or that does not contain it, and answers each round once. Learning party u's input needs t
shares of b_u (from neighbours told u survived) *and* the pairwise seeds of u with those same neighbours
(from u, told they dropped): that needs at least t of u's neighbours claimed dropped, which u refuses
because t > k − t (t > k/2). Fewer than t neighbours colluding with the server learn nothing either. Public
keys are relayed by the server: a server that substitutes keys (an active man in the middle) is out of
this model unless the keys are authenticated — deployed sites sign theirs with their pinned Ed25519
identity and check every relayed key against the run's roster
(:class:`silofl.fl.exchange.secure_round.SecAggIdentity`); in the simulator no identities exist.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from silofl.secure import group, keys, shamir
from silofl.secure.graph import default_neighbours, default_threshold, neighbours

log = logging.getLogger("silofl")

SESSION_BYTES = 16
SEED_BYTES = 32
MAX_PARTIES = 1 << 16
SEALED_SHARE_BYTES = keys.NONCE_BYTES + shamir.SHARE_BYTES + 16


class SecAggRefused(Exception):
    """A message of the protocol that fails its checks (refused and logged; local state intact)."""


@dataclass(frozen=True)
class SecAggSettings:
    """bits of the group Z_{2**bits}; the least number of survivors whose sum may be released (the noise is
    calibrated for it); the neighbours k of the SecAgg+ graph and the Shamir threshold t (defaults:
    :func:`~silofl.secure.graph.default_neighbours`, a majority of k)."""

    bits: int
    min_survivors: int
    neighbours: int | None = None
    threshold: int | None = None

    def __post_init__(self) -> None:
        group.check_bits(self.bits)
        if self.min_survivors < 1:
            raise ValueError(f"min_survivors must be at least 1, got {self.min_survivors}")
        if self.neighbours is not None and self.neighbours < 1:
            raise ValueError(f"neighbours must be at least 1, got {self.neighbours}")
        if self.threshold is not None and self.threshold < 1:
            raise ValueError(f"threshold must be at least 1, got {self.threshold}")

    def degree(self, n: int) -> int:
        """k for a round of ``n`` participants (n − 1 at most; even when the graph is sparse)."""
        k = default_neighbours(n) if self.neighbours is None else self.neighbours
        if k >= n - 1:
            return n - 1
        return k + (k % 2)

    def shares_needed(self, k: int) -> int:
        """t for degree k; ValueError unless k/2 < t ≤ k."""
        t = default_threshold(k) if self.threshold is None else self.threshold
        if not k / 2 < t <= k:
            raise ValueError(f"the threshold t = {t} must lie in (k/2, k] for k = {k} neighbours")
        return t

    def check_round(self, n: int) -> tuple[int, int]:
        """(k, t) for ``n`` participants; ValueError when n is below the minimum or below 2."""
        if n < max(2, self.min_survivors):
            raise ValueError(f"{n} participants, at least {max(2, self.min_survivors)} needed")
        k = self.degree(n)
        return k, self.shares_needed(k)


def _ids(value, what: str, limit: int = MAX_PARTIES) -> list[int]:
    if not isinstance(value, list | tuple) or len(value) > limit:
        raise SecAggRefused(f"{what}: not a list of at most {limit} party ids")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_PARTIES for i in value):
        raise SecAggRefused(f"{what}: party ids must be integers in [0, {MAX_PARTIES})")
    if len(set(value)) != len(value):
        raise SecAggRefused(f"{what}: repeated party ids")
    return sorted(value)


def _sign(u: int, v: int) -> int:
    """+1 if party u adds the pair's mask, −1 if it subtracts it."""
    return 1 if u < v else -1


def _apply(acc: np.ndarray, seed: bytes, sign: int, bits: int) -> np.ndarray:
    m = group.expand(seed, len(acc), bits)
    return group.add(acc, m, bits) if sign > 0 else group.sub(acc, m, bits)


@dataclass
class _Round:
    participants: list[int]
    nbrs: list[int]
    t: int


class Party:
    """One site's side of the protocol (see the module doc)."""

    def __init__(self, pid: int, settings: SecAggSettings):
        self.pid, self.settings = int(pid), settings
        self._sk = keys.new_private_key()
        self.session: bytes | None = None
        self._peers: dict[int, bytes] = {}
        self._shared: dict[int, bytes] = {}
        self._pending: _Round | None = None  # the round masked and not yet unmasked
        self._pending_round = -1
        self._last_round = -1  # rounds are masked once each, in increasing order

    def public_key(self) -> bytes:
        """This party's X25519 public key (raw bytes), which the server relays to the others."""
        return keys.public_bytes(self._sk)

    @property
    def awaiting(self) -> set[int]:
        """The neighbours of the round awaiting unmasking (whose sealed shares may be forwarded to it)."""
        return set(self._pending.nbrs) if self._pending is not None else set()

    # ------------------------------------------------------------------ once per run
    def setup(self, session: bytes, peer_keys: dict[int, bytes]) -> None:
        """Take the session id and everyone's public key (as relayed by the server)."""
        if not isinstance(session, bytes) or len(session) != SESSION_BYTES:
            raise SecAggRefused("session id of the wrong size")
        if not isinstance(peer_keys, dict) or len(peer_keys) > MAX_PARTIES:
            raise SecAggRefused("public keys: not a bounded mapping")
        ids = _ids(list(peer_keys), "public keys")
        if peer_keys.get(self.pid) != self.public_key():
            raise SecAggRefused("the key table does not hold this party's own public key")
        shared = {}
        for i in ids:
            if i == self.pid:
                continue
            try:
                shared[i] = keys.agree(self._sk, peer_keys[i])
            except ValueError as e:
                raise SecAggRefused(f"public key of party {i}: {e}") from None
        self.session, self._peers, self._shared = session, dict(peer_keys), shared
        self._pending = None

    def _key(self, purpose: bytes, v: int, rnd: int) -> bytes:
        assert self.session is not None
        return keys.derive(self._shared[v], self.session, purpose, self.pid, v, rnd)

    # ------------------------------------------------------------------ step 1
    def mask(
        self, rnd: int, x: np.ndarray, participants: list[int], graph_seed: bytes
    ) -> tuple[np.ndarray, dict[int, bytes]]:
        """The masked input (uint64, in [0, 2**bits)) and the sealed shares of this round's self-mask seed,
        one per neighbour."""
        s = self.settings
        if self.session is None:
            raise SecAggRefused("no key agreement yet")
        if not isinstance(rnd, int) or rnd <= self._last_round:
            raise SecAggRefused(f"round {rnd} was masked already or is older than round {self._last_round}")
        parts = _ids(participants, "participants")
        if self.pid not in parts:
            raise SecAggRefused("this party is not among the round's participants")
        missing = [v for v in parts if v != self.pid and v not in self._shared]
        if missing:
            raise SecAggRefused(f"no key agreement with participants {missing[:5]}")
        if not isinstance(graph_seed, bytes) or len(graph_seed) != SESSION_BYTES:
            raise SecAggRefused("graph seed of the wrong size")
        try:
            k, t = s.check_round(len(parts))
        except ValueError as e:
            raise SecAggRefused(str(e)) from None
        x = np.asarray(x)
        if x.dtype != np.uint64 or x.ndim != 1 or (x.size and int(x.max()) >> s.bits):
            raise SecAggRefused("the input must be a vector of uint64 elements of the group")
        nbrs = neighbours(parts, k, graph_seed)[self.pid]
        b = os.urandom(SEED_BYTES)
        shares = shamir.split(int.from_bytes(b, "big"), t, [v + 1 for v in nbrs])
        sealed = {}
        for v in nbrs:
            ad = keys.associated_data(self.session, rnd, self.pid, v)
            sealed[v] = keys.seal(self._key(b"shares", v, 0), shamir.to_bytes(shares[v + 1]), ad)
        y = group.add(x, group.expand(b, len(x), s.bits), s.bits)
        for v in nbrs:
            y = _apply(y, self._key(b"mask", v, rnd), _sign(self.pid, v), s.bits)
        self._last_round = rnd
        self._pending, self._pending_round = _Round(parts, nbrs, t), rnd
        return y, sealed

    # ------------------------------------------------------------------ step 2
    def unmask(self, rnd: int, survivors: list[int], sealed: dict[int, bytes]) -> dict[str, dict[str, str]]:
        """What the party reveals for round ``rnd``: ``{"b": {v: share of b_v}, "pair": {v: pairwise seed}}``
        (hex) — one kind per neighbour. SecAggRefused for a survivor set it must not answer (module doc); a
        sealed share that fails its checks is left out (and logged)."""
        st = self._pending
        if st is None or rnd != self._pending_round:
            raise SecAggRefused(f"round {rnd} is not the round awaiting unmasking (answered once only)")
        surv = _ids(survivors, "survivors")
        if not set(surv) <= set(st.participants):
            raise SecAggRefused("survivors that were not participants")
        if self.pid not in surv:
            raise SecAggRefused("the survivor set leaves out this party")
        if len(surv) < self.settings.min_survivors:
            raise SecAggRefused(
                f"{len(surv)} survivors, below the minimum {self.settings.min_survivors} the noise needs"
            )
        alive = [v for v in st.nbrs if v in surv]
        dropped = [v for v in st.nbrs if v not in surv]
        if len(dropped) > len(st.nbrs) - st.t:
            raise SecAggRefused(
                f"{len(dropped)} of {len(st.nbrs)} neighbours claimed dropped, more than k − t = "
                f"{len(st.nbrs) - st.t}"
            )
        if not isinstance(sealed, dict) or len(sealed) > len(st.nbrs):
            raise SecAggRefused("sealed shares: not a bounded mapping")
        self._pending = None  # answered once, whatever follows
        assert self.session is not None
        out_b: dict[str, str] = {}
        for v in alive:
            blob = sealed.get(v)
            try:
                if not isinstance(blob, bytes) or len(blob) != SEALED_SHARE_BYTES:
                    raise ValueError("missing or of the wrong size")
                ad = keys.associated_data(self.session, rnd, v, self.pid)
                share = shamir.from_bytes(keys.open_sealed(self._key(b"shares", v, 0), blob, ad))
            except (ValueError, shamir.ShareError) as e:
                log.warning("party %d refused the share from party %d in round %d: %s", self.pid, v, rnd, e)
                continue
            out_b[str(v)] = shamir.to_bytes(share).hex()
        out_pair = {str(v): self._key(b"mask", v, rnd).hex() for v in dropped}
        return {"b": out_b, "pair": out_pair}


class Server:
    """The server's side (see the module doc): relays keys, collects masked inputs, asks survivors to
    unmask, and computes the sum — or abandons the round."""

    def __init__(self, settings: SecAggSettings, dim: int):
        self.settings, self.dim = settings, int(dim)
        self.session = os.urandom(SESSION_BYTES)
        self.keys: dict[int, bytes] = {}
        self.reason: str | None = None  # why the last round was abandoned
        self._round: int | None = None

    def setup(self, public_keys: dict[int, bytes]) -> None:
        """Take the parties' public keys (a fresh session: every party must set up again)."""
        for i, k in public_keys.items():
            if not isinstance(k, bytes) or len(k) != keys.PUBLIC_KEY_BYTES:
                raise SecAggRefused(f"public key of party {i} has the wrong size")
        self.session = os.urandom(SESSION_BYTES)
        self.keys = dict(public_keys)

    def begin(self, rnd: int, participants: list[int]) -> bytes:
        """Start round ``rnd`` with ``participants`` (all with keys); the public graph seed."""
        parts = _ids(participants, "participants")
        if any(p not in self.keys for p in parts):
            raise SecAggRefused("a participant without a public key")
        k, t = self.settings.check_round(len(parts))
        seed = os.urandom(SESSION_BYTES)
        self._round, self.participants, self.t = rnd, parts, t
        self.nbrs = neighbours(parts, k, seed)
        self.masked: dict[int, np.ndarray] = {}
        self.sealed: dict[int, dict[int, bytes]] = {}
        self.reason = None
        return seed

    def receive(self, pid: int, masked: np.ndarray, sealed: dict[int, bytes]) -> None:
        """Party ``pid``'s step-1 message; SecAggRefused (the party then counts as dropped) if it fails."""
        if pid not in getattr(self, "nbrs", {}) or pid in self.masked:
            raise SecAggRefused(f"party {pid} is not a participant or sent twice")
        m = np.asarray(masked)
        if m.dtype != np.uint64 or m.shape != (self.dim,) or (m.size and int(m.max()) >> self.settings.bits):
            raise SecAggRefused(f"masked input of party {pid}: not {self.dim} elements of the group")
        if not isinstance(sealed, dict) or sorted(sealed) != self.nbrs[pid]:
            raise SecAggRefused(f"party {pid} did not send one sealed share to each neighbour")
        if any(not isinstance(b, bytes) or len(b) != SEALED_SHARE_BYTES for b in sealed.values()):
            raise SecAggRefused(f"a sealed share of party {pid} has the wrong size")
        self.masked[pid], self.sealed[pid] = m, dict(sealed)

    def survivors(self) -> list[int] | None:
        """The survivors to ask for step 2, or None when the round must be abandoned already."""
        surv = sorted(self.masked)
        if len(surv) < max(2, self.settings.min_survivors):
            self.reason = f"{len(surv)} survivors, at least {max(2, self.settings.min_survivors)} needed"
            return None
        for u in surv:
            alive = sum(v in self.masked for v in self.nbrs[u])
            if alive < self.t:
                self.reason = f"party {u} has {alive} surviving neighbours, {self.t} needed"
                return None
        return surv

    def forwarded(self, pid: int) -> dict[int, bytes]:
        """The sealed shares addressed to ``pid`` by the survivors."""
        return {u: self.sealed[u][pid] for u in sorted(self.masked) if pid in self.sealed[u]}

    def _parse(self, pid: int, reveal, surv: set[int]) -> tuple[dict[int, int], dict[int, bytes]]:
        if not isinstance(reveal, dict) or set(reveal) != {"b", "pair"}:
            raise SecAggRefused("not a reveal")
        b, pair = reveal["b"], reveal["pair"]
        if not isinstance(b, dict) or not isinstance(pair, dict):
            raise SecAggRefused("not a reveal")
        nb = set(self.nbrs[pid])
        out_b, out_pair = {}, {}
        for kind, src, size in (("b", b, shamir.SHARE_BYTES), ("pair", pair, SEED_BYTES)):
            if len(src) > len(nb):
                raise SecAggRefused("too many entries")
            for key, val in src.items():
                if not (isinstance(key, str) and key.isdigit() and len(key) <= 6 and int(key) in nb):
                    raise SecAggRefused(f"{kind}: {key!r} is not a neighbour")
                v = int(key)
                if (v in surv) != (kind == "b"):
                    raise SecAggRefused(
                        f"{kind} revealed for party {v}, which "
                        + ("did not survive" if kind == "b" else "survived")
                    )
                if not isinstance(val, str) or len(val) != 2 * size:
                    raise SecAggRefused(f"{kind} for party {v} has the wrong size")
                try:
                    raw = bytes.fromhex(val)
                except ValueError:
                    raise SecAggRefused(f"{kind} for party {v} is not hex") from None
                if kind == "b":
                    out_b[v] = shamir.from_bytes(raw)
                else:
                    out_pair[v] = raw
        return out_b, out_pair

    def finish(self, reveals: dict[int, dict]) -> np.ndarray | None:
        """The sum of the survivors' inputs in Z_{2**bits}, or None (round abandoned; :attr:`reason`)."""
        bits = self.settings.bits
        surv = set(self.masked)
        shares: dict[int, dict[int, int]] = {u: {} for u in surv}
        seeds: dict[tuple[int, int], bytes] = {}
        for pid, reveal in sorted(reveals.items()):
            if pid not in surv:
                log.warning("secure aggregation: a reveal from party %d, which did not survive", pid)
                continue
            try:
                got_b, got_pair = self._parse(pid, reveal, surv)
            except (SecAggRefused, shamir.ShareError) as e:
                log.warning("secure aggregation refused the reveal of party %d: %s", pid, e)
                continue
            for v, y in got_b.items():
                shares[v][pid + 1] = y
            for v, seed in got_pair.items():
                seeds[(pid, v)] = seed
        total = np.zeros(self.dim, dtype=np.uint64)
        for u in sorted(surv):
            total = group.add(total, self.masked[u], bits)
        for u in sorted(surv):
            try:
                b = shamir.combine(shares[u], self.t)
            except shamir.ShareError as e:
                self.reason = f"self-mask of party {u}: {e}"
                return None
            if b >> (8 * SEED_BYTES):
                self.reason = f"self-mask of party {u} reconstructs outside its range (a wrong share)"
                return None
            total = _apply(total, b.to_bytes(SEED_BYTES, "big"), -1, bits)
        for v in sorted(set(self.participants) - surv):
            for u in self.nbrs[v]:
                if u not in surv:
                    continue
                if (u, v) not in seeds:
                    self.reason = f"party {u} did not reveal its pairwise mask with dropped party {v}"
                    return None
                total = _apply(total, seeds[(u, v)], -_sign(u, v), bits)
        self._round = None
        return total
