"""A site's own folder: one identity, one lifetime privacy budget and one ledger for every protocol.

A hospital that publishes models with PubSub-ML, trains in a deployed federation (``silofl site run``) and
runs
simulations on its own data is one institution with one budget. Its folder (``silofl site init``, or made on
the
first ``silofl pubsub publish``; default ``$SILOFL_HOME/sites/<name>``, ``SILOFL_HOME`` defaulting to
``~/.silofl``)::

    site.json         format "silofl.site/2": name, lifetime_epsilon, lifetime_delta (a copy: the ledger's
    budget
                      entries are the budget of record), data, schema, private_model, test_fraction,
                      report_test_figures, allow_research_seed, allow_non_formal (what the site decided)
    keys/             sign.key (Ed25519: it signs PubSub-ML models and deployment payloads alike), seal.key
    (X25519),
                      node / node.pub (Flower node authentication), public.json (its public card)
    ledger/           site.key (the ledger's secret, 0600) and ledger.jsonl (:mod:`silofl.privacy.ledger`:
    genesis
                      naming the site and its key, budget entries, DP-SGD rounds of every run, PubSub-ML
                      releases,
                      restores), HMAC-chained and append-only
    state/            runs.json (run ids joined, furthest round, replay guard), head.json (last announced
    head)
    federation.json   (deployment only) the other sites' pinned public cards
    policy.json       the site's own privacy policy, signed with sign.key (:mod:`silofl.site.policy`)

What the site has spent is composed from that one ledger by its one accountant
(:class:`silofl.privacy.site_accountant.SiteAccountant`): every mechanism composed in RDP (DP-SGD rounds of
every run, secure rounds), plus by basic composition the prior spend declared by restores and the largest
spend of any record over its PubSub-ML releases. A deployed run, a simulated run with site folders
(:func:`attach`), a secure round and a PubSub-ML release (:meth:`SiteFolder.require_release`) are each
checked against the lifetime budget with everything else the ledger holds, before the step.
:meth:`SiteFolder.training_budget` is the lifetime budget less the (ε, δ)-given part (restores and
releases): what the RDP-composed mechanisms may use together. A site that spent ε = 3 publishing and joins a
run with a lifetime ε of 8 has 5 left.

Folders of the two earlier formats are converted in place when opened (:func:`migrate`): PubSub-ML's
``silofl.site/1`` (``site.json`` with ``lifetime: [ε, δ]``, ``site.key``, ``ledger.jsonl`` and ``sign.key`` at
the top) and deployment's format ``1`` (``keys/``, ``ledger/``). The new files are written first, then moved
into place, the new ``site.json`` last; the old ``site.json`` is kept as ``site.json.v1.bak``. A folder
holding
both (deployment's ``ledger/`` and PubSub-ML's ``ledger.jsonl``) gets one ledger whose spend is the sum of
both.
A folder that cannot be converted (damaged, hostile, oversized) is refused in one line and left as it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError
from silofl.core.private import write_private  # noqa: F401 - its writers import it from here
from silofl.privacy.ledger import (
    KEY_FILE,
    LEDGER_FILE,
    Ledger,
    LedgerTampered,
    announced_head,
    change_lifetime,
    check_site_name,
    lifetime_of,
    require_identity,
    restored_spend,
    start_site_ledger,
)

SITE_FILE = "site.json"
FORMAT = "silofl.site/2"
PUBSUB_V1 = "silofl.site/1"  # PubSub-ML's folder before this format
DEPLOY_V1 = 1  # deployment's folder before this format
BACKUP = "site.json.v1.bak"
KEYS_DIR, LEDGER_DIR, STATE_DIR = "keys", "ledger", "state"
MAX_SITE_JSON = 64 << 10  # a site.json larger than this is refused before it is parsed
MAX_JSON_DEPTH = 16
MAX_LEDGER_BYTES = 256 << 20  # an old ledger larger than this is refused before it is read
MAX_KEY_BYTES = 16 << 10


def default_site_dir(name: str) -> Path:
    """``$SILOFL_HOME/sites/<name>``."""
    home = Path(os.environ.get("SILOFL_HOME", "~/.silofl")).expanduser()
    return home / "sites" / check_site_name(name)


# ---------------------------------------------------------------------------------------------- keys
def _pkcs8(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_raw(key) -> bytes:
    """The 32 raw bytes of an X25519 or Ed25519 public key."""
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_private(path: Path):
    """A PKCS#8 private key written by this module."""
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(path.read_bytes(), None)


