"""The broker service answers every malformed request with a 4xx and a reason, and a refused request changes
nothing (issue 25, item 8). Every route of its OpenAPI schema is fuzzed by schemathesis (valid and invalid
path parameters, queries and bodies), each case sent as the operator, as a registered site and with no
credential; the listed requests are those seen to crash it (500) before.

What "no state change" means here: after every refused request (4xx), the broker's database (every table,
credentials included) and the file names under its state folder are exactly what they were before it; the
access log grows by design (one line per request), SQLite's WAL files are physical, not state. A 2xx request
of the operator or a site is a legitimate write (a registration, a join, a channel) and is the only thing that
may change them."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from silofl.pubsub.service import admin_credential_path, create_app  # noqa: E402


def _key() -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from silofl.pubsub.signing import public_key_hex

    return public_key_hex(Ed25519PrivateKey.generate())


class Broker:
    """A service on a fresh state folder with a registered site ``a`` (joined, one feature, one channel)."""

    def __init__(self, state: Path):
        self.state = state
        self.app = create_app(state, rate=1e9, burst=10**9)
        self.client = TestClient(self.app, raise_server_exceptions=False)
        admin = json.loads(admin_credential_path(state).read_text())["token"]
        self.admin = {"Authorization": f"Bearer {admin}"}
        r = self.client.post(
            "/v1/sites",
            json={"site": "a", "public_key": _key(), "lifetime_epsilon": 4, "lifetime_delta": 1e-4},
            headers=self.admin,
        )
        self.site = {"Authorization": f"Bearer {r.json()['token']}"}
        assert (
            self.client.post(
                "/v1/join", json={"features": {"x": ["continuous", 0.5, 0, 1]}}, headers=self.site
            ).status_code
            == 200
        )
        assert (
            self.client.post("/v1/channels", json={"clauses": [["x"]]}, headers=self.site).status_code == 200
        )

    def snapshot(self) -> tuple:
        with closing(sqlite3.connect(self.state / "broker" / "broker.sqlite")) as db:
            dump = tuple(db.iterdump())
        files = tuple(
            sorted(
                str(p.relative_to(self.state))
                for p in self.state.rglob("*")
                if p.name != "access.log" and not p.name.endswith(("-wal", "-shm"))
            )
        )
        return dump, files

    def check(self, send) -> int:
        """Send one request (``send(headers)``) as operator, site and anonymous; each answer is < 500, a
        refusal carries {"error": reason} and changes nothing. The statuses seen."""
        seen = []
        for headers in (self.admin, self.site, {}):
            before = self.snapshot()
            r = send(headers)
            assert r.status_code < 500, (r.status_code, r.text[:300])
            if r.status_code >= 400:
                body = r.json()
                assert isinstance(body, dict) and str(body.get("error", "")).strip(), r.text[:300]
                assert self.snapshot() == before, f"a refused request ({r.status_code}) changed the broker"
            seen.append(r.status_code)
        return seen


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    return Broker(tmp_path_factory.mktemp("broker-state"))


def _schema():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        raw = create_app(d).app.openapi()  # the service hides /openapi.json; the schema is the app's own
    return schemathesis.openapi.from_dict(raw)


SCHEMA = _schema()
HUGE = 10**23


OPERATIONS = [r.ok() for r in SCHEMA.get_all_operations()]


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_every_route_fuzzed_answers_4xx_with_a_reason_and_a_refusal_changes_nothing(operation, broker):
    # valid and invalid cases of one route per test id (schemathesis' own parametrize gives every route the
    # same id, which pytest-xdist collapses into one)
    @given(case=st.one_of(*(operation.as_strategy(mode) for mode in GenerationMode)))
    @settings(
        max_examples=10,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case):
        broker.check(lambda headers: case.call(app=broker.app, headers=headers))

    fuzz()


MALFORMED = [  # (method, path, JSON body): each answered 500 (or dropped) before
    ("GET", f"/v1/models/{HUGE}", None),
    ("DELETE", f"/v1/models/{HUGE}", None),
    ("GET", f"/v1/channels/{HUGE}", None),
    ("DELETE", f"/v1/channels/{HUGE}", None),
    ("GET", f"/v1/channels/{HUGE}/stream", None),
    ("GET", f"/v1/channels/1/stream?since={HUGE}", None),
    ("POST", "/v1/join", {"features": {"y": ["continuous", 0, "a", "b"]}}),
    ("POST", "/v1/join", {"features": ["y"]}),
    ("POST", "/v1/join", {"features": 5}),
    ("POST", "/v1/join", {"features": {"y": ["continuous", 0, None, 1]}}),
    ("POST", "/v1/join", {"features": {"y": ["categorical", [1, {}], 0, 1]}}),
    ("POST", "/v1/join", {"features": {"": ["continuous", 0, 0, 1]}}),
    ("POST", "/v1/channels", {"clauses": 7}),
    ("POST", "/v1/channels", {"clauses": "x"}),
    ("POST", "/v1/channels", {"clauses": [[1, 2]]}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "body"), MALFORMED)
def test_a_malformed_request_is_a_4xx_with_a_reason(broker, method, path, body):
    seen = broker.check(lambda headers: broker.client.request(method, path, json=body, headers=headers))
    assert all(400 <= s < 500 for s in seen), seen
