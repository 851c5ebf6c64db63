"""The PubSub-ML scale scenario through the broker service next to the folder broker, in one run.

1000 publishers × 500 Hyperplane rows each train a DP logistic regression (ε = 1) through their own site
folder (ledger entry + Ed25519 signature with the declared spend); the same signed models are then posted
(a) to a folder broker and (b) over HTTPS to a `silofl pubsub serve` process on loopback (test certificate),
each publisher with its own credential and its own TLS connection. Then one subscriber (channel {x0, x1, x2})
loads every model (fetch + signature check + validation), selects and fuses them (All and top-10), from each
broker. Prints and writes table.md, table.csv, results.json and plot.png.

    .venv/bin/python bench/pubsub_service_scale.py [--publishers 1000] [--rows 500] [--out
    reports/pubsub_service]

Models are trained with seeds (a benchmark, not a release); the rate limit of the service is raised for the
run (--rate/--burst; limits are per credential, and this measures the service, not its throttle).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/ (not installed)

from silofl.pubsub.broker import Broker  # noqa: E402
from silofl.pubsub.client import RemoteBroker  # noqa: E402
from silofl.pubsub.customize import LocalData, customize  # noqa: E402
from silofl.pubsub.dp_models import Bounds, train  # noqa: E402
from silofl.pubsub.signing import load_signing_key, public_key_hex, sign_model  # noqa: E402
from silofl.pubsub.tls import make_test_certificates  # noqa: E402
from silofl.site.folder import SiteFolder  # noqa: E402
from studies.pubsub_scenarios import _hyperplane  # noqa: E402

FEATS = [f"x{i}" for i in range(10)]
CLASSES = ["0", "1"]
JOIN = {f: ["continuous", 0.5, 0.0, 1.0] for f in FEATS}
LIFETIME = (10.0, 1e-4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subscriber_times(b, site: str, local: LocalData, defaults: dict, top_m) -> dict:
    """load (stream + fetch every model: signature, checksum, validation), select, fuse seconds."""
    ch = b.channels(site)[0]
    t0 = time.perf_counter()
    models = [b.fetch(i) for i in b.stream(ch.id)]
    t_load = time.perf_counter() - t0
    rep = customize(models, local, defaults, top_m=top_m, seed=0, own=None, epochs=100).report
    return {
        "models": len(models),
        "load": t_load,
        "select": rep["seconds"]["select"],
        "fuse": rep["seconds"]["fuse"],
        "total": t_load + rep["seconds"]["select"] + rep["seconds"]["fuse"],
        "test": rep["test"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--publishers", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--out", default="reports/pubsub_service")
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--burst", type=int, default=5000)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="silofl-bench-"))
    n_pub, n = a.publishers, a.rows
    x, y = _hyperplane(n_pub * n + 2000, 0, drift=0.0)
    bounds = Bounds(np.zeros(10), np.ones(10))

    # every publisher: train, record in its own ledger, sign with its own key (the same blobs go to both
    # brokers)
    t0 = time.perf_counter()
    blobs, keys = [], []
    for p in range(n_pub):
        site = f"site{p}"
        folder = SiteFolder.open(work / "sites" / site, site, LIFETIME)
        key = load_signing_key(folder.path)
        sl = slice(p * n, (p + 1) * n)

        def make(sl=sl, site=site, p=p):
            return train(
                "dp-logreg",
                x[sl],
                y[sl],
                publisher=site,
                features=FEATS,
                task="classification",
                bounds=bounds,
                epsilon=1.0,
                delta=1e-5,
                classes=CLASSES,
                seed=p,
            )

        _, blob = folder.release(
            [f"{site}-{i}" for i in range(n)],
            1.0,
            1e-5,
            make,
            lambda data: data,
            seal=lambda data, r, key=key: sign_model(data, key, {**r, "join": JOIN}),
            what="bench",
        )
        blobs.append(blob)
        keys.append(public_key_hex(key))
    t_make = time.perf_counter() - t0
    sub = slice(n_pub * n, n_pub * n + 2000)
    local = LocalData(x[sub], y[sub], FEATS, "classification", CLASSES)
    defaults = {f: 0.5 for f in FEATS}
    results: dict = {}

    # (a) the folder broker
    fb = Broker(work / "folder-broker")
    t0 = time.perf_counter()
    for blob in blobs:
        fb.publish(blob)
    t_post_folder = time.perf_counter() - t0
    fb.join("subscriber")
    fb.subscribe("subscriber", [FEATS[:3]])
    results["folder"] = {
        "post_seconds": t_post_folder,
        **{
            k: subscriber_times(fb, "subscriber", local, defaults, m)
            for k, m in (("All", None), ("top-10", 10))
        },
    }

    # (b) the HTTPS service on loopback
    tls = make_test_certificates(work / "tls", ["127.0.0.1"])
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            "pubsub",
            "serve",
            "--state",
            str(work / "svc"),
            "--port",
            str(port),
            "--cert",
            str(tls["cert"]),
            "--key",
            str(tls["key"]),
            "--rate",
            str(a.rate),
            "--burst",
            str(a.burst),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", verify=str(tls["ca"]), timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        admin = RemoteBroker(url, json.loads((work / "svc" / "admin.json").read_text()), ca=str(tls["ca"]))
        t0 = time.perf_counter()
        tokens = [admin.register(f"site{p}", keys[p], LIFETIME) for p in range(n_pub)]
        tokens.append(admin.register("subscriber", public_key_hex(load_signing_key(work / "sub")), LIFETIME))
        t_register = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p, blob in enumerate(blobs):  # each publisher: its own credential, its own TLS connection
            rb = RemoteBroker(url, {"site": f"site{p}", "token": tokens[p]}, ca=str(tls["ca"]))
            rb._max_bytes = (
                64 * 1024 * 1024
            )  # known from the operator's announcement; saves a /health round trip
            rb.publish(blob)
            rb.close()
        t_post_service = time.perf_counter() - t0
        sb = RemoteBroker(url, {"site": "subscriber", "token": tokens[-1]}, ca=str(tls["ca"]))
        sb.join("subscriber")
        sb.subscribe("subscriber", [FEATS[:3]])
        results["service"] = {
            "post_seconds": t_post_service,
            "register_seconds": t_register,
            **{
                k: subscriber_times(sb, "subscriber", local, defaults, m)
                for k, m in (("All", None), ("top-10", 10))
            },
        }
        sb.close()
        admin.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

    rows = []
    for broker in ("folder", "service"):
        for case in ("All", "top-10"):
            r = results[broker][case]
            rows.append(
                {
                    "broker": broker,
                    "subscriber keeps": case,
                    "models": r["models"],
                    "post s (all publishers)": results[broker]["post_seconds"],
                    "load s": r["load"],
                    "select s": r["select"],
                    "fuse s": r["fuse"],
                    "total s": r["total"],
                    "test accuracy": r["test"],
                }
            )
    ratio = results["service"]["All"]["total"] / results["folder"]["All"]["total"]
    setting = {
        "publishers": n_pub,
        "rows_per_publisher": n,
        "model": "dp-logreg",
        "epsilon": 1.0,
        "make_seconds_train_ledger_sign": t_make,
        "service_register_seconds": results["service"]["register_seconds"],
        "service_rate_limit": [a.rate, a.burst],
        "subscriber_total_ratio_service_over_folder_All": ratio,
        "command": "bench/pubsub_service_scale.py " + " ".join(sys.argv[1:]),
    }
    (out / "results.json").write_text(json.dumps({"setting": setting, "results": results}, indent=2))
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
    body = "".join(
        "| "
        + " | ".join(
            f"{v:.2f}"
            if isinstance(v, float) and k != "test accuracy"
            else (f"{v:.4f}" if isinstance(v, float) else str(v))
            for k, v in r.items()
        )
        + " |\n"
        for r in rows
    )
    md = (
        f"# PubSub-ML scale through the broker service vs the folder broker\n\n"
        f"{n_pub} publishers × {n} rows, dp-logreg ε=1; train + ledger + sign once: {t_make:.1f} s; "
        f"registering {n_pub + 1} sites: {results['service']['register_seconds']:.1f} s.\n\n"
        + head
        + body
        + f"\nsubscriber total (All), service / folder: {ratio:.2f}×\n"
    )
    (out / "table.md").write_text(md)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = [f"{r['broker']}\n{r['subscriber keeps']}" for r in rows]
        bottom = np.zeros(len(rows))
        for part in ("load s", "select s", "fuse s"):
            v = np.array([r[part] for r in rows])
            ax.bar(labels, v, bottom=bottom, label=part.split()[0])
            bottom += v
        ax.set_ylabel("subscriber seconds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "plot.png", dpi=120)
    except Exception as e:  # noqa: BLE001 - the plot is a convenience
        print(f"no plot: {e}")
    print(md)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
