"""``silofl pubsub``: publish DP models, subscribe through feature channels, customize, list."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from silofl.cli.common import friendly_errors
from silofl.core.errors import ConfigError, ModelRejected

app = typer.Typer(
    no_args_is_help=True, help="PubSub-ML: publish DP models, subscribe by feature channels, customize."
)
console = Console()


def read_csv(path: str, target: str, task: str) -> tuple[np.ndarray, np.ndarray, list[str], list | None]:
    """(x, y, feature names, class labels) of a CSV file with a header; ``target`` names the label column.
    Class labels are the target's distinct values, sorted (numbers numerically)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if len(rows) < 2:
        raise ConfigError(f"{path} has no data rows")
    header = [h.strip() for h in rows[0]]
    if target not in header:
        raise ConfigError(f"{path} has no column {target!r} (columns: {', '.join(header[:10])})")
    t = header.index(target)
    features = [h for i, h in enumerate(header) if i != t]
    try:
        x = np.array([[float(v) for i, v in enumerate(r) if i != t] for r in rows[1:]], dtype=np.float64)
    except ValueError as e:
        raise ConfigError(f"{path}: every feature must be numeric ({e})") from None
    raw = [r[t].strip() for r in rows[1:]]
    if task == "regression":
        return x, np.array([float(v) for v in raw]), features, None
    labels = sorted(set(raw), key=lambda v: (0, float(v), v) if _is_number(v) else (1, 0.0, v))
    index = {v: i for i, v in enumerate(labels)}
    return x, np.array([index[v] for v in raw]), features, labels


def read_site(path: str, target: str | None, task: str, schema: str | None):
    """(x, y, features, classes, public metadata or None) of a subscriber's data: with ``schema``, the file
    (CSV or Parquet) is checked against it and encoded with the schema's public bounds
    (:mod:`silofl.pubsub.tables`); without, a CSV of numbers."""
    if schema is None:
        if target is None:
            raise ConfigError("--target is needed without --schema")
        return (*read_csv(path, target, task), None)
    from silofl.pubsub import tables

    t = tables.read(path, schema)
    if target is not None and target != tables.Schema.load(schema).target:
        raise ConfigError(f"--target {target!r} differs from the schema's target")
    if task != t.task and task != "classification":
        raise ConfigError(f"--task {task} differs from the schema's target ({t.task})")
    return t.x, t.y, t.features, t.classes, t.metadata()


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _broker(path: str, credential: str | None = None, site: str | None = None, create: bool = True):
    from silofl.pubsub.client import open_broker

    return open_broker(path, credential, site, create)


def _site_folder(site: str, site_dir: str | None, lifetime_epsilon: float | None, lifetime_delta: float):
    """The publisher's own folder (its lifetime budget and ledger), which must declare a lifetime budget."""
    from silofl.site.folder import SiteFolder

    folder = SiteFolder.open(
        site_dir, site, None if lifetime_epsilon is None else (lifetime_epsilon, lifetime_delta)
    )
    folder.require_lifetime()
    return folder


def _check_release(
    epsilon: float, delta: float, lifetime_epsilon: float | None, lifetime_delta: float
) -> None:
    """Refuse a release's or a lifetime budget's (ε, δ) that no DP model meets, before anything is made."""
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise ConfigError(f"a DP model needs 0 < ε < ∞ and 0 < δ < 1, got ε={epsilon}, δ={delta}")
    if lifetime_epsilon is not None and not (
        math.isfinite(lifetime_epsilon) and lifetime_epsilon > 0 and 0 <= lifetime_delta < 1
    ):
        raise ConfigError(
            f"a lifetime budget needs 0 < ε < ∞ and 0 ≤ δ < 1, got ε={lifetime_epsilon}, δ={lifetime_delta}"
        )


def _sender(b):
    """Publish a signed model's bytes: the model is validated here first; a new site joins the broker with the
    public metadata its signed receipt carries, and only when the broker accepts the model."""
    from silofl.pubsub.model import PublishedModel

    def send(data: bytes) -> int:
        PublishedModel.from_bytes(data, b.max_bytes)
        return b.publish(data)

    return send


