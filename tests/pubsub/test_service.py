"""The broker service as a real server process on loopback with a test certificate: publish, subscribe,
customize and stream end to end through ``--broker https://…``; every attack refused with nothing lost; a
restart keeps the state. One server per module (starting one imports torch)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.privacy.ledger import Ledger
from silofl.pubsub.signing import header_metadata, load_signing_key, sign_model
from tests.data.test_tables import site_frame, write_schema

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
runner = CliRunner()
MAX_UPLOAD = 256 * 1024
RATE, BURST = 20, 40


def said(res, text: str) -> bool:
    """Whether the command printed ``text``, whatever the console's line wrapping."""
    return "".join(text.split()) in "".join(res.output.split())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, root: Path):
        self.root, self.state = root, root / "state"
        res = runner.invoke(app, ["pubsub", "cert", "--out", str(root / "tls"), "--host", "127.0.0.1"])
        assert res.exit_code == 0, res.output
        self.ca = str(root / "tls" / "ca.pem")
        self.proc = None

    def start(self) -> None:
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.log = open(self.root / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "silofl.cli.main",
                "pubsub",
                "serve",
                "--state",
                str(self.state),
                "--port",
                str(self.port),
                "--cert",
                str(self.root / "tls" / "server.pem"),
                "--key",
                str(self.root / "tls" / "server.key"),
                "--max-upload-mb",
                str(MAX_UPLOAD / 2**20),
                "--rate",
                str(RATE),
                "--burst",
                str(BURST),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / f"server-{self.port}.log").read_text()
            try:
                if httpx.get(self.url + "/health", verify=self.ca, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.3)
        raise AssertionError("the broker did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def http(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=self.ca,
            timeout=30,
            headers={"Authorization": f"Bearer {token}"} if token else {},
        )

    def snapshot(self) -> tuple:
        """Everything the operator sees: publishers and their spend, sites, models with their bytes."""
        with self.http(self.admin["token"]) as c:

            def get(path):
                while (
                    r := c.get(path)
                ).status_code == 429:  # the operator's own credential is rate limited too
                    time.sleep(float(r.headers["retry-after"]))
                assert r.status_code == 200, r.text
                return r

            models = get("/v1/models").json()
            blobs = [get(f"/v1/models/{m['id']}").content for m in models]
            return get("/v1/publishers").json(), get("/v1/sites").json(), models, blobs

    @property
    def admin(self) -> dict:
        return json.loads((self.state / "admin.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("broker-service")
    s = Server(root)
    s.start()
    assert (s.state / "admin.json").stat().st_mode & 0o777 == 0o600
    yield s
    s.stop()


def enroll_and_register(server, root: Path, site: str, lifetime="4") -> str:
    """The site makes its key and request; the operator registers it; the site's credential path."""
    res = runner.invoke(
        app,
        [
            "pubsub",
            "enroll",
            "--site",
            site,
            "--site-dir",
            str(root / "sites" / site),
            "--lifetime-epsilon",
            lifetime,
            "--out",
            str(root / f"{site}.request.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    cred = root / "creds" / site / "credential.json"
    res = runner.invoke(
        app,
        [
            "pubsub",
            "register",
            "--broker",
            server.url,
            "--credential",
            str(server.state / "admin.json"),
            "--ca",
            server.ca,
            "--request",
            str(root / f"{site}.request.json"),
            "--out",
            str(cred),
        ],
    )
    assert res.exit_code == 0, res.output
    return str(cred)


def publish(server, root, site, cred, data, *extra, epsilon="1"):
    return runner.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            server.url,
            "--credential",
            cred,
            "--site",
            site,
            "--data",
            str(data),
            "--schema",
            str(write_schema(root)),
            "--epsilon",
            epsilon,
            "--site-dir",
            str(root / "sites" / site),
            *extra,
        ],
    )


def test_publish_subscribe_customize_and_stream_through_the_service(server, tmp_path):
    creds = {s: enroll_and_register(server, tmp_path, s) for s in ("h1", "h2", "sub")}
    for i, s in enumerate(("h1", "h2")):
        site_frame(300, seed=i).to_csv(tmp_path / f"{s}.csv", index=False)
        res = publish(server, tmp_path, s, creds[s], tmp_path / f"{s}.csv")
        assert res.exit_code == 0, res.output
        assert said(res, "spent up to ε=1,")
    res = runner.invoke(
        app,
        [
            "pubsub",
            "subscribe",
            "--broker",
            server.url,
            "--credential",
            creds["sub"],
            "--site",
            "sub",
            "--channel",
            "age,dose",
        ],
    )
    assert res.exit_code == 0 and said(res, "2 models match"), res.output
    res = runner.invoke(app, ["pubsub", "list", "--broker", server.url, "--credential", creds["sub"]])
    assert res.exit_code == 0, res.output
    pubs = {p["site"]: p for p in server.snapshot()[0]}
    assert pubs["h1"]["epsilon_spent"] == 1.0 and pubs["h1"]["lifetime"] == [4.0, 1e-4]
    site_frame(200, seed=7).to_csv(tmp_path / "sub.csv", index=False)
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        [
            "pubsub",
            "customize",
            "--broker",
            server.url,
            "--credential",
            creds["sub"],
            "--site",
            "sub",
            "--data",
            str(tmp_path / "sub.csv"),
            "--schema",
            str(write_schema(tmp_path)),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "customization.json").read_text())
    assert len(rep["models_fetched"]) == 2 and rep["models_skipped"] == []
    # a stream through the service: one model per chunk, the oldest withdrawn (k = 1), each chunk in the
    # ledger
    site_frame(200, seed=9).to_csv(tmp_path / "h2s.csv", index=False)
    res = runner.invoke(
        app,
        [
            "pubsub",
            "stream",
            "--broker",
            server.url,
            "--credential",
            creds["h2"],
            "--site",
            "h2",
            "--data",
            str(tmp_path / "h2s.csv"),
            "--schema",
            str(write_schema(tmp_path)),
            "--epsilon",
            "1",
            "--chunk-size",
            "100",
            "--ensemble",
            "1",
            "--site-dir",
            str(tmp_path / "sites" / "h2"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert said(res, "withdrew chunk 0")
    h2 = [m for m in server.snapshot()[2] if m["publisher"] == "h2"]
    assert [m["chunk"] for m in h2] == [None, 1] and all(m["signed"] for m in h2)
    # the ledger went up by one release per published model (chunk records are new rows)
    assert Ledger(tmp_path / "sites" / "h2" / "ledger").spent() == (1.0, pytest.approx(1e-5))
    # a credential only acts as its site, in one line, exit code 2
    res = publish(server, tmp_path, "h2", creds["h1"], tmp_path / "h1.csv")
    assert res.exit_code == 2 and said(res, "is 'h1''s, not 'h2''s") and "Traceback" not in res.output
    res = runner.invoke(app, ["pubsub", "list", "--broker", server.url])
    assert res.exit_code == 2 and said(res, "--credential")


def test_attacks_are_refused_and_nothing_is_lost(server, tmp_path):
    creds = {s: json.loads(Path(enroll_and_register(server, tmp_path, s)).read_text()) for s in ("a1", "b1")}
    site_frame(300, seed=3).to_csv(tmp_path / "a1.csv", index=False)
    assert (
        publish(
            server, tmp_path, "a1", str(tmp_path / "creds" / "a1" / "credential.json"), tmp_path / "a1.csv"
        ).exit_code
        == 0
    )
    site_frame(300, seed=4).to_csv(tmp_path / "b1.csv", index=False)
    assert (
        publish(
            server, tmp_path, "b1", str(tmp_path / "creds" / "b1" / "credential.json"), tmp_path / "b1.csv"
        ).exit_code
        == 0
    )
    before = server.snapshot()
    a_models = [m["id"] for m in before[2] if m["publisher"] == "a1"]
    b_models = [m["id"] for m in before[2] if m["publisher"] == "b1"]
    with server.http(creds["b1"]["token"]) as c:
        b_blob = c.get(f"/v1/models/{b_models[0]}").content
    key_a = load_signing_key(tmp_path / "sites" / "a1")
    rel = json.loads(header_metadata(b_blob)["silofl.release"])
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    meta = header_metadata(b_blob)
    a_as_b = sign_model(
        st_save(st_load(b_blob), metadata={"silofl.pubsub": meta["silofl.pubsub"]}),
        key_a,
        {**rel, "ledger_seq": 99},
    )
    tensors = st_load(b_blob)
    tensors["coef"] = tensors["coef"] * 2
    tampered = st_save(tensors, metadata=meta)
    pm = json.loads(meta["silofl.pubsub"])
    own = st_save(st_load(b_blob), metadata={"silofl.pubsub": json.dumps({**pm, "publisher": "a1"})})
    over = sign_model(
        own, key_a, {**rel, "site": "a1", "epsilon_spent": 5.0, "lifetime": [4.0, 1e-4], "ledger_seq": 99}
    )
    missing = sign_model(
        own,
        key_a,
        {
            k: v
            for k, v in {**rel, "site": "a1", "ledger_seq": 99}.items()
            if k not in ("epsilon_spent", "delta_spent")
        },
    )
    replayed = a_blob = None
    with server.http(creds["a1"]["token"]) as c:
        a_blob = c.get(f"/v1/models/{a_models[0]}").content
        replayed = a_blob  # the same signed model again (same ledger entry)
    attempts = {
        "unauthenticated publish": (None, "POST", "/v1/models", a_blob, 401),
        "a forged token": ("slf_forged", "POST", "/v1/models", a_blob, 401),
        "publish as another site (b1's signed model)": (
            creds["a1"]["token"],
            "POST",
            "/v1/models",
            b_blob,
            403,
        ),
        "publish as another site (signed by a1)": (creds["a1"]["token"], "POST", "/v1/models", a_as_b, 403),
        "a tampered model": (creds["b1"]["token"], "POST", "/v1/models", tampered, 422),
        "a declared spend over the budget": (creds["a1"]["token"], "POST", "/v1/models", over, 422),
        "a missing declared spend": (creds["a1"]["token"], "POST", "/v1/models", missing, 422),
        "a replayed model": (creds["a1"]["token"], "POST", "/v1/models", replayed, 422),
        "withdraw another site's model": (
            creds["a1"]["token"],
            "DELETE",
            f"/v1/models/{b_models[0]}",
            None,
            403,
        ),
        "remove another site": (creds["a1"]["token"], "DELETE", "/v1/sites/b1", None, 403),
        "register a site as a site": (creds["a1"]["token"], "POST", "/v1/sites", b"{}", 403),
        "an oversized upload": (creds["a1"]["token"], "POST", "/v1/models", b"\0" * (MAX_UPLOAD + 1), 413),
    }
    for what, (token, method, path, body, status) in attempts.items():
        with server.http(token) as c:
            r = c.request(method, path, content=body)
        assert r.status_code == status, (what, r.status_code, r.text)
        assert server.snapshot() == before, what
    with server.http(creds["a1"]["token"]) as c:  # a chunked upload without a length, cut off at the bound

        def chunks():
            for _ in range(64):
                yield b"\0" * 16384

        try:
            r = c.post("/v1/models", content=chunks())
            assert r.status_code == 413
        except httpx.TransportError:
            pass  # the server may close the connection while the client still sends
        assert c.get(f"/v1/models/{b_models[0]}").status_code == 403  # b1's model is on none of a1's channels
    assert server.snapshot() == before
    log = [json.loads(line) for line in (server.state / "access.log").read_text().splitlines()]
    assert {401, 403, 413, 422} <= {e["status"] for e in log}
    assert all(set(e) >= {"time", "client", "method", "path", "status", "site", "ms"} for e in log)
    text = (server.state / "access.log").read_text()
    assert creds["a1"]["token"] not in text and "slf_forged" not in text


def test_a_burst_beyond_the_rate_limit_is_refused_and_nothing_is_lost(server, tmp_path):
    cred = json.loads(Path(enroll_and_register(server, tmp_path, "bursty")).read_text())
    before = server.snapshot()
    with server.http(cred["token"]) as c:
        codes = [c.get("/v1/models").status_code for _ in range(BURST + 20)]
        assert codes[:BURST] == [200] * BURST and 429 in codes[BURST:]
        r = c.get("/v1/models")
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
    with server.http(server.admin["token"]) as c:  # other credentials are not throttled by it
        assert c.get("/v1/whoami").json() == {"site": "admin", "role": "admin"}
    assert server.snapshot() == before


def test_the_broker_restarts_with_its_state(server, tmp_path):
    before = server.snapshot()
    admin = server.admin
    assert before[2], "earlier tests published models"
    server.stop()
    server.start()
    assert server.admin == admin  # the operator's credential is written once
    assert server.snapshot() == before
    with httpx.Client(base_url=server.url, verify=server.ca) as c:
        assert c.get("/health").json()["models"] == len(before[2])
