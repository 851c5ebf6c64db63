"""The PubSub-ML broker as an authenticated HTTPS service (``silofl pubsub serve``).

FastAPI on uvicorn, TLS by default. The state folder holds the broker (:class:`~silofl.pubsub.broker.Broker`
in ``broker/``: SQLite in WAL mode for the registry, channels and models; the model store is
content-addressed, one file per SHA-256) and ``access.log`` (one JSON object per request). Identity:

* the **operator** holds the admin credential (written once, mode 0600, to ``admin.json`` in the state folder
  on first start) and registers each site once, with the site's Ed25519 public key and declared lifetime
  budget (``POST /v1/sites``); the site gets an API token, shown once and stored only as its SHA-256;
* a **site** acts only as itself: it publishes models it signed (the publisher in the model must be the
  credential's site, the signature must verify against its registered key, the declared spend must be present
  and within its declared budget), withdraws its own models, leaves, opens channels, and reads the models its
  channels deliver (and its own);
* the admin can withdraw any model or remove any site from the broker, but cannot publish (it has no key).

Limits: a request body larger than its route's bound is refused with 413 from its ``Content-Length`` before
the body is read, or as soon as a chunked body passes the bound; each credential (and each client address
without a valid credential) has a token bucket (``rate`` requests per second, ``burst`` at once), 429 beyond
it. A refused request changes nothing.
"""

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, ModelRejected, SiloflError
from silofl.core.extras import require
from silofl.deploy.pki import write_private
from silofl.pubsub.broker import Broker, check_number, strict_json
from silofl.pubsub.model import MAX_BYTES

MAX_JSON = 64 * 1024  # the bound on every request body except a model upload
ADMIN = "admin"
CRED_SCHEMA = """
CREATE TABLE IF NOT EXISTS credentials (
    token_sha256 TEXT PRIMARY KEY, site TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL CHECK (role IN ('admin', 'site')),
    created_at TEXT NOT NULL);
"""