def _seal(folder, table):
    """Sign a model with the site's key (``keys/sign.key`` in its folder) and its ledger's receipt, plus the
    schema's public metadata for joining the broker (nothing computed from its rows)."""
    from silofl.pubsub.signing import sign_model

    key = folder.signing_key()  # keys/sign.key: the site's one identity (deployment signs with it too)
    join = {f: list(v) for f, v in table.metadata().items()}

    def seal(data: bytes, receipt: dict) -> bytes:
        return sign_model(data, key, {**receipt, "join": join})

    return seal


def _spent_note(folder, ids) -> str:
    from silofl.privacy.site_accountant import threat_label

    life = folder.lifetime
    books = folder.accountant()
    eps, dlt = books.spent(life[1], "colluders", records={folder.ledger.record_digest(i) for i in ids})
    return (
        f"these records have now spent up to ε={eps:.4g}, δ={dlt:.3g} against "
        f"{threat_label('colluders', books.colluders)} (every release, DP-SGD and secure round of "
        f"{folder.name}'s ledger composed by its one accountant) of its lifetime budget ε={life[0]:g}, "
        f"δ={life[1]:g} (ledger {folder.ledger.path})"
    )


SCHEMA_HELP = (
    "The collaboration's schema (YAML/JSON): DATA (.csv or .parquet) is checked against it, and its declared "
    "bounds, defaults and labels are the only public metadata the site releases."
)
SITE_DIR_HELP = "This site's own folder: lifetime budget, secret, ledger (default: $SILOFL_HOME/sites/SITE)."
LIFETIME_HELP = (
    "The site's lifetime ε for every release of its records (declared once, when its folder is made)."
)
CRED_HELP = (
    "With an https:// --broker: this site's credential file (from the broker's operator; default "
    "$SILOFL_CREDENTIAL)."
)
BROKER_HELP = (
    "A broker folder (one machine; created if missing) or the URL of a broker service (https://HOST:PORT)."
)
ID_HELP = (
    "A column of unique record ids (default: a digest of each row's content); the ledger keys spend by them."
)
SEED_HELP = (
    "A reproducible research model: the guarantee then holds only while the seed stays secret (default: "
    "secret randomness)."
)


@app.command()
@friendly_errors
def publish(
    broker: str = typer.Option(..., help=BROKER_HELP),
    site: str = typer.Option(..., help="This publisher's name."),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
    data: str = typer.Option(..., help="The site's table (CSV or Parquet), checked against --schema."),
    schema: str = typer.Option(..., "--schema", help=SCHEMA_HELP),
    model: str = typer.Option("dp-logreg", help="dp-nn | dp-logreg | dp-nb | dp-forest | dp-linreg"),
    epsilon: float = typer.Option(..., help="This publisher's ε for the model."),
    delta: float = typer.Option(1e-5, help="δ (DP-SGD; the diffprivlib models meet δ = 0)."),
    site_dir: str | None = typer.Option(None, "--site-dir", help=SITE_DIR_HELP),
    lifetime_epsilon: float | None = typer.Option(None, "--lifetime-epsilon", help=LIFETIME_HELP),
    lifetime_delta: float = typer.Option(
        1e-4, "--lifetime-delta", help="The site's lifetime δ (declared with it)."
    ),
    id_column: str | None = typer.Option(None, "--id-column", help=ID_HELP),
    seed: int | None = typer.Option(None, help=SEED_HELP),
):
    """Train a DP model on DATA under (ε, δ) and publish it. The site's ledger first checks that no record of
    DATA would pass the site's lifetime budget, and records the release; a new site joins the broker only
    after its model passed validation, with the schema's public metadata (declared bounds, defaults,
    labels)."""
    from silofl.pubsub import tables
    from silofl.pubsub.dp_models import Bounds, train

    _check_release(epsilon, delta, lifetime_epsilon, lifetime_delta)
    t = tables.read(data, schema, id_column)  # bad input is refused before the site folder or broker is made
    folder = _site_folder(site, site_dir, lifetime_epsilon, lifetime_delta)
    b = _broker(broker, credential, site)
    t0 = time.perf_counter()

    def make():
        return train(
            model,
            t.x,
            t.y,
            publisher=site,
            features=t.features,
            task=t.task,
            bounds=Bounds(t.lo, t.hi),
            epsilon=epsilon,
            delta=delta,
            classes=t.classes,
            seed=seed,
            y_bounds=t.y_bounds,
        )

    m, mid = folder.release(
        t.ids,
        epsilon,
        delta,
        make,
        _sender(b),
        seal=_seal(folder, t),
        what="pubsub-model",
        model=model,
        data=Path(data).name,
    )
    console.print(
        f"published model {mid}: {model} by {site} on {len(t.features)} features, {len(t.x)} rows, "
        f"ε={m.epsilon:.4g} at δ={m.delta:g} ({m.mechanism['name']}), {time.perf_counter() - t0:.1f} s"
    )
    console.print(_spent_note(folder, t.ids))
    if seed is not None:
        console.print(
            f"seeded (--seed {seed}): a research model; its guarantee holds only while the seed stays secret"
        )


