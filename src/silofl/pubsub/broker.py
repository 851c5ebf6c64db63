"""The PubSub-ML broker: a directory with an SQLite file and the published model files.

It holds sites, their feature metadata with public defaults (mean for continuous features, mode
for categorical ones: published statistics, never raw data), channels and published models. No raw
data and no private model ever enter it. Every model is validated on publish (format, schema,
shapes against its feature list, finite values, finite outputs on probe inputs, size, input
bounds equal to the public bounds its publisher declared) and again on fetch (checksum and the same
checks); a rejected model leaves the broker exactly as it was: the file is written under a
temporary name and only renamed inside the database transaction that records it.

Signed models (:mod:`silofl.pubsub.signing`): a publisher registered with an Ed25519 key (table
``publishers``, with its declared lifetime budget) has every model checked against that key, and against its
release receipt: the spend its ledger declares must be present, at least the model's own (ε, δ), within the
site's declared lifetime budget, and recorded by a later ledger entry than the site's previous model (a ledger
that went back is refused). ``require_signed`` (the network service, :mod:`silofl.pubsub.service`) refuses
unsigned models and publishers without a registered key; a folder broker (one machine, every party can write
the folder anyway) registers a signing publisher's key on its first model (trust on first use) and accepts
unsigned research models.

A channel ``F1 ∨ … ∨ Fk`` (each Fi a set of feature names) streams every model whose feature set
contains all of some Fi. Sites join and leave at any time; a site that leaves takes its models,
features and channels with it.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from silofl.core.errors import ConfigError, ModelRejected
from silofl.pubsub.model import MAX_BYTES, PublishedModel, checksum

SCHEMA = """
CREATE TABLE IF NOT EXISTS sites (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS features (
    site TEXT NOT NULL REFERENCES sites(name) ON DELETE CASCADE, name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('continuous', 'categorical')), public_default TEXT NOT NULL,
    lo REAL, hi REAL, PRIMARY KEY (site, name));
