"""In-process simulator: every client in one process, messages through InProcessTransport.

``run(cfg)`` loads and partitions the data, builds the method's clients, runs the rounds with a
progress display, evaluates every ``eval_every`` rounds (and at the last), and writes the run
folder. It returns the summary dict.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from silofl.config import RunConfig, check_against_data
from silofl.data import load_dataset, partition
from silofl.data.formats import site_split
from silofl.errors import BudgetExhausted, ConfigError
from silofl.methods.registry import build_protocol, method_info
from silofl.report import RunFolder, plot_run
from silofl.report.plots import ACC_KEYS, plot_server_rounds
from silofl.report.run_folder import mean_std, write_models
from silofl.runtime.transport import InProcessTransport

log = logging.getLogger("silofl")

PRIVACY_NOTES = {
    "strict": "formal (ε, δ)-DP guarantee for each client's proxy and everything derived from it "
    "(β = 0: the proxy's per-example gradients depend only on that example and its label)",
    "paper": "NOT a formal guarantee: with β > 0 the proxy distils from the private model, a non-private "
    "function of the whole local data set, so DP-SGD's sensitivity bound does not hold; ε is what the "
    "accountant reports for the DP-SGD mechanism alone",
    "off": "no differential privacy: the shared model is trained without clipping or noise",
    "client": "formal client-level (ε, δ)-DP guarantee for one {unit} (all of its records at once) for the global "
    "model and everything the server releases; the server is trusted to add the noise (central DP)",
    "single": "formal (ε, δ)-DP guarantee for each client's DP model (DP-SGD on cross-entropy; the privacy "
    "mode's β does not apply to a method without mutual learning)",
}


def privacy_note(cfg: RunConfig) -> tuple[str, bool]:
    """(note, formal) for the run's privacy mode and method."""
    if not cfg.is_private:
        return PRIVACY_NOTES["off"], False
    if cfg.is_client_level:
        return PRIVACY_NOTES["client"].format(unit=cfg.privacy_unit), True
    if not method_info(cfg.method).mutual_learning:
        return PRIVACY_NOTES["single"], True
    return PRIVACY_NOTES[cfg.privacy], cfg.privacy == "strict"


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prepare_data(cfg: RunConfig, device: torch.device, data=None):
    """Load (unless ``data`` is given, already loaded for this config's data set) and partition."""
    if data is None:
        data = load_dataset(cfg.dataset, cfg.data_dir, image_size=cfg.image_size, max_bag_size=cfg.max_bag_size,
                            seed=cfg.seed)
    if cfg.partition == "site":
        shards, internal, external, data.sites = site_split(data, cfg.clients)
        data.internal_tests = [(data.x_test[i].to(device), data.y_test[i].to(device)) for i in internal]
        ext_sites = sorted(set(data.test_groups[external]) - set(data.sites))
        data.test_set = (f"external: held-out bags of sites {', '.join(ext_sites)} (no client trains on them)"
                         if ext_sites else "every held-out bag (no site is left out of training)")
        x_test, y_test = data.x_test[external], data.y_test[external]
        if cfg.test_limit is not None:
            x_test, y_test = x_test[: cfg.test_limit], y_test[: cfg.test_limit]
    else:
        rng = np.random.default_rng(cfg.seed)
        shards = partition(
            cfg.partition, data.y_train.numpy(), cfg.clients, cfg.samples_per_client, rng,
            p=cfg.p_major, alpha=cfg.dirichlet_alpha,
        )
        x_test, y_test = data.test_split(cfg.test_limit)
    check_against_data(cfg, [len(s) for s in shards])
    parts = [(data.x_train[s].to(device), data.y_train[s].to(device)) for s in shards]
    return data, parts, x_test.to(device), y_test.to(device)


def build(cfg: RunConfig, data, parts, transport=None):
    """The method's protocol over an in-process transport (or the one given)."""
    return build_protocol(cfg, data, parts, transport if transport is not None else InProcessTransport())


CHECKPOINT_DIR = "checkpoint"
# options that may differ between a run and its resumption
RESUMABLE_CHANGES = ("rounds", "threads", "checkpoint_every")