@app.command()
@friendly_errors
def subscribe(
    broker: str = typer.Option(..., help=BROKER_HELP),
    site: str = typer.Option(..., help="The subscriber's name (joins the broker if new)."),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
    channel: str = typer.Option(
        ...,
        help="F1 ∨ … ∨ Fk as 'a,b|c,d': a model matches when its features contain every name of some clause.",
    ),
):
    """Open a channel; every published model whose features contain all of some clause streams to it."""
    b = _broker(broker, credential, site)
    if site not in b.sites():
        b.join(site)
    clauses = [[f.strip() for f in c.split(",") if f.strip()] for c in channel.split("|")]
    ch = b.subscribe(site, clauses)
    console.print(
        f"channel {ch.id} for {site}: "
        + " ∨ ".join("{" + ", ".join(sorted(c)) + "}" for c in ch.clauses)
        + f" — {len(b.stream(ch.id))} models match now"
    )


@app.command()
@friendly_errors
def leave(
    broker: str = typer.Option(..., help=BROKER_HELP),
    site: str = typer.Option(..., help="The site that leaves."),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
):
    """A site leaves: its models, feature metadata and channels go with it (through a broker service, a site
    leaves only as itself; the operator may remove any site)."""
    n = _broker(broker, credential, create=False).leave(site)
    console.print(f"{site} left the broker; {n} published model(s) withdrawn")


@app.command(name="list")
@friendly_errors
def list_(
    broker: str = typer.Option(..., help=BROKER_HELP),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
):
    """Sites, each publisher's declared spend against its lifetime budget, and the published models (through a
    broker service: the models the credential's channels deliver, its own, or all for the operator)."""
    b = _broker(broker, credential, create=False)
    pubs = Table(
        title="publishers: the largest spend their signed models declared (from each site's own ledger)"
    )
    for col in ("publisher", "spent ε", "spent δ", "lifetime ε", "lifetime δ", "key"):
        pubs.add_column(col)
    for p in b.publishers():
        pubs.add_row(
            p["site"],
            f"{p['epsilon_spent']:.4g}",
            f"{p['delta_spent']:.3g}",
            f"{p['lifetime'][0]:g}",
            f"{p['lifetime'][1]:g}",
            p["public_key"][:16] + "…",
        )
    t = Table(title=f"models in {broker}")
    for col in ("id", "publisher", "kind", "task", "features", "ε", "δ", "spent ε", "chunk", "created"):
        t.add_column(col)
    for m in b.models():
        eps = "∞ (non-private)" if math.isinf(m["epsilon"]) else f"{m['epsilon']:.4g}"
        spent = "unsigned" if m.get("epsilon_spent") is None else f"{m['epsilon_spent']:.4g}"
        t.add_row(
            str(m["id"]),
            m["publisher"],
            m["kind"],
            m["task"],
            str(len(m["features"])),
            eps,
            f"{m['delta']:g}",
            spent,
            "—" if m["chunk"] is None else str(m["chunk"]),
            m["created_at"],
        )
    console.print(f"sites: {', '.join(b.sites()) or '—'}")
    console.print(pubs)
    console.print(t)