CREATE TABLE IF NOT EXISTS channels (
    id INTEGER PRIMARY KEY AUTOINCREMENT, subscriber TEXT NOT NULL REFERENCES sites(name) ON DELETE CASCADE,
    spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    id INTEGER PRIMARY KEY AUTOINCREMENT, publisher TEXT NOT NULL REFERENCES sites(name) ON DELETE CASCADE,
    kind TEXT NOT NULL, task TEXT NOT NULL, features TEXT NOT NULL, classes TEXT, epsilon REAL NOT NULL,
    delta REAL NOT NULL, chunk INTEGER, created_at TEXT NOT NULL, checksum TEXT NOT NULL,
    size INTEGER NOT NULL,
    file TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS publishers (
    site TEXT PRIMARY KEY, public_key TEXT NOT NULL, lifetime_epsilon REAL NOT NULL,
    lifetime_delta REAL NOT NULL, epsilon_spent REAL NOT NULL DEFAULT 0, delta_spent REAL NOT NULL DEFAULT 0,
    ledger_seq INTEGER NOT NULL DEFAULT -1,
    registered_at TEXT NOT NULL);
"""
DB_FILE = "broker.sqlite"
MODEL_COLUMNS = (("epsilon_spent", "REAL"), ("delta_spent", "REAL"), ("signed", "INTEGER NOT NULL DEFAULT 0"))
PUBLISHER_COLUMNS = (
    ("ledger_head", "TEXT"),
)  # the last signed ledger head ({"entries", "mac"}) a site presented


@dataclass(frozen=True)
class Channel:
    id: int
    subscriber: str
    clauses: tuple[frozenset[str], ...]

    def matches(self, features: list[str]) -> bool:
        """Whether a model with these features is delivered by the channel."""
        have = set(features)
        return any(clause <= have for clause in self.clauses)


class Broker:
    """A broker in a directory (see the module doc)."""

    def __init__(
        self, path: str | Path, max_bytes: int = MAX_BYTES, require_signed: bool = False, wal: bool = False
    ):
        self.path = Path(path)
        self.models_dir = self.path / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.db_path = self.path / DB_FILE
        self.max_bytes = max_bytes
        self.require_signed = require_signed
        with closing(self._connect()) as db, db:
            if wal:  # readers never block the writer (the network service); WAL needs a local file system
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            have = {r[1] for r in db.execute("PRAGMA table_info(models)")}
            for col, decl in MODEL_COLUMNS:  # brokers made before signed models
                if col not in have:
                    db.execute(f"ALTER TABLE models ADD COLUMN {col} {decl}")
            have = {r[1] for r in db.execute("PRAGMA table_info(publishers)")}
            for col, decl in PUBLISHER_COLUMNS:  # brokers made before ledger heads were kept
                if col not in have:
                    db.execute(f"ALTER TABLE publishers ADD COLUMN {col} {decl}")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30)
        db.execute("PRAGMA foreign_keys = ON")
        return db

    # ------------------------------------------------------------------ publishers' keys and budgets
    def register_publisher(self, site: str, public_key: str, lifetime: tuple[float, float]) -> None:
        """Record a site's Ed25519 public key (hex) and declared lifetime budget; once per site (ConfigError
        if it is registered already)."""
        from silofl.privacy.ledger import check_site_name
        from silofl.pubsub.signing import parse_public_key

        check_site_name(site)
        try:
            parse_public_key(public_key)
        except ModelRejected as e:
            raise ConfigError(str(e)) from None
        eps, dlt = (
            check_number(v, w) for v, w in zip(lifetime, ("lifetime_epsilon", "lifetime_delta"), strict=True)
        )
        if not (math.isfinite(eps) and eps > 0 and 0 <= dlt < 1):
            raise ConfigError(f"a lifetime budget needs 0 < ε < ∞ and 0 ≤ δ < 1, got ε={eps}, δ={dlt}")
        with closing(self._connect()) as db, db:
            try:
                db.execute(
                    "INSERT INTO publishers (site, public_key, lifetime_epsilon, lifetime_delta, "
                    "registered_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (site, public_key, eps, dlt, datetime.now(UTC).isoformat(timespec="seconds")),
                )
            except sqlite3.IntegrityError:
                raise ConfigError(f"site {site!r} is registered already (a site registers once)") from None

    def publisher(self, site: str) -> dict | None:
        """A registered publisher: public key, lifetime budget, the largest spend its models declared."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT site, public_key, lifetime_epsilon, lifetime_delta, epsilon_spent, delta_spent, "
                "ledger_seq, ledger_head FROM publishers WHERE site = ?",
                (site,),
            ).fetchone()
        return None if row is None else _publisher(row)

    def publishers(self) -> list[dict]:
        """Every registered publisher (see :meth:`publisher`), by name."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT site, public_key, lifetime_epsilon, lifetime_delta, epsilon_spent, delta_spent, "
                "ledger_seq, ledger_head FROM publishers ORDER BY site"
            ).fetchall()
        return [_publisher(r) for r in rows]

    def _check_signed(self, data: bytes, model: PublishedModel) -> dict | None:
        """The verified release receipt of a model (None for an unsigned model a folder broker accepts)."""
        from silofl.pubsub.signing import check_receipt, release_of, verify_model

        rel = release_of(data)
        pub = self.publisher(model.publisher)
        if rel is None:
            if self.require_signed or pub is not None:
                raise ModelRejected(f"the model is not signed by {model.publisher!r} (no release receipt)")
            return None
        if pub is None:
            if self.require_signed:
                raise ModelRejected(f"publisher {model.publisher!r} has no registered signing key")
            lifetime = rel.get("lifetime")
            if not (isinstance(lifetime, list) and len(lifetime) == 2):
                raise ModelRejected("the release receipt declares no lifetime budget")
            # the folder broker trusts a new site's first key: verified just below, like any registered key
            pub = {
                "public_key": str(rel["public_key"]),
                "lifetime": (float(lifetime[0]), float(lifetime[1])),
                "ledger_seq": -1,
                "new": True,
            }
        rel = verify_model(data, pub["public_key"])
        rel["spend"] = check_receipt(
            rel, model.publisher, float(model.epsilon), float(model.delta), pub["lifetime"]
        )
        seq = rel.get("ledger_seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= pub["ledger_seq"]:
            raise ModelRejected(
                f"the model's ledger entry {seq!r} is not after {model.publisher!r}'s previous one "
                f"({pub['ledger_seq']}): a replayed model or a rolled-back ledger"
            )
        rel["_ledger_head"] = check_ledger_head(
            rel.get("ledger_head"), seq, pub.get("ledger_head"), model.publisher
        )
        rel["_new_publisher"] = pub.get("new", False)
        rel["_lifetime"] = pub["lifetime"]
        return rel

    # ------------------------------------------------------------------ sites and features
    def join(self, site: str, features: dict[str, tuple] | None = None) -> None:
        """Register a site (idempotent) and its features: ``{name: (continuous|categorical, public default)}``
        or ``(kind, default, lo, hi)`` with public bounds (DP models clip and scale inputs by them)."""
        if not isinstance(site, str) or not site.strip():
            raise ConfigError("a site needs a non-empty name")
        features = {} if features is None else features
        if not isinstance(features, dict):
            raise ConfigError(
                f"features must be a mapping of feature names to (kind, public default[, lo, hi]), got "
                f"{type(features).__name__}"
            )
        if len(features) > MAX_FEATURES:
            raise ConfigError(f"at most {MAX_FEATURES} features, got {len(features)}")
        rows = []
        for name, spec in features.items():
            check_feature_name(name)
            if not isinstance(spec, (list, tuple)) or len(spec) not in (2, 4):
                raise ConfigError(
                    f"feature {name!r}: give (kind, public default[, lo, hi]), got {spec!r}"[:300]
                )
            kind, default, *bounds = spec
            lo, hi = bounds if bounds else (None, None)
            if bounds and not all(_finite_number(b) for b in bounds):
                raise ConfigError(
                    f"feature {name!r}: public bounds are two finite numbers, got {lo!r}, {hi!r}"[:300]
                )
            if lo is not None and not (float(lo) <= float(hi)):
                raise ConfigError(f"feature {name!r}: public bounds need lo ≤ hi, got {lo}, {hi}")
            if kind == "continuous" and not _finite_number(default):
                raise ConfigError(
                    f"feature {name!r}: a continuous feature's public default is a number (its mean), finite"
                )
            if kind == "categorical" and not (
                isinstance(default, (str, int, float)) and len(str(default)) <= 200
            ):
                raise ConfigError(
                    f"feature {name!r}: a categorical feature's public default is one level (a string or "
                    "number)"
                )
            if kind not in ("continuous", "categorical"):
                raise ConfigError(f"feature {name!r}: kind must be continuous or categorical, got {kind!r}")
            if kind == "continuous" and (isinstance(default, bool) or not isinstance(default, (int, float))):
                raise ConfigError(
                    f"feature {name!r}: a continuous feature's public default is a number (its mean)"
                )
            rows.append(
                (
                    site,
                    name,
                    kind,
                    json.dumps(default),
                    None if lo is None else float(lo),
                    None if hi is None else float(hi),
                )
            )
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR IGNORE INTO sites (name) VALUES (?)", (site,))
            db.executemany(
                "INSERT OR REPLACE INTO features (site, name, kind, public_default, lo, hi) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    def leave(self, site: str) -> int:
        """Remove a site with its features, channels and models; returns how many models went with it."""
        with closing(self._connect()) as db, db:
            files = [r[0] for r in db.execute("SELECT file FROM models WHERE publisher = ?", (site,))]
            if not db.execute("DELETE FROM sites WHERE name = ?", (site,)).rowcount:
                raise ConfigError(f"unknown site {site!r}")
        for f in files:
            (self.models_dir / f).unlink(missing_ok=True)
        return len(files)

    def sites(self) -> list[str]:
        """The names of the sites that joined, sorted."""
        with closing(self._connect()) as db:
            return [r[0] for r in db.execute("SELECT name FROM sites ORDER BY name")]

    def public_defaults(self) -> dict[str, object]:
        """Each known feature's public default (the first registering site's, by site name)."""
        out: dict[str, object] = {}
        with closing(self._connect()) as db:
            for name, default in db.execute("SELECT name, public_default FROM features ORDER BY site, name"):
                out.setdefault(name, json.loads(default))
        return out

    def public_bounds(self, site: str) -> dict[str, tuple[float, float]]:
        """A site's declared public bounds per feature (features declared without bounds are left out)."""
        with closing(self._connect()) as db:
            return {
                n: (lo, hi)
                for n, lo, hi in db.execute(
                    "SELECT name, lo, hi FROM features WHERE site = ? AND lo IS NOT NULL", (site,)
                )
            }

    def _features_of(self, db, site: str) -> set[str]:
        return {r[0] for r in db.execute("SELECT name FROM features WHERE site = ?", (site,))}

    # ------------------------------------------------------------------ models
    def publish(self, data: bytes) -> int:
        """Validate and store a published model (bytes of :meth:`PublishedModel.to_bytes`, signed with
        :func:`~silofl.pubsub.signing.sign_model`); its id. A signed model whose site has not joined yet joins
        it with the public feature metadata in its receipt, and only if the model is accepted."""
        model = PublishedModel.from_bytes(data, self.max_bytes)
        rel = self._check_signed(data, model)
        joined = False
        if rel is not None and "join" in rel and model.publisher not in self.sites():
            if not isinstance(rel["join"], dict):
                raise ModelRejected("the receipt's join metadata is not a mapping")
            self.join(model.publisher, rel["join"])
            joined = True
        try:
            return self._store(data, model, rel)
        except Exception:
            if joined:
                self.leave(model.publisher)
            raise

    def _store(self, data: bytes, model: PublishedModel, rel: dict | None) -> int:
        digest = checksum(data)
        spend = (None, None) if rel is None else rel["spend"]
        with closing(self._connect()) as db:
            if not db.execute("SELECT 1 FROM sites WHERE name = ?", (model.publisher,)).fetchone():
                raise ModelRejected(f"publisher {model.publisher!r} has not joined the broker")
            unknown = sorted(set(model.features) - self._features_of(db, model.publisher))
            if unknown:
                raise ModelRejected(f"features {unknown} are not registered by {model.publisher!r}")
            if (
                "input_lo" in model.tensors
            ):  # a model clips to the bounds its publisher declared public, no others
                declared = {
                    n: (lo, hi)
                    for n, lo, hi in db.execute(
                        "SELECT name, lo, hi FROM features WHERE site = ?", (model.publisher,)
                    )
                }
                for f, lo, hi in zip(
                    model.features,
                    model.tensors["input_lo"].tolist(),
                    model.tensors["input_hi"].tolist(),
                    strict=True,
                ):
                    if declared[f] != (lo, hi):
                        raise ModelRejected(
                            f"the model's input bounds for {f!r} ({lo:g}, {hi:g}) are not the public "
                            f"bounds {model.publisher!r} declared ({declared[f][0]}, {declared[f][1]})"
                        )
            fname = f"{digest}.safetensors"
            tmp = self.models_dir / f".{fname}.tmp"
            tmp.write_bytes(data)
            try:
                with db:
                    cur = db.execute(
                        "INSERT INTO models (publisher, kind, task, features, classes, epsilon, delta, "
                        "chunk, created_at, "
                        "checksum, size, file, epsilon_spent, delta_spent, signed) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            model.publisher,
                            model.kind,
                            model.task,
                            json.dumps(model.features),
                            json.dumps(model.classes),
                            model.epsilon,
                            model.delta,
                            model.chunk,
                            model.created_at,
                            digest,
                            len(data),
                            fname,
                            spend[0],
                            spend[1],
                            int(rel is not None),
                        ),
                    )
                    if rel is not None:
                        if rel["_new_publisher"]:
                            db.execute(
                                "INSERT INTO publishers (site, public_key, lifetime_epsilon, lifetime_delta, "
                                "registered_at) VALUES (?, ?, ?, ?, ?)",
                                (
                                    model.publisher,
                                    rel["public_key"],
                                    *rel["_lifetime"],
                                    datetime.now(UTC).isoformat(timespec="seconds"),
                                ),
                            )
                        db.execute(
                            "UPDATE publishers SET epsilon_spent = MAX(epsilon_spent, ?), "
                            "delta_spent = MAX(delta_spent, ?), ledger_seq = ?, ledger_head = ? WHERE site = "
                            "?",
                            (spend[0], spend[1], rel["ledger_seq"], rel["_ledger_head"], model.publisher),
                        )
                    os.replace(tmp, self.models_dir / fname)
                    return int(cur.lastrowid)
            except sqlite3.IntegrityError:
                raise ModelRejected("this exact model is already published") from None
            finally:
                tmp.unlink(missing_ok=True)

    def fetch_bytes(self, model_id: int) -> bytes:
        """The stored blob of a model after its checksum (content address) and, for a model stored signed, its
        publisher's signature were checked; ModelRejected if it was tampered with."""
        check_id(model_id)
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT m.file, m.checksum, m.signed, p.public_key FROM models m LEFT JOIN publishers p "
                "ON p.site = m.publisher WHERE m.id = ?",
                (model_id,),
            ).fetchone()
        if row is None:
            raise ModelRejected(f"no published model {model_id}")
        fname, digest, signed, key = row
        try:
            data = (self.models_dir / fname).read_bytes()
        except OSError as e:
            raise ModelRejected(f"model {model_id}'s file is missing: {e}") from None
        if checksum(data) != digest:
            raise ModelRejected(f"model {model_id} fails its checksum: the stored file was changed")
        if signed or key is not None:
            from silofl.pubsub.signing import verify_model

            verify_model(data, key or "")
        return data

    def fetch(self, model_id: int) -> PublishedModel:
        """The stored model, re-validated (checksum, signature, format, shapes); ModelRejected if it was
        tampered with."""
        return PublishedModel.from_bytes(self.fetch_bytes(model_id), self.max_bytes)

    def unpublish(self, model_id: int) -> None:
        """Withdraw a published model (its file goes too)."""
        check_id(model_id)
        with closing(self._connect()) as db, db:
            row = db.execute("SELECT file FROM models WHERE id = ?", (model_id,)).fetchone()
            if row is None:
                raise ConfigError(f"no published model {model_id}")
            db.execute("DELETE FROM models WHERE id = ?", (model_id,))
        (self.models_dir / row[0]).unlink(missing_ok=True)

    def model(self, model_id: int) -> dict | None:
        """One model's metadata row (see :meth:`models`), or None."""
        rows = self.models(model_id=model_id)
        return rows[0] if rows else None

    def models(self, publisher: str | None = None, model_id: int | None = None) -> list[dict]:
        """Metadata rows of the published models (no tensors), oldest first."""
        q = (
            "SELECT id, publisher, kind, task, features, classes, epsilon, delta, chunk, created_at, size, "
            "epsilon_spent, delta_spent, signed FROM models"
        )
        args: tuple = ()
        if publisher is not None:
            q, args = q + " WHERE publisher = ?", (publisher,)
        elif model_id is not None:
            q, args = q + " WHERE id = ?", (check_id(model_id),)
        with closing(self._connect()) as db:
            rows = db.execute(q + " ORDER BY id", args).fetchall()
        keys = (
            "id",
            "publisher",
            "kind",
            "task",
            "features",
            "classes",
            "epsilon",
            "delta",
            "chunk",
            "created_at",
            "size",
            "epsilon_spent",
            "delta_spent",
            "signed",
        )
        out = []
        for r in rows:
            d = dict(zip(keys, r, strict=True))
            d["features"], d["classes"] = json.loads(d["features"]), json.loads(d["classes"])
            d["signed"] = bool(d["signed"])
            out.append(d)
        return out

    # ------------------------------------------------------------------ channels
    def subscribe(self, subscriber: str, clauses: list[list[str]] | list[set[str]]) -> Channel:
        """Open a channel F1 ∨ … ∨ Fk; every feature must be known to the broker."""
        if not isinstance(clauses, (list, tuple)) or not all(
            isinstance(c, (list, tuple, set, frozenset)) for c in clauses
        ):
            raise ConfigError("a channel is a list of feature sets (lists of feature names)")
        if not clauses or any(not c for c in clauses):
            raise ConfigError("a channel needs at least one non-empty feature set")
        if len(clauses) > MAX_FEATURES or sum(len(c) for c in clauses) > MAX_FEATURES * 4:
            raise ConfigError(f"a channel has at most {MAX_FEATURES} feature sets")
        for c in clauses:
            for f in c:
                check_feature_name(f)
        sets = tuple(frozenset(c) for c in clauses)
        with closing(self._connect()) as db, db:
            if not db.execute("SELECT 1 FROM sites WHERE name = ?", (subscriber,)).fetchone():
                raise ConfigError(f"subscriber {subscriber!r} has not joined the broker")
            known = {r[0] for r in db.execute("SELECT DISTINCT name FROM features")}
            unknown = sorted(set().union(*sets) - known)
            if unknown:
                raise ConfigError(f"channel names unknown features {unknown}; known: {sorted(known)}")
            cur = db.execute(
                "INSERT INTO channels (subscriber, spec) VALUES (?, ?)",
                (subscriber, json.dumps([sorted(c) for c in sets])),
            )
            return Channel(int(cur.lastrowid), subscriber, sets)

    def channel(self, channel_id: int) -> Channel:
        """The channel with this id."""
        check_id(channel_id)
        with closing(self._connect()) as db:
            row = db.execute("SELECT subscriber, spec FROM channels WHERE id = ?", (channel_id,)).fetchone()
        if row is None:
            raise ConfigError(f"no channel {channel_id}")
        return _channel(channel_id, *row)

    def channels(self, subscriber: str) -> list[Channel]:
        """A subscriber's channels."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT id, spec FROM channels WHERE subscriber = ? ORDER BY id", (subscriber,)
            ).fetchall()
        return [_channel(i, subscriber, spec) for i, spec in rows]

    def unsubscribe(self, channel_id: int) -> None:
        """Close a channel."""
        check_id(channel_id)
        with closing(self._connect()) as db, db:
            if not db.execute("DELETE FROM channels WHERE id = ?", (channel_id,)).rowcount:
                raise ConfigError(f"no channel {channel_id}")

    def stream(self, channel_id: int, since: int = 0) -> list[int]:
        """Ids (> ``since``) of the models the channel delivers, oldest first; its own site's models
        excluded."""
        ch = self.channel(channel_id)
        check_id(since, "since")
        return [
            m["id"]
            for m in self.models()
            if m["id"] > since and m["publisher"] != ch.subscriber and ch.matches(m["features"])
        ]


def _publisher(row) -> dict:
    site, key, le, ld, es, ds, seq, head = row
    return {
        "site": site,
        "public_key": key,
        "lifetime": (le, ld),
        "epsilon_spent": es,
        "delta_spent": ds,
        "ledger_seq": seq,
        "ledger_head": None if head is None else json.loads(head),
    }


def check_ledger_head(head, seq: int, kept: dict | None, site: str) -> str | None:
    """The signed ledger head a release receipt presents (the publisher's ledger just before the entry that
    records this release: ``{"entries": seq, "mac": hex}``), as the JSON the broker keeps; ModelRejected if it
    is malformed, does not sit at the receipt's entry, or is missing while the broker keeps an earlier head of
    this site (a site folder replaced by one without a ledger's history). Kept heads only move forward (the
    receipt's ``ledger_seq`` is checked against the kept one before this)."""
    if head is None:
        if kept is not None:
            raise ModelRejected(
                f"the model's receipt presents no ledger head; the broker keeps {site!r}'s head of "
                f"{kept['entries']} entries"
            )
        return None
    if not (
        isinstance(head, dict)
        and set(head) == {"entries", "mac"}
        and isinstance(head["entries"], int)
        and not isinstance(head["entries"], bool)
        and isinstance(head["mac"], str)
        and len(head["mac"]) <= 128
    ):
        raise ModelRejected("the receipt's ledger head is not {entries, mac}")
    if head["entries"] != seq:
        raise ModelRejected(
            f"the receipt's ledger head ({head['entries']} entries) is not where its release entry "
            f"({seq}) is recorded"
        )
    return json.dumps({"entries": head["entries"], "mac": head["mac"]})


def _channel(channel_id: int, subscriber: str, spec: str) -> Channel:
    return Channel(int(channel_id), subscriber, tuple(frozenset(c) for c in json.loads(spec)))


MAX_ID = 2**63 - 1  # SQLite's largest INTEGER
MAX_FEATURES = 10_000


def check_id(value, what: str = "id") -> int:
    """A model or channel id (or a ``since``) as an int in SQLite's range, or a ConfigError (a request's 10^23
    is a refusal, not an overflow)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise ConfigError(f"{what} must be an integer in [0, 2^63 - 1], got {value!r}"[:200])
    return value


def check_feature_name(name) -> str:
    """A feature name: a non-empty string of at most 200 characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ConfigError(
            f"a feature name is a non-empty string of at most 200 characters, got {name!r}"[:200]
        )
    return name


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


MAX_NUMBER_CHARS = 32  # a JSON number's characters (digits, sign, point, exponent) a request may carry


def check_number(value, what: str) -> float:
    """``value`` as a float if it is a JSON number (an int or a float, never a bool: ``true`` is not 1.0) that
    a float holds; else a one-line ConfigError naming ``what`` (a 400-digit integer is a refusal, not an
    overflow)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number, got {type(value).__name__} {str(value)[:40]!r}")
    if isinstance(value, int) and value.bit_length() > 1000:
        raise ConfigError(
            f"{what} must be a number a float holds, got an integer of {value.bit_length()} bits"
        )
    return float(value)


def _bounded(kind, what: str):
    def parse(text: str):
        if len(text) > MAX_NUMBER_CHARS:
            raise ConfigError(
                f"a JSON number of {len(text)} characters (at most {MAX_NUMBER_CHARS}): refused"
            )
        return kind(text)

    return parse


def _no_constant(name: str):
    raise ConfigError(f"{name} is not JSON: refused")


def strict_json(raw: bytes):
    """A request body parsed as JSON with every number's length bounded before it is converted (a 5000-digit
    integer is refused before Python's int parser sees it) and no NaN/Infinity; ConfigError (a 400) if it is
    not such JSON. Its nesting is bounded first (:func:`silofl.comm.messages.json_depth`)."""
    from silofl.comm.messages import json_depth
    from silofl.core.errors import PeerModelRejected

    try:
        json_depth(raw)
        return json.loads(
            raw,
            parse_int=_bounded(int, "integer"),
            parse_float=_bounded(float, "number"),
            parse_constant=_no_constant,
        )
    except ConfigError:
        raise
    except PeerModelRejected as e:
        raise ConfigError(f"malformed request: {e}") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"malformed request: the body is not JSON ({str(e)[:120]})") from None