def hash_token(token: str) -> str:
    """How a token is stored: its SHA-256 (tokens are 256-bit random, so no salt or stretching is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Credentials:
    """API tokens, stored hashed, in the broker's database."""

    def __init__(self, db_path: Path):
        self.db_path = db_path
        with closing(sqlite3.connect(db_path, timeout=30)) as db, db:
            db.executescript(CRED_SCHEMA)

    def issue(self, site: str, role: str) -> str:
        """A new token for ``site`` (ConfigError if it has one)."""
        token = "slf_" + secrets.token_urlsafe(32)
        with closing(sqlite3.connect(self.db_path, timeout=30)) as db, db:
            try:
                db.execute(
                    "INSERT INTO credentials VALUES (?, ?, ?, ?)",
                    (hash_token(token), site, role, datetime.now(UTC).isoformat(timespec="seconds")),
                )
            except sqlite3.IntegrityError:
                raise ConfigError(f"{site!r} has a credential already") from None
        return token

    def lookup(self, token: str) -> tuple[str, str] | None:
        """(site, role) of a token, or None."""
        with closing(sqlite3.connect(self.db_path, timeout=30)) as db:
            row = db.execute(
                "SELECT site, role FROM credentials WHERE token_sha256 = ?", (hash_token(token),)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def has_admin(self) -> bool:
        """Whether an admin credential exists."""
        with closing(sqlite3.connect(self.db_path, timeout=30)) as db:
            return db.execute("SELECT 1 FROM credentials WHERE role = 'admin'").fetchone() is not None


class RateLimiter:
    """One token bucket per key: ``rate`` requests per second, at most ``burst`` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = float(rate), int(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> float:
        """0 if a request of ``key`` may go now (and takes a token), else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate if self.rate > 0 else 3600.0


class LimitsAndLog:
    """ASGI middleware: body size bounds (before the body is read) and a JSON access log line per request."""

    def __init__(self, app, max_upload: int, log_path: Path | None):
        self.app, self.max_upload, self.log_path = app, max_upload, log_path
        self._log_lock = threading.Lock()

    def limit(self, path: str, method: str) -> int:
        """The most bytes a request to ``path`` may carry (a model upload, or any JSON request)."""
        return self.max_upload if (method == "POST" and path == "/v1/models") else MAX_JSON

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        info: dict[str, Any] = {"status": None, "bytes_out": 0, "bytes_in": 0}
        limit = self.limit(scope["path"], scope["method"])
        headers = dict(scope.get("headers") or [])

        async def send_logged(msg):
            if msg["type"] == "http.response.start":
                info["status"] = msg["status"]
            elif msg["type"] == "http.response.body":
                info["bytes_out"] += len(msg.get("body", b""))
            await send(msg)

        async def too_large():
            body = json.dumps(
                {"error": f"request body over the {limit}-byte limit of {scope['path']}"}
            ).encode()
            await send_logged(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"connection", b"close"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send_logged({"type": "http.response.body", "body": body})

        try:
            declared = headers.get(b"content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > limit):
                await too_large()  # refused from the header: the body is never read
                return

            if declared is None and scope["method"] in ("POST", "PUT", "PATCH"):
                # a body without a length (chunked): read it here, at most up to the bound, then hand it on
                parts, more = [], True
                while more:
                    msg = await receive()
                    if msg["type"] != "http.request":
                        return
                    parts.append(msg.get("body", b""))
                    info["bytes_in"] += len(parts[-1])
                    if info["bytes_in"] > limit:
                        await too_large()
                        return
                    more = msg.get("more_body", False)
                body, done = b"".join(parts), False

                async def replay():
                    nonlocal done
                    if done:
                        return await receive()
                    done = True
                    return {"type": "http.request", "body": body, "more_body": False}

                await self.app(scope, replay, send_logged)
                return
            info["bytes_in"] = int(declared or 0)
            await self.app(scope, receive, send_logged)
        finally:
            self._log(scope, info, t0)

    def _log(self, scope, info, t0) -> None:
        client = scope.get("client") or ("", 0)
        line = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "client": client[0],
            "method": scope["method"],
            "path": scope["path"],
            "status": info["status"],
            "site": scope["state"].get("site"),
            "bytes_in": info["bytes_in"],
            "bytes_out": info["bytes_out"],
            "ms": round((time.perf_counter() - t0) * 1000, 2),
        }
        if scope["state"].get("refused"):
            line["refused"] = scope["state"]["refused"]
        text = json.dumps(line)
        with self._log_lock:
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write(text + "\n")


def admin_credential_path(state: Path) -> Path:
    """Where the operator's credential is written (once, mode 0600) in the broker's state folder."""
    return state / "admin.json"


def create_app(
    state: str | Path,
    *,
    max_upload: int = MAX_BYTES,
    rate: float = 20.0,
    burst: int = 40,
    public_url: str | None = None,
):
    """The FastAPI application serving the broker in ``state`` (see the module doc). On first use it writes
    the operator's credential to ``state/admin.json`` (mode 0600)."""
    require("fastapi", "pubsub", "the PubSub-ML broker service")
    from fastapi import FastAPI

    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    broker = Broker(state / "broker", max_bytes=max_upload, require_signed=True, wal=True)
    creds = Credentials(broker.db_path)
    if not creds.has_admin():
        token = creds.issue(ADMIN, "admin")
        path = admin_credential_path(state)
        write_private(path, json.dumps({"broker": public_url, "site": ADMIN, "token": token}).encode())
    limiter = RateLimiter(rate, burst)
    lock = threading.Lock()  # one writer at a time (checks and writes of a publish stay together)

    app = FastAPI(title="silofl PubSub-ML broker", docs_url=None, redoc_url=None, openapi_url=None)
    caller, require_admin, require_site, json_body = _guard(app, creds, limiter, rate, burst)
    _add_site_routes(app, broker, creds, lock, max_upload, caller, require_admin, require_site, json_body)
    _add_model_routes(app, broker, lock, max_upload, caller, require_site, json_body)
    return LimitsAndLog(app, max_upload, state / "access.log")


def _guard(app, creds: Credentials, limiter: RateLimiter, rate: float, burst: int):
    """Install the error handlers (one JSON reason each) and return the routes' dependencies: the caller
    (rate-limited, authenticated), the admin, a site, a JSON body."""
    from fastapi import Depends, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @app.exception_handler(SiloflError)
    async def refused(request: Request, exc: SiloflError):
        status = 422 if isinstance(exc, ModelRejected) else 400
        request.state.refused = str(exc)[:200]
        return JSONResponse({"error": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        msg = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors())[:300]
        request.state.refused = msg
        return JSONResponse({"error": f"malformed request: {msg}"}, status_code=400)

    from starlette.exceptions import (
        HTTPException as RoutingError,  # 404 / 405 from routing: the same JSON reason
    )

    @app.exception_handler(RoutingError)
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: RoutingError):
        request.state.refused = str(exc.detail)[:200]
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    def caller(request: Request) -> tuple[str, str]:
        auth = request.headers.get("authorization", "")
        who = creds.lookup(auth[7:].strip()) if auth.lower().startswith("bearer ") else None
        key = f"site:{who[0]}" if who else f"ip:{request.client.host if request.client else ''}"
        wait = limiter.allow(key)
        if wait:
            raise HTTPException(
                429,
                f"rate limit: {rate:g} requests/s, burst {burst}; retry in {wait:.2f} s",
                headers={"Retry-After": str(max(1, round(wait)))},
            )
        if who is None:
            raise HTTPException(
                401,
                "a valid credential is needed (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        request.state.site = who[0]
        return who

    def require_admin(who=Depends(caller)) -> tuple[str, str]:
        if who[1] != "admin":
            raise HTTPException(403, "only the operator (admin credential) may do this")
        return who

    def require_site(who=Depends(caller)) -> str:
        if who[1] != "site":
            raise HTTPException(
                403, "only a registered site may do this (the admin credential has no signing key)"
            )
        return who[0]

    async def json_body(request: Request) -> dict:
        """The request's JSON object, numbers bounded before they are parsed (broker.strict_json)."""
        body = strict_json(await request.body())
        if not isinstance(body, dict):
            raise ConfigError("malformed request: the body is a JSON object")
        return body

    return caller, require_admin, require_site, json_body


def _add_site_routes(app, broker, creds, lock, max_upload, caller, require_admin, require_site, json_body):
    """Health, identity and the site registry: register, list, join, leave."""
    from fastapi import Depends, HTTPException

    @app.get("/health")
    def health():
        with closing(broker._connect()) as db:
            n = db.execute("SELECT COUNT(*) FROM models").fetchone()[0]
        return {"status": "ok", "models": n, "max_upload": max_upload}

    @app.get("/v1/whoami")
    def whoami(who=Depends(caller)):
        return {"site": who[0], "role": who[1]}

    @app.post("/v1/sites")
    def register(who=Depends(require_admin), body: dict = Depends(json_body)):
        try:
            site, key = str(body["site"]), str(body["public_key"])
            lifetime = (
                check_number(body["lifetime_epsilon"], "lifetime_epsilon"),
                check_number(body["lifetime_delta"], "lifetime_delta"),
            )
        except (KeyError, TypeError):
            raise ConfigError(
                "registration needs site, public_key, lifetime_epsilon, lifetime_delta"
            ) from None
        if site == ADMIN:
            raise ConfigError(f"{ADMIN!r} is the operator's name")
        with lock:
            broker.register_publisher(site, key, lifetime)
            token = creds.issue(site, "site")
        return {"site": site, "token": token}

    @app.get("/v1/publishers")
    def publishers(who=Depends(caller)):
        return broker.publishers()

    @app.get("/v1/sites")
    def sites(who=Depends(caller)):
        return broker.sites()

    @app.post("/v1/join")
    def join(site=Depends(require_site), body: dict = Depends(json_body)):
        with lock:
            broker.join(site, body.get("features") or {})
        return {"site": site}

    @app.delete("/v1/sites/{site}")
    def leave(site: str, who=Depends(caller)):
        if who[1] != "admin" and site != who[0]:
            raise HTTPException(403, f"{who[0]!r} may not remove {site!r}: a site leaves only as itself")
        with lock:
            return {"withdrawn": broker.leave(site)}


def _add_model_routes(app, broker, lock, max_upload, caller, require_site, json_body):
    """Publish, list, fetch and withdraw models; open, read and close the channels that deliver them (a caller
    reads only what its channels deliver); the broker's public defaults."""
    from fastapi import Depends, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import Response

    def may_read(who: tuple[str, str], meta: dict, channels: list | None = None) -> bool:
        if who[1] == "admin" or meta["publisher"] == who[0]:
            return True
        return any(
            ch.matches(meta["features"])
            for ch in (channels if channels is not None else broker.channels(who[0]))
        )

    def model_meta(model_id: int) -> dict:
        meta = broker.model(model_id)
        if meta is None:
            raise HTTPException(404, f"no published model {model_id}")
        return meta

    @app.post("/v1/models")
    async def publish(request: Request, site=Depends(require_site)):
        data = await request.body()

        def store() -> int:
            from silofl.pubsub.model import PublishedModel

            model = PublishedModel.from_bytes(data, max_upload)
            if model.publisher != site:
                raise HTTPException(403, f"{site!r} may not publish as {model.publisher!r}")
            with lock:
                return broker.publish(data)

        return {"id": await run_in_threadpool(store)}

    @app.get("/v1/models")
    def models(publisher: str | None = None, who=Depends(caller)):
        channels = broker.channels(who[0])  # once per listing, not once per model
        return [m for m in broker.models(publisher) if may_read(who, m, channels)]

    @app.get("/v1/models/{model_id}")
    def fetch(model_id: int, who=Depends(caller)):
        if not may_read(who, model_meta(model_id)):
            raise HTTPException(403, f"model {model_id} is on none of {who[0]!r}'s channels")
        return Response(broker.fetch_bytes(model_id), media_type="application/octet-stream")

    @app.delete("/v1/models/{model_id}")
    def withdraw(model_id: int, who=Depends(caller)):
        meta = model_meta(model_id)
        if who[1] != "admin" and meta["publisher"] != who[0]:
            raise HTTPException(403, f"{who[0]!r} may not withdraw {meta['publisher']!r}'s model {model_id}")
        with lock:
            broker.unpublish(model_id)
        return {"withdrawn": model_id}

    @app.post("/v1/channels")
    def subscribe(site=Depends(require_site), body: dict = Depends(json_body)):
        with lock:
            ch = broker.subscribe(site, body.get("clauses") or [])
        return _channel_json(ch)

    def own_channel(channel_id: int, who) -> Any:
        ch = broker.channel(channel_id)
        if who[1] != "admin" and ch.subscriber != who[0]:
            raise HTTPException(403, f"channel {channel_id} is not {who[0]!r}'s")
        return ch

    @app.get("/v1/channels")
    def channels(who=Depends(caller)):
        return [_channel_json(c) for c in broker.channels(who[0])]

    @app.get("/v1/channels/{channel_id}")
    def channel(channel_id: int, who=Depends(caller)):
        return _channel_json(own_channel(channel_id, who))

    @app.get("/v1/channels/{channel_id}/stream")
    def stream(channel_id: int, since: int = 0, who=Depends(caller)):
        own_channel(channel_id, who)
        return broker.stream(channel_id, since)

    @app.delete("/v1/channels/{channel_id}")
    def unsubscribe(channel_id: int, who=Depends(caller)):
        own_channel(channel_id, who)
        with lock:
            broker.unsubscribe(channel_id)
        return {"closed": channel_id}

    @app.get("/v1/defaults")
    def defaults(who=Depends(caller)):
        return broker.public_defaults()


def _channel_json(ch) -> dict:
    return {"id": ch.id, "subscriber": ch.subscriber, "clauses": [sorted(c) for c in ch.clauses]}


def serve(
    state: str | Path,
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    *,
    max_upload: int = MAX_BYTES,
    rate: float = 20.0,
    burst: int = 40,
    log_level: str = "warning",
) -> None:
    """Run the service until interrupted (HTTPS unless ``certfile`` is None)."""
    uvicorn = require("uvicorn", "pubsub", "silofl pubsub serve")
    require("fastapi", "pubsub", "silofl pubsub serve")

    scheme = "https" if certfile else "http"
    app = create_app(
        state, max_upload=max_upload, rate=rate, burst=burst, public_url=f"{scheme}://{host}:{port}"
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
    )
