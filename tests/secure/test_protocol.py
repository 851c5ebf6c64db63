"""The protocol end to end in one process: parties and a server exchanging exactly what the engine would
carry; dropouts, a server that lies, hostile shares and reveals."""

import logging

import numpy as np
import pytest

from silofl.secure import Party, SecAggRefused, SecAggSettings, Server, group

DIM = 32


def make(n, bits=20, min_survivors=2, neighbours=None, threshold=None):
    s = SecAggSettings(bits=bits, min_survivors=min_survivors, neighbours=neighbours, threshold=threshold)
    parties = {i: Party(i, s) for i in range(n)}
    server = Server(s, DIM)
    server.setup({i: p.public_key() for i, p in parties.items()})
    for p in parties.values():
        p.setup(server.session, server.keys)
    return parties, server


def inputs(n, bits, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, 1 << bits, DIM, dtype=np.uint64) for i in range(n)}


def step1(parties, server, rnd, xs, drop=()):
    seed = server.begin(rnd, sorted(parties))
    for i, p in parties.items():
        y, sealed = p.mask(rnd, xs[i], sorted(parties), seed)
        if i not in drop:
            server.receive(i, y, sealed)


def step2(parties, server, rnd, drop=(), tamper=None):
    surv = server.survivors()
    if surv is None:
        return None
    reveals = {}
    for i in surv:
        if i in drop:
            continue
        reveals[i] = parties[i].unmask(rnd, surv, server.forwarded(i))
    if tamper:
        tamper(reveals)
    return server.finish(reveals)


def plain_sum(xs, ids, bits):
    total = np.zeros(DIM, dtype=np.uint64)
    for i in ids:
        total = group.add(total, xs[i], bits)
    return total


def test_unmasked_sum_equals_the_plain_modular_sum():
    parties, server = make(5)
    for rnd in (1, 2):
        xs = inputs(5, 20, rnd)
        step1(parties, server, rnd, xs)
        assert np.array_equal(step2(parties, server, rnd), plain_sum(xs, range(5), 20))


def test_sparse_graph_sum_and_dropout():
    n = 14
    parties, server = make(n, neighbours=4)  # k = 4, t = 3: each party tolerates one dropped neighbour
    xs = inputs(n, 20)
    step1(parties, server, 1, xs, drop={5})
    assert all(len(v) == 4 for v in server.nbrs.values())
    assert np.array_equal(step2(parties, server, 1), plain_sum(xs, set(range(n)) - {5}, 20))


@pytest.mark.parametrize("dropped", [0, 1, 2])
def test_dropout_up_to_k_minus_t_recovers_the_survivors_sum(dropped):
    parties, server = make(6)  # full graph: k = 5, t = 3
    xs = inputs(6, 20, dropped)
    drop = set(range(dropped))
    step1(parties, server, 1, xs, drop=drop)
    assert np.array_equal(step2(parties, server, 1), plain_sum(xs, set(range(6)) - drop, 20))


def test_more_dropouts_release_nothing():
    parties, server = make(6)
    step1(parties, server, 1, inputs(6, 20), drop={0, 1, 2})
    assert step2(parties, server, 1) is None and "surviving neighbours" in server.reason
    parties, server = make(6, min_survivors=5)
    step1(parties, server, 1, inputs(6, 20), drop={0, 1})
    assert step2(parties, server, 1) is None and "survivors" in server.reason


def test_dropping_between_the_steps():
    parties, server = make(6)
    xs = inputs(6, 20)
    step1(parties, server, 1, xs)
    # a survivor that does not unmask: its self-mask comes from its neighbours' shares
    assert np.array_equal(step2(parties, server, 1, drop={4}), plain_sum(xs, range(6), 20))
    # ... but the pairwise seeds with a party dropped in step 1 come from its surviving neighbours only
    step1(parties, server, 2, xs, drop={0})
    assert step2(parties, server, 2, drop={4}) is None and "pairwise mask" in server.reason


def test_one_masked_vector_is_uniform_whatever_the_input():
    """The server's view of party 0 given the others: its masked vector, for input 0 and for the largest
    element, is uniform on Z_16 (chi-square over 16 cells, 4096 coordinates per input)."""
    bits, dim = 4, 4096
    s = SecAggSettings(bits=bits, min_survivors=2)
    parties = {i: Party(i, s) for i in range(3)}
    server = Server(s, dim)
    server.setup({i: p.public_key() for i, p in parties.items()})
    for p in parties.values():
        p.setup(server.session, server.keys)
    for rnd, value in ((1, 0), (2, 15)):
        seed = server.begin(rnd, [0, 1, 2])
        y, _ = parties[0].mask(rnd, np.full(dim, value, dtype=np.uint64), [0, 1, 2], seed)
        counts = np.bincount(y.astype(np.int64), minlength=16)
        chi2 = float(((counts - dim / 16) ** 2 / (dim / 16)).sum())
        assert chi2 < 44.3  # the 0.9999 quantile of chi-square with 15 degrees of freedom
        assert abs(float(np.mean(y == value)) - 1 / 16) < 0.03


