"""The processes of a local deployment (silofl.deploy.local.Proc): stopped together, SIGKILL for one that
ignores SIGTERM, each one's output in its log."""

import time

from silofl.deploy.local import Proc, stop_all


def test_stop_all_stops_every_process_and_kills_one_that_ignores_sigterm(tmp_path):
    polite = [Proc(f"p{i}", ["sleep", "60"], {}, tmp_path) for i in range(2)]
    stubborn = Proc("s", ["bash", "-c", "trap '' TERM; echo ready; sleep 60"], {}, tmp_path)
    deadline = time.monotonic() + 10
    while "ready" not in stubborn.text() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop_all([*polite, stubborn], timeout_s=0.2)
    assert [p.p.returncode for p in polite] == [-15, -15]  # SIGTERM
    assert stubborn.p.returncode == -9  # SIGKILL after its grace
    assert stubborn.text() == "ready\n" and stubborn._log.closed
