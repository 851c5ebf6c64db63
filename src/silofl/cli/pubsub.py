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

app = typer.Typer(no_args_is_help=True, help="PubSub-ML: publish DP models, subscribe by feature channels, customize.")
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
    """(x, y, features, classes, public metadata or None) of a subscriber's data: with ``schema``, the file (CSV or
    Parquet) is checked against it and encoded with the schema's public bounds (:mod:`silofl.pubsub.tables`);
    without, a CSV of numbers."""
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


def _broker(path: str):
    from silofl.pubsub.broker import Broker

    return Broker(path)


def _site_folder(site: str, site_dir: str | None, lifetime_epsilon: float | None, lifetime_delta: float):
    """The publisher's own folder (its lifetime budget and ledger), which must declare a lifetime budget."""
    from silofl.site.folder import SiteFolder

    folder = SiteFolder.open(site_dir, site, None if lifetime_epsilon is None else (lifetime_epsilon, lifetime_delta))
    folder.require_lifetime()
    return folder


def _sender(b, site: str, table):
    """Publish a model's bytes for ``site``: the model is validated first, and only then does a new site join the
    broker, with the schema's public metadata (nothing computed from its rows)."""
    from silofl.pubsub.model import PublishedModel

    def send(data: bytes) -> int:
        PublishedModel.from_bytes(data, b.max_bytes)
        if site not in b.sites():
            b.join(site, table.metadata())
        return b.publish(data)

    return send


def _spent_note(folder, ids) -> str:
    eps, dlt = folder.ledger.spent({folder.ledger.record_digest(i) for i in ids})
    life = folder.lifetime
    return (f"these records have now spent up to ε={eps:.4g}, δ={dlt:.3g} of {folder.name}'s lifetime budget "
            f"ε={life[0]:g}, δ={life[1]:g} (ledger {folder.ledger.path})")


SCHEMA_HELP = ("The collaboration's schema (YAML/JSON): DATA (.csv or .parquet) is checked against it, and its declared "
               "bounds, defaults and labels are the only public metadata the site releases.")
SITE_DIR_HELP = "This site's own folder: lifetime budget, secret, ledger (default: $SILOFL_HOME/sites/SITE)."
LIFETIME_HELP = "The site's lifetime ε for every release of its records (declared once, when its folder is made)."
ID_HELP = "A column of unique record ids (default: a digest of each row's content); the ledger keys spend by them."
SEED_HELP = ("A reproducible research model: the guarantee then holds only while the seed stays secret (default: "
             "secret randomness).")


@app.command()
@friendly_errors
def publish(
    broker: str = typer.Option(..., help="Broker directory (created if missing)."),
    site: str = typer.Option(..., help="This publisher's name."),
    data: str = typer.Option(..., help="The site's table (CSV or Parquet), checked against --schema."),
    schema: str = typer.Option(..., "--schema", help=SCHEMA_HELP),
    model: str = typer.Option("dp-logreg", help="dp-nn | dp-logreg | dp-nb | dp-forest | dp-linreg"),
    epsilon: float = typer.Option(..., help="This publisher's ε for the model."),
    delta: float = typer.Option(1e-5, help="δ (DP-SGD; the diffprivlib models meet δ = 0)."),
    site_dir: str | None = typer.Option(None, "--site-dir", help=SITE_DIR_HELP),
    lifetime_epsilon: float | None = typer.Option(None, "--lifetime-epsilon", help=LIFETIME_HELP),
    lifetime_delta: float = typer.Option(1e-4, "--lifetime-delta", help="The site's lifetime δ (declared with it)."),
    id_column: str | None = typer.Option(None, "--id-column", help=ID_HELP),
    seed: int | None = typer.Option(None, help=SEED_HELP),
):
    """Train a DP model on DATA under (ε, δ) and publish it. The site's ledger first checks that no record of
    DATA would pass the site's lifetime budget, and records the release; a new site joins the broker only
    after its model passed validation, with the schema's public metadata (declared bounds, defaults, labels)."""
    from silofl.pubsub import tables
    from silofl.pubsub.dp_models import Bounds, train

    folder = _site_folder(site, site_dir, lifetime_epsilon, lifetime_delta)
    t = tables.read(data, schema, id_column)
    b = _broker(broker)
    t0 = time.perf_counter()

    def make():
        return train(model, t.x, t.y, publisher=site, features=t.features, task=t.task, bounds=Bounds(t.lo, t.hi),
                     epsilon=epsilon, delta=delta, classes=t.classes, seed=seed, y_bounds=t.y_bounds)

    m, mid = folder.release(t.ids, epsilon, delta, make, _sender(b, site, t), what="pubsub-model", model=model,
                            data=Path(data).name)
    console.print(f"published model {mid}: {model} by {site} on {len(t.features)} features, {len(t.x)} rows, "
                  f"ε={m.epsilon:.4g} at δ={m.delta:g} ({m.mechanism['name']}), {time.perf_counter() - t0:.1f} s")
    console.print(_spent_note(folder, t.ids))
    if seed is not None:
        console.print(f"seeded (--seed {seed}): a research model; its guarantee holds only while the seed stays secret")


