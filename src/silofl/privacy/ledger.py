"""A site's privacy ledger: every release of the site's records, composed, in a file nobody can quietly
edit or roll back.

The ledger is a folder of the site's own: ``site.key`` (a 32-byte secret, mode 0600, created on first
use and never sent anywhere) and ``ledger.jsonl``, one JSON entry per line. Each entry carries its
sequence number, the MAC of the entry before it and its own MAC, HMAC-SHA256 keyed with the site's
secret over the entry's canonical JSON: an edited, inserted, removed or reordered entry breaks the
chain and the ledger refuses to open (:class:`LedgerTampered`). Truncating the tail leaves a valid
shorter chain, so every checkpoint and run record also keeps the ledger's *head* (entry count and last
MAC) and :meth:`Ledger.check_head` refuses a ledger older than a head it once had.

What a site spends is always recomputed from the ledger, never read from a number elsewhere:

* DP-SGD rounds (``kind: "dp-sgd"``): the (σ, q, steps) the mechanism reported, composed by the
  accountant (:meth:`Ledger.history`) — a resumed run continues from what ran, whatever a checkpoint says;
* secure rounds (``kind: "secagg-discrete"``): the discrete mechanisms the site masked;
* releases of records (``kind: "release"``, PubSub-ML models and stream chunks): the (ε, δ) of the release
  and the keyed digests of the record ids it covers. A record's spend is the sum over the releases that
  contain it (basic composition; parallel composition over disjoint chunks falls out of it:
  :func:`release_spend`). A release is recorded *before* its model leaves the site; one refused on the way
  out (e.g. by the broker) is then marked ``kind: "cancel"`` and no longer counts, so a crash in between
  can only over-count.

Every kind is composed with every other by the site's one accountant
(:class:`silofl.privacy.site_accountant.SiteAccountant`), which checks the lifetime budget before any step.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError

FORMAT = "silofl.ledger/1"
KEY_FILE, LEDGER_FILE = "site.key", "ledger.jsonl"
GENESIS = "0" * 64


def release_spend(entries: list[dict], digests: set[str] | None = None) -> tuple[float, float]:
    """The largest (ε, δ) any record (of ``digests``, or any) spent over the ``release`` entries of
    ``entries`` that no ``cancel`` entry withdrew, by basic composition (a record's spend is the sum over
    the releases that contain it; parallel composition over disjoint chunks falls out of it). Releases
    carried over from a ledger keyed otherwise (``"*:<old digest>"``, :func:`silofl.site.folder.migrate`)
    cannot be matched to this key's digests, so the most any of them spent counts for every record. Pure:
    the site accountant asks it with planned releases appended."""
    eps: dict[str, float] = defaultdict(float)
    dlt: dict[str, float] = defaultdict(float)
    cancelled = {e["release"] for e in entries if e["kind"] == "cancel"}
    e_any: dict[str, float] = defaultdict(float)
    d_any: dict[str, float] = defaultdict(float)
    for e in entries:
        if e["kind"] != "release" or e.get("seq") in cancelled:
            continue
        for d in e["records"]:
            if d.startswith("*"):
                e_any[d] += e["epsilon"]
                d_any[d] += e["delta"]
            elif digests is None or d in digests:
                eps[d] += e["epsilon"]
                dlt[d] += e["delta"]
    return (
        max(eps.values(), default=0.0) + max(e_any.values(), default=0.0),
        max(dlt.values(), default=0.0) + max(d_any.values(), default=0.0),
    )


class LedgerTampered(SiloflError):
    """A ledger whose chain of MACs does not verify, or that is older than a head it once had."""


def canonical_json(obj: Any) -> bytes:
    """The one byte form of a JSON value that MACs and signatures cover (sorted keys, no spaces, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def load_key(folder: Path) -> bytes:
    """The site's secret (created with mode 0600 on first use)."""
    path = folder / KEY_FILE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise LedgerTampered(f"{path} is not a site key") from None
    if len(key) != 32:
        raise LedgerTampered(f"{path} is not a site key")
    return key


@dataclass
class Head:
    """Where a ledger stood: its number of entries and the MAC of the last one."""

    entries: int
    mac: str

    def to_dict(self) -> dict:
        """Plain JSON."""
        return {"entries": self.entries, "mac": self.mac}


class Ledger:
    """A site's append-only, MAC-chained ledger (see the module doc)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.key = load_key(self.folder)
        self.path = self.folder / LEDGER_FILE
        self.entries: list[dict] = []
        if self.path.exists():
            self._verify(self.path.read_text())

    # ------------------------------------------------------------------ integrity
    def _mac(self, entry: dict) -> str:
        body = {k: v for k, v in entry.items() if k != "mac"}
        return hmac.new(self.key, canonical_json(body), hashlib.sha256).hexdigest()

    def _verify(self, text: str) -> None:
        prev = GENESIS
        for i, line in enumerate(text.splitlines()):
            try:
                entry = json.loads(line)
            except ValueError:
                raise LedgerTampered(f"{self.path}: entry {i} is not JSON") from None
            if not isinstance(entry, dict) or entry.get("seq") != i or entry.get("prev") != prev:
                raise LedgerTampered(
                    f"{self.path}: entry {i} is out of sequence (removed, inserted or reordered)"
                )
            if not hmac.compare_digest(str(entry.get("mac", "")), self._mac(entry)):
                raise LedgerTampered(f"{self.path}: entry {i} fails its MAC (the ledger was edited)")
            prev = entry["mac"]
            self.entries.append(entry)

    @property
    def head(self) -> Head:
        """The ledger's current head."""
        return Head(len(self.entries), self.entries[-1]["mac"] if self.entries else GENESIS)

    def check_head(self, head: dict | Head) -> None:
        """Raise LedgerTampered unless this ledger contains the given head (it was not rolled back past
        it)."""
        h = head if isinstance(head, Head) else Head(int(head["entries"]), str(head["mac"]))
        have = (
            GENESIS
            if h.entries == 0
            else (self.entries[h.entries - 1]["mac"] if h.entries <= len(self.entries) else None)
        )
        if have != h.mac:
            raise LedgerTampered(
                f"{self.path} holds {len(self.entries)} entries and does not contain the head of "
                f"{h.entries} entries recorded earlier: the ledger was rolled back or replaced"
            )

    def append(self, kind: str, **fields: Any) -> dict:
        """Record an entry (durably: flushed and fsynced before returning)."""
        entry = {
            "format": FORMAT,
            "seq": len(self.entries),
            "prev": self.head.mac,
            "kind": kind,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            **fields,
        }
        entry["mac"] = self._mac(entry)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(canonical_json(entry).decode() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.entries.append(entry)
        return entry

    # ------------------------------------------------------------------ DP-SGD rounds
    def record_steps(
        self, run: str, noise_multiplier: float, sample_rate: float, steps: int, **extra: Any
    ) -> None:
        """Record steps of the subsampled Gaussian mechanism of run ``run``."""
        if steps > 0:
            self.append(
                "dp-sgd",
                run=run,
                noise_multiplier=float(noise_multiplier),
                sample_rate=float(sample_rate),
                steps=int(steps),
                **extra,
            )

    def history(self, run: str | None = None) -> list[tuple[float, float, int]]:
        """The (σ, q, steps) of every recorded DP-SGD step block (of run ``run``, or of every run), in
        order."""
        return [
            (e["noise_multiplier"], e["sample_rate"], e["steps"])
            for e in self.entries
            if e["kind"] == "dp-sgd" and (run is None or e["run"] == run)
        ]

    def units(self) -> list[str]:
        """The privacy units of the recorded DP-SGD step blocks, sorted (``row`` where an entry names none;
        a person-level block, ``--id-column``, names ``person (column X)``). Row-level blocks protect a
        person with k rows only at group-privacy level, so a ledger that mixes units says so."""
        return sorted({str(e.get("unit", "row")) for e in self.entries if e["kind"] == "dp-sgd"})

    # ------------------------------------------------------------------ releases of records
    def record_digest(self, record_id: Any) -> str:
        """A keyed digest of a record id (the ledger never stores the ids themselves)."""
        return hmac.new(self.key, str(record_id).encode(), hashlib.sha256).hexdigest()[:24]

    def spent(self, digests: set[str] | None = None) -> tuple[float, float]:
        """The largest (ε, δ) any record (of ``digests``, or any) has spent, by basic composition."""
        return release_spend(self.entries, digests)

    def record_release(self, digests: set[str], epsilon: float, delta: float, **fields: Any) -> dict:
        """Record a release of these records at (ε, δ)."""
        return self.append(
            "release", records=sorted(digests), epsilon=float(epsilon), delta=float(delta), **fields
        )

    def cancel_release(self, entry: dict, reason: str) -> None:
        """Mark a recorded release as one that never happened (it was recorded first and then refused before
        anything left the site), so that it no longer counts."""
        if (
            entry.get("kind") != "release"
            or not 0 <= entry.get("seq", -1) < len(self.entries)
            or self.entries[entry["seq"]]["mac"] != entry.get("mac")
        ):
            raise ValueError("only a release recorded in this ledger can be cancelled")
        self.append("cancel", release=entry["seq"], reason=str(reason)[:200])


def check_site_name(name: str) -> str:
    """A site name safe to use as a folder name (letters, digits, '.', '_', '-'; not '.' or '..')."""
    ok = (
        bool(name)
        and len(name) <= 64
        and all(c.isalnum() or c in "._-" for c in name)
        and name not in (".", "..")
    )
    if not ok:
        raise ConfigError(
            f"a site name has 1–64 letters, digits, '.', '_' or '-' and is not '.' or '..', got {name!r}"
        )
    return name


# ---------------------------------------------------------------------------------------------- identity,
# budget, heads A site's ledger is the budget of record: its first entry names the site it belongs to (``kind:
# "genesis"``), its lifetime budget is set and changed only by entries (``kind: "budget"``: old → new, when,
# why), and a lost ledger comes back only by an explicit restore (``kind: "restore"``: the prior spend the
# operator declares). A ledger head carries the number of restores (its *epoch*) so that whoever keeps a
# site's last head (the coordinator, the broker: :class:`HeadStore`) can tell an older ledger from a restored
# one.


def identity_of(ledger: Ledger) -> dict | None:
    """The ledger's genesis entry (which site it belongs to), or None for a ledger without one."""
    return ledger.entries[0] if ledger.entries and ledger.entries[0].get("kind") == "genesis" else None


def start_site_ledger(
    ledger: Ledger, site: str, key_id: str, lifetime: tuple[float, float], why: str
) -> None:
    """Write the genesis (site ``site``, public key ``key_id``) and the first lifetime budget of an empty
    ledger."""
    if ledger.entries:
        raise LedgerTampered(
            f"{ledger.path} already holds {len(ledger.entries)} entries: a ledger is started once"
        )
    ledger.append("genesis", site=site, key_id=key_id)
    ledger.append("budget", epsilon=float(lifetime[0]), delta=float(lifetime[1]), previous=None, why=why)


def require_identity(ledger: Ledger, site: str, key_id: str) -> None:
    """LedgerTampered unless the ledger's genesis names this site and key (another site's ledger, copied in
    with its key, chains correctly but names its own site)."""
    g = identity_of(ledger)
    if g is None:
        raise LedgerTampered(
            f"{ledger.path} does not say which site it belongs to (no genesis entry): it is not this "
            f"site's ledger; restore one with `silofl site ledger-restore`"
        )
    if g.get("site") != site or g.get("key_id") != key_id:
        raise LedgerTampered(
            f"{ledger.path} is the ledger of site {g.get('site')!r} (key {str(g.get('key_id'))[:16]}…), "
            f"not of this site {site!r}: a foreign ledger is never used"
        )


def lifetime_of(ledger: Ledger) -> tuple[float, float] | None:
    """The lifetime (ε, δ) the ledger's last budget entry sets (None if it has none)."""
    for e in reversed(ledger.entries):
        if e.get("kind") == "budget":
            return float(e["epsilon"]), float(e["delta"])
    return None


def change_lifetime(ledger: Ledger, epsilon: float, delta: float, why: str) -> dict:
    """Record a new lifetime budget (old → new, when, why)."""
    import math

    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise ConfigError(f"a lifetime budget needs 0 < ε < ∞ and 0 < δ < 1, got ε={epsilon}, δ={delta}")
    if not why.strip():
        raise ConfigError("say why the lifetime budget changes (--why): the ledger records it")
    old = lifetime_of(ledger)
    return ledger.append(
        "budget",
        epsilon=float(epsilon),
        delta=float(delta),
        previous=list(old) if old else None,
        why=why.strip()[:500],
    )


def restored_spend(ledger: Ledger) -> tuple[float, float]:
    """The prior spend declared by restores of this ledger (ε, δ), composed with the rest by basic
    composition."""
    eps = sum(float(e["epsilon"]) for e in ledger.entries if e.get("kind") == "restore")
    dlt = sum(float(e["delta"]) for e in ledger.entries if e.get("kind") == "restore")
    return eps, dlt


def epoch_of(ledger: Ledger) -> int:
    """The ledger's epoch: 0, or the epoch its last restore started (each restore starts a new one)."""
    return max((int(e["epoch"]) for e in ledger.entries if e.get("kind") == "restore"), default=0)


def restore_ledger(
    folder: str | Path,
    site: str,
    key_id: str,
    lifetime: tuple[float, float],
    spent_epsilon: float,
    spent_delta: float,
    why: str,
    previous: dict | None = None,
) -> Ledger:
    """A new ledger for site ``site`` in ``folder`` after its ledger was lost: genesis, the lifetime budget,
    and a restore entry with the prior spend the operator declares (ε, δ; it counts against the budget by
    basic composition) and a new epoch (after the one of ``previous``, the last head the site announced). A
    ledger file still there is kept beside it (``ledger.jsonl.lost-<time>``), never deleted."""
    import math

    if not (math.isfinite(spent_epsilon) and spent_epsilon >= 0 and 0 <= spent_delta < 1):
        raise ConfigError(
            f"the declared prior spend needs 0 ≤ ε < ∞ and 0 ≤ δ < 1, got ε={spent_epsilon}, δ={spent_delta}"
        )
    if not why.strip():
        raise ConfigError("say why the ledger is restored (--why): the ledger records it")
    folder = Path(folder)
    path = folder / LEDGER_FILE
    if path.exists():
        path.replace(folder / f"{LEDGER_FILE}.lost-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}")
    try:
        load_key(folder)
    except LedgerTampered:  # a lost or damaged key: a new one (the old ledger could not be verified anyway)
        (folder / KEY_FILE).replace(folder / f"{KEY_FILE}.lost-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}")
    led = Ledger(folder)
    led.append("genesis", site=site, key_id=key_id)
    led.append(
        "budget", epsilon=float(lifetime[0]), delta=float(lifetime[1]), previous=None, why="restored ledger"
    )
    led.append(
        "restore",
        epsilon=float(spent_epsilon),
        delta=float(spent_delta),
        why=why.strip()[:500],
        epoch=int((previous or {}).get("epoch", 0)) + 1,
        previous=previous,
    )
    return led


def announced_head(ledger: Ledger) -> dict:
    """The head a site announces (and keeps, and a coordinator or broker stores): epoch, entries, last MAC."""
    return {"epoch": epoch_of(ledger), **ledger.head.to_dict()}


def head_order(old: dict, new: dict) -> int:
    """−1 if head ``new`` is older than ``old`` (fewer entries in the same epoch, or an earlier epoch), 0 if
    it is the
    same head, 1 if it is newer; LedgerTampered if they diverge (same epoch and length, another last MAC)."""
    o, n = (int(old.get("epoch", 0)), int(old["entries"])), (int(new.get("epoch", 0)), int(new["entries"]))
    if n < o:
        return -1
    if n == o:
        if str(old["mac"]) != str(new["mac"]):
            raise LedgerTampered(
                f"a ledger head of {n[1]} entries differs from the one announced before with as many: "
                "the ledger was replaced"
            )
        return 0
    return 1


class HeadStore:
    """The last ledger head each site announced, kept by a party that is not the site (a coordinator in its
    state folder, a broker): :meth:`accept` refuses a head older than the one it holds, so a site whose ledger
    was deleted, truncated or replaced cannot join as if nothing had been spent. One JSON file, written
    atomically."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.heads: dict[str, dict] = {}
        if self.path.is_file():
            try:
                d = json.loads(self.path.read_text())
            except ValueError:
                raise LedgerTampered(f"{self.path}: not a store of ledger heads") from None
            if not isinstance(d, dict) or not isinstance(d.get("heads"), dict):
                raise LedgerTampered(f"{self.path}: not a store of ledger heads")
            self.heads = d["heads"]

    def get(self, site: str) -> dict | None:
        """The last head site ``site`` announced, or None."""
        return self.heads.get(site)

    def check(self, site: str, head: dict) -> None:
        """LedgerTampered if ``head`` is older than (or diverges from) the last one ``site`` announced."""
        old = self.heads.get(site)
        if old is not None and head_order(old, head) < 0:
            raise LedgerTampered(
                f"site {site} presents a ledger head of {head['entries']} entries (epoch "
                f"{head.get('epoch', 0)}); it "
                f"announced {old['entries']} entries (epoch {old.get('epoch', 0)}) before: its ledger was "
                f"lost, "
                "truncated or replaced. Its operator restores it with `silofl site ledger-restore` "
                "(declaring the "
                "prior spend), which starts a new epoch"
            )

    def accept(self, site: str, head: dict) -> None:
        """:meth:`check`, then keep ``head`` as the site's last (durably)."""
        self.check(site, head)
        self.heads[site] = {
            "epoch": int(head.get("epoch", 0)),
            "entries": int(head["entries"]),
            "mac": str(head["mac"]),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps({"format": "silofl.heads/1", "heads": self.heads}, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
