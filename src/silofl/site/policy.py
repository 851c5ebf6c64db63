"""A site's own privacy policy: what it accepts of any run, written and signed by the site, never by a
coordinator.

A hospital decides once, in its folder, which releases of its records it takes part in; every run plan is
checked against that decision before the first step (deployed: :mod:`silofl.deploy.site`'s setup; simulated
with site folders: :func:`silofl.runner.plan.check_site_policies`). A refusal is one line naming the switch
that would allow it; nothing is trained, released or spent.

``policy.json`` in the site folder (0600)::

    {"format": "silofl.policy/1", "site": NAME, "key": SIGN-PUBLIC-KEY-HEX,
     "policy": {...the fields of SitePolicy...}, "signature": ED25519-HEX}

signed with the site's own Ed25519 key (``keys/sign.key``) over ``"silofl policy|" + canonical JSON`` of
everything but the signature, and checked against the public half of that same key. A file that fails its
signature, names another site or key, or breaks the schema (an unknown field, a wrong type, a value out of
range) makes the site refuse to start, in one line. Only the site's own commands write it
(``silofl site init`` the safe default, ``silofl site policy`` its edits); no message of a run can.

Noise placements (:class:`PlanRequest`.placement):

* ``local`` — example-level DP-SGD: the site adds all of its own noise before anything leaves it;
* ``server`` — client-level DP without secure aggregation: the site uploads its clipped, *un-noised* update
  sum and the coordinator adds the noise; accepted only with ``trust_server_noise``;
* ``secure`` — secure aggregation, each site adds a share of the noise: accepted only when every secure sum
  carries at least this site's survivors floor (:meth:`SitePolicy.survivors_floor`) and at least its
  minimum noise multiplier; its ε against the server plus ``colluders`` sites counts the honest survivors'
  shares only;
* ``none`` — nothing noised: refused unless the site allows it explicitly.

Older folders kept these decisions in ``site.json`` (``allow_research_seed``, ``allow_non_formal``,
``secagg_min_noise``, ``secagg_min_survivors``): the first time such a folder is opened its policy is
written from them (:func:`load_policy`), and ``site.json`` keeps them as a copy that :func:`save_policy`
updates. A hand edit of that copy can only narrow the signed policy, never widen it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from silofl.core.errors import ConfigError

log = logging.getLogger("silofl")

POLICY_FILE = "policy.json"
POLICY_FORMAT = "silofl.policy/1"
MAX_POLICY_BYTES = 64 << 10  # a policy file larger than this is refused before it is parsed
SIGN_LABEL = b"silofl policy|"
UNITS = ("row", "person", "hospital", "subclient", "publication", "none")
PLACEMENTS = ("local", "server", "secure", "none")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a backbone's registered name: never a path
SWITCH = "`silofl site policy"  # how a refusal names the command that would change it

__all__ = [
    "PLACEMENTS",
    "POLICY_FILE",
    "UNITS",
    "PlanRequest",
    "PolicyRefused",
    "SitePolicy",
    "load_policy",
    "policy_changes",
    "save_policy",
]


class PolicyRefused(ConfigError):
    """A run plan this site's policy does not accept (one line naming the switch that would)."""


@dataclass(frozen=True)
class PlanRequest:
    """What a run asks of one site, built above the site layer from the run's plan
    (:func:`silofl.runner.plan.policy_request`)."""

    method: str
    unit: str  # "row" | "person" | "hospital" | "subclient" | "publication" | "none"
    placement: str  # "local" | "server" | "secure" | "none" (see the module doc)
    noise_multiplier: float | None
    rounds: int
    features: str  # "none" | "scatter" | "backbone:NAME" | another registered stage (as the run names it)
    seeded: bool
    secure_min_survivors: int | None = None  # the coordinator's minimum survivors per secure sum
    sample_size: int | None = None  # parties per secure round
    secure_noise: float | None = None  # the secure update sum's noise multiplier (its share of z)
    non_formal: bool = False  # the run's ε is not a formal guarantee (e.g. paper mode)