def make_site_keys(folder: Path, name: str, sign=None) -> dict:
    """A site's keys under ``folder``: ``node`` / ``node.pub`` (Flower node authentication, EC P-384 OpenSSH),
    ``seal.key`` (X25519) and ``sign.key`` (Ed25519; ``sign`` keeps an existing one); returns its public card
    (also written to ``public.json``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519

    node = ec.generate_private_key(ec.SECP384R1())
    write_private(
        folder / "node",
        node.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    node_pub = node.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    (folder / "node.pub").write_bytes(node_pub + f" {name}\n".encode())
    seal = x25519.X25519PrivateKey.generate()
    sign = sign if sign is not None else ed25519.Ed25519PrivateKey.generate()
    write_private(folder / "seal.key", _pkcs8(seal))
    write_private(folder / "sign.key", _pkcs8(sign))
    card = {
        "name": name,
        "seal": public_raw(seal.public_key()).hex(),
        "sign": public_raw(sign.public_key()).hex(),
        "node": node_pub.decode(),
    }
    (folder / "public.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


# ---------------------------------------------------------------------------------------------- site.json
@dataclass
class SiteConfig:
    """What a site decided for itself (``site.json``). ``data`` is None for a site that only publishes with
    PubSub-ML (a deployed site needs it). ``allow_research_seed``, ``allow_non_formal`` and ``secagg_*`` are a
    copy of the site's signed policy (:mod:`silofl.site.policy`, ``policy.json``), which decides: a hand edit
    of the copy can only narrow it."""

    name: str
    data: (
        str | None
    )  # a data file in the site folder (silofl's export) or a table/folder read with ``schema``
    lifetime_epsilon: float
    lifetime_delta: float
    private_model: str | None = None
    schema: str | None = None
    test_fraction: float = 0.2
    # the column naming each row's person (person-level DP, silofl.privacy.person): the site samples, clips
    # and accounts by person in every run; None: its unit is the row
    id_column: str | None = None
    report_test_figures: bool = False
    allow_research_seed: bool = False
    allow_non_formal: bool = False  # runs whose ε is not a formal guarantee (paper mode, no DP)
    # secure aggregation, client-level methods: the least noise multiplier of the discrete noise and the least
    # minimum survivors this site accepts (None: no floor beyond its lifetime budget; silofl.fl.exchange)
    secagg_min_noise: float | None = None
    secagg_min_survivors: int | None = None

    def to_dict(self) -> dict:
        """The JSON of ``site.json``."""
        return {"format": FORMAT, **self.__dict__}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> SiteConfig:
        """Checked fields of ``site.json`` (``format`` aside); ConfigError naming ``where`` and the field."""
        d = {k: v for k, v in d.items() if k != "format"}
        try:
            c = cls(**d)
        except TypeError as e:
            raise ConfigError(f"{where}: {e}") from None
        from silofl.core.validate import check_field_types

        check_field_types(c, where)  # a wrong type in an edited site.json: one line naming the field
        check_site_name(c.name)
        if not (math.isfinite(c.lifetime_epsilon) and c.lifetime_epsilon > 0 and 0 <= c.lifetime_delta < 1):
            raise ConfigError(f"{where}: the lifetime budget needs 0 < ε < ∞ and 0 ≤ δ < 1")
        if c.secagg_min_noise is not None and not (
            math.isfinite(c.secagg_min_noise) and c.secagg_min_noise >= 0
        ):
            raise ConfigError(f"{where}: secagg_min_noise must be a finite non-negative number")
        if c.secagg_min_survivors is not None and c.secagg_min_survivors < 2:
            raise ConfigError(f"{where}: secagg_min_survivors must be at least 2")
        return c

    @classmethod
    def load(cls, folder: Path) -> SiteConfig:
        """Read and check ``folder/site.json`` (converting a folder of an earlier format first:
        :func:`migrate`)."""
        migrate(Path(folder))
        return cls.from_dict(read_site_json(Path(folder)), str(Path(folder) / SITE_FILE))


def read_site_json(folder: Path) -> dict:
    """``folder/site.json`` as a dict, its size and nesting bounded before it is parsed; ConfigError
    otherwise."""
    path = folder / SITE_FILE
    if not path.is_file():
        raise ConfigError(f"{folder} is not a site folder (no site.json): create it with `silofl site init`")
    try:
        if path.stat().st_size > MAX_SITE_JSON:
            raise ConfigError(f"{path}: larger than {MAX_SITE_JSON} bytes, not a site file")
        raw = path.read_bytes()
        from silofl.comm.messages import json_depth

        json_depth(raw, MAX_JSON_DEPTH)
        d = json.loads(raw)
    except ConfigError:
        raise
    except (OSError, ValueError, SiloflError) as e:
        raise ConfigError(f"{path}: not JSON of a site file ({str(e)[:200]})") from None
    except Exception as e:  # noqa: BLE001 - e.g. the depth check's own refusal
        raise ConfigError(f"{path}: not a site file ({str(e)[:200]})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: not a site file (a JSON object is expected)")
    return d


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------- migration
def _bounded_text(path: Path, limit: int, what: str) -> str:
    if path.is_symlink() or not path.is_file():
        raise ConfigError(f"{path}: {what} is not a plain file")
    if path.stat().st_size > limit:
        raise ConfigError(f"{path}: {what} is larger than {limit} bytes: refused")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {what} cannot be read ({e})") from None


def _old_pubsub_ledger(folder: Path) -> Ledger | None:
    """PubSub-ML's ledger at the top of ``folder`` (``site.key``, ``ledger.jsonl``), verified; None if
    absent."""
    if not (folder / LEDGER_FILE).exists():
        return None
    _bounded_text(folder / LEDGER_FILE, MAX_LEDGER_BYTES, "the PubSub-ML ledger")
    if not (folder / KEY_FILE).is_file():
        raise ConfigError(
            f"{folder / LEDGER_FILE}: a PubSub-ML ledger without its key ({KEY_FILE}) cannot be "
            "verified: refused"
        )
    _bounded_text(folder / KEY_FILE, MAX_KEY_BYTES, "the ledger key")
    try:
        return Ledger(folder)
    except LedgerTampered as e:
        raise ConfigError(f"cannot convert {folder}: its PubSub-ML ledger does not verify ({e})") from None


def _old_sign_key(folder: Path):
    """PubSub-ML's Ed25519 signing key (``sign.key``, 32 bytes in hex), or None."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = folder / "sign.key"
    if not path.exists():
        return None
    try:
        return Ed25519PrivateKey.from_private_bytes(
            bytes.fromhex(_bounded_text(path, MAX_KEY_BYTES, "sign.key").strip())
        )
    except ValueError:
        raise ConfigError(f"{path}: not an Ed25519 signing key: refused") from None