@app.command()
@friendly_errors
def subscribe(
    broker: str = typer.Option(...),
    site: str = typer.Option(..., help="The subscriber's name (joins the broker if new)."),
    channel: str = typer.Option(..., help="F1 ∨ … ∨ Fk as 'a,b|c,d': a model matches when its features contain "
                                "every name of some clause."),
):
    """Open a channel; every published model whose features contain all of some clause streams to it."""
    b = _broker(broker)
    if site not in b.sites():
        b.join(site)
    clauses = [[f.strip() for f in c.split(",") if f.strip()] for c in channel.split("|")]
    ch = b.subscribe(site, clauses)
    console.print(f"channel {ch.id} for {site}: " + " ∨ ".join("{" + ", ".join(sorted(c)) + "}" for c in ch.clauses)
                  + f" — {len(b.stream(ch.id))} models match now")


@app.command()
@friendly_errors
def leave(broker: str = typer.Option(...), site: str = typer.Option(..., help="The site that leaves.")):
    """A site leaves: its models, feature metadata and channels go with it."""
    n = _broker(broker).leave(site)
    console.print(f"{site} left the broker; {n} published model(s) withdrawn")


@app.command(name="list")
@friendly_errors
def list_(broker: str = typer.Option(...)):
    """Sites, published models and channels of a broker."""
    b = _broker(broker)
    t = Table(title=f"models in {broker}")
    for col in ("id", "publisher", "kind", "task", "features", "ε", "δ", "chunk", "created"):
        t.add_column(col)
    for m in b.models():
        eps = "∞ (non-private)" if math.isinf(m["epsilon"]) else f"{m['epsilon']:.4g}"
        t.add_row(str(m["id"]), m["publisher"], m["kind"], m["task"], str(len(m["features"])), eps, f"{m['delta']:g}",
                  "—" if m["chunk"] is None else str(m["chunk"]), m["created_at"])
    console.print(f"sites: {', '.join(b.sites()) or '—'}")
    console.print(t)


@app.command()
@friendly_errors
def customize(
    broker: str = typer.Option(...),
    site: str = typer.Option(..., help="The subscriber (its channels select the models)."),
    data: str = typer.Option(..., help="The subscriber's CSV (header row, one target column; with --schema: CSV or Parquet)."),
    target: str | None = typer.Option(None, help="The target column (with --schema: the schema's)."),
    schema: str | None = typer.Option(None, "--schema", help="The collaboration's schema (YAML/JSON): DATA (.csv or "
                                      ".parquet) is checked against it and its declared bounds are the public metadata."),
    task: str = typer.Option("classification"),
    top_m: str = typer.Option("all", "--top-m", help="Keep the best m models on the customize part, or 'all'."),
    out: str = typer.Option("runs/customize", help="Where customization.json goes."),
    seed: int = typer.Option(0, help="Seed of the split and the fusion fit (the subscriber spends no privacy budget)."),
):
    """Algorithm 2: split DATA 60/20/20, train an own model, keep the top-m subscribed models, fuse them."""
    from silofl.pubsub.customize import LocalData
    from silofl.pubsub.customize import customize as run_customize

    x, y, features, classes, _ = read_site(data, target, task, schema)
    b = _broker(broker)
    t0 = time.perf_counter()
    ids = sorted({i for ch in b.channels(site) for i in b.stream(ch.id)})
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
    res = run_customize(models, LocalData(x, y, features, task, classes), b.public_defaults(), top_m=m, seed=seed)
    rep = {**res.report, "models_fetched": ids, "models_skipped": skipped}
    rep["seconds"] = {"load": t_load, **rep["seconds"]}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "customization.json").write_text(json.dumps(rep, indent=2, default=str))
    metric = rep["metric"]
    own = f"own model alone {rep['own_test']:.4f}" if rep["own_test"] is not None else rep["own_note"]
    console.print(f"customized from {len(ids)} subscribed models + own: test {metric} {rep['test']:.4f} "
                  f"({own}); selected {', '.join(rep['selected'])}")
    console.print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in rep["seconds"].items()))
    console.print(rep["privacy"] + ".")
    console.print(f"→ {Path(out) / 'customization.json'}")


