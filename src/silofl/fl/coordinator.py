"""What a method is: the site each institution runs, and the coordinator that drives rounds.

A :class:`Method` builds both. The :class:`Coordinator` runs where the engine's coordinator runs (the
simulator's process, rank 0 of torch.distributed, Flower's ServerApp) and sees sites only through
``engine.call(step, {site: request})`` — it routes packets between sites (gossip, cycle) or plays the
server (averaging, client-level DP), and never knows where or in how many processes the sites run.

Every round it first retires sites: those whose last reply said they cannot pay for another round
(their budget), and those the engine lost (a crash or a timeout), with the method's repair
(:meth:`Coordinator.on_lost`). Then the method's :meth:`Coordinator.run_round`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from silofl.comm.engine import Engine
from silofl.comm.messages import Message, Packet
from silofl.core.errors import BudgetExhausted, PeerModelRejected
from silofl.fl.plan import RunPlan, as_plan
from silofl.site.base import Site

log = logging.getLogger("silofl")


class DataShape(Protocol):
    """What building models needs to know of the data."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example."""
        ...

    num_classes: int


@dataclass
class RoundEvents:
    """What happened in a round besides training."""

    left: list[int] = field(default_factory=list)  # budget spent
    rejected: list[dict] = field(default_factory=list)
    lost: dict[int, str] = field(default_factory=dict)  # site -> why the engine lost it
    rejoined: list[int] = field(default_factory=list)  # lost sites back from their own checkpoints


