"""Everything a site reports is signed (issue 41, "smaller holes"): a relay rewrote a site's reported ε in its
reply's metadata and the summary printed 0.0123 while the site's ledger said 6.25. Every reply's meta — ε,
metrics, row counts, ledger head, and the step and round it answers — is now signed with the site's Ed25519
key; the coordinator verifies it against the pinned card, refuses and logs a reply it did not sign (the site
is lost), and shows only verified figures. Real site folders and workers, every frame packed and checked."""

import pytest

from silofl.comm import batch
from silofl.comm.messages import Message, pack, unpack
from silofl.core.errors import SiloflError
from tests.deploy.test_worker import deployed_run

FORGED = 0.0123


def forging_relay(victim: int, key: str = "epsilon", value=FORGED):
    """A relay that rewrites ``key`` in every reply of site ``victim`` that reports it."""
    forged = []

    def rewrite(meta: dict) -> None:
        if key in meta and meta[key] is not None:
            meta[key] = value
            forged.append(key)

    def tap(step, k, frame, way):
        if way != "from" or k != victim:
            return frame
        got, msgs = unpack(frame)
        ((kk, m),) = msgs.items()
        if got == batch.BATCH:
            for part in m.meta.get("parts", []):
                rewrite(part["meta"])
        else:
            rewrite(m.meta)
        return pack(got, {kk: Message(m.meta, m.packets)})

    return tap, forged


@pytest.mark.slow
@pytest.mark.deploy
def test_a_relay_that_rewrites_a_sites_reported_epsilon_is_refused(tiny_cfg, tmp_path):
    tap, forged = forging_relay(victim=1)
    cfg = tiny_cfg.replace(method="fedavg", clients=3, rounds=2, eval_every=1, seed=0)
    s, engine, workers, _ = deployed_run(cfg, tmp_path, tap)
    assert forged  # the relay did rewrite the figure
    assert any(r["client"] == 1 and "not signed by its key" in r["reason"] for r in engine.refused)
    assert "not signed" in engine.lost[1]  # the site behind the forging path is lost, its figures dropped
    shown = [r.get("epsilon") for r in s["final"]["per_client"]] + [a.get("epsilon") for a in s["accounting"]]
    assert FORGED not in shown  # the forged figure is never shown
    for a in s["accounting"]:  # what is shown is what each site's own accountant reported, signed
        assert a["epsilon"] == pytest.approx(workers[a["client"]].site.epsilon(), rel=1e-12)


@pytest.mark.slow
@pytest.mark.deploy
def test_a_relay_that_rewrites_a_metric_or_a_row_count_is_refused(tiny_cfg, tmp_path):
    tap, forged = forging_relay(victim=0, key="accs", value={"global_acc": 0.999})
    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=1, seed=0)
    s, engine, _, _ = deployed_run(cfg, tmp_path, tap)
    assert forged and any(r["client"] == 0 and "not signed" in r["reason"] for r in engine.refused)
    assert all(r.get("global_acc") != 0.999 for r in s["final"]["per_client"])
    tap, forged = forging_relay(victim=0, key="n", value=10**6)  # a row count, in the signed hello
    with pytest.raises(SiloflError, match="did not sign"):
        deployed_run(cfg, tmp_path / "again", tap)


@pytest.mark.slow
@pytest.mark.deploy
def test_an_untampered_reply_verifies_and_a_moved_one_does_not(tiny_cfg, tmp_path):
    """The signature covers the step and round a reply answers: a reply replayed as the answer to another
    request is refused too."""
    from silofl.deploy.coordinator import join
    from tests.deploy.test_worker import Loopback, deployment

    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=1, seed=0)
    cfg, workers, spec, _ = deployment(cfg, tmp_path)
    engine = Loopback(workers)
    join(engine, spec)
    frame = workers[0].handle_frame(pack("status", {0: Message({"round": 1})}))
    engine.asked = {0: [("status", 1)]}
    assert engine.reply_of(0, "status", frame) is not None and 0 not in engine.lost
    engine.asked = {0: [("status", 2)]}  # the same signed reply, offered as the answer to round 2
    assert engine.reply_of(0, "status", frame) is None and "not signed" in engine.lost[0]