@app.command()
@friendly_errors
def stream(
    broker: str = typer.Option(...),
    site: str = typer.Option(..., help="The publisher."),
    data: str = typer.Option(..., help="The site's table (CSV or Parquet), read in order as a stream of chunks."),
    schema: str = typer.Option(..., "--schema", help=SCHEMA_HELP),
    chunk_size: int = typer.Option(500, "--chunk-size", help="Rows per chunk; each trains one model."),
    ensemble: int = typer.Option(3, "--ensemble", help="k: how many of the latest models stay published."),
    model: str = typer.Option("dp-logreg"),
    epsilon: float = typer.Option(...),
    delta: float = typer.Option(1e-5),
    site_dir: str | None = typer.Option(None, "--site-dir", help=SITE_DIR_HELP),
    lifetime_epsilon: float | None = typer.Option(None, "--lifetime-epsilon", help=LIFETIME_HELP),
    lifetime_delta: float = typer.Option(1e-4, "--lifetime-delta", help="The site's lifetime δ (declared with it)."),
    id_column: str | None = typer.Option(None, "--id-column", help=ID_HELP),
    seed: int | None = typer.Option(None, help=SEED_HELP),
):
    """Algorithm 4: publish one DP model per disjoint chunk of DATA, keeping the k latest published. Within one
    stream every record is in exactly one chunk (parallel composition); across streams, publishes and runs the
    site's ledger composes each record's spend and refuses a chunk that would pass the lifetime budget."""
    from silofl.pubsub import tables
    from silofl.pubsub.dp_models import Bounds
    from silofl.pubsub.stream import StreamPublisher

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size must be ≥ 1, got {chunk_size}")
    folder = _site_folder(site, site_dir, lifetime_epsilon, lifetime_delta)
    t = tables.read(data, schema, id_column)
    b = _broker(broker)
    pub = StreamPublisher(site, t.features, t.task, model, epsilon, delta, Bounds(t.lo, t.hi), k=ensemble,
                          classes=t.classes, broker=b, seed=seed, folder=folder, send=_sender(b, site, t),
                          train_options={"y_bounds": t.y_bounds} if t.y_bounds is not None else {})
    for start in range(0, len(t.x), chunk_size):
        rows = np.arange(start, min(start + chunk_size, len(t.x)))
        ev = pub.add_chunk(t.x[rows], t.y[rows], [t.ids[i] for i in rows])
        gone = f", withdrew chunk {ev['withdrawn_chunks'][0]}" if ev["withdrawn_chunks"] else ""
        console.print(f"chunk {ev['chunk']}: {len(rows)} rows → model {ev['published']}{gone}; live chunks "
                      f"{ev['live_chunks']}")
    g = pub.guarantee()
    console.print(f"{g['chunks']} chunks, {g['live_models']} models live; this stream: ε={g['epsilon']:g}, "
                  f"δ={g['delta']:g} per record ({g['composition']})")
    console.print(_spent_note(folder, t.ids))
    if seed is not None:
        console.print(f"seeded (--seed {seed}): research models; their guarantee holds only while the seed stays secret")


@app.command()
@friendly_errors
def scenario(
    name: str = typer.Argument(..., help="iid | non-iid | distributed-features | regression | stream | noisy-sites | scale"),
    out: str = typer.Option(..., help="Output directory (table.csv, table.md, results.json, plot.png)."),
    quick: bool = typer.Option(False, "--quick", help="Shrink the scenario to seconds (one seed; digits for images)."),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds (default depends on the scenario)."),
):
    """Run one PubSub-ML experiment: PubSub-ML, PubSub-ML*, Own and the DP FL baselines (V and F)."""
    from silofl.experiments.pubsub_scenarios import run_scenario

    seed_list = None
    if seeds:
        try:
            seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(f"--seeds takes integers separated by commas, got {seeds!r}") from None
    t0 = time.perf_counter()
    run_scenario(name, out, quick=quick, seeds=seed_list)
    console.print((Path(out) / "table.md").read_text())
    console.print(f"{name}: {time.perf_counter() - t0:.1f} s → {out}/table.csv, table.md, results.json, plot.png")
