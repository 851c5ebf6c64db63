"""Experiment tracking: a run's figures, round by round, in TensorBoard or MLflow (``--track KIND DIR``).

A :class:`Tracker` gets three calls from the round loop (:mod:`silofl.runner.loop`): :meth:`Tracker.start`
with the resolved config (logged as text / parameters), :meth:`Tracker.log_round` after each evaluated round
with the records that round wrote to ``metrics.jsonl``, and :meth:`Tracker.finish` with the summary;
:meth:`Tracker.close` ends it (a run that stopped before :meth:`Tracker.finish` is marked failed where the
backend has a status). A backend that fails during the run stops tracking with a warning; the run goes on.

Every figure is logged as a scalar tagged ``<label>/<figure>/client<k>``, where the label says what the
figure is a function of (:mod:`silofl.site.base`): ``dp`` (post-processing of a DP release, e.g. the shared
model's accuracy), ``public`` (nothing private: ε and δ — the accountant's output for the mechanism that ran
—, bytes, protocol state) or ``nonprivate`` (the site's data without DP: the private model's accuracy,
un-noised gradient norms). The tracker logs only what the round's records hold, and the records hold a
non-private figure only when its site released it (``report_nonprivate``): a run whose sites keep them logs
none. The labels of a site's figures are the site's own (its evaluation reply's ``labels``); the run's
bookkeeping and a coordinator's figures are labelled here (:data:`RUN_LABELS`); a figure without a label
counts as non-private.

Backends are chosen by name from :data:`TRACKERS`; their packages are imported only when a tracker is opened
(the ``track`` extra: ``pip install 'silofl[track]'``).
"""

from __future__ import annotations

import importlib.util
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError
from silofl.core.extras import MissingExtra

log = logging.getLogger("silofl")

# tag prefixes (the sites' "non-private" is written without "-")
DP, PUBLIC, NONPRIVATE = "dp", "public", "nonprivate"
SITE_LABELS = {"dp": DP, "public": PUBLIC, "non-private": NONPRIVATE}
# figures the run or its coordinator adds to a site's record: ε and δ are the accountant's output for the
# mechanism that ran (its public parameters), bytes are message sizes; a client-level server's v (its
# privatised count) and clip (set from privatised quantiles, or fixed) are DP; its xi/phi/lambda/cos_std (of
# the un-noised sum) are not
RUN_LABELS = {
    "epsilon": PUBLIC,
    "delta": PUBLIC,
    "bytes_sent": PUBLIC,
    "bytes_received": PUBLIC,
    "active": PUBLIC,
    "epsilon_hospital": PUBLIC,
    "epsilon_subclient": PUBLIC,
    "v": DP,
    "clip": DP,
}
NOT_FIGURES = ("round", "client")


def label_of(key: str, site_labels: dict[str, str]) -> str:
    """The tag prefix of figure ``key`` of a record: the site's label, else the run's, else non-private."""
    if key in site_labels:
        return SITE_LABELS.get(site_labels[key], NONPRIVATE)
    return RUN_LABELS.get(key, NONPRIVATE)


def scalars(records: list[dict], labels: dict[int, dict[str, str]]) -> dict[str, float]:
    """``<label>/<figure>/client<k>`` -> value for every number in a round's records (None, text skipped)."""
    out: dict[str, float] = {}
    for r in records:
        k = r["client"]
        for key, v in r.items():
            if key in NOT_FIGURES or v is None or isinstance(v, str):
                continue
            if not isinstance(v, (bool, int, float)) or not math.isfinite(float(v)):
                continue
            out[f"{label_of(key, labels.get(k, {}))}/{key}/client{k}"] = float(v)
    return out


def config_params(cfg: Any) -> dict[str, str]:
    """The resolved config as flat text parameters (the method's options beside the common settings)."""
    return {k: str(v) for k, v in sorted(cfg.to_flat().items()) if k != "track"}