class Coordinator(ABC):
    """A method's round logic over an engine (see the module doc). Node ids: sites ``0..K-1``; a role the
    coordinator plays (a server) is node ``K``."""

    deferred_steps: frozenset[str] = frozenset(
        {"receive_global"}
    )  # sent with the site's next step (see call)
    # a round's evaluation may go with each site's next step (defer_evaluation): its replies need no work of
    # the coordinator's before the next round
    deferrable_evaluation: bool = True

    def __init__(self, cfg: Any, n_sites: int):
        self.cfg = cfg
        self.n_sites = n_sites
        self.engine: Engine | None = None
        self.active: list[int] = list(range(n_sites))
        self.left_at: dict[int, int | None] = {k: None for k in range(n_sites)}
        self.can_continue: dict[int, bool] = {k: True for k in range(n_sites)}
        self.lost_sites: set[int] = set()  # lost by the engine (they may rejoin), not left for their budget
        self.info: dict[int, dict] = {}
        self.release_nonprivate = True  # report the coordinator's own figures of non-private data
        self._pending: dict[int, list[tuple[str, Message]]] = {}  # deferred steps per site (see call)
        self._late: list[dict] = []
        self.delivered: dict[int, int] = {}  # site -> the last round whose deferred deliveries it answered
        self._evaluating: dict | None = None  # a deferred evaluation: {"round", "sites", "replies"}

    @property
    def server_id(self) -> int:
        """The node id of a role the coordinator plays (a server)."""
        return self.n_sites

    # ------------------------------------------------------------------ talking to sites
    def call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        """``engine.call`` that also keeps every site's last word on whether it can continue.

        A step in :attr:`deferred_steps` is not sent now: it waits for the next step asked of the same site
        and goes with it in one message (:mod:`silofl.comm.batch`), so a round costs one message per site; its
        reply (the payloads the site refused) comes back then, into :meth:`take_late`. A site lost meanwhile
        never gets it; :attr:`delivered` says up to which round each site is known to have taken its
        deliveries."""
        assert self.engine is not None, "connect() first"
        if step in self.deferred_steps and self.engine.batches:
            for k, m in requests.items():
                if k not in self.engine.lost:
                    self._defer(k, (step, m))
            return {}
        pending = {k: self._pending.pop(k) for k in requests if k in self._pending}
        if pending:
            replies = self._batch({k: [*pending.get(k, []), (step, m)] for k, m in requests.items()})
        else:
            replies = self.engine.call(step, requests)
        for k, r in replies.items():
            self.can_continue[k] = bool(r.meta.get("can_continue", True))
        return replies

    def _defer(self, k: int, part: tuple[str, Message]) -> None:
        """Queue ``part`` for site ``k``'s next message; a queue one part short of what a batch may hold
        (:data:`silofl.comm.batch.MAX_PARTS`, with the step that will carry it) is sent on its own first — a
        site left out of several rounds (client sampling, skipped rounds) keeps collecting deliveries."""
        from silofl.comm.batch import MAX_PARTS

        if len(self._pending.get(k, [])) >= MAX_PARTS - 1:
            self.flush([k])
        self._pending.setdefault(k, []).append(part)

    def flush(self, sites: list[int] | None = None) -> None:
        """Send the deferred steps (of ``sites``; of all by default) now, on their own (before reading a
        site's state out of band, as tests do)."""
        if sites is None:
            pending, self._pending = self._pending, {}
        else:
            pending = {k: self._pending.pop(k) for k in sites if k in self._pending}
        if pending:
            for k, r in self._batch(pending).items():
                self.can_continue[k] = bool(r.meta.get("can_continue", True))

    def _batch(self, parts: dict[int, list[tuple[str, Message]]]) -> dict[int, Message]:
        """Each site's parts in one batch request; the replies of the last parts (the earlier ones' refusals
        go to :meth:`take_late`, and their rounds to :attr:`delivered`)."""
        from silofl.comm import batch

        assert self.engine is not None
        got = self.engine.call(batch.BATCH, {k: batch.make(p) for k, p in parts.items()})
        replies = {}
        for k, r in got.items():
            try:
                answers = batch.split_reply(r, len(parts[k]))
            except (
                PeerModelRejected
            ) as e:  # a site that answers a batch wrongly is lost, as for any bad reply
                self.engine.lost.setdefault(k, f"malformed batch reply: {e}")
                continue
            for (s, m), a in zip(parts[k], answers, strict=True):
                ev = self._evaluating
                if s == "evaluate" and ev is not None and m.meta.get("round") == ev["round"]:
                    ev["replies"][k] = a
                if s in self.deferred_steps:
                    self._late.extend(a.meta.get("rejected", []) or [])
                    if isinstance(m.meta.get("round"), int):
                        self.delivered[k] = max(self.delivered.get(k, -1), int(m.meta["round"]))
            replies[k] = answers[-1]
        return replies

    def take_late(self) -> list[dict]:
        """The refusals that came back with deferred steps' replies since the last call of this."""
        late, self._late = self._late, []
        return late

    def connect(self, engine: Engine) -> None:
        """Meet the sites (their public facts) and check that at least one can train a round."""
        self.engine = engine
        self.info = {
            k: r.meta for k, r in self.call("hello", {k: Message() for k in range(self.n_sites)}).items()
        }
        self.setup()
        if not any(self.may_continue(k) for k in self.active):
            raise BudgetExhausted(self.budget_message())

    def open_ledger(self, folder) -> None:
        """Keep the spend the coordinator's roles account for (a client-level server's) in a ledger in
        ``folder``."""
        return None

    def setup(self) -> None:
        """Build the coordinator's own roles once the sites' public facts are known (e.g. a server)."""
        return None

    def may_continue(self, k: int) -> bool:
        """Whether site ``k`` may take part in another round (its own budget; a server's, if it keeps one)."""
        return self.can_continue.get(k, True)

    def budget_message(self) -> str:
        """Why no site can train a single round within its budget."""
        msgs = [i["budget_message"] for _, i in sorted(self.info.items()) if "budget_message" in i]
        return msgs[0] if msgs else "no site can train a single round within its budget"

    def start(self) -> None:
        """Anything before round 1 (e.g. a server broadcasting its initial model)."""
        return None

    # ------------------------------------------------------------------ rounds
    def retire(self, rnd: int, events: RoundEvents) -> list[int]:
        """Lost sites that are back rejoin; sites the engine lost and sites whose budget cannot pay for this
        round leave; the active ones."""
        lost = self.engine.lost if self.engine is not None else {}
        leaving = []
        for k in list(self.active):
            if k in lost:
                events.lost[k] = lost[k]
                self.lost_sites.add(k)
                log.warning(
                    "client %d leaves the protocol before round %d: process lost (%s)", k, rnd, lost[k]
                )
            elif not self.may_continue(k):
                events.left.append(k)
                leaving.append(k)
                log.info("client %d spent its budget and leaves the protocol before round %d", k, rnd)
            else:
                continue
            self.active.remove(k)
            self.left_at[k] = rnd
        if leaving:
            self.call("leave", {k: Message({"round": rnd}) for k in leaving})
        if events.lost:
            self.on_lost(set(events.lost), rnd)
        earlier = {
            k for k in self.lost_sites if (self.left_at.get(k) or rnd) < rnd
        }  # retired in an earlier round
        for k in self.engine.rejoin_ready(rnd, earlier) if self.engine is not None and earlier else []:
            self.lost_sites.discard(k)
            self.active = sorted([*self.active, k])
            self.left_at[k] = None
            self.can_continue[k] = True
            events.rejoined.append(k)
            log.warning("client %d rejoins the protocol before round %d from its own checkpoint", k, rnd)
        return list(self.active)

    def routable(self, rnd: int, k: int, replies: dict, allowed: set[int], events: RoundEvents) -> list:
        """The packets in site ``k``'s reply that it may send this round — from itself, to one of ``allowed``;
        any other is refused (logged and recorded), never delivered."""
        ok = []
        for p in replies[k].packets if k in replies else []:
            if p.src == k and p.dst in allowed:
                ok.append(p)
            else:
                why = (
                    f"site {k} sent a packet as node {p.src}"
                    if p.src != k
                    else f"site {k} may not send to node {p.dst} in round {rnd}"
                )
                log.warning("the coordinator refused a packet: %s", why)
                events.rejected.append({"round": rnd, "client": self.server_id, "src": k, "reason": why})
        return ok

    def send_from_server(self, rnd: int, sites: list[int], payload, events: RoundEvents) -> None:
        """Send each of ``sites`` its packet from the server role (``payload(rnd, k)``: wire bytes) in a
        ``receive_global`` step; the models they refused go into ``events``."""
        requests = {k: Message({"round": rnd}, [Packet(self.server_id, k, payload(rnd, k))]) for k in sites}
        for r in self.call("receive_global", requests).values():
            events.rejected += r.meta.get("rejected", [])

    def on_lost(self, nodes: set[int], rnd: int) -> None:
        """Repair after losing ``nodes`` (e.g. take back PushSum mass sent to them)."""
        return None

    @abstractmethod
    def run_round(self, rnd: int) -> RoundEvents:
        """One round of the method."""

    def evaluated(self, rnd: int) -> list[int]:
        """The sites reported in this round's evaluation: active ones and those leaving this round."""
        return [k for k in range(self.n_sites) if k in self.active or self.left_at[k] == rnd]

    def evaluate(self, rnd: int, internal: bool = False) -> dict[int, dict]:
        """Every reported site's evaluation reply (accuracies, ε, figures of its last round)."""
        replies = self.call(
            "evaluate", {k: Message({"round": rnd, "internal": internal}) for k in self.evaluated(rnd)}
        )
        return {k: r.meta for k, r in replies.items()}

    def defer_evaluation(self, rnd: int, internal: bool = False) -> bool:
        """Queue round ``rnd``'s evaluation to go with each site's next step, in one message (when the engine
        batches and the method allows; whether it did). A site runs it before that step, on its state at the
        end of ``rnd``; :meth:`deferred_evaluation` gives the replies after the next round."""
        assert self.engine is not None, "connect() first"
        if not (self.deferrable_evaluation and self.engine.batches) or self._evaluating is not None:
            return False
        sites = [k for k in self.evaluated(rnd) if k not in self.engine.lost]
        for k in sites:
            self._defer(k, ("evaluate", Message({"round": rnd, "internal": internal})))
        self._evaluating = {"round": rnd, "sites": sites, "replies": {}}
        return True

    def undelivered_bytes(self) -> tuple[dict[int, int], dict[int, int]]:
        """(sent, received) bytes per node of the deferred parts still waiting for their site's next message,
        counted as the engine will count them then: a round's figures include its deliveries."""
        assert self.engine is not None, "connect() first"
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        for parts in self._pending.values():
            for _, m in parts:
                for p in m.packets:
                    received[p.dst] = received.get(p.dst, 0) + len(p.data)
                    if p.src not in self.engine.site_ids:
                        sent[p.src] = sent.get(p.src, 0) + len(p.data)
        return sent, received

    def deferred_evaluation(self) -> dict[int, dict]:
        """The deferred evaluation's replies (as :meth:`evaluate`'s): those that came back with the sites'
        steps since; a site not asked anything since gets its waiting parts now, on their own. A site lost
        meanwhile has none."""
        ev = self._evaluating
        if ev is None:
            return {}
        self.flush([k for k in ev["sites"] if any(s == "evaluate" for s, _ in self._pending.get(k, []))])
        self._evaluating = None
        return {k: r.meta for k, r in sorted(ev["replies"].items())}

    def before_finish(self, rnd: int | None) -> None:
        """What the method does once its rounds are over, before the sites save and report (``rnd``: the last
        round this process ran; None when it ran none, e.g. a resumed run that was already complete)."""
        return None

    def extra_metrics(self, k: int) -> dict:
        """The coordinator's per-site figures for this round's metrics (e.g. a server's diagnostics)."""
        return {}

    def site_report(self, k: int, report: dict) -> dict:
        """A site's final report as summary.json records it (the coordinator may add what it accounted)."""
        return report

    # ------------------------------------------------------------------ checkpoints and reporting
    def state_dict(self) -> dict:
        """The coordinator's state (its roles', who is active), for checkpoints."""
        return {"active": list(self.active), "left_at": {str(k): v for k, v in self.left_at.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.active = [int(k) for k in state["active"]]
        self.left_at = {int(k): v for k, v in state["left_at"].items()}

    def privacy_summary(self) -> dict:
        """Method-specific entries of summary.json's ``privacy`` section."""
        return {}

    def round_history(self) -> list[dict]:
        """Per-round records of a server role (written to summary.json), if the method has one."""
        return []


class Method(ABC):
    """A method: the site every institution runs and the coordinator (see the module doc).

    Built from the run's plan (:class:`silofl.fl.plan.RunPlan`): ``self.plan.config`` is what the user asked,
    ``self.plan`` what the run derived (batch size, σ, each party's q and steps); ``self.opts`` the method's
    options. A config given in full (every derived value filled in: a checkpoint's, a deployed site's) is
    taken as its plan (:func:`silofl.fl.plan.given`). ``self.cfg`` is the same plan, under the name methods
    written before plans used (its read-only settings are ``plan.config``'s: see :mod:`silofl.fl.plan`)."""

    def __init__(self, plan: Any):
        self.plan: RunPlan = as_plan(plan)
        self.cfg: RunPlan = self.plan
        self.opts = self.plan.config.options

    def site_data(
        self, parts: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each site's training data from the clients' partitions (one site per client, except Joint)."""
        return parts

    @abstractmethod
    def make_site(self, k: int, x: torch.Tensor, y: torch.Tensor, data: DataShape) -> Site:
        """Site ``k`` with training data (x, y)."""

    @abstractmethod
    def make_coordinator(self, n_sites: int, data: DataShape, device: torch.device) -> Coordinator:
        """The coordinator over ``n_sites`` sites."""