@dataclass(frozen=True)
class SitePolicy:
    """The site's decisions (defaults: the safe ones; see the module doc and docs/threat_model.md)."""

    placements: tuple[str, ...] = ("local", "secure")  # "server" only through trust_server_noise
    units: tuple[str, ...] = ("row", "person", "hospital", "subclient", "publication")
    trust_server_noise: bool = False  # client-level with the server adding the noise
    min_survivors: int = 3  # the least parties whose noise reaches every secure sum
    survivor_fraction: float = 0.5  # ... and at least this share of the sample
    colluders: int = 1  # sites assumed to collude with the server (per-threat ε; floor ≥ colluders + 2)
    min_noise: float | None = None  # the least noise multiplier of a secure sum
    max_rounds: int | None = None  # the most rounds of one run
    min_sigma: float | None = None  # the smallest noise multiplier of one run
    features: tuple[str, ...] = ("none", "scatter")  # feature stages allowed (backbones: by name, below)
    backbones: tuple[tuple[str, str], ...] = ()  # (NAME, the site's own directory), registered by the site
    allow_research_seed: bool = False
    allow_non_formal: bool = False
    # a copy of the narrowing a hand-edited site.json applied (not part of the signed file)
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ schema
    def validate(self, where: str = "the site policy") -> None:
        """ConfigError (one line naming ``where`` and the field) unless every field is in range."""
        for name in ("placements", "units", "features"):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not all(isinstance(x, str) for x in v):
                raise ConfigError(f"{where}: {name} must be a list of names")
        if bad := [p for p in self.placements if p not in PLACEMENTS or p == "server"]:
            raise ConfigError(
                f"{where}: placements are among local, secure, none (server: trust_server_noise), got {bad}"
            )
        if bad := [u for u in self.units if u not in UNITS or u == "none"]:
            raise ConfigError(f"{where}: units are among {', '.join(UNITS[:-1])}, got {bad}")
        if bad := [f for f in self.features if not NAME_RE.fullmatch(f) or f == "backbone"]:
            raise ConfigError(f"{where}: features are stage names (backbones are registered by name): {bad}")
        for name in ("trust_server_noise", "allow_research_seed", "allow_non_formal"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{where}: {name} must be true or false")
        _int_at_least(where, "min_survivors", self.min_survivors, 2)
        _int_at_least(where, "colluders", self.colluders, 0)
        if self.max_rounds is not None:
            _int_at_least(where, "max_rounds", self.max_rounds, 1)
        if not (_real(self.survivor_fraction) and 0 <= self.survivor_fraction <= 1):
            raise ConfigError(f"{where}: survivor_fraction must lie in [0, 1]")
        for name in ("min_noise", "min_sigma"):
            v = getattr(self, name)
            if v is not None and not (_real(v) and v >= 0):
                raise ConfigError(f"{where}: {name} must be a finite non-negative number or null")
        _check_backbones(where, self.backbones)

    def to_dict(self) -> dict[str, Any]:
        """The signed fields as plain JSON."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "notes"}
        for k in ("placements", "units", "features"):
            d[k] = list(d[k])
        d["backbones"] = {n: p for n, p in self.backbones}
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "the site policy") -> SitePolicy:
        """A policy from its JSON; ConfigError naming ``where`` and the field for anything else."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: not a policy (a JSON object is expected)")
        names = {f.name for f in dataclasses.fields(cls)} - {"notes"}
        if unknown := sorted(set(d) - names):
            raise ConfigError(f"{where}: unknown field(s) {', '.join(map(str, unknown))[:200]}")
        if missing := sorted(names - set(d)):
            raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
        v = dict(d)
        for k in ("placements", "units", "features"):
            if not isinstance(v[k], list) or len(v[k]) > 64:
                raise ConfigError(f"{where}: {k} must be a list of names")
            v[k] = tuple(v[k])
        bb = v["backbones"]
        if not isinstance(bb, dict) or len(bb) > 256:
            raise ConfigError(f"{where}: backbones must map names to directories")
        v["backbones"] = tuple(sorted(bb.items()))
        return cls(**v).checked_by(where)

    def checked_by(self, where: str) -> SitePolicy:
        """Self after :meth:`validate` naming ``where``."""
        self.validate(where)
        return self

    def replace(self, **changes: Any) -> SitePolicy:
        """A new policy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ what it accepts
    def survivors_floor(self, sample: int | None) -> int:
        """The least number of parties whose noise must reach a secure sum of ``sample`` parties: at least
        ``min_survivors``, ``colluders`` + 2 (the site and one honest party besides the colluders) and
        ``survivor_fraction`` of the sample."""
        floor = max(self.min_survivors, self.colluders + 2)
        if sample is not None:
            floor = max(floor, math.ceil(self.survivor_fraction * sample - 1e-9))
        return floor

    def backbone_dir(self, name: str) -> str:
        """The directory this site registered for backbone ``name`` (PolicyRefused otherwise; the refusal
        depends on the name only, never on what exists on this machine)."""
        for n, p in self.backbones:
            if n == name:
                return p
        if not NAME_RE.fullmatch(name):
            raise PolicyRefused(
                "the run names its backbone by a path: this site loads a backbone only by a name it "
                f"registered ({SWITCH} --register-backbone NAME=DIR`); a path from a run is never opened"
            )
        raise PolicyRefused(
            f"backbone {name!r} is not registered at this site ({SWITCH} --register-backbone {name}=DIR`)"
        )

    def check(self, req: PlanRequest) -> None:
        """PolicyRefused (one line naming the switch that would allow it) unless this site accepts
        ``req``."""
        self._check_placement(req)
        if req.placement != "none" and req.unit not in self.units:
            raise PolicyRefused(
                f"privacy unit {req.unit!r} is not among this site's ({', '.join(self.units)}; "
                f"{SWITCH} --allow-unit {req.unit}`)"
            )
        if req.non_formal and not self.allow_non_formal:
            raise PolicyRefused(
                f"method {req.method} in this run gives no formal guarantee and this site requires one "
                f"({SWITCH} --allow-non-formal`; the site.json field allow_non_formal)"
            )
        if req.seeded and not self.allow_research_seed:
            raise PolicyRefused(
                "the run carries a seed, and whoever knows it can reproduce this site's noise; this site "
                f"accepts seeded research runs only with allow_research_seed ({SWITCH} "
                "--allow-research-seed`; the site.json field allow_research_seed)"
            )
        if self.max_rounds is not None and req.rounds > self.max_rounds:
            raise PolicyRefused(
                f"{req.rounds} rounds exceed this site's most per run, {self.max_rounds} "
                f"({SWITCH} --max-rounds`)"
            )
        z = req.noise_multiplier
        if self.min_sigma is not None and req.placement != "none" and (z is None or z < self.min_sigma):
            raise PolicyRefused(
                f"noise multiplier {_g(z)} is below this site's smallest per run, {self.min_sigma:g} "
                f"({SWITCH} --min-sigma`)"
            )
        self._check_features(req.features)
        if req.placement == "secure":
            self._check_secure(req)

    def _check_placement(self, req: PlanRequest) -> None:
        p = req.placement
        if p not in PLACEMENTS:
            raise PolicyRefused(f"unknown noise placement {str(p)[:40]!r}")
        if p == "server" and not self.trust_server_noise:
            raise PolicyRefused(
                f"method {req.method} without --secure-aggregation has every site upload its clipped, "
                "un-noised update sum for the coordinator to noise, and this site does not trust a server's "
                f"noise (run it with --secure-aggregation, or {SWITCH} --trust-server-noise`)"
            )
        if p == "none" and "none" not in self.placements:
            raise PolicyRefused(
                f"method {req.method} in this run adds no noise (no DP): no formal guarantee, and this site "
                f"releases nothing un-noised ({SWITCH} --allow-placement none`; the site.json field "
                "allow_non_formal)"
            )
        if p in ("local", "secure") and p not in self.placements:
            raise PolicyRefused(
                f"noise placement {p!r} is not among this site's ({', '.join(self.placements) or 'none'}; "
                f"{SWITCH} --allow-placement {p}`)"
            )

    def _check_features(self, features: str) -> None:
        name, _, arg = str(features).partition(":")
        if name == "backbone":
            self.backbone_dir(arg)
            return
        if name not in self.features:
            raise PolicyRefused(
                f"feature stage {name[:40]!r} is not among this site's ({', '.join(self.features)}; "
                f"{SWITCH} --allow-feature {name[:40]}`)"
            )

    def _check_secure(self, req: PlanRequest) -> None:
        floor = self.survivors_floor(req.sample_size)
        n, m = req.sample_size, req.secure_min_survivors
        if n is not None and n < floor:
            raise PolicyRefused(
                f"the run's secure sums have {n} parties, fewer than this site's survivors floor {floor} "
                f"(at least {self.min_survivors}, colluders {self.colluders} + 2 and "
                f"{self.survivor_fraction:g} of the sample; {SWITCH} --min-survivors / --colluders`)"
            )
        if m is None or m < floor:
            raise PolicyRefused(
                f"minimum survivors {_g(m)} is below this site's floor {floor}: fewer parties' noise could "
                f"reach a sum than it accepts ({SWITCH} --min-survivors / --colluders`)"
            )
        z = req.secure_noise
        if self.min_noise is not None and (z is None or z < self.min_noise):
            raise PolicyRefused(
                f"the secure sums' noise multiplier {_g(z)} is below this site's floor {self.min_noise:g} "
                f"({SWITCH} --min-noise`)"
            )

    def describe(self) -> str:
        """One line: what this policy accepts (for the console and ``silofl site policy``)."""
        places = [*self.placements, *(["server (trust-server-noise)"] if self.trust_server_noise else [])]
        parts = [
            f"placements {', '.join(places)}",
            f"units {', '.join(self.units)}",
            f"secure sums: survivors ≥ {self.survivors_floor(None)} and ≥ {self.survivor_fraction:g} of the "
            f"sample, colluders assumed {self.colluders}, noise ≥ {_g(self.min_noise)}",
            f"rounds ≤ {_g(self.max_rounds)}, σ ≥ {_g(self.min_sigma)}",
            f"features {', '.join(self.features)}"
            + (f", backbones {', '.join(n for n, _ in self.backbones)}" if self.backbones else ""),
            f"research seed {'yes' if self.allow_research_seed else 'no'}",
            f"non-formal ε {'yes' if self.allow_non_formal else 'no'}",
        ]
        return "; ".join(parts)

    def admitting(self, req: PlanRequest) -> SitePolicy:
        """This policy widened just enough to accept ``req``: for folders one user makes for every party of
        a run at once (``silofl deploy local``), never for a site's own folder."""
        changes: dict[str, Any] = {}
        if req.placement == "server":
            changes["trust_server_noise"] = True
        elif req.placement not in self.placements:
            changes["placements"] = (*self.placements, req.placement)
        if req.unit not in self.units and req.unit != "none":
            changes["units"] = (*self.units, req.unit)
        if req.seeded:
            changes["allow_research_seed"] = True
        if req.non_formal:
            changes["allow_non_formal"] = True
        if req.placement == "secure" and req.secure_min_survivors is not None:
            m = req.secure_min_survivors
            changes.update(
                min_survivors=m, colluders=min(self.colluders, max(0, m - 2)), survivor_fraction=0.0
            )
        name = str(req.features).partition(":")[0]
        if name not in ("backbone", *self.features):
            changes["features"] = (*self.features, name)
        return self.replace(**changes)

    @classmethod
    def from_site_json(cls, d: dict) -> SitePolicy:
        """The policy an older folder's ``site.json`` decided (its allow_* and secagg_* fields)."""
        non_formal = d.get("allow_non_formal") is True
        m = d.get("secagg_min_survivors")
        z = d.get("secagg_min_noise")
        return cls(
            placements=("local", "secure", "none") if non_formal else ("local", "secure"),
            allow_research_seed=d.get("allow_research_seed") is True,
            allow_non_formal=non_formal,
            min_survivors=max(3, m) if _int(m) else 3,
            min_noise=float(z) if _real(z) and z >= 0 else None,
        )

    def narrowed_by(self, d: dict) -> SitePolicy:
        """This policy with ``site.json``'s copy of the older fields applied where it is stricter (a hand edit
        narrows; a wider value there is ignored with a warning)."""
        changes: dict[str, Any] = {}
        notes: list[str] = []
        for key in ("allow_research_seed", "allow_non_formal"):
            if d.get(key) is False and getattr(self, key):
                changes[key] = False
                notes.append(f"site.json's {key}: false narrows the policy")
                if key == "allow_non_formal" and "none" in self.placements:  # it refused no-DP runs too
                    changes["placements"] = tuple(p for p in self.placements if p != "none")
            elif d.get(key) is True and not getattr(self, key):
                notes.append(f"site.json's {key}: true is ignored: the signed policy decides ({SWITCH}`)")
        m, z = d.get("secagg_min_survivors"), d.get("secagg_min_noise")
        if _int(m) and m > self.min_survivors:
            changes["min_survivors"] = m
            notes.append(f"site.json's secagg_min_survivors {m} narrows the policy")
        if _real(z) and z > (self.min_noise if self.min_noise is not None else -1.0):
            changes["min_noise"] = float(z)
            notes.append(f"site.json's secagg_min_noise {z:g} narrows the policy")
        for n in notes:
            log.warning("%s", n)
        return self.replace(**changes, notes=tuple(notes)) if changes or notes else self

    def site_json_copy(self) -> dict[str, Any]:
        """The older site.json fields as this policy decides them (the copy :func:`save_policy` keeps)."""
        return {
            "allow_research_seed": self.allow_research_seed,
            "allow_non_formal": self.allow_non_formal,
            "secagg_min_noise": self.min_noise,
            "secagg_min_survivors": self.min_survivors,
        }


