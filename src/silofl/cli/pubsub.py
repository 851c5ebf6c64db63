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
from silofl.core.errors import ConfigError

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
    """(x, y, features, classes, public metadata or None): with ``schema``, the file (CSV or Parquet) is checked against
    it and encoded with the schema's public bounds (:mod:`silofl.pubsub.tables`); without, a CSV of numbers."""
    if schema is None:
        if target is None:
            raise ConfigError("--target is needed without --schema")
        return (*read_csv(path, target, task), None)
    from silofl.pubsub import tables

    if task != "classification":
        raise ConfigError("--schema describes a classification target; regression reads a CSV without --schema")
    t = tables.read(path, schema)
    if target is not None and target != tables.Schema.load(schema).target:
        raise ConfigError(f"--target {target!r} differs from the schema's target")
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


def _join(b, site: str, x: np.ndarray, features: list[str], metadata: dict | None = None):
    """Join ``site`` on first use with public metadata: the schema's declared bounds and defaults when given, else
    from its data (per-feature mean and min/max, released without DP as in the paper); the public bounds its DP
    models clip to."""
    from silofl.pubsub.dp_models import Bounds

    if site not in b.sites():
        b.join(site, metadata or {f: ("continuous", float(x[:, i].mean()), float(x[:, i].min()), float(x[:, i].max()))
                                  for i, f in enumerate(features)})
    declared = b.public_bounds(site)
    missing = [f for f in features if f not in declared]
    if missing:
        raise ConfigError(f"site {site!r} has not declared public bounds for {missing[:5]}")
    return Bounds(np.array([declared[f][0] for f in features]), np.array([declared[f][1] for f in features]))


@app.command()
@friendly_errors
def publish(
    broker: str = typer.Option(..., help="Broker directory (created if missing)."),
    site: str = typer.Option(..., help="This publisher's name."),
    data: str = typer.Option(..., help="CSV with a header row; one column is the target (with --schema: CSV or Parquet)."),
    target: str | None = typer.Option(None, help="The target column (with --schema: the schema's)."),
    schema: str | None = typer.Option(None, "--schema", help="The collaboration's schema (YAML/JSON): DATA (.csv or "
                                      ".parquet) is checked against it and its declared bounds are the public metadata."),
    model: str = typer.Option("dp-logreg", help="dp-nn | dp-logreg | dp-nb | dp-forest | dp-linreg"),
    epsilon: float = typer.Option(..., help="This publisher's ε for the model."),
    delta: float = typer.Option(1e-5, help="δ (DP-SGD; the diffprivlib models meet δ = 0)."),
    task: str = typer.Option("classification", help="classification | regression"),
    seed: int | None = typer.Option(None, help="A reproducible research model: the guarantee then holds only while the seed stays secret (default: secret randomness)."),
):
    """Train a DP model on DATA under (ε, δ) and publish it. On first use the site joins the broker with
    public feature metadata taken from DATA: mean (default for subscribers that lack the feature) and
    min/max (the bounds DP models clip to). These statistics are released without DP, as in the paper."""
    from silofl.pubsub.dp_models import train

    x, y, features, classes, meta = read_site(data, target, task, schema)
    b = _broker(broker)
    bounds = _join(b, site, x, features, meta)
    t0 = time.perf_counter()
    y_bounds = (float(y.min()), float(y.max())) if task == "regression" else None
    m = train(model, x, y, publisher=site, features=features, task=task, bounds=bounds, epsilon=epsilon, delta=delta,
              classes=classes, seed=seed, y_bounds=y_bounds)
    mid = b.publish(m.to_bytes())
    console.print(f"published model {mid}: {model} by {site} on {len(features)} features, {len(x)} rows, "
                  f"ε={m.epsilon:.4g} at δ={m.delta:g} ({m.mechanism['name']}), {time.perf_counter() - t0:.1f} s")


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
    models = [b.fetch(i) for i in ids]
    t_load = time.perf_counter() - t0
    if top_m != "all" and not top_m.strip().isdigit():
        raise ConfigError(f"--top-m takes a positive number of models or 'all', got {top_m!r}")
    m = None if top_m == "all" else int(top_m)
    res = run_customize(models, LocalData(x, y, features, task, classes), b.public_defaults(), top_m=m, seed=seed)
    rep = {**res.report, "models_fetched": ids}
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
    data: str = typer.Option(..., help="CSV read in order as a stream of chunks (header row, one target column)."),
    target: str | None = typer.Option(None, help="The target column (with --schema: the schema's)."),
    schema: str | None = typer.Option(None, "--schema", help="The collaboration's schema (YAML/JSON): DATA (.csv or "
                                      ".parquet) is checked against it and its declared bounds are the public metadata."),
    chunk_size: int = typer.Option(500, "--chunk-size", help="Rows per chunk; each trains one model."),
    ensemble: int = typer.Option(3, "--ensemble", help="k: how many of the latest models stay published."),
    model: str = typer.Option("dp-logreg"),
    epsilon: float = typer.Option(...),
    delta: float = typer.Option(1e-5),
    task: str = typer.Option("classification"),
    seed: int | None = typer.Option(None, help="A reproducible research model: the guarantee then holds only while the seed stays secret (default: secret randomness)."),
):
    """Algorithm 4: publish one DP model per disjoint chunk of DATA, keeping the k latest published. Every
    record is in exactly one chunk, so the stream's guarantee stays (ε, δ) however long it runs."""
    from silofl.pubsub.stream import StreamPublisher

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size must be ≥ 1, got {chunk_size}")
    x, y, features, classes, meta = read_site(data, target, task, schema)
    b = _broker(broker)
    bounds = _join(b, site, x, features, meta)
    pub = StreamPublisher(site, features, task, model, epsilon, delta, bounds, k=ensemble, classes=classes, broker=b,
                          seed=seed)
    for start in range(0, len(x), chunk_size):
        ids = np.arange(start, min(start + chunk_size, len(x)))
        ev = pub.add_chunk(x[ids], y[ids], ids)
        gone = f", withdrew chunk {ev['withdrawn_chunks'][0]}" if ev["withdrawn_chunks"] else ""
        console.print(f"chunk {ev['chunk']}: {len(ids)} rows → model {ev['published']}{gone}; live chunks "
                      f"{ev['live_chunks']}")
    g = pub.guarantee()
    console.print(f"{g['chunks']} chunks, {g['live_models']} models live; every record: ε={g['epsilon']:g}, "
                  f"δ={g['delta']:g} ({g['composition']})")


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