def _checkpoint_state(protocol, tr, last, left_log, rejected_log, train_s, eval_s, cfg) -> tuple[dict, dict]:
    states = dict(protocol.state_dict())
    states["simulator"] = {"torch_rng": torch.get_rng_state()}
    run_state = {"config": cfg.to_dict(), "left": left_log, "rejected": rejected_log, "train_s": train_s,
                 "eval_s": eval_s, "last": {str(k): v for k, v in last.items()},
                 "bytes_sent": {str(k): v for k, v in tr.bytes_sent.items()},
                 "bytes_received": {str(k): v for k, v in tr.bytes_received.items()}}
    return states, run_state


def _checkpoint_root(cfg: RunConfig, tr) -> Path:
    """``OUT/checkpoint``; between processes each writes its own nodes under ``OUT/checkpoint/rankR``."""
    root = Path(cfg.out) / CHECKPOINT_DIR
    return root / f"rank{tr.rank}" if hasattr(tr, "rank") else root


def _resume(cfg: RunConfig, protocol, root: Path) -> tuple[int, dict]:
    """Load the latest checkpoint under ``root`` into the protocol; (its round, the run state).

    Between processes every process resumes from the same round: the latest one all of them completed
    (each keeps its last two, so a crash while writing leaves an earlier common one). A client whose
    own latest checkpoint is newer keeps that checkpoint's accountant: rounds run again are counted
    again, and the privacy spend never goes back."""
    from silofl.runtime.checkpoint import load_run, saved_rounds

    tr = protocol.transport
    rounds = saved_rounds(root)
    common = tr.all_min(max(rounds, default=0))
    if common == 0:
        raise ConfigError(f"no checkpoint to resume from in {root} (run with --checkpoint-every N first)"
                          if not rounds else "a process of the run has no checkpoint to resume from")
    rnd, states, run_state = load_run(root, common)
    if rounds[-1] > rnd:
        _, newest, _ = load_run(root, rounds[-1])
        for node, state in newest.items():
            if isinstance(state, dict) and state.get("accountant") is not None:
                states[node]["accountant"] = state["accountant"]
                log.warning("node %d resumes from round %d but keeps its accountant of round %d: rounds %d–%d are "
                            "counted again", node, rnd, rounds[-1], rnd + 1, rounds[-1])
    saved = RunConfig.from_dict(run_state["config"]).to_dict()
    want = cfg.to_dict()
    diff = sorted(k for k in want if k not in RESUMABLE_CHANGES and saved.get(k) != want[k])
    if diff:
        raise ConfigError(f"cannot resume {cfg.out}: the checkpoint was written with different options "
                          f"({', '.join(f'{k}={saved.get(k)!r}' for k in diff)}); only {', '.join(RESUMABLE_CHANGES)} may change")
    if rnd >= cfg.rounds:
        raise ConfigError(f"the checkpoint of {cfg.out} is at round {rnd}; ask for more rounds than that to resume")
    torch.set_rng_state(states.pop("simulator")["torch_rng"])
    protocol.load_state_dict(states)
    for k, v in run_state["bytes_sent"].items():
        tr.bytes_sent[int(k)] = v
    for k, v in run_state["bytes_received"].items():
        tr.bytes_received[int(k)] = v
    return rnd, run_state