def policy_changes(
    old: SitePolicy,
    units: tuple[list[str], list[str]] = ([], []),
    placements: tuple[list[str], list[str]] = ([], []),
    features: list[str] | None = None,
    backbones: tuple[dict[str, str], list[str]] = ({}, []),
    limits: dict[str, Any] | None = None,
    **switches: Any,
) -> SitePolicy:
    """``old`` with a site operator's edits (``silofl site policy``): units and placements (allowed, refused),
    feature stages allowed, backbones (registered NAME → DIR, names forgotten), ``limits`` (max_rounds,
    min_sigma, min_noise; ``clear`` drops them first) and the other fields by name (None: unchanged).
    ConfigError for a value out of range."""
    if "server" in placements[0]:
        raise ConfigError("the server placement is allowed by --trust-server-noise, not --allow-placement")

    def edit(have: tuple[str, ...], add: list[str], drop: list[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x for x in (*have, *add) if x not in drop))

    bb = {n: d for n, d in old.backbones if n not in backbones[1]}
    bb.update(backbones[0])
    lim = dict(limits or {})
    clear = lim.pop("clear", False)
    changes: dict[str, Any] = {k: v for k, v in {**switches, **lim}.items() if v is not None}
    if clear:
        changes = {"max_rounds": None, "min_sigma": None, "min_noise": None, **changes}
    return old.replace(
        units=edit(old.units, *units),
        placements=edit(old.placements, *placements),
        features=edit(old.features, features or [], []),
        backbones=tuple(sorted(bb.items())),
        notes=(),
        **changes,
    )


