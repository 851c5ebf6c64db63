"""One round of secure aggregation (:mod:`silofl.secure`) through ``engine.call``, for any method whose
coordinator plays a server: the site's side (:class:`SecureParty`, a mixin for a site) and the
coordinator's (:class:`SecureRound`).

The steps, each one ``engine.call`` (so they run the same on the simulator, torch.distributed and Flower):

* ``secagg_keys`` / ``secagg_setup`` — once per run, and again after a site rejoins or the run resumes:
  every site makes a fresh X25519 key pair, the server relays the public keys with a fresh session id;
* ``train_upload`` with ``meta["secagg"]`` — each selected site trains, encodes its upload into the group
  (the method's encoding: :mod:`silofl.privacy.discrete`) and masks it (:meth:`SecureParty.secure_upload`);
* ``secagg_unmask`` — the survivors reveal, per neighbour, a self-mask share or a pairwise seed;

and the server decodes the modular sum, or abandons the round with nothing released. What the sum *means*
(a noisy client-level update, a weighted sum of model deltas) and how it is decoded is the method's: the
round hands back the sum in the group (:class:`SecureResult`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from silofl.comm.messages import Message, Packet
from silofl.core.errors import ConfigError, PeerModelRejected
from silofl.fl.options import MethodOptions

log = logging.getLogger("silofl")

__all__ = ["SecAggIdentity", "SecAggOptions", "SecureParty", "SecureResult", "SecureRound", "plausible"]

KEY_LABEL = b"silofl secagg public key v1"


@dataclass
class SecAggOptions(MethodOptions):
    """The secure-aggregation settings every server method shares (used with the run's
    ``secure_aggregation``; :mod:`silofl.secure`). A method's options add what it encodes."""

    secagg_bits: int = field(
        default=20,
        metadata={
            "help": "--secure-aggregation: bits per coordinate; the sum lives in Z_(2^bits).",
            "panel": "privacy",
        },
    )
    secagg_min_survivors: int | None = field(
        default=None,
        metadata={
            "help": "--secure-aggregation: the least number of sites whose noise must reach the sum; fewer "
            "survivors and the round releases nothing (default K − 1; client-level methods with "
            "--client-rate q < 1: round(q·K) − 1, at least 2, and a smaller sample skips the round).",
            "panel": "privacy",
        },
    )
    secagg_neighbours: int | None = field(
        default=None,
        metadata={
            "help": "--secure-aggregation: SecAgg+ neighbours per site (default: all up to 10 sites, then "
            "about 3·log2 K).",
            "panel": "privacy",
        },
    )
    secagg_threshold: int | None = field(
        default=None,
        metadata={
            "help": "--secure-aggregation: Shamir threshold t among the neighbours, above half of them "
            "(default: a majority).",
            "panel": "privacy",
        },
    )

    supports_secure_aggregation: ClassVar[bool] = True

    def min_survivors(self, run: Any) -> int:
        """The least number of surviving sites whose sum may be released (default K − 1, at least 2)."""
        if self.secagg_min_survivors is not None:
            return self.secagg_min_survivors
        return max(2, run.clients - 1)

    def check_secure(self, run: Any, settings: Any) -> None:
        """The shared settings' ranges, then that the protocol of ``settings()`` (built only once the ranges
        hold) can run with the run's sites: one-line ConfigErrors."""
        if not 8 <= self.secagg_bits <= 62:
            raise ConfigError(f"secagg_bits must lie in [8, 62], got {self.secagg_bits}")
        m = self.min_survivors(run)
        if not 2 <= m <= run.clients:
            raise ConfigError(f"secagg_min_survivors must lie in [2, clients = {run.clients}], got {m}")
        for name in ("secagg_neighbours", "secagg_threshold"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be at least 1, got {v}")
        try:
            settings().protocol().check_round(run.clients)
        except ValueError as e:
            raise ConfigError(f"secure aggregation with {run.clients} sites: {e}") from None


SIGNATURE_HEX = 128  # an Ed25519 signature, hex


def key_text(run_id: str, pid: int, public_key: bytes) -> bytes:
    """What a site signs when it hands the server its key-agreement public key: the purpose, the run, its
    index in the run and the key."""
    return KEY_LABEL + b"|" + run_id.encode() + b"|" + int(pid).to_bytes(4, "big") + bytes(public_key)


@dataclass
class SecAggIdentity:
    """A deployed site's identity for secure aggregation: its Ed25519 signing key (the one it seals with)
    and the run's roster, index → the pinned Ed25519 key of that site. With it a site signs the X25519
    public key it hands the server and checks every relayed key against the roster: a coordinator that
    substitutes a key (an active man in the middle of the pairwise key agreement, and so of the channels
    the Shamir shares travel in) is detected, the site refuses the session and releases nothing."""

    sign_key: Any  # cryptography's Ed25519PrivateKey
    roster: dict[int, Any]  # index -> Ed25519PublicKey
    run_id: str

    def sign(self, pid: int, public_key: bytes) -> str:
        """This site's signature (hex) of party ``pid``'s key-agreement ``public_key``, bound to the run."""
        return self.sign_key.sign(key_text(self.run_id, pid, public_key)).hex()

    def verify(self, pid: int, public_key: bytes, signature: Any) -> None:
        """SecAggRefused unless ``signature`` is party ``pid``'s pinned identity's over its key."""
        from cryptography.exceptions import InvalidSignature

        from silofl.secure import SecAggRefused

        if pid not in self.roster:
            raise SecAggRefused(f"party {pid} is not in the run's roster")
        if not isinstance(signature, str) or len(signature) != SIGNATURE_HEX:
            raise SecAggRefused(f"the public key of party {pid} comes without its signature")
        try:
            self.roster[pid].verify(bytes.fromhex(signature), key_text(self.run_id, pid, public_key))
        except (InvalidSignature, ValueError):
            raise SecAggRefused(
                f"the public key of party {pid} is not signed by its pinned identity (a substituted key): "
                "no session, nothing released"
            ) from None


# ---------------------------------------------------------------------------------------------- site side
class SecureParty:
    """A site's steps of secure aggregation (mixed into a Site; the site says which protocol settings it
    accepts through :meth:`secure_protocol`)."""

    party: Any = None  # this site's side of the protocol (silofl.secure.Party)
    identity: SecAggIdentity | None = None  # deployed: sign own key, verify the relayed ones
    cid: int

    def secure_protocol(self):
        """This site's :class:`~silofl.secure.SecAggSettings` (None: secure aggregation is off here)."""
        return None

    def _refuse(self, step: str, rnd: Any, why: str) -> Message:
        log.warning("client %d refused secure aggregation step %s in round %s: %s", self.cid, step, rnd, why)
        return Message({"refused": why[:300]})

    def on_secagg_keys(self, msg: Message) -> Message:
        """A fresh key pair (a new session follows): its public half."""
        from silofl.secure import Party

        settings = self.secure_protocol()
        if settings is None:
            return self._refuse("keys", None, "secure aggregation is off at this site")
        self.party = Party(self.cid, settings)
        pk = self.party.public_key()
        signed = {"signature": self.identity.sign(self.cid, pk)} if self.identity is not None else {}
        return Message({"public_key": pk.hex(), **signed})

    def on_secagg_setup(self, msg: Message) -> Message:
        """The session id and everyone's public key, as the server relays them."""
        from silofl.secure import SecAggRefused

        if self.party is None:
            return self._refuse("setup", None, "no key pair yet")
        try:
            session, table = msg.meta.get("session"), msg.meta.get("keys")
            if not isinstance(session, str) or len(session) != 32 or not isinstance(table, dict):
                raise SecAggRefused("malformed setup")
            if len(table) > 1 << 16 or not all(
                isinstance(k, str) and k.isdigit() and len(k) <= 6 and isinstance(v, str) and len(v) == 64
                for k, v in table.items()
            ):
                raise SecAggRefused("malformed key table")
            peer_keys = {int(k): bytes.fromhex(v) for k, v in table.items()}
            if self.identity is not None:  # every relayed key, own included, as its owner signed it
                sigs = msg.meta.get("signatures")
                if not isinstance(sigs, dict) or len(sigs) > len(table):
                    raise SecAggRefused("the relayed keys come without their signatures")
                for i, pk in sorted(peer_keys.items()):
                    self.identity.verify(i, pk, sigs.get(str(i)))
            self.party.setup(bytes.fromhex(session), peer_keys)
        except (SecAggRefused, ValueError) as e:
            return self._refuse("setup", None, str(e))
        return Message({"ok": True})

    def secure_round_meta(self, sec: Any) -> tuple[list[int], bytes, int]:
        """(participants, graph seed, rotation seed) of the server's ``meta["secagg"]``, validated
        (SecAggRefused otherwise); also refused when this site holds no key agreement."""
        from silofl.secure import SecAggRefused

        if self.party is None or self.party.session is None:
            raise SecAggRefused("no key agreement yet")
        if not isinstance(sec, dict):
            raise SecAggRefused("no secure aggregation parameters")
        parts, gseed, rseed = sec.get("participants"), sec.get("graph_seed"), sec.get("rotation_seed")
        if not isinstance(parts, list) or len(parts) > 1 << 16:
            raise SecAggRefused("participants: not a bounded list")
        if not isinstance(gseed, str) or len(gseed) != 32:
            raise SecAggRefused("graph seed: not 16 bytes of hex")
        if not isinstance(rseed, str) or not rseed.isdigit() or len(rseed) > 40:
            raise SecAggRefused("rotation seed: not a decimal integer")
        graph_seed = bytes.fromhex(gseed)
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise SecAggRefused("participants: not integers")
        return sorted(parts), graph_seed, int(rseed)

    def secure_request(self, msg: Message, what: str) -> tuple[list[int], bytes, int]:
        """(participants, graph seed, rotation seed) of a ``train_upload`` request while secure aggregation is
        on here: SecAggRefused for a request of an upload in the clear (``what``: what would be uploaded) or
        a round the protocol cannot run — before anything is computed."""
        from silofl.secure import SecAggRefused

        if "secagg" not in msg.meta:
            raise SecAggRefused(f"secure aggregation is on at this site: it uploads no {what} in the clear")
        parts, graph_seed, rseed = self.secure_round_meta(msg.meta["secagg"])
        self.party.settings.check_round(len(parts))
        return parts, graph_seed, rseed

    def secure_upload(
        self, rnd: int, server: int, x: np.ndarray, participants: list[int], graph_seed: bytes
    ) -> Message:
        """The masked upload of ``x`` (a vector of the group) with the sealed shares; SecAggRefused if the
        protocol refuses to mask."""
        from silofl.secure.messages import pack_masked

        y, sealed = self.party.mask(rnd, x, participants, graph_seed)
        data = pack_masked(
            y, sealed, self.party.settings.bits, {"round": rnd, "src": self.cid, "secagg": True}
        )
        return Message(packets=[Packet(self.cid, server, data)])

    def on_secagg_unmask(self, msg: Message) -> Message:
        """Reveal, for each neighbour, its self-mask share (it survived) or the pairwise seed (it did not)."""
        from silofl.secure import SecAggRefused
        from silofl.secure.messages import unpack_shares

        rnd = msg.meta.get("round")
        if self.party is None:
            return self._refuse("unmask", rnd, "no key agreement yet")
        try:
            surv = msg.meta.get("survivors")
            if not isinstance(rnd, int) or not isinstance(surv, list) or len(msg.packets) != 1:
                raise SecAggRefused("malformed unmask request")
            p = msg.packets[0]
            sealed = unpack_shares(p.data, {"round": rnd, "dst": self.cid}, self.party.awaiting)
            reveal = self.party.unmask(rnd, surv, sealed)
        except (SecAggRefused, PeerModelRejected, ValueError) as e:
            return self._refuse("unmask", rnd, str(e))
        return Message({"reveal": reveal})


# ---------------------------------------------------------------------------------------------- server side
@dataclass
class SecureResult:
    """What one secure round gave the server: the sum of the survivors' inputs in the group (None: the
    round was abandoned, :attr:`reason` says why, nothing was revealed), the survivors, the public rotation
    seed the inputs were encoded with, and the participants."""

    total: np.ndarray | None = None
    survivors: list[int] = field(default_factory=list)
    rotation_seed: int | None = None
    participants: list[int] = field(default_factory=list)
    reason: str | None = None


class SecureRound:
    """The coordinator's side: the protocol's server role (:class:`silofl.secure.Server`) driven through a
    coordinator's ``call`` (see the module doc). ``dim``: the length of every site's group vector;
    ``rotation_rng``: where the public per-round rotation seeds come from (seeded research runs:
    reproducible)."""

    def __init__(self, settings, dim: int, rotation_rng):
        from silofl.secure import Server

        self.settings, self.dim = settings, int(dim)
        self.server = Server(settings, self.dim)
        self.rotation_rng = rotation_rng
        self.keys_ready = False  # the current session's keys reached every site

    @property
    def keys(self) -> dict[int, bytes]:
        """The sites with a public key in the current session."""
        return self.server.keys

    def refused(self, coord, rnd: int, k: int, why: str, events) -> None:
        """Log and record that site ``k``'s part of round ``rnd`` was refused (``why``)."""
        log.warning("secure aggregation, round %d: site %d: %s", rnd, k, why)
        events.rejected.append({"round": rnd, "client": coord.server_id, "src": k, "reason": str(why)[:300]})

    def setup(self, coord, sites: list[int], events) -> None:
        """Key agreement (once per run, again after a site rejoins or the run resumes): every site makes a
        fresh key pair; the server relays the public keys with a fresh session id."""
        sec = self.server
        got = coord.call("secagg_keys", {k: Message({}) for k in sites})
        table, sigs = {}, {}
        for k, r in sorted(got.items()):
            pk, sig = r.meta.get("public_key"), r.meta.get("signature")
            if isinstance(pk, str) and len(pk) == 64:
                try:
                    table[k] = bytes.fromhex(pk)
                    if isinstance(sig, str) and len(sig) == SIGNATURE_HEX:  # a deployed site's: relayed
                        sigs[str(k)] = sig
                    continue
                except ValueError:
                    pass
            self.refused(coord, -1, k, f"no valid public key ({r.meta.get('refused', 'malformed')})", events)
        sec.setup(table)
        meta: dict = {"session": sec.session.hex(), "keys": {str(k): v.hex() for k, v in table.items()}}
        if sigs:
            meta["signatures"] = {k: v for k, v in sigs.items() if int(k) in table}
        done = coord.call("secagg_setup", {k: Message(meta) for k in sorted(table)})
        for k in sorted(table):
            if not done.get(k, Message()).meta.get("ok"):
                sec.keys.pop(k, None)
                self.refused(coord, -1, k, "key agreement refused or lost", events)
        self.keys_ready = True

    def participants(self, coord, active: list[int], events) -> list[int]:
        """The sites with keys among ``active`` (key agreement first if a site rejoined or none was made)."""
        if events.rejoined or not self.keys_ready:
            self.setup(coord, active, events)
        return sorted(set(active) & set(self.server.keys))

    def run(self, coord, rnd: int, chosen: list[int], events, meta: dict | None = None) -> SecureResult:
        """The round's masked uploads from ``chosen`` (each sent ``train_upload`` with ``meta`` and
        ``meta["secagg"]``), the unmasking by the survivors and the sum — or the round abandoned."""
        from silofl.comm.messages import Packet as P
        from silofl.secure import SecAggRefused
        from silofl.secure.messages import pack_shares, unpack_masked

        sec = self.server
        out = SecureResult(participants=list(chosen))
        try:
            graph_seed = sec.begin(rnd, chosen)
        except (ValueError, SecAggRefused) as e:
            out.reason = str(e)
            return out
        rseed = self.rotation_rng.getrandbits(128)
        out.rotation_seed = rseed
        sm = {"participants": chosen, "graph_seed": graph_seed.hex(), "rotation_seed": str(rseed)}
        base = {"round": rnd, "server": coord.server_id, **(meta or {})}
        uploads = coord.call("train_upload", {k: Message({**base, "secagg": sm}) for k in chosen})
        for k in sorted(uploads):
            if "refused" in uploads[k].meta:
                self.refused(coord, rnd, k, f"refused to mask: {uploads[k].meta['refused']}", events)
            for p in coord.routable(rnd, k, uploads, {coord.server_id}, events):
                try:
                    expect = {"round": rnd, "src": k, "secagg": True}
                    y, sealed = unpack_masked(
                        p.data, sec.dim, sec.settings.bits, expect, max_shares=len(chosen)
                    )
                    sec.receive(k, y, sealed)
                except (PeerModelRejected, SecAggRefused) as e:
                    self.refused(coord, rnd, k, f"masked upload refused: {e}", events)
        surv = sec.survivors()
        if surv is not None:
            requests = {
                k: Message(
                    {"round": rnd, "survivors": surv},
                    [P(coord.server_id, k, pack_shares(sec.forwarded(k), {"round": rnd, "dst": k}))],
                )
                for k in surv
            }
            reveals = {}
            for k, r in sorted(coord.call("secagg_unmask", requests).items()):
                if isinstance(r.meta.get("reveal"), dict):
                    reveals[k] = r.meta["reveal"]
                else:
                    why = f"refused to unmask: {r.meta.get('refused', 'no reveal')}"
                    self.refused(coord, rnd, k, why, events)
            out.total = sec.finish(reveals)
            out.survivors = list(surv)
        if out.total is None:
            out.reason = sec.reason
        return out


def plausible(released: torch.Tensor, mech, survivors: int, rnd: int) -> bool:
    """Whether the decoded sum is within what ``survivors`` clipped, rounded, noisy inputs can add up to (a
    wrong mask or a wrap-around gives a vector of the group's size); the server saw it either way. The
    noise's norm concentrates at √d′·σ (its spread is about σ/√2): eight σ of slack on top of every input at
    its bound and every rounding at its largest. A uniform vector of the group (what a wrong mask leaves) is
    about 2.3 times as long as the noise alone, since the group holds k = 4 standard deviations of a
    coordinate of the sum (silofl.privacy.discrete.calibrate)."""
    d = mech.padded_dim()
    std = mech.central_std(survivors)
    per = mech.per_party  # summands per site, each clipped and rounded on its own
    bound = survivors * per * (mech.clip + math.sqrt(d) / mech.scale) + std * (math.sqrt(d) + 8)
    norm = float(torch.linalg.vector_norm(released))
    if norm > bound:
        log.warning(
            "secure aggregation, round %d: the decoded sum's norm %.4g exceeds %.4g (a wrong mask or a "
            "wrap-around): the model does not move",
            rnd,
            norm,
            bound,
        )
        return False
    return True
