"""A broker reached over HTTPS (:mod:`silofl.pubsub.service`), with the same methods as the folder
:class:`~silofl.pubsub.broker.Broker`, so publishing, streams, subscriptions and customization work unchanged.

A site's credential file (JSON, written by ``silofl pubsub register``) holds the broker's URL, the site's
name, its API token and, optionally, the CA certificate to trust (a path relative to the file). Every model
fetched is verified against its publisher's registered Ed25519 key before it is parsed or used, so a broker
that altered a model is caught by every subscriber.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from silofl.core.errors import ConfigError, ModelRejected, SiloflError
from silofl.core.extras import require
from silofl.pubsub.broker import Broker, Channel
from silofl.pubsub.model import PublishedModel


class BrokerRefused(SiloflError):
    """The broker refused a request (authentication, authorization, rate or size limit)."""


class BrokerUnavailable(SiloflError):
    """The broker could not be reached (nothing was sent)."""


class DeliveryUncertain(SiloflError):
    """The connection failed after a request was sent: the broker may have received it."""

    may_have_left = True


def load_credential(path: str | Path) -> dict:
    """A credential file: {"broker": URL, "site": name, "token": ..., "ca": optional path}."""
    p = Path(path)
    try:
        cred = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the credential file {p}: {e}") from None
    if (
        not isinstance(cred, dict)
        or not isinstance(cred.get("token"), str)
        or not isinstance(cred.get("site"), str)
    ):
        raise ConfigError(f"{p} is not a silofl broker credential (site, token)")
    if cred.get("ca"):
        ca = Path(cred["ca"])
        cred["ca"] = str(ca if ca.is_absolute() else p.parent / ca)
    return cred


class RemoteBroker:
    """The broker service at ``url``, as the site of ``credential`` (a file path or a loaded dict)."""

    def __init__(
        self,
        url: str,
        credential: str | Path | dict,
        ca: str | None = None,
        timeout: float = 60.0,
        retries_on_429: int = 5,
    ):
        httpx = require("httpx", "pubsub", "the PubSub-ML broker client (--broker URL)")

        if not url.startswith("https://") and not url.startswith("http://"):
            raise ConfigError(f"a broker URL starts with https://, got {url!r}")
        cred = credential if isinstance(credential, dict) else load_credential(credential)
        self.url, self.site, self.retries = url.rstrip("/"), cred["site"], retries_on_429
        verify = ca or cred.get("ca") or True
        self._http = httpx.Client(
            base_url=self.url,
            verify=verify,
            timeout=timeout,
            headers={"Authorization": f"Bearer {cred['token']}"},
        )
        self._keys: dict[str, str] = {}
        self._max_bytes: int | None = None

    def close(self) -> None:
        """Close the connection."""
        self._http.close()

    # ------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, *, sends: bool = False, **kw):
        import httpx

        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, **kw)
            except httpx.ConnectError as e:
                raise BrokerUnavailable(f"cannot reach the broker at {self.url}: {e}") from None
            except httpx.TransportError as e:
                if sends:
                    raise DeliveryUncertain(
                        f"the connection to {self.url} failed during {method} {path}: {e}"
                    ) from None
                raise BrokerUnavailable(
                    f"the broker at {self.url} failed during {method} {path}: {e}"
                ) from None
            if r.status_code == 429 and attempt < self.retries:
                time.sleep(min(10.0, float(r.headers.get("retry-after", "1"))))
                continue
            break
        if r.status_code >= 400:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            if r.status_code in (413, 422):
                raise ModelRejected(f"the broker refused it: {msg}")
            if r.status_code in (400, 404):
                raise ConfigError(str(msg))
            raise BrokerRefused(f"the broker refused {method} {path} ({r.status_code}): {msg}")
        return r

    def _json(self, method: str, path: str, **kw):
        return self._request(method, path, **kw).json()

    def _as_me(self, site: str) -> None:
        if site != self.site:
            raise ConfigError(f"the credential is {self.site!r}'s; it cannot act as {site!r}")

    # ------------------------------------------------------------------ the Broker interface
    @property
    def max_bytes(self) -> int:
        """The broker's upload bound."""
        if self._max_bytes is None:
            self._max_bytes = int(self.health()["max_upload"])
        return self._max_bytes

    def health(self) -> dict:
        """The broker's /health answer."""
        return self._json("GET", "/health")

    def sites(self) -> list[str]:
        return self._json("GET", "/v1/sites")

    def publishers(self) -> list[dict]:
        """Registered publishers: public key, lifetime budget, largest declared spend."""
        return self._json("GET", "/v1/publishers")

    def join(self, site: str, features: dict | None = None) -> None:
        self._as_me(site)
        self._json("POST", "/v1/join", json={"features": features or {}})

    def leave(self, site: str) -> int:
        return int(self._json("DELETE", f"/v1/sites/{site}")["withdrawn"])

    def publish(self, data: bytes) -> int:
        if len(data) > self.max_bytes:  # refused here already; the broker would refuse it from its length
            raise ModelRejected(f"model of {len(data)} bytes exceeds the broker's limit of {self.max_bytes}")
        return int(
            self._json(
                "POST",
                "/v1/models",
                sends=True,
                content=data,
                headers={"content-type": "application/octet-stream"},
            )["id"]
        )

    def public_key(self, site: str) -> str:
        """A publisher's registered Ed25519 key (hex), from the broker's registry."""
        if site not in self._keys:
            self._keys.update({p["site"]: p["public_key"] for p in self.publishers()})
        if site not in self._keys:
            raise ModelRejected(f"{site!r} has no registered signing key")
        return self._keys[site]

    def fetch_bytes(self, model_id: int) -> bytes:
        """A model's signed blob after its signature was verified against its publisher's registered key."""
        from silofl.pubsub.signing import MODEL_KEY, header_metadata, verify_model

        data = self._request("GET", f"/v1/models/{int(model_id)}").content
        try:
            publisher = json.loads(header_metadata(data)[MODEL_KEY])["publisher"]
        except (KeyError, ValueError, TypeError):
            raise ModelRejected(f"model {model_id} is not a silofl published model") from None
        verify_model(data, self.public_key(str(publisher)))
        return data

    def fetch(self, model_id: int) -> PublishedModel:
        return PublishedModel.from_bytes(self.fetch_bytes(model_id), self.max_bytes)

    def unpublish(self, model_id: int) -> None:
        self._json("DELETE", f"/v1/models/{int(model_id)}", sends=True)

    def models(self, publisher: str | None = None) -> list[dict]:
        return self._json("GET", "/v1/models", params={} if publisher is None else {"publisher": publisher})

    def subscribe(self, subscriber: str, clauses) -> Channel:
        self._as_me(subscriber)
        return _channel(self._json("POST", "/v1/channels", json={"clauses": [sorted(c) for c in clauses]}))

    def channel(self, channel_id: int) -> Channel:
        return _channel(self._json("GET", f"/v1/channels/{int(channel_id)}"))

    def channels(self, subscriber: str) -> list[Channel]:
        self._as_me(subscriber)
        return [_channel(c) for c in self._json("GET", "/v1/channels")]

    def unsubscribe(self, channel_id: int) -> None:
        self._json("DELETE", f"/v1/channels/{int(channel_id)}")

    def stream(self, channel_id: int, since: int = 0) -> list[int]:
        return self._json("GET", f"/v1/channels/{int(channel_id)}/stream", params={"since": since})

    def public_defaults(self) -> dict:
        return self._json("GET", "/v1/defaults")

    # ------------------------------------------------------------------ the operator's
    def register(self, site: str, public_key: str, lifetime: tuple[float, float]) -> str:
        """Register a site (admin credential); the site's new API token."""
        return self._json(
            "POST",
            "/v1/sites",
            json={
                "site": site,
                "public_key": public_key,
                "lifetime_epsilon": lifetime[0],
                "lifetime_delta": lifetime[1],
            },
        )["token"]