_ENVELOPE = ("format", "seq", "prev", "mac", "time")


def _carry(new: Ledger, old: Ledger, same_key: bool, origin: str) -> int:
    """Append ``old``'s spending entries to ``new`` (each with where it came from); returns how many. Releases
    keep their record digests when both ledgers share the key; otherwise (``"*:<digest>"``) the most any old
    record spent counts for every record."""
    remap: dict[int, int] = {}
    n = 0
    for e in old.entries:
        kind = e.get("kind")
        if kind not in ("release", "cancel", "dp-sgd", "restore", "client-level"):
            continue
        _check_entry(e, origin)
        body = {k: v for k, v in e.items() if k not in _ENVELOPE and k != "kind"}
        if kind == "release" and not same_key:  # another key: counted for every record of this ledger
            body["records"] = [f"*:{r}" for r in e["records"]]
        if kind == "cancel":
            if e.get("release") not in remap:
                continue
            body["release"] = remap[e["release"]]
        body["migrated"] = {"from": origin, "seq": e.get("seq"), "time": e.get("time")}
        got = new.append(str(kind), **body)
        if kind == "release":
            remap[int(e["seq"])] = got["seq"]
        n += 1
    return n


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _check_entry(e: dict, origin: str) -> None:
    """ConfigError unless a spending entry of an old ledger has the fields that make it count (a MAC proves
    who wrote it, not that it is well formed)."""
    kind, ok = e["kind"], True
    if kind == "release":
        recs = e.get("records")
        ok = (
            _number(e.get("epsilon"))
            and _number(e.get("delta"))
            and isinstance(recs, list)
            and all(isinstance(r, str) and len(r) <= 64 for r in recs)
        )
    elif kind == "cancel":
        ok = isinstance(e.get("release"), int) and not isinstance(e.get("release"), bool)
    elif kind == "dp-sgd":
        ok = (
            _number(e.get("noise_multiplier"))
            and _number(e.get("sample_rate"))
            and isinstance(e.get("steps"), int)
            and not isinstance(e.get("steps"), bool)
        )
    elif kind == "restore":
        ok = _number(e.get("epsilon")) and _number(e.get("delta")) and isinstance(e.get("epoch"), int)
    if not ok:
        raise ConfigError(
            f"cannot convert the {origin}: its entry {e.get('seq')} ({kind}) is malformed: refused"
        )


def migrate(folder: Path) -> str | None:
    """Convert a site folder of an earlier format to ``silofl.site/2`` in place (see the module doc); what was
    done, or None if it is already current. ConfigError (one line; the folder as it was) if it cannot be
    converted."""
    folder = Path(folder)
    d = read_site_json(folder)
    fmt = d.get("format", DEPLOY_V1)
    if fmt == FORMAT:
        return None
    where = str(folder / SITE_FILE)
    if fmt == PUBSUB_V1:
        return _migrate_pubsub(folder, d, where)
    if fmt == DEPLOY_V1 and not isinstance(fmt, bool):
        return _migrate_deploy(folder, d, where)
    raise ConfigError(
        f"{where}: unknown site folder format {str(fmt)[:40]!r} (this silofl reads {FORMAT!r}, "
        f"{PUBSUB_V1!r} and {DEPLOY_V1})"
    )


