"""silofl.site.base.Site directly: the step seam, what an evaluation releases and keeps, labels, state."""

import json

import pytest
import torch

from silofl.comm.messages import Message
from silofl.core.errors import SiloflError
from silofl.privacy.ledger import LedgerTampered
from silofl.site.base import DP, PUBLIC, Site


class Counter(Site):
    """A site with fixed figures: a DP shared model ("proxy"), a non-private own model ("private")."""

    def __init__(self, cid: int, budget: int = 3):
        super().__init__(cid)
        self.budget = budget
        self.last_train = {"mean_grad_norm": 2.5, "examples_seen": 30}
        x = torch.zeros(4, 2)
        self.tests = {"external": (x, torch.zeros(4, dtype=torch.long)), "internal": (x[:2], torch.zeros(2))}

    def can_continue(self):
        return self.budget > 0

    def evaluate(self, x, y, cache=None):
        return {"private_acc": 0.9, "private_auroc": 0.8, "proxy_acc": 0.5 + len(y) / 100, "proxy_f1": 0.4}

    def epsilon(self):
        return 1.5

    def privacy_report(self):
        return {}

    def final_models(self):
        return {}

    def architectures(self):
        return {"proxy": "mlp", "private": "cnn1"}

    @property
    def n(self):
        return 40

    def extra_metrics(self):
        return {"pushsum_weight": 0.5}

    def metric_label(self, key):
        if key == "proxy_acc":
            return DP
        if key in ("pushsum_weight", "examples_seen"):
            return PUBLIC
        return super().metric_label(key)  # the default: non-private


def test_every_reply_says_whether_the_site_can_pay_another_round_and_an_unknown_step_is_an_error():
    site = Counter(2)
    assert site.handle("status", Message()).meta == {"can_continue": True}
    assert site.handle("hello", Message()).meta == {
        "n": 40,
        "architectures": {"proxy": "mlp", "private": "cnn1"},
        "can_continue": True,
    }
    broke = Counter(1, budget=0)
    assert (
        broke.handle("hello", Message()).meta["budget_message"]
        == "site 1 cannot train a single round within its budget"
    )
    site.handle("leave", Message({"round": 4}))
    assert (site.active, site.left_at, site.handle("status", Message()).meta["can_continue"]) == (
        False,
        4,
        False,
    )
    with pytest.raises(SiloflError, match="site 2 has no step 'steal'"):
        site.handle("steal", Message())


def test_a_site_that_keeps_its_nonprivate_figures_releases_only_dp_and_public_ones_and_writes_the_rest(
    tmp_path,
):
    site = Counter(0)
    site.open_folder(tmp_path / "client0", run_label="r", release_nonprivate=False)
    meta = site.handle("evaluate", Message({"round": 3, "internal": True})).meta
    assert meta["accs"] == {
        "proxy_acc": 0.54,
        "proxy_f1": 0.4,
    }  # a model's other metrics go as its accuracy does
    assert meta["internal"] == {"proxy_acc": 0.52, "proxy_f1": 0.4}
    assert (meta["extra"], meta["train"], meta["epsilon"]) == (
        {"pushsum_weight": 0.5},
        {"examples_seen": 30},
        1.5,
    )
    assert meta["labels"] == {
        "proxy_acc": "dp",
        "proxy_f1": "dp",
        "pushsum_weight": "public",
        "examples_seen": "public",
        "proxy_acc_internal": "dp",
        "proxy_f1_internal": "dp",
    }
    kept = [json.loads(line) for line in (tmp_path / "client0" / "metrics.jsonl").read_text().splitlines()]
    assert kept == [
        {
            "round": 3,
            "client": 0,
            "mean_grad_norm": 2.5,
            "private_acc": 0.9,
            "private_auroc": 0.8,
            "private_acc_internal": 0.9,
            "private_auroc_internal": 0.8,
        }
    ]


def test_a_site_that_releases_reports_everything_labelled_and_keeps_no_file(tmp_path):
    site = Counter(1)
    site.open_folder(tmp_path / "client1", release_nonprivate=True)
    meta = site.handle("evaluate", Message({"round": 1, "score": True})).meta
    assert meta["accs"] == {"private_acc": 0.9, "private_auroc": 0.8, "proxy_acc": 0.54, "proxy_f1": 0.4}
    assert meta["train"] == {"mean_grad_norm": 2.5, "examples_seen": 30} and meta["internal"] == {}
    assert meta["labels"]["private_auroc"] == meta["labels"]["mean_grad_norm"] == "non-private"
    assert not (tmp_path / "client1" / "metrics.jsonl").exists()
    assert site.handle("evaluate", Message({"score": False})).meta["accs"] == {}


def test_state_round_trips_and_a_ledger_older_than_the_checkpoint_is_refused(tmp_path):
    site = Counter(0)
    site.open_folder(tmp_path / "c")
    site.ledger.record_steps("r", noise_multiplier=1.0, sample_rate=0.25, steps=4)
    site.leave(5)
    state = json.loads(json.dumps(site.state_dict()))  # a checkpoint's state is plain data
    assert (state["active"], state["left_at"], state["ledger_head"]["entries"]) == (False, 5, 1)
    same = Counter(0)
    same.open_folder(tmp_path / "c")
    same.load_state_dict(state)
    assert (same.active, same.left_at) == (False, 5)
    fresh = Counter(0)
    fresh.open_folder(tmp_path / "other")  # a ledger that lost the spend the checkpoint saw
    with pytest.raises(LedgerTampered, match="does not contain the head"):
        fresh.load_state_dict(state)