# the operations a folder broker offers, over HTTPS: the same contract, the same documentation
for _name in (
    "sites",
    "join",
    "leave",
    "publish",
    "fetch",
    "unpublish",
    "models",
    "subscribe",
    "channel",
    "channels",
    "unsubscribe",
    "stream",
    "public_defaults",
):
    _doc = getattr(Broker, _name).__doc__
    getattr(RemoteBroker, _name).__doc__ = f"{_doc or _name} (over HTTPS, as the credential's site)"


def _channel(d: dict) -> Channel:
    return Channel(int(d["id"]), d["subscriber"], tuple(frozenset(c) for c in d["clauses"]))


def open_broker(broker: str, credential: str | None = None, site: str | None = None, create: bool = True):
    """A folder broker (a path) or the service at an https:// URL with ``credential`` (whose site must be
    ``site`` when given). Without ``create``, a folder that holds no broker is refused (a mistyped
    ``--broker`` of a command that only reads or removes is not made into a new, empty broker)."""
    if broker.startswith(("https://", "http://")):
        if not credential:
            raise ConfigError(
                "a broker URL needs --credential FILE (the site's credential from its operator)"
            )
        b = RemoteBroker(broker, credential)
        if site is not None and b.site != site:
            raise ConfigError(f"the credential {credential} is {b.site!r}'s, not {site!r}'s")
        return b
    from silofl.pubsub.broker import DB_FILE, Broker

    if not broker.strip():
        raise ConfigError("--broker is empty: give a broker folder or https:// URL")
    if not create and not (Path(broker) / DB_FILE).is_file():
        raise ConfigError(
            f"no broker in {broker} ({DB_FILE} not found): check --broker (a folder broker is made by "
            "the first publish)"
        )
    return Broker(broker)