def _stage(folder: Path) -> Path:
    stage = folder / ".migrating"
    if stage.exists():  # a conversion that stopped before its commit: nothing of it was moved into place
        shutil.rmtree(stage)
    stage.mkdir()
    return stage


def _commit(
    folder: Path, stage: Path, d_old: dict, cfg: SiteConfig, moves: list[str], old_files: list[str]
) -> None:
    """Move the staged ``moves`` into place, back up the old site.json, write the new one (the commit point),
    then keep the old top-level files under ``*.v1.bak`` names."""
    for name in moves:
        (stage / name).replace(folder / name)
    _write_atomic(folder / BACKUP, json.dumps(d_old, indent=1) + "\n")
    _write_atomic(folder / SITE_FILE, json.dumps(cfg.to_dict(), indent=1) + "\n")
    for name in old_files:
        if (folder / name).exists():
            (folder / name).replace(folder / f"{name}.v1.bak")
    shutil.rmtree(stage, ignore_errors=True)


def _migrate_pubsub(folder: Path, d: dict, where: str) -> str:
    name = d.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: 'name' must be a site name")
    check_site_name(name)
    life = d.get("lifetime")
    if life is None:
        raise ConfigError(
            f"{where}: site {name!r} has no lifetime privacy budget to carry over: declare it once with "
            "--lifetime-epsilon E [--lifetime-delta D]"
        )
    if not (
        isinstance(life, list)
        and len(life) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in life)
    ):
        raise ConfigError(f"{where}: 'lifetime' must be [ε, δ]")
    cfg = SiteConfig.from_dict(
        {"name": name, "data": None, "lifetime_epsilon": float(life[0]), "lifetime_delta": float(life[1])},
        where,
    )
    for sub in (KEYS_DIR, LEDGER_DIR):
        if (folder / sub).exists():
            raise ConfigError(
                f"cannot convert {folder}: it holds PubSub-ML's site.json and a {sub}/ folder; set one "
                "aside and open it again"
            )
    old = _old_pubsub_ledger(folder)
    sign = _old_sign_key(folder)
    stage = _stage(folder)
    try:
        card = make_site_keys(stage / KEYS_DIR, name, sign)
        (stage / LEDGER_DIR).mkdir()
        if old is not None:  # the same key: the record digests of its releases stay valid
            shutil.copy2(folder / KEY_FILE, stage / LEDGER_DIR / KEY_FILE)
        led = Ledger(stage / LEDGER_DIR)
        start_site_ledger(
            led,
            name,
            card["sign"],
            (cfg.lifetime_epsilon, cfg.lifetime_delta),
            f"the lifetime budget of {PUBSUB_V1} site.json (migrated)",
        )
        n = _carry(led, old, True, f"{PUBSUB_V1} ledger.jsonl") if old is not None else 0
        led.append(
            "migrate",
            source=PUBSUB_V1,
            entries=n,
            old_head=old.head.to_dict() if old is not None else None,
            kept_sign_key=sign is not None,
        )
        _commit(folder, stage, d, cfg, [KEYS_DIR, LEDGER_DIR], [LEDGER_FILE, KEY_FILE, "sign.key"])
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return f"converted from {PUBSUB_V1}: {n} ledger entries carried over"


def _migrate_deploy(folder: Path, d: dict, where: str) -> str:
    cfg = SiteConfig.from_dict(d, where)
    old = _old_pubsub_ledger(folder)  # a folder holding both: PubSub-ML's ledger beside deployment's
    if old is None:
        _write_atomic(folder / BACKUP, json.dumps(d, indent=1) + "\n")
        _write_atomic(folder / SITE_FILE, json.dumps(cfg.to_dict(), indent=1) + "\n")
        return f"converted from deployment format {DEPLOY_V1}"
    if not (folder / LEDGER_DIR / LEDGER_FILE).is_file():
        raise ConfigError(
            f"cannot convert {folder}: it holds PubSub-ML's ledger but deployment's {LEDGER_DIR}/ has "
            "no ledger to join it to"
        )
    _bounded_text(folder / LEDGER_DIR / LEDGER_FILE, MAX_LEDGER_BYTES, "the ledger")
    stage = _stage(folder)
    # deployment's chain is kept (its coordinator holds its head); PubSub-ML's spend is appended to a copy
    try:
        shutil.copytree(folder / LEDGER_DIR, stage / LEDGER_DIR)
        try:
            led = Ledger(stage / LEDGER_DIR)
        except LedgerTampered as e:
            raise ConfigError(f"cannot convert {folder}: its ledger does not verify ({e})") from None
        n = _carry(led, old, False, f"{PUBSUB_V1} ledger.jsonl")
        led.append(
            "migrate",
            source=f"{DEPLOY_V1} + {PUBSUB_V1}",
            entries=n,
            old_head=old.head.to_dict(),
            kept_sign_key=False,
        )
        # the staged ledger replaces the live one in one rename (the old one kept beside it)
        (folder / LEDGER_DIR).replace(stage / "ledger.v1.bak")
        (stage / LEDGER_DIR).replace(folder / LEDGER_DIR)
        (stage / "ledger.v1.bak").replace(folder / "ledger.v1.bak")
        _commit(folder, stage, d, cfg, [], [LEDGER_FILE, KEY_FILE, "sign.key"])
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return f"converted from deployment format {DEPLOY_V1} with PubSub-ML's ledger: {n} entries carried over"


