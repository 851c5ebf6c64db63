"""silofl.core.threads: one torch thread per process unless asked, the choice recorded."""

from __future__ import annotations

import torch

from silofl.core import threads


def test_default_is_one_thread_per_process_and_says_why():
    c = threads.choose(None)
    assert (c.threads, c.asked) == (1, False)
    assert "one thread per process" in c.reason and "--threads N overrides" in c.reason


def test_asked_threads_win():
    c = threads.choose(3)
    assert (c.threads, c.asked, c.reason) == (3, True, "--threads 3")


def test_apply_sets_torch_threads_and_the_summary_records_the_choice(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert threads.apply(2).threads == 2 and torch.get_num_threads() == 2
        assert threads.apply(None).threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    d = threads.choose(None).describe()
    assert d["threads"] == 1 and d["wait_policy"] == "PASSIVE" and d["cores"] >= 1
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert threads.choose(None).describe()["wait_policy"].startswith("libgomp's default")
