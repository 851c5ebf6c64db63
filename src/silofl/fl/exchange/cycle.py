"""CWT, cyclical weight transfer (Chang et al.): one DP model passed from site to site.

By default each round the model visits every active site in id order (one full cycle, so every site
trains one local epoch per round, as in the other methods, and spends the same ε); each trains it
with DP-SGD and sends it to the next; the last one hands it back to the first, which holds it at the
start of the next round. ``cwt_visits: v`` lets only v sites train per round (the model moves v hops;
``1`` = one site per communication round). If the holder leaves (budget spent), it hands the model
to the next active site first. There is one model, so ``global_acc`` is the holder's, evaluated once
and reported in every site's row. The coordinator only routes the model between sites.
"""

from __future__ import annotations

from silofl.comm.messages import Message, Packet
from silofl.core.errors import PeerModelRejected
from silofl.fl.coordinator import Coordinator, RoundEvents
from silofl.site.dpsgd import DPSGDSite


class CycleSite(DPSGDSite):
    """A DP-SGD site that trains the travelling model and passes it on."""

    def on_train_send(self, msg: Message) -> Message:
        """Train one round; send the model to ``to`` (if any)."""
        self.train(int(msg.meta["round"]))
        return self.on_send(msg)

    def on_send(self, msg: Message) -> Message:
        """Send the model to ``to`` without training (a holder that left hands it on)."""
        to = msg.meta.get("to")
        if to is None:
            return Message()
        return Message(packets=[Packet(self.cid, int(to), self.payload(int(msg.meta["round"])))])

    def on_receive(self, msg: Message) -> Message:
        """Take the model (validated first); say whether it was accepted."""
        rnd = int(msg.meta["round"])
        accepted, rejected = False, []
        for p in msg.packets:
            try:
                tensors, _, _ = self.read(p, rnd=rnd)
                self.replace_shared(tensors)
                accepted = True
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, p, e))
        return Message({"accepted": accepted, "rejected": rejected})


class CWT(Coordinator):
    """The cycle (see the module doc). When the run finishes, the holder first hands the travelling model to
    every other site it can reach (sending and receiving only: no training, no spend).

    Without the hand-out only the holder ends with the final model while every row of the run reports the
    holder's figure (one model, evaluated once): the other sites saved the version they last trained and
    passed on, so ``silofl evaluate``, ``predict`` and ``export`` of their ``models/`` files scored a model
    the run never reported (a 3-site CWT digits run: client 1 re-scored at AUROC 0.6327, its row said 0.6468).
    The hand-out's bytes count in ``summary.json``'s totals, not in any round's metrics."""

    deferrable_evaluation = False  # the holder scores for everyone (evaluate): asked when the round ends

    def __init__(self, cfg, n_sites: int, visits: int | None = None):
        super().__init__(cfg, n_sites)
        self.holder = 0
        self.visits = visits

    def before_finish(self, rnd: int | None) -> None:
        if rnd is not None:
            self.hand_out(rnd)

    def hand_out(self, rnd: int) -> None:
        """Send the holder's model to every site but the holder and the ones the engine lost (once)."""
        lost = self.engine.lost if self.engine is not None else {}
        events = RoundEvents()
        for k in range(self.n_sites):
            if k != self.holder and k not in lost and self.holder not in lost:
                sent = self.call("send", {self.holder: Message({"round": rnd, "to": k})}).get(self.holder)
                self._deliver(rnd, self.holder, k, sent, events)  # the holder stays the holder

    def _deliver(self, rnd: int, src: int, dst: int, reply: Message | None, events: RoundEvents) -> int:
        """Deliver ``src``'s packet to ``dst``; the site holding the newest model afterwards."""
        packets = self.routable(rnd, src, {src: reply} if reply is not None else {}, {dst}, events)
        got = self.call("receive", {dst: Message({"round": rnd}, packets)}).get(dst)
        if got is None:
            return src
        events.rejected += got.meta.get("rejected", [])
        return dst if got.meta.get("accepted") else src

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        active = self.retire(rnd, events)
        if not active:
            return events
        # the cycle from the holder on (or from the next active site after a holder that left)
        start = next((i for i, c in enumerate(active) if c >= self.holder), 0)
        order = active[start:] + active[:start]
        if self.holder != order[0]:
            sent = self.call("send", {self.holder: Message({"round": rnd, "to": order[0]})}).get(self.holder)
            self.holder = self._deliver(rnd, self.holder, order[0], sent, events)
        visits = len(order) if self.visits is None else min(self.visits, len(order))
        for i in range(visits):
            c, nxt = order[i], order[(i + 1) % len(order)]
            to = nxt if nxt != c else None
            sent = self.call("train_send", {c: Message({"round": rnd, "to": to})}).get(c)
            self.holder = self._deliver(rnd, c, nxt, sent, events) if to is not None else c
        return events

    def evaluate(self, rnd: int, internal: bool = False) -> dict[int, dict]:
        ks = self.evaluated(rnd)
        requests = {
            k: Message({"round": rnd, "internal": internal, "score": k == self.holder})
            for k in sorted(set(ks) | {self.holder})
        }
        replies = {k: r.meta for k, r in self.call("evaluate", requests).items()}
        acc = replies.get(self.holder, {}).get("accs", {})
        return {k: {**replies[k], "accs": dict(acc)} for k in ks if k in replies}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "holder": self.holder}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.holder = int(state["holder"])