def run(cfg: RunConfig, progress: bool = True, console=None, resume: bool = False, transport=None) -> dict | None:
    """Run ``cfg`` and write its run folder; ``resume`` continues from the folder's latest checkpoint
    (models, optimizers, accountants, RNGs: the privacy spend carries on, it never restarts).

    With a ``transport`` between processes (:mod:`silofl.runtime.distributed`) this runs the clients
    of this process only; the reporting process gathers every process's records and writes the same
    run folder, and returns the summary (the others return None)."""
    cfg = cfg.resolve()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    t_start = time.perf_counter()
    data, parts, x_test, y_test = prepare_data(cfg, device)
    tr = transport if transport is not None else InProcessTransport()
    distributed = transport is not None
    if distributed:
        from silofl.runtime.distributed import check_method, inject_fault

        check_method(cfg.method)
    parts = [(x, y) if tr.is_local(k) else (None, None) for k, (x, y) in enumerate(parts)]  # keep only our shards
    info = method_info(cfg.method)
    protocol = build(cfg, data, parts, tr)
    clients = protocol.clients
    mine = protocol.local(clients)
    verdict = tr.agree({c.cid: c.can_continue() for c in mine}, len(clients))
    if not any(verdict.values()):
        raise BudgetExhausted(protocol.budget_message())
    last: dict[int, dict] = {}
    left_log: list[dict] = []
    rejected_log: list[dict] = []
    train_s = eval_s = 0.0
    rounds_run = 0
    reporting = tr.writes_reports
    folder = None
    if resume:
        rounds_run, rs = _resume(cfg, protocol, _checkpoint_root(cfg, tr))
        left_log, rejected_log, train_s, eval_s = rs["left"], rs["rejected"], rs["train_s"], rs["eval_s"]
        last = {int(k): v for k, v in rs["last"].items()}
        log.info("resuming %s after round %d", cfg.out, rounds_run)
        folder = RunFolder(cfg.out, keep_until=rounds_run) if reporting else None
    else:
        if reporting:
            folder = RunFolder(cfg.out)
        protocol.start()
    if folder is not None:
        folder.write_config(cfg)
    first = rounds_run + 1
    # per-client internal test sets (partition "site"); Joint pools every site, so it has none
    internal = data.internal_tests if data.internal_tests and len(data.internal_tests) == len(clients) else None

    bar = _progress(console) if progress and reporting else nullcontext()
    with bar as p:
        task = p.add_task(info.name, total=cfg.rounds, completed=first - 1) if p else None
        for rnd in range(first, cfg.rounds + 1):
            if distributed:
                tr.round = rnd
                inject_fault(tr.rank, rnd)
            t0 = time.perf_counter()
            ev = protocol.run_round(rnd)
            train_s += time.perf_counter() - t0
            rounds_run = rnd
            left_log += [{"client": c, "round": rnd, "reason": "budget spent"} for c in ev.left]
            left_log += [{"client": c, "round": rnd, "reason": f"process lost: {why}"} for c, why in ev.lost.items()]
            rejected_log += ev.rejected
            if rnd % cfg.eval_every == 0 or rnd == cfg.rounds or ev.left or ev.lost:
                t0 = time.perf_counter()
                records = []
                for cid, accs in protocol.evaluate(x_test, y_test, rnd).items():
                    c = clients[cid]
                    if internal:
                        accs.update({f"{k}_internal": v for k, v in c.evaluate(*internal[cid]).items()})
                    records.append({"round": rnd, "client": cid, "active": c.active, **accs,
                                    "epsilon": c.epsilon(), "delta": cfg.delta if cfg.is_private else None,
                                    "bytes_sent": tr.bytes_sent[cid], "bytes_received": tr.bytes_received[cid],
                                    **protocol.extra_metrics(c), **c.last_train})
                gathered = tr.gather_json(records)
                if gathered is not None:
                    records = sorted((r for part in gathered for r in part), key=lambda r: r["client"])
                    last.update({r["client"]: r for r in records})
                    folder.add_metrics(records)
                eval_s += time.perf_counter() - t0
                if p and records:
                    p.update(task, description=_describe(info, records))
            if cfg.checkpoint_every and (rnd % cfg.checkpoint_every == 0 or rnd == cfg.rounds):
                from silofl.runtime.checkpoint import save_run

                save_run(_checkpoint_root(cfg, tr), rnd,
                         *_checkpoint_state(protocol, tr, last, left_log, rejected_log, train_s, eval_s, cfg),
                         keep=2 if distributed else 1)
            if p:
                p.update(task, advance=1)
            if not protocol.active_ids:
                log.info("every client has left the protocol after round %d", rnd)
                break

    wall = time.perf_counter() - t_start
    # what only each process knows: its clients' final figures and models, its nodes' bytes, its rejections
    models = write_models(cfg.out, mine)
    local_nodes = sorted(n for n in set(tr.bytes_sent) | set(tr.bytes_received) if tr.is_local(n))
    report = {
        "clients": [{"client": c.cid, "architectures": c.architectures(), "epsilon": c.epsilon(), "left_at": c.left_at,
                     "privacy": c.privacy_report()} for c in mine],
        "bytes": [[n, tr.bytes_sent[n], tr.bytes_received[n]] for n in local_nodes],
        "receive_s": {str(n): v for n, v in getattr(tr, "wait_s", {}).items()},
        "models": models, "rejected": rejected_log,
    }
    gathered = tr.gather_json(report)
    if distributed:
        tr.close()
    if gathered is None:
        return None
    finals = sorted((c for g in gathered for c in g["clients"]), key=lambda c: c["client"])
    sent = {n: s_ for g in gathered for n, s_, _ in g["bytes"]}
    received = {n: r for g in gathered for n, _, r in g["bytes"]}
    rejected_log = [r for g in gathered for r in g["rejected"]]
    acc_keys = [k + sfx for sfx in ("", "_internal") for k in ACC_KEYS if any(k + sfx in r for r in last.values())]
    per_client = [
        {"client": f["client"], **{f"{role}_model": arch for role, arch in f["architectures"].items()},
         "round": last.get(f["client"], {}).get("round"), **{k: last.get(f["client"], {}).get(k) for k in acc_keys},
         "epsilon": f["epsilon"], "left_at": f["left_at"],
         "bytes_sent": sent.get(f["client"], 0), "bytes_received": received.get(f["client"], 0)}
        for f in finals
    ]
    note, formal = privacy_note(cfg)
    nodes = sorted(set(sent) | set(received))
    summary = {
        "method": cfg.method,
        "headline": info.headline,
        "dataset": cfg.dataset,
        "data_source": data.source,
        "test_set": data.test_set,
        "sites": data.sites,
        "clients": cfg.clients,
        "sites_trained": len(clients),
        "rounds_requested": cfg.rounds,
        "rounds_run": rounds_run,
        "privacy": {
            "mode": cfg.privacy,
            "formal_guarantee": formal,
            "note": note,
            "unit": ("one training example of the pooled data set (example-level DP)" if cfg.method == "joint"
                     else "one training example of one client (example-level DP, per client)"),
            "delta": cfg.delta if cfg.is_private else None,
            "accountant": mine[0].accountant.name if cfg.is_private else None,
            "dml_alpha": cfg.dml_alpha if info.mutual_learning else None,
            "dml_beta": cfg.dml_beta if info.mutual_learning else None,
            **protocol.privacy_summary(),
        },
        "final": {
            "per_client": per_client,
            **{k: mean_std([r[k] for r in per_client]) for k in acc_keys},
            "epsilon": mean_std([r["epsilon"] for r in per_client]),
        },
        "wall_time_s": wall,
        "train_time_s": train_s,
        "eval_time_s": eval_s,
        "seconds_per_round": (train_s + eval_s) / max(1, rounds_run),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "processes": len(gathered),
        "accounting": [f["privacy"] for f in finals],
        "left": left_log,
        "rejected_messages": rejected_log,
        "bytes": {
            "sent": {str(n): sent.get(n, 0) for n in nodes},
            "received": {str(n): received.get(n, 0) for n in nodes},
            "server_node": protocol.server_id if info.exchange == "server" else None,
            "total_sent": sum(sent.values()),
            "per_client_mean": statistics.fmean(r["bytes_sent"] + r["bytes_received"] for r in per_client),
        },
    }
    if distributed:  # measured between processes: seconds each node spent in receive, waiting included
        summary["lost_processes"] = {str(r): why for r, why in sorted(tr.lost.items())}
        summary["receive_seconds"] = {k: v for g in gathered for k, v in g["receive_s"].items()}
    history = protocol.round_history()
    if history:
        summary["server_rounds"] = history
    summary["models"] = [m for g in gathered for m in g["models"]]
    folder.write_metrics_csv()
    if folder.records:
        eps_note = {"paper": "ε: NOT a formal guarantee (paper mode)", "off": "no DP"}.get(cfg.privacy, "")
        if formal:
            eps_note = ""
        summary["plots"] = [plot_run(folder.records, folder.path / "accuracy_epsilon.png",
                                     title=f"{info.name} on {cfg.dataset}, {cfg.clients} clients, privacy {cfg.privacy}",
                                     epsilon_note=eps_note, delta=cfg.delta if cfg.is_private else None).name]
    if history:
        summary.setdefault("plots", []).append(
            plot_server_rounds(history, folder.path / "server_rounds.png",
                               title=f"{info.name}: noise level, diversity and sub-clients per round").name)
    folder.write_summary(summary)
    return summary


def _describe(info, records: list[dict]) -> str:
    accs = " ".join(
        f"{k.removesuffix('_acc')} {statistics.fmean(r[k] for r in records):.3f}"
        for k in ACC_KEYS if all(k in r for r in records)
    )
    eps = [r["epsilon"] for r in records if r["epsilon"] is not None]
    e = f" ε {max(eps):.2f}" if eps else ""
    return f"{info.name} {accs}{e}"


def _progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        disable=bool(os.environ.get("SILOFL_NO_PROGRESS")),
    )