@app.command()
@friendly_errors
def customize(
    broker: str = typer.Option(..., help=BROKER_HELP),
    site: str = typer.Option(..., help="The subscriber (its channels select the models)."),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
    data: str = typer.Option(
        ..., help="The subscriber's CSV (header row, one target column; with --schema: CSV or Parquet)."
    ),
    target: str | None = typer.Option(None, help="The target column (with --schema: the schema's)."),
    schema: str | None = typer.Option(
        None,
        "--schema",
        help="The collaboration's schema (YAML/JSON): DATA (.csv or "
        ".parquet) is checked against it and its declared bounds are the public metadata.",
    ),
    task: str = typer.Option("classification"),
    top_m: str = typer.Option(
        "all", "--top-m", help="Keep the best m models on the customize part, or 'all'."
    ),
    out: str = typer.Option("runs/customize", help="Where customization.json goes."),
    seed: int = typer.Option(
        0, help="Seed of the split and the fusion fit (the subscriber spends no privacy budget)."
    ),
):
    """Algorithm 2: split DATA 60/20/20, train an own model, keep the top-m subscribed models, fuse them."""
    from silofl.pubsub.customize import LocalData
    from silofl.pubsub.customize import customize as run_customize
    from silofl.runner.folder import check_out_path

    check_out_path(out)
    x, y, features, classes, _ = read_site(data, target, task, schema)
    b = _broker(broker, credential, site, create=False)
    t0 = time.perf_counter()
    channels = b.channels(site)
    if not channels:
        raise ConfigError(
            f"{site} has no channel on this broker, so no model would be used: open one first with "
            f"`silofl pubsub subscribe --site {site} --channel ...`"
        )
    ids = sorted({i for ch in channels for i in b.stream(ch.id)})
    models, skipped = [], []
    for i in ids:  # a stored model that fails its checks now is skipped, not fatal
        try:
            models.append(b.fetch(i))
        except ModelRejected as e:
            skipped.append(i)
            console.print(f"[yellow]skipped model {i}: {e}[/yellow]")
    ids = [i for i in ids if i not in skipped]
    t_load = time.perf_counter() - t0
    if top_m != "all" and not top_m.strip().isdigit():
        raise ConfigError(f"--top-m takes a positive number of models or 'all', got {top_m!r}")
    m = None if top_m == "all" else int(top_m)
    res = run_customize(
        models, LocalData(x, y, features, task, classes), b.public_defaults(), top_m=m, seed=seed
    )
    rep = {**res.report, "models_fetched": ids, "models_skipped": skipped}
    rep["seconds"] = {"load": t_load, **rep["seconds"]}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "customization.json").write_text(json.dumps(rep, indent=2, default=str))
    metric = rep["metric"]
    own = f"own model alone {rep['own_test']:.4f}" if rep["own_test"] is not None else rep["own_note"]
    console.print(
        f"customized from {len(ids)} subscribed models + own: test {metric} {rep['test']:.4f} "
        f"({own}); selected {', '.join(rep['selected'])}"
    )
    console.print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in rep["seconds"].items()))
    console.print(rep["privacy"] + ".")
    console.print(f"→ {Path(out) / 'customization.json'}")


