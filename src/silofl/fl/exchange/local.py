"""No exchange: every site that can still pay for a round trains alone (Regular, Joint)."""

from __future__ import annotations

from silofl.comm.messages import Message
from silofl.fl.coordinator import Coordinator, RoundEvents
from silofl.site.dpsgd import DPSGDSite


class LocalSite(DPSGDSite):
    """A DP-SGD site that only trains."""

    def on_train(self, msg: Message) -> Message:
        """Train one round."""
        self.train(int(msg.meta["round"]))
        return Message()


class Local(Coordinator):
    """Each round every active site trains; nothing crosses."""

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        self.call("train", {k: Message({"round": rnd}) for k in self.retire(rnd, events)})
        return events