# ---------------------------------------------------------------------------------------------- replay state
class SiteState:
    """What a site remembers of its runs, in ``state/`` of its folder (so a re-setup or a restarted worker
    cannot reset it): every run id it joined, with the furthest round it reached and the sealed payloads it
    opened (its replay guard), and the last ledger head it announced."""

    guard_type: Callable[[], Any] | None = None  # the replay guard's class (deployment's)

    def __init__(self, folder: Path):
        self.dir = folder / STATE_DIR
        self.runs_path, self.head_path = self.dir / "runs.json", self.dir / "head.json"
        self.runs: dict[str, dict] = self._read(self.runs_path, {})
        self.head: dict | None = self._read(self.head_path, None)

    @staticmethod
    def _read(path: Path, default: Any) -> Any:
        if not path.is_file():
            return default
        try:
            return json.loads(path.read_text())
        except ValueError:
            raise ConfigError(
                f"{path} is damaged (not JSON): the site's replay state cannot be trusted; restore it "
                "from a backup"
            ) from None

    @staticmethod
    def _write(path: Path, obj: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(obj))

    def save_run(self, run_id: str, rnd: int | None, guard: Any) -> None:
        """Keep run ``run_id``'s furthest round and replay guard (``guard.seen``)."""
        self.runs[run_id] = {"round": rnd, "seen": sorted([list(k) for k in guard.seen], key=str)}
        self._write(self.runs_path, self.runs)

    def seen_of(self, run_id: str) -> set[tuple]:
        """Run ``run_id``'s replay guard contents as they were last kept."""
        return {tuple(k) for k in self.runs.get(run_id, {}).get("seen", [])}

    def save_head(self, head: dict) -> None:
        """Keep the last ledger head the site announced."""
        self.head = head
        self._write(self.head_path, head)


