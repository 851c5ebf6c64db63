"""Keys and certificates of a deployment, made with ``cryptography`` (no OpenSSL command needed).

* The coordinator's TLS: a CA and a server certificate for the SuperLink (:func:`make_ca`,
  :func:`make_server_cert`). Sites pin the CA certificate.
* Each site's Flower node key (EC P-384, OpenSSH format): the SuperLink admits only registered node
  keys (SuperNode authentication).
* Each site's sealing keys: X25519 (payloads to it are encrypted to this key) and Ed25519 (it signs the
  payloads it sends). Their public halves form the federation's directory, pinned in every site folder.

Private keys are written with mode 0600 and never leave the folder they are made in.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from silofl.core.errors import ConfigError, PeerModelRejected
from silofl.core.names import SITE_NAME_RE, plain_name

# a site's keys, and the key-file helpers the coordinator's keys share, live in the site folder module
from silofl.site.folder import (  # noqa: F401 - re-exported for deploy's modules
    _pkcs8,
    load_private,
    make_site_keys,
    public_raw,
    write_private,
)

PEM = serialization.Encoding.PEM
RAW = serialization.Encoding.Raw


def make_ca(folder: Path, name: str = "silofl deployment CA", days: int = 365) -> None:
    """A CA key and self-signed certificate: ``ca.key`` (0600) and ``ca.crt``."""
    now = datetime.datetime.now(datetime.UTC)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(folder / "ca.key", _pkcs8(key))
    (folder / "ca.crt").write_bytes(cert.public_bytes(PEM))


def make_server_cert(folder: Path, hosts: list[str], days: int = 365) -> None:
    """``server.key`` (0600) and ``server.crt`` for ``hosts`` (names or IP addresses), signed by the CA in
    ``folder``."""
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )  # type: ignore[arg-type]
    write_private(folder / "server.key", _pkcs8(key))
    (folder / "server.crt").write_bytes(cert.public_bytes(PEM))


def make_coordinator_keys(folder: Path) -> dict:
    """The coordinator's sealing keys under ``folder``: ``coordinator.seal.key`` (X25519: sites seal what they
    send a server role to it) and ``coordinator.sign.key`` (Ed25519: it signs what a server role sends);
    returns its public card (also written to ``coordinator.json``), which every site pins (``silofl site pin
    --coordinator``)."""
    seal, sign = x25519.X25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    write_private(folder / "coordinator.seal.key", _pkcs8(seal))
    write_private(folder / "coordinator.sign.key", _pkcs8(sign))
    card = {
        "role": "coordinator",
        "seal": public_raw(seal.public_key()).hex(),
        "sign": public_raw(sign.public_key()).hex(),
    }
    (folder / "coordinator.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


def load_public(hex_key: str, kind: str):
    """A pinned public key from its hex (``kind``: "x25519" or "ed25519"); ValueError if it is not one."""
    raw = bytes.fromhex(str(hex_key))
    if kind == "x25519":
        return x25519.X25519PublicKey.from_public_bytes(raw)
    return ed25519.Ed25519PublicKey.from_public_bytes(raw)


HEX_KEY = re.compile(r"[0-9a-f]{64}")  # a raw 32-byte X25519 / Ed25519 public key, in lowercase hex
NODE_KEY = re.compile(r"(ecdsa-sha2-nistp(256|384|521)|ssh-ed25519) [A-Za-z0-9+/]{1,1024}={0,2}")
MAX_CARD_BYTES = 16 << 10


def check_keys(card: object, where: str, fields: tuple[str, ...] = ("seal", "sign")) -> dict:
    """``card`` if its ``seal`` (X25519) and ``sign`` (Ed25519) public keys are each 64 lowercase hex digits
    that load as a key; else a one-line ConfigError naming ``where`` and the field."""
    if not isinstance(card, dict):
        raise ConfigError(f"{where}: a card is a JSON object")
    for f in fields:
        v = card.get(f)
        if not isinstance(v, str) or not HEX_KEY.fullmatch(v):
            raise ConfigError(
                f"{where}: '{f}' must be a public key of 64 lowercase hex digits, got {str(v)[:80]!r}"
            )
        try:
            load_public(v, "x25519" if f == "seal" else "ed25519")
        except ValueError as e:
            raise ConfigError(f"{where}: '{f}' is not a public key ({e})") from None
    return card


def check_card(card: object, where: str) -> dict:
    """A site's public card checked before anything is pinned or written from it (issue 41: names from
    outside never become paths): ``name`` a plain name (a folder and file name), ``seal`` and ``sign`` keys
    of 64 hex digits, ``node`` one OpenSSH public key line; a one-line ConfigError naming ``where``
    otherwise."""
    if not isinstance(card, dict) or not {"name", "seal", "sign", "node"} <= set(card):
        raise ConfigError(f"{where}: not a site's public card (name, seal, sign, node)")
    try:
        plain_name(card["name"], "a site's name", SITE_NAME_RE)
    except PeerModelRejected as e:
        raise ConfigError(f"{where}: {e}") from None
    check_keys(card, where)
    node = card["node"]
    if not isinstance(node, str) or not NODE_KEY.fullmatch(node.strip()):
        raise ConfigError(f"{where}: 'node' must be one OpenSSH public key line, got {str(node)[:80]!r}")
    return card


def read_card(path: Path, check=check_card) -> dict:
    """The card in the file ``path``, its size bounded before it is parsed and ``check`` ed."""
    try:
        size = path.stat().st_size
        if size > MAX_CARD_BYTES:
            raise ConfigError(f"{path}: a card of {size} bytes (at most {MAX_CARD_BYTES})")
        c = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a public card ({e})") from None
    return check(c, str(path))
