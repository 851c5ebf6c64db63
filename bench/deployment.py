"""Per-round seconds and bytes per site of ProxyFL on three engines, K sites, in one run of this script: the
in-process simulator (`silofl run`), torch.distributed (`silofl launch --survive-faults`, one process per
site, gloo on loopback) and Flower (`silofl deploy local`: a SuperLink and K SuperNodes as processes, TLS,
node authentication, payloads sealed end to end) — as silofl runs it (each site's warm executor, a paced
SuperNode, one message per site per round), as Flower ships it (`flower-stock`: a ClientApp process per
message, the SuperNode's 3 s idle sleep; the same fused protocol), and with 10 ms each way between the sites
and the SuperLink (`flower+20ms`: a delaying TCP relay, as this kernel has no netem).

    python bench/deployment.py [--ks 2,4,8] [--rounds 5] [--out docs/data/deployment.json]
    python bench/deployment.py --requests-only --ks 8   # only the requests per task, counted again

Writes the JSON and docs/deployment.md (the table and how to read it). Scikit-learn's digits, K sites ×
min(120, 1340/K) examples, MLP private and proxy models, evaluation at the last round only (so the seconds
are the protocol's), one torch thread per process. Seconds per round: (training + evaluation) / rounds as
each run's summary measures them on the coordinator; bytes: the payloads a site sends and receives per
round (the engine's count of model bytes), and for Flower the whole frames to and from each site (sealing
and framing included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def args_for(k: int, rounds: int) -> list[str]:
    per = max(30, min(120, 1340 // k))
    return [
        "--method",
        "proxyfl",
        "--dataset",
        "digits",
        "--rounds",
        str(rounds),
        "--samples-per-client",
        str(per),
        "--batch-size",
        str(min(30, per)),
        "--delta",
        "0.001",
        "--proxy-model",
        "mlp",
        "--private-model",
        "mlp",
        "--partition",
        "iid",
        "--test-limit",
        "100",
        "--eval-every",
        str(rounds),
        "--threads",
        "1",
        "--seed",
        "0",
        "--quiet",
    ]


HZ = os.sysconf("SC_CLK_TCK")


def _kind(pid: int, root: int) -> str:
    """What process ``pid`` of a benchmarked command is: by its command line, or for one forked from a fork
    server by the log its output goes to ("other" for anything else, a child not yet exec'd included)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        out = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return "other"
    name = Path(out).name
    for needle, kind in (
        ("flower-superlink", "superlink"),
        ("flower_shim", "supernodes"),
        ("flower-supernode", "supernodes"),
        ("flower-superexec", "serverapp"),
        ("flwr-serverapp", "serverapp"),
        ("flwr-clientapp", "clientapps"),
    ):
        if needle in cmd:
            return kind
    if pid == root:
        return "command"
    if "forkserver" not in cmd:  # e.g. a child between its fork and its exec
        return "other"
    # forked from a fork server (or one): a site's worker, its SuperNode, the ServerApp, a torch.distributed
    # process
    if name == "supernode.log":
        return "supernodes"
    if name == "superlink.log":
        return "serverapp"
    return "workers"


class CpuSampler:
    """The CPU seconds (user + system, from /proc) of a command's process tree, per process, sampled every
    0.1 s, each process counted under its latest kind (a process started by fork and exec changes kind);
    :meth:`mark` snapshots them (a process that ends between two samples loses at most its last 0.1 s)."""

    def __init__(self, root: int):
        self.root = root
        self.cpu: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.marks: dict[str, tuple[float, dict[int, float]]] = {}

    def sample(self) -> None:
        parent = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                parent[int(d)] = (int(stat[1]), (int(stat[11]) + int(stat[12])) / HZ)
        tree, todo = {self.root}, [self.root]
        children: dict[int, list[int]] = {}
        for pid, (pp, _) in parent.items():
            children.setdefault(pp, []).append(pid)
        while todo:
            for c in children.get(todo.pop(), []):
                if c not in tree:
                    tree.add(c)
                    todo.append(c)
        for pid in tree:
            if pid in parent:
                self.cpu[pid] = max(self.cpu.get(pid, 0.0), parent[pid][1])
                kind = _kind(pid, self.root)  # "other" also for a process that has just ended (a zombie)
                if kind != "other" or pid not in self.kind:
                    self.kind[pid] = kind

    def by_kind(self, since: dict[int, float] | None = None, until: dict[int, float] | None = None) -> dict:
        """CPU seconds by kind, between two marks' snapshots (from the start, to now, when not given)."""
        out: dict[str, float] = {}
        for pid, c in (until if until is not None else self.cpu).items():
            k = self.kind[pid]
            out[k] = out.get(k, 0.0) + c - (since or {}).get(pid, 0.0)
        return out

    def mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = (time.monotonic(), dict(self.cpu))


def silofl(
    *args: str,
    timeout: float = 3600,
    env: dict | None = None,
    status: Path | None = None,
    last: int = 0,
    delay_ms: float = 0.0,
) -> dict:
    """Run ``silofl ARGS``; the CPU seconds of its processes by kind (``total``), and, given the deployed
    run's ``status`` file, from the moment round 2 is sent to the moment round ``last`` is (``rounds``: the
    rounds between, so neither the start-up nor the last round's evaluation and the end are in it) and that
    window's wall seconds. ``delay_ms``: the sites and the SuperLink of a ``deploy local`` that far apart each
    way (bench/delayed_deploy.py)."""
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", **(env or {})}
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        start = [sys.executable, "-m", "silofl.cli.main"]
        if delay_ms:
            start = [sys.executable, str(Path(__file__).with_name("delayed_deploy.py")), str(delay_ms)]
        p = subprocess.Popen([*start, *args], stdout=so, stderr=se, env=env)
        cpu = CpuSampler(p.pid)
        deadline = time.monotonic() + timeout
        while p.poll() is None and time.monotonic() < deadline:
            cpu.sample()
            if status is not None and status.is_file():
                try:
                    st = json.loads(status.read_text())
                except ValueError:
                    st = {}
                r = st.get("round") if st.get("state") == "running" else None
                if isinstance(r, int) and r >= 2:
                    cpu.mark("start")
                if isinstance(r, int) and r >= last and "start" in cpu.marks:
                    cpu.mark("end")
            time.sleep(0.1)
        if p.poll() is None:
            p.kill()
        p.wait()
        so.seek(0)
        se.seek(0)
        if p.returncode != 0:
            raise SystemExit(f"silofl {' '.join(args[:3])} failed:\n{so.read()[-2000:]}\n{se.read()[-2000:]}")
    result = {"total": cpu.by_kind()}
    if "start" in cpu.marks and "end" in cpu.marks and last > 2:
        (t0, a), (t1, b) = cpu.marks["start"], cpu.marks["end"]
        result["rounds"] = cpu.by_kind(a, b)
        result["window_s"] = t1 - t0
    return result


ENGINES = "simulator,torch.distributed,flower,flower-stock,flower+20ms"


def measure(engine: str, k: int, rounds: int, out: Path, env: dict | None = None) -> dict:
    a = args_for(k, rounds)
    t0 = time.perf_counter()
    if engine == "simulator":
        cpu = silofl("run", "--clients", str(k), *a, "--out", str(out))
    elif engine == "torch.distributed":
        cpu = silofl(
            "launch",
            "--nproc-per-node",
            str(k),
            "--survive-faults",
            "--clients",
            str(k),
            *a,
            "--peer-timeout",
            "900",
            "--out",
            str(out),
        )
    else:
        env = {**({"SILOFL_FLOWER_STOCK": "1"} if engine == "flower-stock" else {}), **(env or {})}
        cpu = silofl(
            "deploy",
            "local",
            "--sites",
            str(k),
            "--timeout",
            "3000",
            *a,
            "--out",
            str(out),
            env=env,
            status=out / "coordinator" / "status.json",
            last=rounds,
            delay_ms=10.0 if engine == "flower+20ms" else 0.0,
        )
    wall = time.perf_counter() - t0
    s = json.loads((out / "summary.json").read_text())
    per_site = [(r["bytes_sent"] + r["bytes_received"]) / s["rounds_run"] for r in s["final"]["per_client"]]
    row = {
        "engine": engine,
        "k": k,
        "rounds": s["rounds_run"],
        "seconds_per_round": s["seconds_per_round"],
        "payload_bytes_per_site_round": statistics.fmean(per_site),
        "command_wall_s": wall,
        "proxy_acc": statistics.fmean(r["proxy_acc"] for r in s["final"]["per_client"]),
        "epsilon": max(r["epsilon"] for r in s["final"]["per_client"]),
        "cpu_s": cpu["total"],
    }
    if "rounds" in cpu:  # rounds 2 … R-1
        row["round_cpu_s"] = {kind: c / (s["rounds_run"] - 2) for kind, c in cpu["rounds"].items()}
        row["cores_busy"] = sum(cpu["rounds"].values()) / cpu["window_s"]
    e = s["engine"]
    if engine.startswith("flower"):
        frames = [e["frame_bytes_to_sites"][str(i)] + e["frame_bytes_from_sites"][str(i)] for i in range(k)]
        row["frame_bytes_per_site_round"] = statistics.fmean(frames) / s["rounds_run"]
        row["security"] = {x: e[x] for x in ("tls", "node_auth", "sealed")}
        row["setup_s"] = s["deployment"]["setup_s"]
        row["setup_phases_s"] = s["deployment"].get("setup_phases_s")
        row["trace"] = task_trace(out / "deployment" / "logs")
    return row


KINDS = ("superlink", "supernodes", "workers", "serverapp", "clientapps", "command")
ACCESS = re.compile(r'"POST (/v1/[a-z-]+/[a-z-]+) HTTP')
FLEET_PULL_OBJECT = re.compile(r"\[Fleet\.PullObject\] Pull Object with object_id=([0-9a-f]+)")


def requests_per_task(k: int, rounds: int, out: Path, env: dict | None = None) -> dict:
    """The HTTP requests the SuperLink serves per task (one message to a site and its reply), by route: one
    more `deploy local` run with Flower's debug log, which lists every request (the routine ones included)."""
    measure("flower", k, rounds, out, env={"FLWR_LOG_LEVEL": "DEBUG", **(env or {})})
    logs = out / "deployment" / "logs"
    text = (logs / "superlink.log").read_text(errors="replace")
    routes = ACCESS.findall(text)
    counts: dict[str, int] = {}
    for r in routes:
        counts[r] = counts.get(r, 0) + 1
    # the run proper: from the ServerApp's first message to its last confirmed reply (before: the SuperNodes
    # polling while the run starts; after: while it ends and the sites stop)
    first = routes.index("/v1/runtime/push-messages") if "/v1/runtime/push-messages" in routes else 0
    last = max((i for i, r in enumerate(routes) if r == "/v1/runtime/confirm-message-received"), default=-1)
    in_run: dict[str, int] = {}
    for r in routes[first : last + 1]:
        in_run[r] = in_run.get(r, 0) + 1
    tasks = sum(len(TRACE.findall(f.read_text(errors="replace"))) for f in logs.glob("site*.log"))
    # a SuperNode's pulls of one object beyond the first: asked before the ServerApp had pushed it
    pulled = FLEET_PULL_OBJECT.findall(text)
    return {
        "k": k,
        "rounds": rounds,
        "tasks": tasks,
        "per_task": {r: n / tasks for r, n in counts.items()},
        "in_run_per_task": {r: n / tasks for r, n in in_run.items()},
        "fleet_object_repulls_per_task": (len(pulled) - len(set(pulled))) / tasks,
        "env": {x: v for x, v in (env or {}).items()},
    }


TRACE = re.compile(
    r"task (\d+) \(round (\d+)\) at [\d.]+: queued ([\d.]+) s, input ([\d.]+) s, work ([\d.]+) s, "
    r"reply ([\d.]+) s"
)


def task_trace(logs: Path) -> dict | None:
    """Where a task's seconds go at the sites (their executors' trace lines), over the tasks of rounds ≥ 1 but
    the last (the set-up and the final evaluation aside): mean seconds queued (from the coordinator creating
    the message to the site's executor taking it), pulling its input, working, pushing the reply; tasks per
    site and round."""
    rows = []
    for f in sorted(logs.glob("site*.log")):
        rows += [tuple(float(x) for x in m.groups()) for m in TRACE.finditer(f.read_text(errors="replace"))]
    if not rows:
        return None  # stock Flower: no executor, no trace
    last = max(r[1] for r in rows)
    mid = [r for r in rows if 1 <= r[1] < last] or rows
    sites = len(list(logs.glob("site*.log")))
    rounds = max(1, len({r[1] for r in mid}))
    return {
        "queued_s": statistics.fmean(r[2] for r in mid),
        "input_s": statistics.fmean(r[3] for r in mid),
        "work_s": statistics.fmean(r[4] for r in mid),
        "reply_s": statistics.fmean(r[5] for r in mid),
        "tasks_per_site_round": len(mid) / sites / rounds,
    }


# what each route the SuperLink serves is, per task (one message to a site and its reply), and the fewest
# requests Flower 1.41's API allows it: a Message with content is three objects (the Message, its RecordDict,
# the one ConfigRecord holding silofl's frame), each pushed and pulled in a request of its own
ROUTES = {
    "/v1/runtime/push-messages": ("the ServerApp registers a step's K messages, one request for all", None),
    "/v1/runtime/push-object": ("the ServerApp pushes each message's 3 objects, a request each", 3),
    "/v1/fleet/pull-messages": ("a SuperNode asks for its next message: the pull finding it, empty ones", 1),
    "/v1/fleet/pull-object": ("the SuperNode pulls the message's 3 objects (again if not pushed yet)", 3),
    "/v1/fleet/confirm-message-received": ("the SuperNode confirms the message", 1),
    "/v1/fleet/push-messages": ("the SuperNode registers the site's reply", 1),
    "/v1/fleet/push-object": ("the SuperNode pushes the reply's 3 objects, a request each", 3),
    "/v1/runtime/pull-messages": ("the ServerApp polls for the replies, one request for all pending", None),
    "/v1/runtime/pull-object": ("the ServerApp pulls each reply's 3 objects (again if not pushed yet)", 3),
    "/v1/runtime/confirm-message-received": ("the ServerApp confirms the reply", 1),
}


def requests_section(req: dict) -> list[str]:
    """The doc's table of the requests per task, by route, beside the fewest Flower's API allows."""
    k = req["k"]
    lines = [
        "",
        "The requests the SuperLink serves per task (one message to a site and its reply; "
        f"K = {k}, {req['rounds']} rounds, {req['tasks']} tasks; one more `deploy local` run "
        f"with Flower's debug log, which lists them; measured on {req.get('date', 'the date above')}; "
        "*in the run*: from the ServerApp's first message to its last confirmed reply, the SuperNodes' "
        "pulls while the run starts and ends left out):",
        "",
        "| route | requests / task | in the run | fewest | what it is |",
        "|---|---|---|---|---|",
    ]
    run = req.get("in_run_per_task")

    def during(n: float) -> str:
        return "—" if run is None else f"{n:.2f}"

    rare, rare_run, floor = 0.0, 0.0, 0.0
    for route, n in sorted(req["per_task"].items(), key=lambda x: -x[1]):
        if route in ROUTES:
            what, least = ROUTES[route]
            least = 1 / k if least is None else least
            floor += least
            lines.append(
                f"| `{route}` | {n:.2f} | {during((run or {}).get(route, 0.0))} | {least:.2f} | {what} |"
            )
        else:
            rare += n
            rare_run += (run or {}).get(route, 0.0)
    lines.append(
        f"| the others (set-up, heartbeats, the run's task) | {rare:.2f} | {during(rare_run)} | — | |"
    )
    lines.append(
        f"| all | {sum(req['per_task'].values()):.2f} | {during(sum((run or {}).values()))} | {floor:.2f} | |"
    )
    repulls = req.get("fleet_object_repulls_per_task")
    lines += [
        "",
        "Why these: in Flower 1.41 a message travels as content-addressed objects, each pushed and pulled "
        "in a request of its own, and a Message with content is at least three — the Message (its metadata), "
        "its RecordDict (the names of its records) and a record (silofl's whole sealed frame is one bytes "
        "entry of one ConfigRecord; an ArrayRecord would add an Array and its chunks). So 3 objects are "
        "pushed per message and 3 per reply, and pulled again at the other end; *fewest* is that floor. "
        "The rest depends on waiting: a SuperNode's empty pulls while its site waits for the next step "
        "(paced by `flower_shim.Pacer`: one sleep until 3/4 of the shortest of the last intervals "
        "between two messages has passed since the last one, then every 0.1 s), the ServerApp's polls for "
        "the replies (`coordinator.POLL_SHARE`), and "
        "an object pulled before its sender has pushed it (the SuperLink lists a message as soon as it is "
        "registered, before its objects arrive"
        + (f"; {repulls:.2f} such SuperNode pulls per task here" if repulls is not None else "")
        + "). A task's reply and its status (the executor's PushMessages, 3 PushObject and PushTaskOutput) "
        "go to the site's own SuperNode on loopback, not to the SuperLink; Flower 1.41's "
        "`PushTaskOutputRequest` has no field for a message, so they stay separate requests there.",
    ]
    return lines


def write_doc(result: dict, path: Path) -> None:
    rows = result["rows"]
    td = {r["k"]: r["seconds_per_round"] for r in rows if r["engine"] == "torch.distributed"}
    lines = [
        "<!-- generated by: python bench/deployment.py "
        f"--ks {','.join(str(k) for k in result['ks'])} --rounds {result['rounds']} -->",
        "# Deployment: seconds and bytes per round on three engines",
        "",
        f"ProxyFL on scikit-learn's digits, K sites, {result['rounds']} rounds, MLP private and proxy "
        f"models, one "
        "torch thread per process, evaluation at the last round only; measured on "
        f"{result['machine']} ({result['cpus']} cores) on {result['date']} in one run of the command above. "
        "Every engine ran the same seeded configuration and gave the same per-site accuracy and ε (last "
        "columns).",
        "",
        "| K | engine | s / round | × torch.distributed | set-up s | command s | payload kB / site / round | "
        "frame kB / site / round | proxy acc | ε |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        frame = f"{r['frame_bytes_per_site_round'] / 1e3:.1f}" if "frame_bytes_per_site_round" in r else "—"
        ratio = f"{r['seconds_per_round'] / td[r['k']]:.2f}" if td.get(r["k"]) else "—"
        setup = f"{r['setup_s']:.1f}" if "setup_s" in r else "—"
        lines.append(
            f"| {r['k']} | {r['engine']} | {r['seconds_per_round']:.2f} | {ratio} | {setup} | "
            f"{r['command_wall_s']:.1f} | "
            f"{r['payload_bytes_per_site_round'] / 1e3:.1f} | {frame} | {r['proxy_acc']:.4f} | "
            f"{r['epsilon']:.3f} |"
        )
    traced = [r for r in rows if r.get("trace")]
    if traced:
        lines += [
            "",
            "Where a deployed task's seconds go (means over the sites' tasks of the middle rounds, from the "
            "executors' trace lines in each site's log):",
            "",
            "| K | engine | tasks / site / round | queued s | input s | work s | reply s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in traced:
            t = r["trace"]
            lines.append(
                f"| {r['k']} | {r['engine']} | {t['tasks_per_site_round']:.1f} | {t['queued_s']:.3f} | "
                f"{t['input_s']:.3f} | {t['work_s']:.3f} | {t['reply_s']:.3f} |"
            )
    lines += [
        "",
        "Where the machine's CPU goes (seconds of CPU, user + system, read from /proc for every process of "
        "the command; *per round*: from the moment round 2 is sent to the moment the last round is, over "
        "the rounds between, so neither the start-up nor the last round's evaluation and the end are in "
        "it; *cores busy*: that CPU over that window's wall time; *workers*: the sites' workers, or "
        "torch.distributed's processes, and the fork server they come from; *supernodes*: the sites' "
        "SuperNodes, forked from their workers or not):",
        "",
        "| K | engine | s / round | "
        + " | ".join(f"{k} CPU s / round" for k in KINDS)
        + " | CPU s / round | cores busy | CPU s, whole command |",
        "|---|---|---|" + "---|" * (len(KINDS) + 3),
    ]
    for r in rows:
        per = r.get("round_cpu_s")
        cells = [f"{per.get(k, 0.0):.2f}" if per else "—" for k in KINDS]
        total = f"{sum(per.values()):.2f}" if per else "—"
        busy = f"{r['cores_busy']:.2f}" if per else "—"
        lines.append(
            f"| {r['k']} | {r['engine']} | {r['seconds_per_round']:.2f} | "
            + " | ".join(cells)
            + f" | {total} | {busy} | {sum(r['cpu_s'].values()):.1f} |"
        )
    req = result.get("requests")
    if req:
        lines += requests_section(req)
    phased = [r for r in rows if r.get("setup_phases_s")]
    if phased:
        names = list(phased[0]["setup_phases_s"])
        lines += [
            "",
            "Where a local deployment's set-up goes (seconds; the sites start while the SuperLink does):",
            "",
            "| K | engine | " + " | ".join(n.replace("_", " ") for n in names) + " | total |",
            "|---|---|" + "---|" * (len(names) + 1),
        ]
        for r in phased:
            ph = r["setup_phases_s"]
            lines.append(
                f"| {r['k']} | {r['engine']} | "
                + " | ".join(f"{ph.get(n, 0):.1f}" for n in names)
                + f" | {r['setup_s']:.1f} |"
            )
    lines += [
        "",
        "How to read it:",
        "- *payload*: the model bytes a site sends and receives per round, counted by the engine on the "
        "messages "
        "(the same protocol on every engine; Flower's payloads are sealed — X25519 + ChaCha20-Poly1305 + "
        "Ed25519 "
        "and their context, about 170 bytes per payload). *frame*: Flower only — everything the coordinator "
        "sends "
        "to and receives from the site per round: the sealed payloads, the requests' JSON and the figures "
        "the site "
        "reports; TLS records come on top.",
        "- Seconds per round are measured on the coordinator (training and evaluation over the rounds). "
        "*flower* is "
        "`silofl deploy local` as shipped: each site's SuperNode runs with Flower's process isolation and "
        "silofl's "
        "pacing (`silofl.deploy.flower_shim`: no 3 s sleep while a run is on), its tasks taken by the warm "
        "executor "
        "inside the site's worker (`silofl.deploy.executor`: no process per message, the models in memory), "
        "and a "
        "round asks each site one message (`silofl.comm.batch`: the last round's deliveries and, when due, "
        "its evaluation ride with this round's step). *flower-stock* runs the same protocol with Flower as "
        "it ships: a `flwr-clientapp` process per message and the SuperNode's 3 s sleep after an empty pull. "
        "*flower+20ms*: *flower* with a relay holding "
        "every chunk 10 ms each way between the sites and the SuperLink (the kernel here has no `netem`).",
        "- *queued*: from the coordinator creating a message to the site's executor taking it (the "
        "coordinator's "
        "push to the SuperLink, the SuperNode's pull, its doorbell); *input*: pulling the task's message "
        "from the "
        "SuperNode; *work*: the site's own step (training, sealing); *reply*: pushing the reply and the "
        "task's "
        "status. On this machine all K sites, the SuperLink and the coordinator share its cores.",
        "- *set-up*: from `deploy local`'s start of the deployment (keys, site folders) until every "
        "site's SuperNode is connected; *command*: the whole command, its own start, the run, writing "
        "the run folder and stopping every process included. Each site's worker is forked from one fork "
        "server that imported what a site's worker needs once (`silofl.core.forking`: torch, the run loop, "
        "Opacus' accountants, torch's dynamo, which torch.optim loads at the first optimizer, and Flower's "
        "SuperNode), started before the keys and the site folders are made — as torch.distributed's "
        "processes are forked from `silofl launch`'s; each worker forks its paced SuperNode before it "
        "starts a thread; the run is submitted in `deploy local`'s own process, which then takes the run's "
        "ServerApp task from the SuperLink (Flower's process isolation, its SuperExec secret) and forks "
        "Flower's `run_serverapp` from the same server, instead of a `flower-superexec` process starting a "
        "`flwr-serverapp` process (*flower-stock* keeps those); at the end the sites stop together and a "
        "stopped site's process ends without the interpreter's teardown of torch and Flower.",
    ]
    floor = [
        r
        for r in rows
        if r["engine"] == "flower" and r.get("round_cpu_s") and td.get(r["k"]) and r["k"] == max(result["ks"])
    ]
    if floor and req:
        r = floor[0]
        per, pt = r["round_cpu_s"], req["per_task"]
        lines.append(
            f"- *Why Flower stays above torch.distributed here* (K = {r['k']}): a Flower round used "
            f"{sum(per.values()):.2f} s of CPU, the sites' workers {per.get('workers', 0):.2f} s of it "
            "(their training and sealing); the rest is the message path: the SuperLink "
            f"{per.get('superlink', 0):.2f} s, the SuperNodes {per.get('supernodes', 0):.2f} s, the "
            f"ServerApp {per.get('serverapp', 0):.2f} s. Every task is "
            f"{sum(req['per_task'].values()):.0f} HTTPS "
            + (
                f"requests to the SuperLink (counted on {req['date']}, the CPU above on {result['date']}; "
                if req.get("date", result["date"]) != result["date"]
                else "requests to the SuperLink ("
            )
            + f"the ServerApp pushes {pt.get('/v1/runtime/push-object', 0):.1f} "
            f"objects per message and a SuperNode {pt.get('/v1/fleet/push-object', 0):.1f} per reply, a "
            "request each; the SuperNodes' pulls of messages and objects, the empty ones included, are "
            f"{pt.get('/v1/fleet/pull-messages', 0) + pt.get('/v1/fleet/pull-object', 0):.1f}), each a few "
            "milliseconds of the SuperLink's Python (uvicorn, FastAPI, node authentication). With "
            f"{os.cpu_count()} cores for all of it, the round takes about its CPU over the cores busy "
            f"({r['cores_busy']:.2f} here), while torch.distributed's round is the workers' own CPU and a "
            "gloo exchange."
        )
    if result.get("note"):
        lines.append(f"- {result['note']}")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engines", default=ENGINES)
    ap.add_argument("--out", default=str(ROOT / "docs" / "data" / "deployment.json"))
    ap.add_argument("--doc", default=str(ROOT / "docs" / "deployment.md"))
    ap.add_argument("--note", default="", help="A line about the machine's state, added to the doc.")
    ap.add_argument("--render", action="store_true", help="Only write the doc from --out's JSON (no runs).")
    ap.add_argument(
        "--requests-only",
        action="store_true",
        help="Only count the requests per task again (at the largest of --ks) into --out's JSON, then write "
        "the doc.",
    )
    a = ap.parse_args()
    if a.requests_only:
        result = json.loads(Path(a.out).read_text())
        with tempfile.TemporaryDirectory() as tmp:
            k = max(int(x) for x in a.ks.split(","))
            result["requests"] = requests_per_task(k, a.rounds, Path(tmp) / "flower-debug")
        result["requests"]["date"] = time.strftime("%Y-%m-%d")
        print(json.dumps(result["requests"]), flush=True)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        write_doc(result, Path(a.doc))
        return
    if a.render:
        result = json.loads(Path(a.out).read_text())
        if a.note:
            result["note"] = a.note
        write_doc(result, Path(a.doc))
        print(Path(a.doc).read_text())
        return
    ks = [int(k) for k in a.ks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in ks:
            for engine in a.engines.split(","):
                row = measure(engine, k, a.rounds, Path(tmp) / f"{engine}-{k}")
                rows.append(row)
                print(json.dumps(row), flush=True)
        requests = None
        if "flower" in a.engines.split(","):
            requests = requests_per_task(max(ks), a.rounds, Path(tmp) / "flower-debug")
            requests["date"] = time.strftime("%Y-%m-%d")
            print(json.dumps(requests), flush=True)
    result = {
        "ks": ks,
        "rounds": a.rounds,
        "rows": rows,
        "requests": requests,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "note": a.note,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    write_doc(result, Path(a.doc))
    print(Path(a.doc).read_text())


if __name__ == "__main__":
    main()