class Tracker(ABC):
    """Where a run's figures go besides its run folder (see the module doc). A backend that fails while
    the run goes on (a full disk, a locked store) is logged once and stops tracking; the run, its folder
    and its ledgers carry on."""

    def __init__(self, where: Path):
        self.where = where
        self.finished = False
        self.failed: str | None = None

    def start(self, cfg: Any) -> None:
        """Log the run's resolved config."""
        self._guard(self._start, cfg)

    def log_round(self, rnd: int, records: list[dict], labels: dict[int, dict[str, str]]) -> None:
        """Log one evaluated round's records (``labels``: each site's labels of its figures)."""
        self._guard(self._log_round, rnd, records, labels)

    def finish(self, summary: dict) -> None:
        """The run ended normally."""
        self.finished = True

    def close(self) -> None:
        """Flush and release (a failed status where :meth:`finish` was not called)."""
        try:
            self._close()
        except Exception as e:  # noqa: BLE001 - the run is over and written: tracking must not turn it into a crash
            log.warning("tracking (%s) could not be closed: %s", self.where, e)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        if self.failed is not None:
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a side channel: never the reason a run (and its privacy spend) is lost
            self.failed = f"{type(e).__name__}: {e}"
            log.warning(
                "tracking to %s stopped: %s (the run goes on; its folder has every figure)",
                self.where,
                self.failed,
            )

    @abstractmethod
    def _start(self, cfg: Any) -> None: ...

    @abstractmethod
    def _log_round(self, rnd: int, records: list[dict], labels: dict[int, dict[str, str]]) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...


def _run_dir(where: Path, name: str) -> Path:
    """``where/name``, or ``where/name-2``, ``-3``… when taken: every run keeps its own event files."""
    p, i = where / name, 1
    while p.exists():
        i += 1
        p = where / f"{name}-{i}"
    return p


class TensorBoardTracker(Tracker):
    """Event files under ``DIR/<run name>`` (``tensorboard --logdir DIR``): scalars per round, the config as
    text."""

    def __init__(self, where: Path):
        super().__init__(where)
        self.writer: Any = None

    def _start(self, cfg: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = _run_dir(self.where, Path(cfg.out).name or "run")
        self.writer = SummaryWriter(log_dir=str(self.path))
        self.writer.add_text("config", "```yaml\n" + cfg.to_yaml() + "```", global_step=0)

    def _log_round(self, rnd: int, records: list[dict], labels: dict[int, dict[str, str]]) -> None:
        for tag, v in scalars(records, labels).items():
            self.writer.add_scalar(tag, v, global_step=rnd)
        self.writer.flush()

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MlflowTracker(Tracker):
    """An MLflow run in the local store ``sqlite:///DIR/mlflow.db`` (artifacts under ``DIR/artifacts``; no
    server: ``mlflow ui --backend-store-uri sqlite:///DIR/mlflow.db``): metrics per round, the config as
    parameters and as ``config.yaml``."""

    EXPERIMENT = "silofl"

    def __init__(self, where: Path):
        super().__init__(where)
        self.client: Any = None
        self.run_id: str | None = None

    @staticmethod
    def uri(where: Path) -> str:
        """The tracking URI of the store in ``where``."""
        return f"sqlite:///{where.resolve() / 'mlflow.db'}"

    def _start(self, cfg: Any) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.where.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri(self.where))
        exp = self.client.get_experiment_by_name(self.EXPERIMENT)
        eid = (
            exp.experiment_id
            if exp is not None
            else self.client.create_experiment(
                self.EXPERIMENT, artifact_location=(self.where.resolve() / "artifacts").as_uri()
            )
        )
        run = self.client.create_run(
            eid,
            run_name=Path(cfg.out).name or "run",
            tags={
                "silofl.out": str(Path(cfg.out).resolve()),
                "silofl.method": cfg.method,
                "silofl.dataset": cfg.dataset,
                "silofl.privacy": cfg.privacy,
            },
        )
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in config_params(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, cfg.to_yaml(), "config.yaml")

    def _log_round(self, rnd: int, records: list[dict], labels: dict[int, dict[str, str]]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, v, now, rnd) for tag, v in scalars(records, labels).items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def _close(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(
                self.run_id, status="FINISHED" if self.finished and not self.failed else "FAILED"
            )
            self.run_id = None


TRACKERS: dict[str, tuple[Callable[[Path], Tracker], str, str]] = {
    # kind: (class, module it needs, the package that provides it)
    "tensorboard": (TensorBoardTracker, "tensorboard", "tensorboard"),
    "mlflow": (MlflowTracker, "mlflow", "mlflow-skinny"),
}


def check_available(kind: str) -> None:
    """ConfigError unless ``kind`` names a tracker whose package is installed."""
    if kind not in TRACKERS:
        raise ConfigError(f"unknown tracker {kind!r} for --track; choose one of: {', '.join(TRACKERS)}")
    _, module, package = TRACKERS[kind]
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(module, "track", f"--track {kind} ({package})")


def open_tracker(track: tuple[str, str] | None) -> Tracker | None:
    """The tracker of ``--track KIND DIR`` (None without one)."""
    if track is None:
        return None
    kind, where = track
    check_available(kind)
    return TRACKERS[kind][0](Path(where))
