"""A self-signed test CA and a server certificate signed by it (``silofl pubsub cert``), for trying the
broker service and for the tests. A real deployment uses a certificate from the institutions' own CA."""

from __future__ import annotations

from pathlib import Path


def make_test_certificates(out: str | Path, hosts: list[str], days: int = 30) -> dict[str, Path]:
    """Write ``ca.pem`` (give it to every client), ``server.pem`` and ``server.key`` (the broker's, mode 0600)
    under ``out`` for the DNS names / IP addresses ``hosts``. The CA's key is not kept: nothing else can be
    signed by it. (The certificates are made as for a deployment: :mod:`silofl.deploy.pki`.)"""
    from silofl.deploy.pki import make_ca, make_server_cert

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    make_ca(out, "silofl test CA", days=days)
    make_server_cert(out, hosts, days=days)
    (out / "ca.key").unlink()
    paths = {"ca": out / "ca.pem", "cert": out / "server.pem", "key": out / "server.key"}
    (out / "ca.crt").replace(paths["ca"])
    (out / "server.crt").replace(paths["cert"])
    return paths
