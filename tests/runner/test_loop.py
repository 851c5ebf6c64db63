"""The run loop's rounds: a round's evaluation goes with each site's next step, so a deployed round costs one
message per site, and a run gives the same figures as with the evaluation sent on its own."""

import json
from collections import Counter

import pytest

from silofl.comm.engine import InProcessEngine
from silofl.fl.coordinator import Coordinator
from silofl.runner.loop import run


class CountingEngine(InProcessEngine):
    """In-process sites; counts the messages each site gets (a batch of steps is one)."""

    def __init__(self, sites):
        super().__init__(sites)
        self.messages: Counter = Counter()
        self._depth = 0

    def call(self, step, requests):
        if self._depth == 0:
            self.messages.update(k for k in requests if k not in self.lost)
        self._depth += 1
        try:
            return super().call(step, requests)
        finally:
            self._depth -= 1


def _run(cfg, engines: list):
    def factory(make, n):
        engines.append(CountingEngine({k: make(k) for k in range(n)}))
        return engines[-1]

    return run(cfg, progress=False, engine_factory=factory)


@pytest.mark.slow  # two seconds-long runs per method
@pytest.mark.parametrize("method", ["proxyfl", "dp-fedavg"])
def test_a_rounds_evaluation_goes_with_the_next_rounds_message_and_changes_no_figure(
    method, tiny_cfg, tmp_path, monkeypatch
):
    cfg = tiny_cfg.replace(method=method, rounds=4, eval_every=1, seed=0)
    cfg = (
        cfg.replace(private_model="mlp")
        if method == "proxyfl"
        else cfg.replace(private_model=None, noise_multiplier=1.0, clip=1.0)
    )
    folded: list = []
    a = _run(cfg.replace(out=str(tmp_path / "folded")), folded)
    monkeypatch.setattr(Coordinator, "deferrable_evaluation", False)
    apart: list = []
    b = _run(cfg.replace(out=str(tmp_path / "apart")), apart)

    def rows(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if not k.endswith("_s")} for x in lines]

    assert rows("folded") == rows("apart") and len(rows("folded")) == 4 * cfg.clients
    assert a["final"]["per_client"] == b["final"]["per_client"]
    # per site: hello, one message a round, the last round's evaluation, finish — against two a round
    assert set(folded[0].messages.values()) == {cfg.rounds + 3}
    assert set(apart[0].messages.values()) == {2 * cfg.rounds + 2}
