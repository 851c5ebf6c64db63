"""Out-of-range numbers at the broker (issue 41, "smaller holes"): a 400-digit lifetime answered 500, a
5000-digit one dropped the connection, ``"lifetime_epsilon": true`` was taken as 1.0. Every JSON body is
parsed with each number's length bounded before it is converted and no bool is a number: a one-line 400, and
nothing registered."""

import json

import pytest
from starlette.testclient import TestClient

from silofl.core.errors import ConfigError
from silofl.pubsub.broker import check_number, strict_json
from silofl.pubsub.service import admin_credential_path, create_app

HOSTILE = {
    "400 digits": "1" + "0" * 400,
    "5000 digits": "1" + "0" * 5000,
    "true": "true",
    "a string": '"4"',
    "NaN": "NaN",
    "Infinity": "Infinity",
    "1e400": "1e400",
}


def registration(site: str, epsilon: str) -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from silofl.pubsub.signing import public_key_hex

    key = public_key_hex(Ed25519PrivateKey.generate())
    return (
        f'{{"site": "{site}", "public_key": "{key}", "lifetime_epsilon": {epsilon}, "lifetime_delta": 1e-4}}'
    )


def check_refusals(post, publishers):
    for i, (what, eps) in enumerate(HOSTILE.items()):
        r = post(registration(f"s{i}", eps))
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
        error = r.json()["error"]
        assert error and "\n" not in error and len(error) < 300, (what, error)
    assert publishers() == []  # nothing registered
    r = post(registration("fine", "4"))
    assert r.status_code == 200 and [p["site"] for p in publishers()] == ["fine"]


def test_hostile_numbers_in_a_registration_are_one_line_4xx_and_register_nothing(tmp_path):
    app = create_app(tmp_path, rate=1e9, burst=10**9)
    client = TestClient(app, raise_server_exceptions=False)
    token = json.loads(admin_credential_path(tmp_path).read_text())["token"]
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    check_refusals(
        lambda body: client.post("/v1/sites", content=body, headers=headers),
        lambda: client.get("/v1/publishers", headers=headers).json(),
    )


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_real_broker_process_answers_hostile_numbers_with_4xx_and_keeps_the_connection(tmp_path):
    from tests.pubsub.test_service import Server

    server = Server(tmp_path)
    server.start()
    try:
        token = json.loads(admin_credential_path(server.state).read_text())["token"]
        with server.http(token) as c:  # one connection for every request: none is dropped
            check_refusals(
                lambda body: c.post("/v1/sites", content=body, headers={"content-type": "application/json"}),
                lambda: c.get("/v1/publishers").json(),
            )
    finally:
        server.stop()


def test_strict_json_bounds_numbers_before_converting_them():
    assert strict_json(b'{"a": [1, 2.5, -3e2]}') == {"a": [1, 2.5, -300.0]}
    for bad in (b'{"a": ' + b"9" * 5000 + b"}", b"[NaN]", b"[-Infinity]", b"{", b"[" * 100000):
        with pytest.raises(ConfigError):
            strict_json(bad)
    assert check_number(4, "x") == 4.0 and check_number(0.5, "x") == 0.5
    for bad in (True, False, "4", None, [1], 10**400):
        with pytest.raises(ConfigError, match="x must be a number"):
            check_number(bad, "x")