@app.command()
@friendly_errors
def stream(
    broker: str = typer.Option(..., help=BROKER_HELP),
    site: str = typer.Option(..., help="The publisher."),
    credential: str | None = typer.Option(None, "--credential", envvar="SILOFL_CREDENTIAL", help=CRED_HELP),
    data: str = typer.Option(
        ..., help="The site's table (CSV or Parquet), read in order as a stream of chunks."
    ),
    schema: str = typer.Option(..., "--schema", help=SCHEMA_HELP),
    chunk_size: int = typer.Option(500, "--chunk-size", help="Rows per chunk; each trains one model."),
    ensemble: int = typer.Option(3, "--ensemble", help="k: how many of the latest models stay published."),
    model: str = typer.Option("dp-logreg"),
    epsilon: float = typer.Option(...),
    delta: float = typer.Option(1e-5),
    site_dir: str | None = typer.Option(None, "--site-dir", help=SITE_DIR_HELP),
    lifetime_epsilon: float | None = typer.Option(None, "--lifetime-epsilon", help=LIFETIME_HELP),
    lifetime_delta: float = typer.Option(
        1e-4, "--lifetime-delta", help="The site's lifetime δ (declared with it)."
    ),
    id_column: str | None = typer.Option(None, "--id-column", help=ID_HELP),
    seed: int | None = typer.Option(None, help=SEED_HELP),
):
    """Algorithm 4: publish one DP model per disjoint chunk of DATA, keeping the k latest published. Within
    one stream every record is in exactly one chunk (parallel composition); across streams, publishes and runs
    the site's ledger composes each record's spend and refuses a chunk that would pass the lifetime budget."""
    from silofl.pubsub import tables
    from silofl.pubsub.dp_models import Bounds
    from silofl.pubsub.stream import StreamPublisher

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size must be ≥ 1, got {chunk_size}")
    _check_release(epsilon, delta, lifetime_epsilon, lifetime_delta)
    t = tables.read(data, schema, id_column)  # bad input is refused before the site folder or broker is made
    folder = _site_folder(site, site_dir, lifetime_epsilon, lifetime_delta)
    b = _broker(broker, credential, site)
    pub = StreamPublisher(
        site,
        t.features,
        t.task,
        model,
        epsilon,
        delta,
        Bounds(t.lo, t.hi),
        k=ensemble,
        classes=t.classes,
        broker=b,
        seed=seed,
        folder=folder,
        send=_sender(b),
        seal=_seal(folder, t),
        train_options={"y_bounds": t.y_bounds} if t.y_bounds is not None else {},
    )
    for start in range(0, len(t.x), chunk_size):
        rows = np.arange(start, min(start + chunk_size, len(t.x)))
        ev = pub.add_chunk(t.x[rows], t.y[rows], [t.ids[i] for i in rows])
        gone = f", withdrew chunk {ev['withdrawn_chunks'][0]}" if ev["withdrawn_chunks"] else ""
        console.print(
            f"chunk {ev['chunk']}: {len(rows)} rows → model {ev['published']}{gone}; live chunks "
            f"{ev['live_chunks']}"
        )
    g = pub.guarantee()
    console.print(
        f"{g['chunks']} chunks, {g['live_models']} models live; this stream: ε={g['epsilon']:g}, "
        f"δ={g['delta']:g} per record ({g['composition']})"
    )
    console.print(_spent_note(folder, t.ids))
    if seed is not None:
        console.print(
            f"seeded (--seed {seed}): research models; their guarantee holds only while the seed stays secret"
        )