# ---------------------------------------------------------------------------------------------- checks
def _real(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _g(v: Any) -> str:
    return "none" if v is None else f"{v:g}"


def _int_at_least(where: str, name: str, v: Any, low: int) -> None:
    if not _int(v) or v < low or v > 1 << 20:
        raise ConfigError(f"{where}: {name} must be an integer of at least {low}")


def _check_backbones(where: str, backbones: Any) -> None:
    if not isinstance(backbones, tuple):
        raise ConfigError(f"{where}: backbones must map names to directories")
    for item in backbones:
        ok = isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item)
        if not ok or not NAME_RE.fullmatch(item[0]) or not os.path.isabs(item[1]) or len(item[1]) > 4096:
            raise ConfigError(f"{where}: a backbone is a plain name mapped to an absolute directory")


# ---------------------------------------------------------------------------------------------- the file
def _signed_text(body: dict) -> bytes:
    from silofl.privacy.ledger import canonical_json

    return SIGN_LABEL + canonical_json(body)


def save_policy(folder: Any, policy: SitePolicy) -> Path:
    """Sign ``policy`` with the site's key and write ``policy.json`` (0600, atomically); ``site.json``'s copy
    of the older fields follows. ``folder``: a :class:`silofl.site.folder.SiteFolder`."""
    from silofl.site.folder import SITE_FILE, read_site_json, write_private

    key = folder.signing_key()
    body = {
        "format": POLICY_FORMAT,
        "site": folder.name,
        "key": _public_hex(key),
        "policy": policy.to_dict(),
    }
    body["signature"] = key.sign(_signed_text(body)).hex()
    path = Path(folder.path) / POLICY_FILE
    tmp = path.with_name(path.name + ".tmp")
    write_private(tmp, (json.dumps(body, indent=1) + "\n").encode())
    tmp.replace(path)
    d = read_site_json(Path(folder.path))
    copy = policy.site_json_copy()
    if any(d.get(k) != v for k, v in copy.items()):
        d.update(copy)
        stmp = Path(folder.path) / (SITE_FILE + ".tmp")
        stmp.write_text(json.dumps(d, indent=1) + "\n")
        stmp.replace(Path(folder.path) / SITE_FILE)
    return path


