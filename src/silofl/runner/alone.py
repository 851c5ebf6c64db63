""" "How does this compare with training alone?": the same sites, split and rounds trained by each site on its
own
data without DP (Regular, privacy off) — the line a collaboration under a budget has to beat."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from silofl.runner.config import RunConfig
from silofl.training.metrics import METRICS, higher_is_better, metric_field, metric_label

# what going alone does not take from the run: its method, privacy mechanism, combination, output and
# reporting.
# Everything else — the data set and its sources, schema, split, sizes, features, evaluation — is copied, so
# the
# reference trains on the same rows, with the same inputs, and is scored on the same test set
NOT_COPIED = (
    "method",
    "privacy",
    "noise_multiplier",
    "clip",
    "delta",
    "accountant",
    "target_epsilon",
    "target_epsilons",
    "calibrate_noise",
    "out",
    "eval_every",
    "checkpoint_every",
    "report_nonprivate",
    "split_seed",
    "combine",
    "combine_holdout",
    "combine_epochs",
    "combine_l2",
    "combine_balance",
    "track",
)


def alone_config(cfg: RunConfig, split_seed: int | None) -> RunConfig:
    """Regular without DP on ``cfg``'s split: every data and feature setting of ``cfg`` (same data, sources,
    clients,
    examples, rounds, features, test set), the run's private architecture (else its shared one)."""
    flat = {k: getattr(cfg, k) for k in RunConfig.common_fields() if k not in NOT_COPIED}
    regular = RunConfig.from_dict({"method": "regular"}).options
    opts = {
        k: getattr(cfg.options, k) for k in regular.field_names() if hasattr(cfg.options, k)
    }  # same training
    if "private_model" not in opts and getattr(
        cfg.options, "proxy_model", None
    ):  # no private model: the shared one
        opts["private_model"] = cfg.options.proxy_model
    if (
        opts.get("private_lr") is not None
    ):  # the run trains its non-DP models with Adam at private_lr: so does alone
        opts.update(optimizer="adam", momentum=0.0, nesterov=False, lr=opts["private_lr"], augmult=0)
    return RunConfig.from_dict(
        {
            **flat,
            **opts,
            "method": "regular",
            "privacy": "off",
            "split_seed": split_seed,
            "eval_every": cfg.rounds,
            "out": str(Path(cfg.out) / "alone"),
        },
        strict=False,
    )


def compare_with_alone(cfg: RunConfig, summary: dict, console=None) -> dict:
    """Run the go-it-alone baseline into ``OUT/alone`` and add the comparison to ``OUT/summary.json``."""
    from silofl.runner.loop import run

    metric = getattr(cfg, "metric", "accuracy")
    suffix = "_" + METRICS[metric]  # the figures compared: --metric's (accuracy by default)
    alone = run(alone_config(cfg, summary.get("data_split_seed")), progress=False)
    base = alone["final"][metric_field("private_acc", metric)]["mean"]
    fin = summary["final"]
    mine = {
        k: fin[k]["mean"]
        for k in fin
        if k.endswith(suffix) and isinstance(fin[k], dict) and fin[k].get("mean") is not None
    }
    eps = fin["epsilon"]["mean"]
    result = {
        f"alone_{metric_field('private_acc', metric)}": base,
        "alone_run": str(Path(cfg.out) / "alone"),
        "this_run": mine,
        "difference": {k: v - base for k, v in mine.items()} if base is not None else {},
        "epsilon": eps,
        "metric": metric,
        "alone": {
            k: v["mean"]
            for k, v in alone["final"].items()
            if k.startswith("private_") and isinstance(v, dict) and not k.endswith("_internal")
        },
        "note": "training alone: Regular without DP on the same split, examples, rounds, features and "
        "architecture",
    }
    path = Path(cfg.out) / "summary.json"
    data = json.loads(path.read_text())
    data["vs_alone"] = result
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    _decide(cfg, data, console)
    if console is not None and base is not None:
        parts = ", ".join(f"{k.removesuffix(suffix)} {v:.3f} ({v - base:+.3f})" for k, v in mine.items())
        eps_txt = f" at ε = {eps:.2f}" if eps is not None else ""
        what = (
            ""
            if metric == "accuracy"
            else f", {metric_label(metric)}{'' if higher_is_better(metric) else ', lower is better'}"
        )
        console.print(
            f"[bold]vs training alone[/] (Regular, no DP, same split and rounds{what}: {base:.3f}): "
            f"{parts}{eps_txt}"
        )
    return result


def _decide(cfg: RunConfig, summary: dict, console=None) -> None:
    """The run's decision report (silofl.runner.decision) again, now with going alone on the same rows: the
    split is drawn again from the recorded seed (the same rows the run and the alone run trained on)."""
    import torch

    from silofl.runner.data import prepare_split
    from silofl.runner.decision import report

    seed = summary.get("data_split_seed")
    split = prepare_split(dataclasses.replace(cfg, split_seed=seed), torch.device("cpu"))
    report(cfg, split, summary, Path(cfg.out), console, alone=Path(cfg.out) / "alone")