# ---------------------------------------------------------------------------------------------- the broker
# service
def _parse_hostport(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1–65535, got {port}")
    if not host:
        raise ConfigError("--host must not be empty")


@app.command()
@friendly_errors
def serve(
    state: str = typer.Option(
        ...,
        "--state",
        help="The broker's folder: registry and models (broker/), access.log, "
        "admin.json (the operator's credential, written on first start, mode 0600).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8443, help="Port to listen on."),
    cert: str | None = typer.Option(
        None, "--cert", help="The server's TLS certificate (PEM), e.g. from `silofl pubsub cert`."
    ),
    key: str | None = typer.Option(None, "--key", help="The server's TLS private key (PEM)."),
    insecure_http: bool = typer.Option(
        False,
        "--insecure-http",
        help="Serve plain HTTP (only behind a TLS "
        "terminating proxy on the same host; tokens would otherwise travel in clear).",
    ),
    max_upload_mb: float = typer.Option(64.0, "--max-upload-mb", help="The largest model upload, in MiB."),
    rate: float = typer.Option(
        50.0, "--rate", help="Requests per second per credential (and per address without one)."
    ),
    burst: int = typer.Option(200, "--burst", help="Requests at once per credential before --rate applies."),
):
    """Run the PubSub-ML broker as an authenticated HTTPS service (FastAPI on uvicorn)."""
    from silofl.pubsub.service import admin_credential_path
    from silofl.pubsub.service import serve as run_serve

    _parse_hostport(host, port)
    if insecure_http and (cert or key):
        raise ConfigError("--insecure-http and --cert/--key exclude each other")
    if not insecure_http:
        if not cert or not key:
            raise ConfigError(
                "HTTPS needs --cert and --key (make test ones with `silofl pubsub cert`), or pass "
                "--insecure-http behind a TLS proxy"
            )
        for f in (cert, key):
            if not Path(f).is_file():
                raise ConfigError(f"no such file: {f}")
    if max_upload_mb <= 0 or rate <= 0 or burst < 1:
        raise ConfigError("--max-upload-mb and --rate must be positive and --burst at least 1")
    scheme = "http" if insecure_http else "https"
    console.print(
        f"broker on {scheme}://{host}:{port} (state {state}); operator credential: "
        f"{admin_credential_path(Path(state))}",
        soft_wrap=True,
    )
    run_serve(
        state,
        host,
        port,
        None if insecure_http else cert,
        None if insecure_http else key,
        max_upload=int(max_upload_mb * 1024 * 1024),
        rate=rate,
        burst=burst,
    )


@app.command()
@friendly_errors
def cert(
    out: str = typer.Option(..., help="Folder for ca.pem (for every client), server.pem and server.key."),
    host: list[str] = typer.Option(
        ["localhost", "127.0.0.1"],
        "--host",
        help="A DNS name or IP address of the broker (repeat the option).",
    ),
    days: int = typer.Option(30, help="Validity in days."),
):
    """Make a self-signed test CA and a server certificate for the broker (for trials and tests; a real
    deployment uses the institutions' own CA)."""
    from silofl.pubsub.tls import make_test_certificates

    if days < 1:
        raise ConfigError(f"--days must be ≥ 1, got {days}")
    paths = make_test_certificates(out, host, days)
    console.print(
        f"CA {paths['ca']}; server certificate {paths['cert']} and key {paths['key']} for {', '.join(host)}"
    )


@app.command()
@friendly_errors
def enroll(
    site: str = typer.Option(..., help="This site's name."),
    out: str = typer.Option(
        ...,
        help="Where the registration request (JSON: name, public key, lifetime budget) goes; "
        "give it to the broker's operator.",
    ),
    site_dir: str | None = typer.Option(None, "--site-dir", help=SITE_DIR_HELP),
    lifetime_epsilon: float | None = typer.Option(None, "--lifetime-epsilon", help=LIFETIME_HELP),
    lifetime_delta: float = typer.Option(
        1e-4, "--lifetime-delta", help="The site's lifetime δ (declared with it)."
    ),
):
    """Make this site's signing key (in its own folder, never sent) and its registration request for a
    broker."""
    from silofl.pubsub.signing import public_key_hex

    folder = _site_folder(site, site_dir, lifetime_epsilon, lifetime_delta)
    life = folder.require_lifetime()
    pub = public_key_hex(folder.signing_key())
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {"site": site, "public_key": pub, "lifetime_epsilon": life[0], "lifetime_delta": life[1]},
            indent=2,
        )
        + "\n"
    )
    console.print(
        f"{site}: signing key in {folder.path}; registration request → {out} (public key {pub[:16]}…)"
    )


@app.command()
@friendly_errors
def register(
    broker: str = typer.Option(..., help="The broker service's URL (https://HOST:PORT)."),
    credential: str = typer.Option(..., "--credential", help="The operator's credential (admin.json)."),
    request: str = typer.Option(
        ..., "--request", help="A site's registration request (`silofl pubsub enroll`)."
    ),
    out: str = typer.Option(
        ..., help="Where the site's credential goes (give it to the site; it holds its token)."
    ),
    ca: str | None = typer.Option(
        None,
        "--ca",
        help="The CA certificate the site should trust (copied into its credential as a path next to it).",
    ),
):
    """Register a site once (operator): its public key and lifetime budget; writes the site's credential."""
    import os
    import shutil

    from silofl.pubsub.client import RemoteBroker

    try:
        req = json.loads(Path(request).read_text())
        site, pub = str(req["site"]), str(req["public_key"])
        life = (float(req["lifetime_epsilon"]), float(req["lifetime_delta"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{request} is not a registration request: {e}") from None
    if Path(out).exists():
        raise ConfigError(f"{out} exists; a credential is never overwritten")
    token = RemoteBroker(broker, credential, ca=ca).register(site, pub, life)
    cred = {"broker": broker, "site": site, "token": token}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if ca:
        dest = Path(out).parent / "ca.pem"
        if not dest.exists():
            shutil.copyfile(ca, dest)
        cred["ca"] = "ca.pem"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cred, f, indent=2)
    console.print(f"registered {site} (lifetime ε={life[0]:g}, δ={life[1]:g}); credential → {out}")
