"""What a run's targets are, and what follows from it: the task registry.

A run's task is read from its data — a data set's ``task`` metadata (:mod:`silofl.data.datasets`), or a
table's schema (:attr:`silofl.data.schema.Schema.task`) — and decides which ``--metric`` names it computes,
which headline it defaults to and which methods train it. The built-in tasks:

==============  ========================================  ===================  =======================
task            targets                                   metrics              methods
==============  ========================================  ===================  =======================
classification  class indices (n,)                        accuracy, auroc, …   all
segmentation    H×W masks (n, H, W)                       accuracy, dice, iou  all (no --combine)
survival        [time, event, bin, exposures] rows        c_index              not the personalised
                (:func:`~silofl.training.survival.encode_target`)
==============  ========================================  ===================  =======================

A task with its own per-example loss and figures (``survival``) recognises its target tensors
(``accepts``); the training loop (:func:`silofl.training.poisson.dml_loss`) and the evaluation
(:mod:`silofl.training.evaluation`) ask :func:`target_task` for them instead of branching on the task's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from silofl.core.errors import ConfigError


@dataclass(frozen=True)
class Task:
    """One kind of target (see the module doc)."""

    name: str
    metrics: tuple[str, ...]  # the --metric names its runs compute (silofl.training.metrics.METRICS)
    default_metric: str
    # the methods that train it (None: every method); the others refuse with ``refusal``
    methods: tuple[str, ...] | None = None
    refusal: str = ""
    # recognises this task's target tensors (None: the built-in classification/segmentation paths)
    accepts: Callable[[torch.Tensor], bool] | None = None
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # per-example, (B,)
    scores: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None = None  # from (outputs, targets)
    # deep mutual learning (ProxyFL, FML): what a model's partner sees of its (detached) outputs, and the
    # per-example loss (1 − w)·loss + w·divergence from it (None: log-softmax and KL, the classifier's)
    partner_view: Callable[[torch.Tensor], torch.Tensor] | None = None
    distill: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor] | None = None
    # "accuracy" (the configuration's default) stands for the default metric: accuracy is not defined here
    no_accuracy: bool = False


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add ``task`` (a plug-in may add its own)."""
    TASKS[task.name] = task
    return task


def _survival_accepts(y: torch.Tensor) -> bool:
    from silofl.training.survival import is_survival_target

    return is_survival_target(y)


def _survival_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from silofl.training.survival import encoded_loss

    return encoded_loss(out, y)


def _survival_distill(
    out: torch.Tensor, y: torch.Tensor, other: torch.Tensor | None, weight: float
) -> torch.Tensor:
    from silofl.training.survival import distill_loss

    return distill_loss(out, y, other, weight)


def _survival_scores(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    from silofl.training.survival import survival_metrics

    return survival_metrics(out, y)


register_task(Task("classification", ("accuracy", "auroc", "balanced_accuracy", "f1", "ece"), "accuracy"))
register_task(Task("segmentation", ("accuracy", "dice", "iou"), "accuracy"))
register_task(
    Task(
        "survival",
        ("c_index",),
        "c_index",
        methods=(
            "proxyfl",
            "fml",
            "regular",
            "joint",
            "fedavg",
            "avgpush",
            "cwt",
            "fedprox",
            "scaffold",
            "fedavg-adam",
            "fedavg-yogi",
            "fedadam",
            "fednova",
            "rmsprop",
            "dp-fedavg",
            "dp-fedadam",
            "dp-fednova",
            "dp2-rmsprop",
        ),
        refusal="the personalised methods mix or split a classifier's class scores; a survival target "
        "trains in",
        accepts=_survival_accepts,
        loss=_survival_loss,
        scores=_survival_scores,
        partner_view=lambda out: out.detach(),  # the partner's raw outputs: its log hazards
        distill=_survival_distill,
        no_accuracy=True,
    )
)


def task(name: str) -> Task:
    """The registered task ``name``; ConfigError naming the choices else."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[name]


def target_task(y: torch.Tensor) -> Task | None:
    """The registered task with its own loss and figures whose targets ``y`` are, or None (the built-in
    classification/regression/segmentation paths)."""
    for t in TASKS.values():
        if t.accepts is not None and t.accepts(y):
            return t
    return None


def metric_task(metric: str) -> str:
    """The task whose runs compute ``metric``: ``any`` for one every task but those with ``no_accuracy``
    compute (accuracy), else the first task listing it."""
    owners = [t.name for t in TASKS.values() if metric in t.metrics]
    if len(owners) > 1:
        return "any"
    return owners[0] if owners else "classification"


def check_metric(task_name: str, metric: str, where: str) -> str:
    """The headline metric of a run of task ``task_name`` asked for ``metric``: ``metric`` itself, or the
    task's default for ``accuracy`` where accuracy is not defined; ConfigError (one line) for a metric the
    task does not compute."""
    t = task(task_name)
    if metric == "accuracy" and t.no_accuracy:
        return t.default_metric
    if metric not in t.metrics:
        raise ConfigError(
            f"--metric {metric} is not computed for {where} (a {t.name} task); choose "
            + " or ".join(m for m in t.metrics if not (t.no_accuracy and m == "accuracy"))
        )
    return metric


def declared_task(y: torch.Tensor) -> dict[str, str]:
    """What a deployed site says of its targets in its hello: ``{"task": name}`` for a registered task with
    its own loss and figures (:func:`target_task`, e.g. ``survival``), nothing for the built-in paths. A
    public fact about the target's kind (the schema's), no statistic of the data; the coordinator, which
    reads no schema, sets the run's headline from it (:func:`agreed_task`)."""
    t = target_task(y)
    return {"task": t.name} if t is not None else {}


MAX_TASK_NAME = 64


def agreed_task(declared: list[object]) -> str | None:
    """The one task every site declared (:func:`declared_task`; None where none declared one); ConfigError
    (one line) for a name that is no registered task or sites that disagree."""
    names = set()
    for d in declared:
        if d is not None and not (isinstance(d, str) and 0 < len(d) <= MAX_TASK_NAME and d in TASKS):
            shown = repr(d)[:80]
            raise ConfigError(f"a site's hello is malformed: task {shown} is no registered task")
        names.add(d)
    if len(names) > 1:
        shown = ", ".join(
            sorted(str(n) if n is not None else "classification (none declared)" for n in names)
        )
        raise ConfigError(f"the sites' targets differ in task: {shown}")
    (name,) = names or {None}
    return name