# ---------------------------------------------------------------------------------------------- the folder
class SiteFolder:
    """A site's folder (see the module doc)."""

    def __init__(self, path: str | Path, config: SiteConfig):
        self.path, self.config = Path(path), config
        self._ledger: Ledger | None = None

    @property
    def name(self) -> str:
        """The site's name."""
        return self.config.name

    # -------------------------------------------------------------- making and opening
    @classmethod
    def create(cls, path: str | Path, config: SiteConfig, policy: Any = None) -> SiteFolder:
        """A new site folder: keys, ``site.json``, a ledger naming the site with its lifetime budget and its
        signed privacy policy (``policy``, a :class:`silofl.site.policy.SitePolicy`; default: the safe one,
        with ``config``'s older allow_*/secagg_* fields). Refuses a folder that already holds a site (keys
        and ledgers are never overwritten)."""
        p = Path(path)
        check_site_name(config.name)
        if (p / SITE_FILE).exists():
            raise ConfigError(
                f"{p} already holds a site (site.json): a site's keys and ledger are never overwritten"
            )
        for sub in (KEYS_DIR, LEDGER_DIR):
            if (p / sub).exists() and any((p / sub).iterdir()):
                raise ConfigError(f"{p / sub} exists: a site's keys and ledger are never overwritten")
        p.mkdir(parents=True, exist_ok=True)
        card = make_site_keys(p / KEYS_DIR, config.name)
        start_site_ledger(
            Ledger(p / LEDGER_DIR),
            config.name,
            card["sign"],
            (config.lifetime_epsilon, config.lifetime_delta),
            "site init",
        )
        _write_atomic(
            p / SITE_FILE, json.dumps(config.to_dict(), indent=1) + "\n"
        )  # then the policy: a folder without one gets it from site.json when opened (load_policy)
        from silofl.site.policy import SitePolicy, save_policy

        folder = cls(p, config)
        save_policy(folder, policy if policy is not None else SitePolicy.from_site_json(config.to_dict()))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> SiteFolder:
        """An existing site folder (converted first if it is of an earlier format)."""
        p = Path(path)
        return cls(p, SiteConfig.load(p))

    @classmethod
    def open(
        cls, path: str | Path | None, name: str, lifetime: tuple[float, float] | None = None
    ) -> SiteFolder:
        """Site ``name``'s folder at ``path`` (default: :func:`default_site_dir`), made on first use with the
        lifetime budget (ε, δ) given (PubSub-ML's way in: a site that only publishes needs no data). A budget
        other than the ledger's is refused: it changes only by ``silofl site budget``."""
        check_site_name(name)
        p = Path(path) if path is not None else default_site_dir(name)
        if lifetime is not None:
            eps, dlt = lifetime
            if not (math.isfinite(eps) and eps > 0 and 0 <= dlt < 1):
                raise ConfigError(f"a lifetime budget needs 0 < ε < ∞ and 0 ≤ δ < 1, got ε={eps}, δ={dlt}")
        if not (p / SITE_FILE).exists():
            if lifetime is None:
                raise ConfigError(
                    f"site {name!r} has no lifetime privacy budget: declare it once with "
                    "--lifetime-epsilon E [--lifetime-delta D]"
                )
            return cls.create(
                p,
                SiteConfig(
                    name=name,
                    data=None,
                    lifetime_epsilon=float(lifetime[0]),
                    lifetime_delta=float(lifetime[1]),
                ),
            )
        folder = cls.load(p)
        if folder.name != name:
            raise ConfigError(f"{p} is the folder of site {folder.name!r}, not {name!r}")
        have = folder.lifetime
        if lifetime is not None and (float(lifetime[0]), float(lifetime[1])) != have:
            raise ConfigError(
                f"site {name!r} has the lifetime budget ε={have[0]:g}, δ={have[1]:g}; it is set once, "
                "when its folder is made, and changes only by a ledger entry (`silofl site budget`)"
            )
        return folder

    # -------------------------------------------------------------- identity
    @property
    def card(self) -> dict:
        """The site's public card (``keys/public.json``)."""
        try:
            c = json.loads(
                _bounded_text(self.path / KEYS_DIR / "public.json", MAX_KEY_BYTES, "the public card")
            )
        except ValueError:
            raise ConfigError(f"{self.path / KEYS_DIR / 'public.json'}: not a public card") from None
        if not isinstance(c, dict) or not isinstance(c.get("sign"), str):
            raise ConfigError(f"{self.path / KEYS_DIR / 'public.json'}: not a public card")
        return c

    @property
    def key_id(self) -> str:
        """The site's public signing key (hex): its identity in its ledger, at the broker and in a
        federation."""
        return self.card["sign"]

    def signing_key(self):
        """The site's Ed25519 signing key (``keys/sign.key``)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        try:
            key = load_private(self.path / KEYS_DIR / "sign.key")
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(
                f"{self.path / KEYS_DIR / 'sign.key'}: not the site's signing key ({e})"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{self.path / KEYS_DIR / 'sign.key'}: not an Ed25519 key")
        return key

    @property
    def policy(self) -> Any:
        """The site's own privacy policy (:func:`silofl.site.policy.load_policy`: ``policy.json`` verified
        against its key and schema, written from ``site.json`` for a folder made before policies)."""
        from silofl.site.policy import load_policy

        return load_policy(self)

    @property
    def state(self) -> SiteState:
        """Run ids, furthest rounds, replay guards and the last announced head (``state/``)."""
        return SiteState(self.path)

    # -------------------------------------------------------------- the one ledger and the one budget
    @property
    def ledger_dir(self) -> Path:
        """``ledger/``: the one ledger of every protocol."""
        return self.path / LEDGER_DIR

    @property
    def ledger(self) -> Ledger:
        """The site's ledger (opened, verified and checked to be this site's on first use)."""
        if self._ledger is None:
            led = Ledger(self.ledger_dir)
            require_identity(led, self.name, self.key_id)
            self._ledger = led
        return self._ledger

    def announced_head(self) -> dict:
        """The head of this site's ledger as it announces it (epoch, entries, last MAC): what a broker or
        coordinator keeps for it with :class:`silofl.privacy.ledger.HeadStore` and compares with
        :func:`silofl.privacy.ledger.head_order`."""
        return announced_head(self.ledger)

    @property
    def lifetime(self) -> tuple[float, float]:
        """The lifetime budget (ε, δ) the ledger's last budget entry sets (the budget of record)."""
        life = lifetime_of(self.ledger)
        if life is None:
            raise LedgerTampered(f"{self.ledger.path} sets no lifetime budget")
        return life

    def require_lifetime(self) -> tuple[float, float]:
        """The lifetime budget (every folder of this format has one)."""
        return self.lifetime

    def set_lifetime(self, epsilon: float, delta: float, why: str) -> dict:
        """Change the lifetime budget: a ledger entry (old → new, when, why); ``site.json`` follows."""
        entry = change_lifetime(self.ledger, epsilon, delta, why)
        d = read_site_json(self.path)
        d.update(lifetime_epsilon=float(epsilon), lifetime_delta=float(delta))
        _write_atomic(self.path / SITE_FILE, json.dumps(d, indent=1) + "\n")
        self.config.lifetime_epsilon, self.config.lifetime_delta = float(epsilon), float(delta)
        return entry

    def outside_training(self) -> dict[str, tuple[float, float]]:
        """What the site spent outside DP-SGD training, by source: the prior spend its restores declare, and
        the largest spend of any record over its releases (PubSub-ML models and stream chunks)."""
        return {"restored": restored_spend(self.ledger), "released": self.ledger.spent()}

    def training_budget(self) -> tuple[float, float]:
        """The (ε, δ) the RDP-composed mechanisms (DP-SGD and secure rounds of every run) may use together:
        the lifetime budget less what restores and releases spent (the site accountant composes them:
        ε_RDP(δ left) + the rest ≤ the lifetime ε)."""
        life = self.lifetime
        parts = self.outside_training().values()
        return life[0] - sum(p[0] for p in parts), life[1] - sum(p[1] for p in parts)

    def budget_note(self) -> str:
        """One line: the lifetime budget and what restores and releases took from it."""
        life, out = self.lifetime, self.outside_training()
        left = self.training_budget()
        took = "; ".join(f"{k} ε {v[0]:.4g}" for k, v in out.items() if v[0] > 0) or "nothing yet"
        return (
            f"site {self.name}'s lifetime ε {life[0]:g} (δ {life[1]:g}) leaves ε {left[0]:.4g} for training "
            f"after {took}"
        )

    def trained_epsilon(self, delta: float) -> float:
        """ε at ``delta`` of every DP-SGD round the ledger records (every run, every protocol), by the RDP
        accountant."""
        from silofl.privacy.accountant import Accountant

        hist = self.ledger.history()
        if not hist:
            return 0.0
        acc = Accountant("rdp")
        acc.replay(hist)
        return acc.epsilon(delta)

    def accountant(self, colluders: int = 0):
        """The site's one accountant over its ledger
        (:class:`silofl.privacy.site_accountant.SiteAccountant`; ``colluders``: the c its policy assumes)."""
        from silofl.privacy.site_accountant import SiteAccountant

        return SiteAccountant(self.ledger, colluders=colluders)

    def require_release(
        self, record_ids, epsilon: float, delta: float
    ) -> tuple[set[str], tuple[float, float]]:
        """(the keyed digests of ``record_ids``, what they have spent so far), after checking that releasing
        them at (ε, δ) stays within the lifetime budget (BudgetExhausted if not). What they spent is the site
        accountant's: restores, every release containing them, and every mechanism composed in RDP (DP-SGD
        rounds and secure rounds of every run) at the δ the budget leaves them."""
        from silofl.core.errors import BudgetExhausted
        from silofl.privacy.site_accountant import planned_release

        life = self.lifetime
        digests = {self.ledger.record_digest(i) for i in record_ids}
        books = self.accountant()
        before = books.spent(max(life[1] - delta, 1e-300), "colluders", records=digests)
        if not books.allows([planned_release(digests, epsilon, delta)], life, records=digests):
            raise BudgetExhausted(
                f"releasing these records at ε={epsilon:g}, δ={delta:g} would take some past the site's "
                f"lifetime budget ε={life[0]:g}, δ={life[1]:g}: they have spent up to ε={before[0]:.4g}, "
                f"δ={before[1]:.3g} already (every mechanism of site {self.name}'s ledger composed)"
            )
        return digests, before

    def release(
        self,
        record_ids,
        epsilon: float,
        delta: float,
        make: Callable[[], Any],
        send: Callable[[Any], Any],
        seal: Callable[[bytes, dict], bytes] | None = None,
        **fields: Any,
    ) -> tuple[Any, Any]:
        """Release something computed from ``record_ids`` within the lifetime budget: check the budget for the
        (ε, δ) asked for, ``make()`` the artifact (it has ``.epsilon``, ``.delta`` and ``to_bytes()``), record
        the release at the artifact's actual (ε, δ) with its checksum, then ``send(bytes)``. A send refused
        before anything left (a :class:`~silofl.core.errors.SiloflError`, e.g. the broker rejecting the model)
        cancels the record and re-raises; any other failure keeps it counted (the artifact may have left).
        With ``seal``, the bytes sent are ``seal(bytes, receipt)``: the receipt declares the spend of the
        released records including this release (``epsilon_spent``, ``delta_spent``), the lifetime budget and
        the ledger entry (``ledger_seq``) that records it, for the publisher to sign
        (:func:`silofl.pubsub.signing.sign_model`). Returns (artifact, what ``send`` returned)."""
        digests, before = self.require_release(record_ids, epsilon, delta)
        artifact = make()
        data = artifact.to_bytes()
        eps, dlt = float(artifact.epsilon), float(artifact.delta)
        if eps > epsilon * (1 + 1e-9) or dlt > delta * (1 + 1e-9):
            raise RuntimeError(
                f"the mechanism spent ε={eps}, δ={dlt}, above the (ε={epsilon}, δ={delta}) it was asked for"
            )
        if seal is not None:
            life = self.lifetime
            data = seal(
                data,
                {
                    "site": self.name,
                    "epsilon_spent": before[0] + eps,
                    "delta_spent": before[1] + dlt,
                    "lifetime": [life[0], life[1]],
                    "ledger_seq": len(self.ledger.entries),
                    "ledger_head": self.ledger.head.to_dict(),
                },
            )  # signed: the broker keeps the latest
        entry = self.ledger.record_release(
            digests,
            eps,
            dlt,
            checksum=hashlib.sha256(data).hexdigest(),
            unit="record",
            **_mechanism_of(artifact),
            **fields,
        )
        try:
            out = send(data)
        except SiloflError as e:
            if not getattr(
                e, "may_have_left", False
            ):  # e.g. a connection lost after the upload: keep it counted
                self.ledger.cancel_release(entry, f"{type(e).__name__}: {e}")
            raise
        return artifact, out


