"""The paced SuperNode (silofl.deploy.flower_shim): its pacing, its doorbell and its object-pull backoff. The
real SuperNode it runs is exercised by every deployment test (tests/deploy/test_deploy_local.py)."""

import socket
import types

import pytest

from silofl.deploy import flower_shim as shim


class Clock:
    def __init__(self):
        self.t = 1000.0
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def test_the_pacer_polls_fast_while_a_run_is_on_and_backs_off_to_flowers_3_s_when_idle():
    c = Clock()
    p = shim.Pacer(clock=c, sleep=c.sleep)
    assert p.delay(0.5) == shim.REPLY_S  # the reply checks
    assert p.delay(3) == shim.ACTIVE_S  # just started: a run is about to be submitted
    c.t += shim.IDLE_AFTER_S + 1
    idle = [p.delay(3) for _ in range(10)]  # no run: doubling from the active pace up to 3 s
    assert idle[0] == 2 * shim.ACTIVE_S and idle[-1] == 3 and idle == sorted(idle)
    p.pulled()
    assert [p.delay(3) for _ in range(5)] == [shim.ACTIVE_S] * 5  # a run is on
    c.t += shim.IDLE_AFTER_S + 1
    assert p.delay(3) == 2 * shim.ACTIVE_S  # quiet for a while: backing off again
    p.pulled()
    assert p.delay(3) == shim.ACTIVE_S


def test_the_pacer_sleeps_towards_the_next_step_then_polls():
    c = Clock()
    p = shim.Pacer(clock=c, sleep=c.sleep)
    p.pulled()  # the first message: no interval known yet, the active pace
    assert p.delay(3) == shim.ACTIVE_S
    for period in (0.8, 1.2, 1.0):  # a step every this many seconds
        c.t += period
        p.pulled()
    assert p.periods == pytest.approx([0.8, 1.2, 1.0])
    c.t += 0.3  # the site worked 0.3 s, answered, and finds no message
    first = p.delay(3)  # one sleep until LEAD × the shortest interval since the last message
    assert first == pytest.approx(shim.LEAD * 0.8 - 0.3)
    c.t += first
    assert p.delay(3) == shim.ACTIVE_S  # from there on, the active pace
    c.t += 0.05
    p.pulled()
    c.t += 0.7  # a site that worked longer than that: no early sleep, the active pace
    assert p.delay(3) == shim.ACTIVE_S
    p.pulled()  # a shorter step is remembered
    assert p.periods[-1] == pytest.approx(0.7)
    c.t += shim.IDLE_AFTER_S + 5
    p.pulled()  # an idle spell is not a step's interval
    assert p.periods[-1] == pytest.approx(0.7) and len(p.periods) == shim.PERIODS


def test_the_patched_loop_rings_the_doorbell_only_when_a_message_was_stored(tmp_path):
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    bell.bind(str(tmp_path / "bell"))
    bell.settimeout(0.2)
    results = iter([None, 42])
    mod = types.SimpleNamespace(
        time=__import__("time"), _pull_and_store_message=lambda *a, **k: next(results)
    )
    c = Clock()
    pacer = shim.Pacer(clock=c, sleep=c.sleep)
    shim.patch(mod, pacer, str(tmp_path / "bell"))
    assert mod._pull_and_store_message() is None
    with pytest.raises(TimeoutError):
        bell.recv(8)
    assert mod._pull_and_store_message() == 42
    assert bell.recv(8) == b"1" and pacer.last_message == c.t
    mod.time.sleep(3)
    assert (
        c.slept == [shim.ACTIVE_S] and mod.time.monotonic is __import__("time").monotonic
    )  # the rest is time's
    shim.ring(str(tmp_path / "nobody"))  # nobody listening: nothing happens
    bell.close()


@pytest.mark.slow  # imports Flower (seconds)
@pytest.mark.deploy
def test_fast_pulls_lowers_flowers_object_pull_backoff_in_this_process():
    from flwr.supercore.inflatable import inflatable_utils as iu

    fns = (iu.pull_objects, iu.pull_and_inflate_object_from_tree)
    before = [dict(f.__kwdefaults__) for f in fns]
    try:
        assert shim.fast_pulls() is True
        for f in fns:
            assert (
                f.__kwdefaults__["initial_backoff"],
                f.__kwdefaults__["backoff_cap"],
            ) == shim.PULL_BACKOFF_S
    finally:
        for f, kw in zip(fns, before, strict=True):
            f.__kwdefaults__.update(kw)


@pytest.mark.slow  # starts a Python that imports Flower (seconds)
@pytest.mark.deploy
def test_the_supernode_process_imports_flower_but_not_silofl_or_torch():
    import subprocess

    cmd = shim.command()
    r = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:], "--version"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == f"Flower version: {shim.SUPPORTED}", r.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time")
    }
    assert "flwr.supernode.cli.flower_supernode" in imported
    assert not {m for m in imported if m.split(".")[0] in ("silofl", "torch")}