def test_the_server_lying_about_dropouts_is_refused():
    parties, server = make(6)  # k = 5, t = 3
    step1(parties, server, 1, inputs(6, 20))
    forwarded = server.forwarded(0)
    with pytest.raises(SecAggRefused, match="k − t"):  # 3 of 5 neighbours "dropped"
        parties[0].unmask(1, [0, 4, 5], forwarded)
    with pytest.raises(SecAggRefused, match="leaves out"):
        parties[1].unmask(1, [0, 2, 3, 4, 5], server.forwarded(1))
    with pytest.raises(SecAggRefused, match="not participants"):
        parties[2].unmask(1, [0, 1, 2, 3, 4, 9], server.forwarded(2))
    # party 0's refusals changed nothing: it answers the honest request, once, one kind per neighbour
    reveal = parties[0].unmask(1, [0, 1, 2, 3, 5], forwarded)
    assert set(reveal["b"]) == {"1", "2", "3", "5"} and set(reveal["pair"]) == {"4"}
    with pytest.raises(SecAggRefused, match="answered once"):
        parties[0].unmask(1, [0, 1, 2, 3, 4, 5], forwarded)
    with pytest.raises(SecAggRefused, match="masked already"):
        parties[0].mask(1, np.zeros(DIM, dtype=np.uint64), list(range(6)), b"g" * 16)


def test_too_few_survivors_for_the_noise_are_refused_by_a_party():
    parties, server = make(6, min_survivors=5)
    step1(parties, server, 1, inputs(6, 20))
    with pytest.raises(SecAggRefused, match="below the minimum"):
        parties[0].unmask(1, [0, 1, 2, 3], server.forwarded(0))


def test_tampered_sealed_share_is_refused_and_the_sum_survives(caplog):
    parties, server = make(6)
    xs = inputs(6, 20)
    step1(parties, server, 1, xs)
    blob = bytearray(server.sealed[3][0])
    blob[-1] ^= 1
    server.sealed[3][0] = bytes(blob)
    replayed = server.sealed[2][1]
    server.sealed[4][1] = replayed  # a share addressed 2 -> 1, forwarded as if from 4
    with caplog.at_level(logging.WARNING, logger="silofl"):
        total = step2(parties, server, 1)
    assert np.array_equal(total, plain_sum(xs, range(6), 20))
    assert sum("refused the share" in r.message for r in caplog.records) == 2


def test_a_wrong_revealed_share_is_detected_and_nothing_released():
    parties, server = make(6)
    step1(parties, server, 1, inputs(6, 20))

    def lie(reveals):
        share = bytearray(bytes.fromhex(reveals[1]["b"]["0"]))
        share[-1] ^= 1
        reveals[1]["b"]["0"] = bytes(share).hex()

    assert step2(parties, server, 1, tamper=lie) is None and "inconsistent" in server.reason


@pytest.mark.parametrize(
    "hostile",
    [
        "nonsense",
        {"b": [], "pair": {}},
        {"b": {"99": "00" * 66}, "pair": {}},
        {"b": {"2": "zz" * 66}, "pair": {}},
        {"b": {"2": "00" * 65}, "pair": {}},
        {"b": {}, "pair": {"2": "00" * 32}},  # a pairwise seed for a party that survived
        {"b": {"2": "ff" * 66}, "pair": {}},  # outside the field
        {"b": {str(i): "00" * 66 for i in range(50)}, "pair": {}},
    ],
)
def test_hostile_reveals_are_refused_and_the_rest_suffices(hostile, caplog):
    parties, server = make(6)
    xs = inputs(6, 20)
    step1(parties, server, 1, xs)

    def swap(reveals):
        reveals[1] = hostile

    with caplog.at_level(logging.WARNING, logger="silofl"):
        total = step2(parties, server, 1, tamper=swap)
    assert np.array_equal(total, plain_sum(xs, range(6), 20))
    assert any("refused the reveal of party 1" in r.message for r in caplog.records)


def test_hostile_setup_and_inputs_leave_the_party_intact():
    parties, server = make(3)
    p = parties[0]
    session = p.session
    for table in (
        {1: server.keys[1]},  # lacks its own key
        {0: server.keys[0], 1: b"\0" * 32},  # low-order point
        {0: server.keys[0], "x": server.keys[1]},
    ):
        with pytest.raises(SecAggRefused):
            p.setup(b"n" * 16, table)
        assert p.session == session
    with pytest.raises(SecAggRefused):
        p.setup(b"short", server.keys)
    seed = server.begin(1, [0, 1, 2])
    with pytest.raises(SecAggRefused, match="uint64"):
        p.mask(1, np.full(DIM, 1 << 21, dtype=np.uint64), [0, 1, 2], seed)
    with pytest.raises(SecAggRefused, match="not among"):
        p.mask(1, np.zeros(DIM, dtype=np.uint64), [1, 2], seed)
    with pytest.raises(SecAggRefused):
        server.receive(0, np.zeros(DIM + 1, dtype=np.uint64), {})
    y, sealed = p.mask(1, np.zeros(DIM, dtype=np.uint64), [0, 1, 2], seed)
    with pytest.raises(SecAggRefused, match="one sealed share"):
        server.receive(0, y, {1: sealed[1]})
    server.receive(0, y, sealed)
    with pytest.raises(SecAggRefused, match="twice"):
        server.receive(0, y, sealed)


def test_settings_refuse_a_threshold_a_lying_server_could_exploit():
    s = SecAggSettings(bits=16, min_survivors=2, threshold=2)
    with pytest.raises(ValueError, match=r"\(k/2, k\]"):
        s.check_round(6)  # k = 5: t = 2 would let one party's two secrets both be collected
    with pytest.raises(ValueError):
        SecAggSettings(bits=0, min_survivors=2)
