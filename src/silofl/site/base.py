"""The site: one institution's party, driven through :meth:`Site.handle`.

An engine (:mod:`silofl.comm.engine`) delivers a step name and a request :class:`Message`; the site runs
``on_<step>`` and replies. Every reply says whether the site can pay for another round
(``can_continue``), so a coordinator never needs to know a site's budget. What a site holds never
leaves it except through its replies: the packets a method's steps put there, and the figures the
common steps below report.

Common steps: ``hello`` (public facts: data size, architectures), ``status``, ``leave``,
``evaluate`` (score its models on its test sets), ``save``/``load``/``checkpoints`` (its own
checkpoint files), ``finish`` (write its final models, report its privacy accounting).

Every figure a site reports carries a label (:data:`DP`, :data:`PUBLIC`, :data:`NONPRIVATE`,
:meth:`Site.metric_label`). A figure computed from non-private data — the private model's accuracy,
un-noised per-example gradient norms — leaves the site only if the site chose to release it
(``release_nonprivate``); otherwise it is written to the site's own folder and nowhere else.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from silofl.comm.messages import Message
from silofl.core.checkpoint import load_node, save_node
from silofl.core.errors import ConfigError, SiloflError
from silofl.models import ModelSpec
from silofl.privacy.ledger import Ledger
from silofl.training.metrics import acc_field_of

if TYPE_CHECKING:
    from silofl.site.combine import Combination

log = logging.getLogger("silofl")

DP, PUBLIC, NONPRIVATE = "dp", "public", "non-private"


class Site(ABC):
    """One party that holds data (see the module doc). Subclasses add models and the method's steps."""

    cid: int

    def __init__(self, cid: int):
        self.cid = cid
        self.active = True
        self.left_at: int | None = None
        self.last_train: dict = {}
        self.tests: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # "external" (shared), "internal" (own)
        self.eval_cache: dict | None = None  # set by an in-process engine for one evaluate call
        self.wire_cache: dict | None = (
            None  # lent by silofl.comm.engine.run_here for one step: shared decoding
        )
        # how this site turns its raw rows or images into model inputs (silofl.data.preprocessing JSON);
        # written next to its models, for `silofl predict` and `silofl export`
        self.preprocessing: dict | None = None
        # the feature stage between preprocessing and the models (silofl.features record); written next to its
        # models
        self.features: dict | None = None
        self.ledger: Ledger | None = None  # the site's persistent privacy ledger (open_folder)
        self.folder: Path | None = None  # the site's own folder: its ledger and the figures it keeps
        self.run_label = "run"
        self.release_nonprivate = True  # report figures computed from non-private data (the site's choice)
        self.combination: Combination | None = (
            None  # its own model fused with the DP ones (silofl.site.combine)
        )

    def open_folder(
        self, folder: str | Path, run_label: str = "run", release_nonprivate: bool = True
    ) -> None:
        """Keep this site's ledger (its privacy spend, recomputed from it: :mod:`silofl.privacy.ledger`) and
        the figures it does not release in ``folder``; ``release_nonprivate``: whether it reports figures
        computed from non-private data."""
        self.folder = Path(folder)
        self.ledger = Ledger(self.folder)
        self.run_label = run_label
        self.release_nonprivate = release_nonprivate
        self.restore_spend()

    def restore_spend(self) -> None:
        """Rebuild the site's accountants from its ledger (sites with a mechanism override this)."""
        return None

    # ------------------------------------------------------------------ the seam
    def handle(self, step: str, msg: Message) -> Message:
        """Run step ``step`` on request ``msg`` and return the reply."""
        fn = getattr(self, "on_" + step, None)
        if fn is None or not callable(fn):
            raise SiloflError(f"site {self.cid} has no step {step!r}")
        reply = fn(msg) or Message()
        reply.meta["can_continue"] = bool(self.active and self.can_continue())
        return reply

    def on_batch(self, msg: Message) -> Message:
        """Several steps in one request (:mod:`silofl.comm.batch`), run in order."""
        from silofl.comm import batch

        return batch.reply([self.handle(step, part) for step, part in batch.split(msg)])

    # ------------------------------------------------------------------ what every site provides
    @abstractmethod
    def can_continue(self) -> bool:
        """False when one more round would exceed the site's privacy budget."""

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, cache: dict | None = None) -> dict[str, float]:
        """Accuracy of each of the site's models on (x, y), keyed ``<role>_acc``, and the other classification
        metrics of the same pass keyed ``<role>_<metric>`` (:mod:`silofl.training.metrics`; see
        :meth:`cached_scores`)."""

    @abstractmethod
    def epsilon(self) -> float | None:
        """The site's ε so far (None without DP)."""

    @abstractmethod
    def privacy_report(self) -> dict:
        """The accountant's inputs and output, for summary.json."""

    def ledger_privacy(self) -> dict:
        """``{"site_ledger": ...}``: the site's one accountant over its whole ledger (every run, every
        protocol: :class:`silofl.privacy.site_accountant.SiteAccountant`), ε per threat at the run's δ with
        the parties each holds against and its unit; empty without a ledger or a δ."""
        delta = getattr(getattr(self, "settings", None), "delta", None)
        if self.ledger is None or not isinstance(delta, float) or not 0 < delta < 1:
            return {}
        from silofl.privacy.site_accountant import SiteAccountant

        return {"site_ledger": SiteAccountant(self.ledger).report(delta)}

    @abstractmethod
    def final_models(self) -> dict[str, tuple[nn.Module, ModelSpec]]:
        """role -> (model, ModelSpec) for the run folder."""

    @abstractmethod
    def architectures(self) -> dict[str, str]:
        """role -> architecture name."""

    @property
    @abstractmethod
    def n(self) -> int:
        """The number of training examples (public: it sets weights and sampling rates)."""

    def own_model(self) -> nn.Module | None:
        """The site's own model trained without DP, if its method has one (ProxyFL's, FML's private model)."""
        return None

    def _scores(self, x: torch.Tensor, y: torch.Tensor, cache: dict | None = None) -> dict[str, float]:
        """:meth:`evaluate`, plus the combined model's figures (``combined_acc``, ``combined_auroc``, …) when
        the site combines."""
        out = self.evaluate(x, y, cache)
        if self.combination is not None:
            from silofl.training.metrics import prefixed

            out.update(prefixed("combined_acc", self.combination.scores(self, x, y)))
        return out

    @staticmethod
    def cached_scores(
        key: object,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        cache: dict | None,
        store: bool = True,
    ) -> dict:
        """Every metric of ``model`` on (x, y) (:func:`silofl.training.evaluation.scores`: ``acc``, ``auroc``,
        …), taken from an engine's evaluation cache when it holds them under ``("scores", key)``; with
        ``store`` what is computed here is put there too (and its accuracy under ``key``, as
        :func:`accuracy`'s figure)."""
        from silofl.training.evaluation import scores

        found = cache.get(("scores", key)) if cache is not None and key is not None else None
        if found is not None:
            return found
        s = scores(model, x, y)
        if store and cache is not None and key is not None:
            cache[("scores", key)] = s
            cache[key] = s["acc"]
        return s

    def extra_metrics(self) -> dict:
        """Method-specific figures reported with every evaluation (e.g. a PushSum weight)."""
        return {}

    def metric_label(self, key: str) -> str:
        """What a reported figure is a function of: DP releases (``dp``), nothing private (``public``), or the
        site's data without DP (``non-private``). Unknown figures are treated as non-private."""
        return NONPRIVATE

    def figure_labels(self, meta: dict) -> dict[str, str]:
        """The label (:meth:`metric_label`) of every figure of an evaluation reply, keyed as the run's
        metrics key it (``<figure>_internal`` on the site's own held-out rows)."""
        out = {
            k: self.metric_label(acc_field_of(k) or k)
            for part in ("accs", "extra", "train")
            for k in meta[part]
        }
        out.update({f"{k}_internal": self.metric_label(acc_field_of(k) or k) for k in meta["internal"]})
        return out

    def _release(self, figures: dict, kept: dict, suffix: str = "") -> dict:
        if self.release_nonprivate:
            return figures
        out = {}
        for k, v in figures.items():
            if (
                self.metric_label(acc_field_of(k) or k) == NONPRIVATE
            ):  # a model's AUROC, F1 …: as its accuracy
                kept[k + suffix] = v
            else:
                out[k] = v
        return out

    def budget_message(self) -> str:
        """Why this site cannot train a single round within its budget."""
        return f"site {self.cid} cannot train a single round within its budget"

    def leave(self, rnd: int) -> None:
        """Leave the protocol before round ``rnd``."""
        self.active = False
        self.left_at = rnd

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where this site stopped (for checkpoints), with the head of
        its ledger (a resume refuses a ledger older than that)."""
        head = self.ledger.head.to_dict() if self.ledger is not None else None
        return {"active": self.active, "left_at": self.left_at, "ledger_head": head}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the spend comes from the ledger, never from the checkpoint."""
        self.active, self.left_at = bool(state["active"]), state["left_at"]
        if self.ledger is not None and state.get("ledger_head") is not None:
            self.ledger.check_head(state["ledger_head"])

    # ------------------------------------------------------------------ common steps
    def on_hello(self, msg: Message) -> Message:
        """The site's public facts: its data size and architectures (and why it cannot train, if it
        cannot)."""
        meta = {"n": self.n, "architectures": self.architectures()}
        if not self.can_continue():
            meta["budget_message"] = self.budget_message()
        return Message(meta)

    def on_status(self, msg: Message) -> Message:
        """Nothing but the status every reply carries."""
        return Message()

    def on_leave(self, msg: Message) -> Message:
        """Leave the protocol before the round in the request."""
        self.leave(int(msg.meta["round"]))
        return Message()

    def on_evaluate(self, msg: Message) -> Message:
        """Score the models on the shared test set (``score``) and on the site's own held-out set
        (``internal``); report ε and the last round's training figures."""
        kept: dict = {}
        if self.combination is not None:  # refitted on the site's held-out rows with the current models
            self.combination.fit(self)
        meta: dict = {
            "accs": {},
            "internal": {},
            "epsilon": self.epsilon(),
            "extra": self._release(self.extra_metrics(), kept),
            "train": self._release(dict(self.last_train), kept),
        }
        if msg.meta.get("score", True) and "external" in self.tests:
            x, y = self.tests["external"]
            # the cache shares one model's score among sites holding it, per test set: sites that see the
            # shared test set through their own preprocessing (per-site sources) hold different tensors
            cache = (
                self.eval_cache.setdefault(("test set", id(x)), {}) if self.eval_cache is not None else None
            )
            meta["accs"] = self._release(self._scores(x, y, cache), kept)
        if msg.meta.get("internal", False) and "internal" in self.tests:
            meta["internal"] = self._release(self._scores(*self.tests["internal"]), kept, "_internal")
        meta["labels"] = self.figure_labels(meta)  # what each released figure is a function of
        if kept and self.folder is not None:  # what the site keeps to itself
            with open(self.folder / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"round": msg.meta.get("round"), "client": self.cid, **kept}) + "\n")
        return Message(meta)

    def on_finish(self, msg: Message) -> Message:
        """Write the final models under ``models_dir`` (if given) and report the privacy accounting."""
        from silofl.models import save_model

        written = []
        if msg.meta.get("models_dir"):
            d = Path(msg.meta["models_dir"])
            for name, (model, spec) in self.final_models().items():
                p = d / f"client{self.cid}_{name}"
                save_model(model, spec, p)
                written.append(f"{d.name}/{p.name}.safetensors")
            if self.preprocessing is not None and written:
                import json

                (d / f"client{self.cid}_preprocessing.json").write_text(
                    json.dumps(self.preprocessing, indent=1) + "\n"
                )
            if self.features is not None and written:
                import json

                (d / f"client{self.cid}_features.json").write_text(json.dumps(self.features, indent=1) + "\n")
            if self.combination is not None:
                written += self.combination.save(self, d)
        return Message(
            {
                "architectures": self.architectures(),
                "epsilon": self.epsilon(),
                "left_at": self.left_at,
                "privacy": {**self.privacy_report(), **self.ledger_privacy()},
                "models": written,
            }
        )

    def on_save(self, msg: Message) -> Message:
        """Write this site's state into the round folder the coordinator names (``root/round<r>``); keep only
        the newest ``keep`` of its own checkpoints."""
        root, rnd = Path(msg.meta["root"]), int(msg.meta["round"])
        save_node(root / f"round{rnd}", self.cid, self.state_dict(), meta={"round": rnd})
        keep = int(msg.meta.get("keep", 0))
        if keep > 0:
            for old in self.on_checkpoints(msg).meta["rounds"][:-keep]:
                for f in (root / f"round{old}").glob(f"node{self.cid}.*"):
                    f.unlink(missing_ok=True)
        return Message()

    def on_checkpoints(self, msg: Message) -> Message:
        """The rounds of which this site holds a checkpoint under ``root``."""
        root = Path(msg.meta["root"])
        rounds = sorted(
            int(d.name[5:])
            for d in root.glob("round*")
            if d.name[5:].isdigit() and (d / f"node{self.cid}.json").is_file()
        )
        return Message({"rounds": rounds})

    def on_load(self, msg: Message) -> Message:
        """Resume from the checkpoint of round ``round`` under ``root``. If this site holds a newer one, its
        accountant is kept: rounds run again are counted again, and the privacy spend never goes back."""
        root, rnd = Path(msg.meta["root"]), int(msg.meta["round"])
        state, meta = load_node(root / f"round{rnd}", self.cid)
        if meta.get("round") != rnd:
            raise ConfigError(
                f"checkpoint of site {self.cid} in {root}/round{rnd} is from round {meta.get('round')}"
            )
        newest = max(self.on_checkpoints(msg).meta["rounds"], default=rnd)
        if newest > rnd and state.get("accountant") is not None:
            newer, _ = load_node(root / f"round{newest}", self.cid)
            if newer.get("accountant") is not None:
                state["accountant"] = newer["accountant"]
                log.warning(
                    "node %d resumes from round %d but keeps its accountant of round %d: rounds %d–%d are "
                    "counted again",
                    self.cid,
                    rnd,
                    newest,
                    rnd + 1,
                    newest,
                )
        self.load_state_dict(state)
        return Message()
