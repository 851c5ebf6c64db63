"""The one seam through which every engine drives sites.

A method's coordinator (:mod:`silofl.fl`) runs a round as a sequence of *calls*:
``engine.call(step, {site: request})`` runs ``site.handle(step, request)`` on every addressed site and
returns ``{site: reply}`` for the sites that answered. Where the sites run — in this process
(:class:`InProcessEngine`, the simulator), in other processes (:mod:`silofl.comm.torchdist`), at other
institutions (Flower) — is the engine's business: a method never knows, and an engine never knows a
method by name.

The engine counts every packet's bytes for its source and destination node when it crosses: a
packet in a request arrives at the site it is addressed to (and leaves the coordinator, when a role
the coordinator plays — a server — sent it); a packet in a reply leaves its site (and arrives at the
coordinator's role it is addressed to). A packet from one site to another is counted as sent when it
leaves its sender and as received when it is delivered. A site that stops answering is *lost*
(:attr:`Engine.lost`): it gets no more requests, and the coordinator decides what that means for the
protocol.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Protocol

from silofl.comm.messages import Message


class SiteHandle(Protocol):
    """What an engine needs of a site: run a step; the caches an engine lends its sites for one call."""

    eval_cache: dict | None
    wire_cache: dict | None

    def handle(self, step: str, msg: Message) -> Message:
        """Run ``step`` on the request and return the reply."""
        ...


class Engine(ABC):
    """Runs site steps and counts the bytes that cross (see the module doc)."""

    name = "engine"
    batches = True  # may carry several steps in one message (silofl.comm.batch); off for an audit's observer

    def __init__(self, site_ids: list[int]):
        self.site_ids = list(site_ids)
        self._is_site = set(self.site_ids)
        self.bytes_sent: dict[int, int] = defaultdict(int)
        self.bytes_received: dict[int, int] = defaultdict(int)
        self.lost: dict[int, str] = {}  # site -> why it was lost

    def call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        """Run ``step`` on every addressed site that is not lost; the replies of those that answered."""
        requests = {k: m for k, m in requests.items() if k not in self.lost}
        replies = self._call(step, requests)
        for k, reply in replies.items():
            for p in requests[k].packets:
                self.bytes_received[p.dst] += len(p.data)
                if p.src not in self._is_site:
                    self.bytes_sent[p.src] += len(p.data)
            for p in reply.packets:
                self.bytes_sent[p.src] += len(p.data)
                if p.dst not in self._is_site:
                    self.bytes_received[p.dst] += len(p.data)
        return replies

    @abstractmethod
    def _call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        """Deliver the requests and collect the replies (sites that fail are added to ``self.lost``)."""

    @property
    def processes(self) -> int:
        """How many processes the sites run in."""
        return 1

    def rejoin_ready(self, rnd: int, candidates: set[int]) -> list[int]:
        """Those of the lost sites ``candidates`` that are back before round ``rnd``, restored from their own
        checkpoints with their spend intact, and no longer lost (an engine that cannot bring a site back
        returns none)."""
        return []

    def describe(self) -> dict:
        """What summary.json records about the engine (its name and security settings)."""
        return {"name": self.name, "processes": self.processes}

    def close(self) -> None:
        """Release whatever the engine holds (processes, connections)."""
        return None


class InProcessEngine(Engine):
    """The simulator's engine: every site is an object in this process; a call is a method call.

    Messages are still real wire bytes, so sizes and validation are real. Evaluation of sites that hold
    the same model (a broadcast global model) is shared through one cache per ``evaluate`` call, and with
    ``batch_eval`` (the default) every model the sites will score on a shared test set is scored first in one
    vectorised pass per architecture (:func:`silofl.training.evaluation.all_scores`); each site then finds its
    scores in the cache.
    """

    name = "simulator"

    def __init__(self, sites: dict[int, SiteHandle], batch_eval: bool = True):
        super().__init__(sorted(sites))
        self.sites = sites
        self.batch_eval = batch_eval

    def _prescore(self, requests: dict[int, Message], cache: dict) -> None:
        """Score every model the requested sites will score on a shared test set, one pass per
        architecture."""
        from silofl.training.evaluation import all_scores

        by_test: dict[int, tuple] = {}
        for k, req in requests.items():
            site = self.sites[k]
            models = getattr(site, "eval_models", None)
            tests = getattr(site, "tests", {})
            if models is None or not req.meta.get("score", True) or "external" not in tests:
                continue
            x, y = tests["external"]
            _, _, keyed = by_test.setdefault(id(x), (x, y, {}))
            for key, model in models():
                keyed.setdefault(key, model)
        for xid, (x, y, keyed) in by_test.items():
            if len(keyed) < 2:
                continue
            scores = all_scores(
                list(keyed.values()), x, y
            )  # every metric from one pass (silofl.training.metrics)
            held = cache.setdefault(("test set", xid), {})
            held.update(zip(keyed, (s["acc"] for s in scores), strict=True))  # accuracies, as before
            held.update({("scores", key): s for key, s in zip(keyed, scores, strict=True)})

    def call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        """As :meth:`Engine.call`; a batch (:mod:`silofl.comm.batch`) runs as its parts, right-aligned across
        the sites — every site's last part (the step asked of all) together, so an ``evaluate`` keeps its
        shared cache — each site's parts in its own order."""
        from silofl.comm import batch

        if step != batch.BATCH:
            return super().call(step, requests)
        requests = {k: m for k, m in requests.items() if k not in self.lost}
        answers: dict[int, list[Message]] = {k: [] for k in requests}
        for s, _, reqs in batch.phases(requests):
            for k, r in self.call(s, reqs).items():  # through a subclass's call (an audit tap sees each step)
                answers[k].append(r)
        n = {k: len(batch.split(m)) for k, m in requests.items()}
        return {k: batch.reply(a) for k, a in answers.items() if len(a) == n[k]}

    def _call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        cache: dict | None = {} if step == "evaluate" else None
        if cache is not None and self.batch_eval:
            self._prescore(requests, cache)
        return run_here(self.sites, step, requests, cache)


def run_here(
    sites: dict[int, SiteHandle], step: str, requests: dict[int, Message], cache: dict | None = None
) -> dict[int, Message]:
    """Run ``step`` on sites held in this process; one evaluation cache is lent to them for an ``evaluate``
    (``cache``, possibly filled already; a fresh one otherwise), and one wire cache for every step: a payload
    that several of them receive is decoded and checked once (:func:`silofl.comm.wire.read_model_shared`)."""
    if cache is None and step == "evaluate":
        cache = {}
    wire: dict = {}
    replies = {}
    for k, req in requests.items():
        site = sites[k]
        site.eval_cache, site.wire_cache = cache, wire
        try:
            replies[k] = site.handle(step, req)
        finally:
            site.eval_cache = site.wire_cache = None
    return replies