def _mechanism_of(artifact: Any) -> dict:
    """``{"mechanism": ...}``: what a released artifact says its mechanism was (plain JSON), for an auditor
    recomputing the ledger; nothing when it says nothing JSON can hold."""
    from silofl.privacy.ledger import canonical_json

    mech = getattr(artifact, "mechanism", None)
    try:
        canonical_json(mech)
    except (TypeError, ValueError):
        return {}
    return {"mechanism": mech} if isinstance(mech, dict) else {}


def attach(site: Any, folder: SiteFolder, run_label: str = "run", release_nonprivate: bool = True) -> Any:
    """Make ``site`` (a simulated site, :func:`silofl.runner.loop.make_site`) keep its spend in ``folder``'s
    one ledger: its accountant replays every DP-SGD round the ledger holds (every run, every protocol) and its
    budget is capped at what the lifetime leaves for training after restores and PubSub-ML releases. Returns
    ``site``."""
    from silofl.core.errors import BudgetExhausted

    left = folder.training_budget()
    folder.ledger  # noqa: B018 - verified and checked to be this site's before anything is charged to it
    settings = getattr(site, "settings", None)
    if settings is not None and getattr(settings, "private", False) and settings.delta > left[1]:
        raise BudgetExhausted(
            f"site {folder.name} refuses the run: its δ {settings.delta:g} exceeds what its lifetime "
            f"budget leaves, δ {left[1]:g} ({folder.budget_note()})"
        )
    site.open_folder(folder.ledger_dir, run_label=run_label, release_nonprivate=release_nonprivate)
    if site.ledger is not None:
        folder._ledger = (
            site.ledger
        )  # one Ledger object for the file: appends from either side chain on each other
    budget = getattr(site, "budget", None)
    if budget is not None:
        if left[0] <= 0 or not folder.accountant().allows([]):
            raise BudgetExhausted(f"site {folder.name} has no budget left to train: {folder.budget_note()}")
        target = budget.target_epsilon
        budget.target_epsilon = min(target if target is not None else math.inf, left[0])
        unit = site.privacy_unit if getattr(site, "persons", None) is not None else "row"
        budget.lifetime = folder.accountant().dpsgd_guard(unit)  # every mechanism of the ledger, each step
    return site


def with_site_folders(
    folders: dict[int, SiteFolder], run_label: str = "run"
) -> Callable[[Any, int], tuple[Any, int]]:
    """A ``sites`` hook for :class:`silofl.runner.loop.RunHooks`: simulated site ``k`` charges
    ``folders[k]``'s ledger (:func:`attach`) — the same ledger and budget its PubSub-ML releases and deployed
    runs use. The run's plan is checked against each folder's policy before any site is built (the hook's
    ``folders``: :func:`silofl.runner.plan.check_site_policies`)."""

    def hook(make: Callable[[int], Any], n: int) -> tuple[Callable[[int], Any], int]:
        def made(k: int) -> Any:
            site = make(k)
            return attach(site, folders[k], run_label) if k in folders else site

        return made, n

    hook.folders = folders  # type: ignore[attr-defined]
    return hook
