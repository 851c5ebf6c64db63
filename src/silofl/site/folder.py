"""A site's own folder: who it is, its lifetime privacy budget, its secret and its ledger.

Everything a site keeps across runs and releases lives here (``site.json``, ``site.key``,
``ledger.jsonl``): the budget is set once, when the folder is made, and every release of the site's
records — a PubSub-ML model, a stream chunk, the rounds of a federated run — is checked against it and
recorded in the ledger (:mod:`silofl.privacy.ledger`) before it happens. The default folder is
``$SILOFL_HOME/sites/<name>`` (``SILOFL_HOME`` defaults to ``~/.silofl``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError
from silofl.privacy.ledger import Ledger, announced_head, check_site_name

SITE_FILE = "site.json"
FORMAT = "silofl.site/1"


def default_site_dir(name: str) -> Path:
    """``$SILOFL_HOME/sites/<name>``."""
    home = Path(os.environ.get("SILOFL_HOME", "~/.silofl")).expanduser()
    return home / "sites" / check_site_name(name)


class SiteFolder:
    """A site's folder (see the module doc)."""

    def __init__(self, path: str | Path, name: str, lifetime: tuple[float, float] | None):
        self.path, self.name, self.lifetime = Path(path), name, lifetime
        self._ledger: Ledger | None = None

    @classmethod
    def open(cls, path: str | Path | None, name: str, lifetime: tuple[float, float] | None = None) -> SiteFolder:
        """The site's folder at ``path`` (default: :func:`default_site_dir`), made on first use with the lifetime
        budget (ε, δ) given; afterwards a different budget is refused (it is set once)."""
        check_site_name(name)
        p = Path(path) if path is not None else default_site_dir(name)
        if lifetime is not None:
            eps, dlt = lifetime
            if not (math.isfinite(eps) and eps > 0 and 0 <= dlt < 1):
                raise ConfigError(f"a lifetime budget needs 0 < ε < ∞ and 0 ≤ δ < 1, got ε={eps}, δ={dlt}")
        f = p / SITE_FILE
        if f.exists():
            try:
                d = json.loads(f.read_text())
                saved = d["name"], (tuple(d["lifetime"]) if d.get("lifetime") is not None else None)
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"{f} is not a silofl site file ({e})") from None
            if saved[0] != name:
                raise ConfigError(f"{p} is the folder of site {saved[0]!r}, not {name!r}")
            if lifetime is not None and saved[1] is not None and tuple(lifetime) != saved[1]:
                raise ConfigError(f"site {name!r} has the lifetime budget ε={saved[1][0]:g}, δ={saved[1][1]:g}; it is "
                                  "set once, when its folder is made")
            folder = cls(p, name, saved[1] or lifetime)
            if saved[1] is None and lifetime is not None:
                folder._write()
            return folder
        folder = cls(p, name, lifetime)
        folder._write()
        return folder

    def _write(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / SITE_FILE).write_text(json.dumps(
            {"format": FORMAT, "name": self.name, "lifetime": list(self.lifetime) if self.lifetime else None}) + "\n")

    @property
    def ledger(self) -> Ledger:
        """The site's ledger (opened, and verified, on first use)."""
        if self._ledger is None:
            self._ledger = Ledger(self.path)
        return self._ledger

    def announced_head(self) -> dict:
        """The head of this site's ledger as it announces it (epoch, entries, last MAC): what a broker keeps for it with
        :class:`silofl.privacy.ledger.HeadStore` and compares with :func:`silofl.privacy.ledger.head_order`."""
        return announced_head(self.ledger)

    def require_lifetime(self) -> tuple[float, float]:
        """The lifetime budget; ConfigError if the site never declared one."""
        if self.lifetime is None:
            raise ConfigError(f"site {self.name!r} has no lifetime privacy budget: declare it once with "
                              "--lifetime-epsilon E [--lifetime-delta D]")
        return self.lifetime

    def require_release(self, record_ids, epsilon: float, delta: float) -> tuple[set[str], tuple[float, float]]:
        """(the keyed digests of ``record_ids``, what they have spent so far), after checking that releasing them at
        (ε, δ) stays within the lifetime budget (BudgetExhausted if not)."""
        digests = {self.ledger.record_digest(i) for i in record_ids}
        return digests, self.ledger.require_release(digests, epsilon, delta, self.require_lifetime())

    def release(self, record_ids, epsilon: float, delta: float, make: Callable[[], Any],
                send: Callable[[Any], Any], seal: Callable[[bytes, dict], bytes] | None = None,
                **fields: Any) -> tuple[Any, Any]:
        """Release something computed from ``record_ids`` within the lifetime budget: check the budget for the
        (ε, δ) asked for, ``make()`` the artifact (it has ``.epsilon``, ``.delta`` and ``to_bytes()``), record the
        release at the artifact's actual (ε, δ) with its checksum, then ``send(bytes)``. A send refused before anything
        left (a :class:`~silofl.core.errors.SiloflError`, e.g. the broker rejecting the model) cancels the record
        and re-raises; any other failure keeps it counted (the artifact may have left). With ``seal``, the bytes sent
        are ``seal(bytes, receipt)``: the receipt declares the spend of the released records including this release
        (``epsilon_spent``, ``delta_spent``), the lifetime budget and the ledger entry (``ledger_seq``) that records it,
        for the publisher to sign (:func:`silofl.pubsub.signing.sign_model`). Returns (artifact, what ``send``
        returned)."""
        import hashlib

        digests, before = self.require_release(record_ids, epsilon, delta)
        artifact = make()
        data = artifact.to_bytes()
        eps, dlt = float(artifact.epsilon), float(artifact.delta)
        if eps > epsilon * (1 + 1e-9) or dlt > delta * (1 + 1e-9):
            raise RuntimeError(f"the mechanism spent ε={eps}, δ={dlt}, above the (ε={epsilon}, δ={delta}) it was asked for")
        if seal is not None:
            life = self.require_lifetime()
            data = seal(data, {"site": self.name, "epsilon_spent": before[0] + eps, "delta_spent": before[1] + dlt,
                               "lifetime": [life[0], life[1]], "ledger_seq": len(self.ledger.entries),
                               "ledger_head": self.ledger.head.to_dict()})  # signed: the broker keeps the latest
        entry = self.ledger.record_release(digests, eps, dlt, checksum=hashlib.sha256(data).hexdigest(), **fields)
        try:
            out = send(data)
        except SiloflError as e:
            if not getattr(e, "may_have_left", False):  # e.g. a connection lost after the upload: keep it counted
                self.ledger.cancel_release(entry, f"{type(e).__name__}: {e}")
            raise
        return artifact, out