def load_policy(folder: Any) -> SitePolicy:
    """The site's policy: ``policy.json`` verified against the site's own key and its schema (ConfigError in
    one line otherwise), narrowed by ``site.json``'s copy of the older fields. A folder without one (made
    before policies) gets one written from its ``site.json`` first."""
    from silofl.site.folder import read_site_json

    path = Path(folder.path) / POLICY_FILE
    d = read_site_json(Path(folder.path))
    if not path.exists() and not path.is_symlink():
        save_policy(folder, SitePolicy.from_site_json(d))
        log.info("site %s: its policy was written from site.json (%s)", folder.name, path)
    return read_signed(path, folder.name, _public_hex(folder.signing_key())).narrowed_by(d)


def read_signed(path: Path, site: str, key_hex: str) -> SitePolicy:
    """The policy in ``path``, signed by the key ``key_hex`` of site ``site``; ConfigError otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    where = str(path)
    if path.is_symlink() or not path.is_file():
        raise ConfigError(f"{where}: the site's policy is not a plain file: refused")
    if path.stat().st_size > MAX_POLICY_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_POLICY_BYTES} bytes, not a site policy: refused")
    try:
        raw = path.read_bytes()
        from silofl.comm.messages import json_depth

        json_depth(raw, 8)
        d = json.loads(raw)
    except Exception as e:  # noqa: BLE001 - any parse failure is a damaged policy
        raise ConfigError(f"{where}: not a site policy ({str(e)[:120]}): refused") from None
    if not isinstance(d, dict) or set(d) != {"format", "site", "key", "policy", "signature"}:
        raise ConfigError(f"{where}: not a site policy (its fields): refused")
    if d["format"] != POLICY_FORMAT:
        raise ConfigError(f"{where}: format {str(d['format'])[:40]!r} is not {POLICY_FORMAT}: refused")
    if d["site"] != site or d["key"] != key_hex:
        raise ConfigError(f"{where}: the policy is another site's or another key's: refused")
    sig = d.pop("signature")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(key_hex)).verify(
            bytes.fromhex(sig) if isinstance(sig, str) else b"", _signed_text(d)
        )
    except (InvalidSignature, ValueError):
        raise ConfigError(
            f"{where}: the policy's signature does not verify with site {site}'s key: it was changed "
            f"outside `silofl site policy`; the site refuses to start"
        ) from None
    return SitePolicy.from_dict(d["policy"], where)


def _public_hex(key: Any) -> str:
    from silofl.site.folder import public_raw

    return public_raw(key.public_key()).hex()
