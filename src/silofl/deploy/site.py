"""A sovereign site: its folder, and the worker that runs its steps for a coordinator it does not control.

``silofl site init`` writes a site folder::

    site.json         what the site decided: its name, data, private model, lifetime (ε, δ) budget, what it
                      reports, whether it accepts a research seed; the coordinator's CA it pins
    keys/             node (Flower node key, registered with the coordinator), seal.key (X25519), sign.key
                      (Ed25519), public.json (its public card, to hand to the coordinator and the other sites)
    federation.json   the other sites' public cards, pinned (payloads are sealed to and checked against them)
    ledger/           the site's privacy ledger: every step its DP mechanism ran, in every run
    checkpoint/ models/ metrics.jsonl   its state across rounds and runs, its final models, figures it keeps

``silofl site run`` starts :class:`SiteWorker` (this module: it holds the data, the models and the ledger in
memory, serving one local socket only its own user can open) and a Flower SuperNode that connects out to
the coordinator's SuperLink over TLS with the node key. Flower's ClientApp (``silofl.deploy.fab``) only
relays each message's bytes between the SuperNode and this worker.

The worker checks everything it receives (:mod:`silofl.comm.messages` bounds every frame) and decides for
itself: it refuses a run whose δ exceeds its budget, whose planned spend would exceed what its ledger has
left, that carries a seed it did not accept, or that asks for a method it does not run; it caps its own
accountant at its lifetime ε (a coordinator that asks for more rounds than announced gets refusals, never
an overspend); it writes only into its own folder (paths in requests are ignored); it opens payloads
from other sites only when sealed by their pinned keys for this run, round and recipient, and seals what
it sends. A refused message is logged and answered with the reason; the site's state is left intact.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import BudgetExhausted, ConfigError, PeerModelRejected, SiloflError
from silofl.deploy import seal as sealing
from silofl.deploy.pki import load_private

log = logging.getLogger("silofl")

FORMAT = 1
HELLO, SETUP, ERROR = "__hello__", "__setup__", "__error__"
MAX_FRAME = 256 << 20  # one request to one site
NOT_DEPLOYABLE = {"joint": "Joint pools every site's data in one place: it is a reference, not a deployment"}
TRAIN_STEPS = ("train", "train_send", "train_upload")  # the steps that run a DP mechanism
SOCKET_NAME = "site.sock"


@dataclass
class SiteConfig:
    """What a site decided for itself (``site.json``)."""

    name: str
    data: str  # a data file in the site folder (silofl's export) or a table/folder read with ``schema``
    lifetime_epsilon: float
    lifetime_delta: float
    private_model: str | None = None
    schema: str | None = None
    test_fraction: float = 0.2
    report_test_figures: bool = False
    allow_research_seed: bool = False
    allow_non_formal: bool = False  # runs whose ε is not a formal guarantee (paper mode, no DP)

    def to_dict(self) -> dict:
        """The JSON of ``site.json``."""
        return {"format": FORMAT, **self.__dict__}

    @classmethod
    def load(cls, folder: Path) -> SiteConfig:
        """Read and check ``folder/site.json``."""
        path = folder / "site.json"
        if not path.is_file():
            raise ConfigError(f"{folder} is not a site folder (no site.json): create it with `silofl site init`")
        try:
            d = json.loads(path.read_text())
        except ValueError as e:
            raise ConfigError(f"{path}: not JSON ({e})") from None
        d.pop("format", None)
        try:
            c = cls(**d)
        except TypeError as e:
            raise ConfigError(f"{path}: {e}") from None
        from silofl.core.validate import check_field_types
        check_field_types(c, str(path))  # a wrong type in an edited site.json: one line naming the field
        if not (c.lifetime_epsilon > 0 and 0 < c.lifetime_delta < 1):
            raise ConfigError(f"{path}: the lifetime budget needs ε > 0 and 0 < δ < 1")
        return c


def init_site(folder: Path, cfg: SiteConfig, federation: list[dict] | None = None) -> dict:
    """Create a site folder with fresh keys; returns the site's public card. Refuses an existing site folder."""
    from silofl.deploy.pki import make_site_keys
    from silofl.privacy.ledger import check_site_name

    check_site_name(cfg.name)
    if (folder / "site.json").exists():
        raise ConfigError(f"{folder} already holds a site (site.json): a site's keys and ledger are never overwritten")
    folder.mkdir(parents=True, exist_ok=True)
    card = make_site_keys(folder / "keys", cfg.name)
    (folder / "site.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
    if federation is not None:
        pin_federation(folder, federation)
    return card


def pin_federation(folder: Path, cards: list[dict]) -> None:
    """Pin the federation's public cards (every site's, this one's included) in ``folder/federation.json``."""
    names = [c["name"] for c in cards]
    if len(set(names)) != len(names):
        raise ConfigError("two sites of the federation share a name")
    (folder / "federation.json").write_text(json.dumps({"sites": cards}, indent=1) + "\n")


def export_data(path: Path, x: torch.Tensor, y: torch.Tensor, test: tuple[torch.Tensor, torch.Tensor],
                internal: tuple[torch.Tensor, torch.Tensor] | None, meta: dict) -> None:
    """One site's data as a safetensors file (its training rows, the shared test set, its own held-out rows)."""
    from safetensors.torch import save_file

    t = {"x": x.cpu().contiguous(), "y": y.cpu().contiguous(), "test_x": test[0].cpu().contiguous(),
         "test_y": test[1].cpu().contiguous()}
    if internal is not None:
        t["internal_x"], t["internal_y"] = internal[0].cpu().contiguous(), internal[1].cpu().contiguous()
    save_file(t, str(path), metadata={"silofl": json.dumps(meta)})


@dataclass
class LocalData:
    """A site's own data, as its worker holds it."""

    x: torch.Tensor
    y: torch.Tensor
    test: tuple[torch.Tensor, torch.Tensor] | None
    internal: tuple[torch.Tensor, torch.Tensor] | None
    input_shape: tuple[int, ...]
    num_classes: int
    classes: list[str]
    preprocessing: dict | None
    source: str


def load_local(folder: Path, cfg: SiteConfig, seed: int | None = None) -> LocalData:
    """The site's data: silofl's safetensors export, or a table (with the site's schema) or image folder."""
    path = Path(cfg.data) if Path(cfg.data).is_absolute() else folder / cfg.data
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(str(path), "pt") as f:
                meta = json.loads((f.metadata() or {}).get("silofl", "{}"))
            t = load_file(str(path))
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
            raise ConfigError(f"{path}: not a silofl data export ({e})") from None
        internal = (t["internal_x"], t["internal_y"]) if "internal_x" in t else None
        return LocalData(t["x"], t["y"], (t["test_x"], t["test_y"]), internal, tuple(t["x"].shape[1:]),
                         int(meta["num_classes"]), list(meta.get("classes") or []), meta.get("preprocessing"),
                         meta.get("source", str(path)))
    from silofl.data.sites import load_site_images, load_site_tables

    seed = 0 if seed is None else seed  # the site's own held-out rows: the loaders' fixed default without a run seed
    if cfg.schema:
        src = load_site_tables(cfg.schema, [str(path)], None, cfg.test_fraction, seed)
    else:
        src = load_site_images([str(path)], 28, None, cfg.test_fraction, seed)
    x, y = src.parts[0]
    return LocalData(x, y, None, src.internal[0] if src.internal else None, tuple(x.shape[1:]), len(src.classes),
                     list(src.classes), src.preprocessing[0].to_dict() if src.preprocessing else None, str(path))


class _Shape:
    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        self.input_shape, self.num_classes = input_shape, num_classes


class SiteWorker:
    """The site's side of a deployment (see the module doc): frames in, frames out."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).resolve()
        self.cfg = SiteConfig.load(self.folder)
        fed_path = self.folder / "federation.json"
        if not fed_path.is_file():
            raise ConfigError(f"{self.folder}: no federation.json (pin the other sites' public cards: `silofl site "
                              "pin`)")
        self.cards = json.loads(fed_path.read_text())["sites"]
        self.names = [c["name"] for c in self.cards]
        if self.cfg.name not in self.names:
            raise ConfigError(f"{fed_path}: this site ({self.cfg.name}) is not in its own federation")
        from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

        self.seal_key = load_private(self.folder / "keys" / "seal.key")
        self.sign_key = load_private(self.folder / "keys" / "sign.key")
        assert isinstance(self.seal_key, x25519.X25519PrivateKey) and isinstance(self.sign_key, ed25519.Ed25519PrivateKey)
        self.seal_pub = {c["name"]: x25519.X25519PublicKey.from_public_bytes(bytes.fromhex(c["seal"])) for c in self.cards}
        self.sign_pub = {c["name"]: ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(c["sign"]))
                         for c in self.cards}
        self.data = load_local(self.folder, self.cfg)
        self.site: Any = None
        self.run_id: str | None = None
        self.order: list[str] = []  # the run's sites, by index
        self.index: int | None = None
        self.round: int | None = None
        self.guard = sealing.ReplayGuard()
        self.refused: list[str] = []

    # ------------------------------------------------------------------ frames
    def handle_frame(self, frame: bytes) -> bytes:
        """One request frame in, one reply frame out; never raises (a refusal is an error frame with the reason)."""
        try:
            step, msgs = unpack(frame, MAX_FRAME)
            if len(msgs) != 1:
                raise PeerModelRejected(f"a request frame must address exactly this site, got {len(msgs)} messages")
            (k, msg), = msgs.items()
            if step == HELLO:
                return pack(step, {k: self._hello(msg)})
            if step == SETUP:
                return pack(step, {k: self._setup(k, msg)})
            if self.site is None or k != self.index:
                raise PeerModelRejected(f"step {step!r} for site {k} before this site joined a run as that index")
            return pack(step, {k: self._step(step, msg)})
        except (SiloflError, PeerModelRejected, ValueError, KeyError, TypeError) as e:
            why = f"{type(e).__name__}: {e}"
            log.warning("site %s refused a request: %s", self.cfg.name, why)
            self.refused.append(why)
            return pack(ERROR, {0: Message({"error": why[:2000]})})

    def _hello(self, msg: Message) -> Message:
        nonce = msg.meta.get("nonce")
        if not isinstance(nonce, str) or len(nonce) > 128:
            raise PeerModelRejected("hello needs a nonce")
        sig = self.sign_key.sign(f"silofl hello|{nonce}|{self.cfg.name}".encode()).hex()
        d = self.data
        return Message({"name": self.cfg.name, "n": len(d.y), "input_shape": list(d.input_shape),
                        "num_classes": d.num_classes, "signature": sig,
                        "internal": d.internal is not None, "test": d.test is not None})

    def _setup(self, k: int, msg: Message) -> Message:
        from silofl.run.config import RunConfig
        from silofl.run.loop import SiteInputs, make_site

        m = msg.meta
        run_id, order, config = m.get("run_id"), m.get("sites"), m.get("config")
        if not (isinstance(run_id, str) and 0 < len(run_id) <= 128 and isinstance(order, list)
                and all(isinstance(s, str) for s in order) and isinstance(config, dict)):
            raise PeerModelRejected("setup needs a run id, the run's sites and its config")
        if order.count(self.cfg.name) != 1 or order.index(self.cfg.name) != k:
            raise PeerModelRejected(f"setup addresses this site ({self.cfg.name}) as index {k} of {order}")
        unknown = [s for s in order if s not in self.names]
        if unknown:
            raise PeerModelRejected(f"the run names sites this site has no pinned keys for: {unknown}")
        cfg = RunConfig.from_dict(config).resolve()
        why = NOT_DEPLOYABLE.get(cfg.method)
        if why:
            raise ConfigError(f"method {cfg.method} is not run between institutions: {why}")
        if cfg.seed is not None and not self.cfg.allow_research_seed:
            raise ConfigError("the run carries a seed: whoever knows it can reproduce this site's noise; this site "
                              "accepts seeded research runs only with allow_research_seed in its site.json")
        if not cfg.guarantee().formal and cfg.seed is None and not self.cfg.allow_non_formal:
            raise ConfigError(f"privacy {cfg.privacy} gives no formal guarantee; this site requires one "
                              "(allow_non_formal in its site.json)")
        if cfg.is_private and cfg.delta > self.cfg.lifetime_delta:
            raise ConfigError(f"the run's δ {cfg.delta:g} exceeds this site's lifetime δ {self.cfg.lifetime_delta:g}")
        if self.cfg.private_model and hasattr(cfg.options, "private_model"):
            cfg = cfg.replace(private_model=self.cfg.private_model, private_models=None)
        cfg = cfg.replace(report_nonprivate=self.cfg.report_test_figures)
        method = cfg.info.cls(cfg)
        d = self.data
        torch.set_num_threads(cfg.threads or torch.get_num_threads())
        site = make_site(method, k, SiteInputs(d.x, d.y, d.test, d.internal, d.preprocessing),
                         _Shape(d.input_shape, d.num_classes), self.folder / "ledger", run_id, self.cfg.report_test_figures)
        planned = self._cap_budget(site, cfg)
        resumed = None
        if m.get("resume"):  # rejoining a run it was lost from: its own latest checkpoint, its ledger's spend
            root = self.folder / "checkpoint" / run_id
            rounds = site.on_checkpoints(Message({"root": str(root)})).meta["rounds"]
            if not rounds:
                raise ConfigError(f"site {self.cfg.name} has no checkpoint of run {run_id} to rejoin from")
            resumed = rounds[-1]
            site.on_load(Message({"root": str(root), "round": resumed}))
        self.site, self.run_id, self.order, self.index = site, run_id, list(order), k
        self.round = resumed
        self.guard = sealing.ReplayGuard()
        log.info("site %s %s run %s as site %d (%s)", self.cfg.name,
                 f"rejoined from its round-{resumed} checkpoint" if resumed else "joined", run_id, k, cfg.method)
        return Message({"joined": True, "planned_epsilon": planned, "resumed_from": resumed,
                        "lifetime": [self.cfg.lifetime_epsilon, self.cfg.lifetime_delta]})

    def _cap_budget(self, site: Any, cfg: Any) -> float | None:
        """Refuse a run that would exceed the lifetime budget; cap the site's own accountant at it."""
        acc, budget = getattr(site, "accountant", None), getattr(site, "budget", None)
        if acc is None or budget is None or not cfg.is_private:
            return None
        s = site.settings
        planned = acc.epsilon_after(s.noise_multiplier, site.sample_rate, cfg.rounds * site.steps_per_round, s.delta)
        spent = acc.epsilon(s.delta) if acc.steps else 0.0
        if planned > self.cfg.lifetime_epsilon and cfg.target_epsilon_of(site.cid) is None:
            raise BudgetExhausted(f"this run would bring site {self.cfg.name} to ε {planned:.3f} (δ {s.delta:g}; spent "
                                  f"{spent:.3f} before it), over its lifetime ε {self.cfg.lifetime_epsilon:g}: refused")
        target = budget.target_epsilon
        budget.target_epsilon = min(target if target is not None else math.inf, self.cfg.lifetime_epsilon)
        return planned

    def _step(self, step: str, msg: Message) -> Message:
        if "round" in msg.meta:
            r = msg.meta["round"]
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise PeerModelRejected("round must be a non-negative integer")
            if r != self.round:  # the testing hook SILOFL_INJECT_FAULT=SITE:ROUND:KIND
                from silofl.comm.torchdist import inject_fault

                inject_fault(self.index or 0, r, "start")
            self.round = r
        if step in TRAIN_STEPS and not self.site.can_continue():
            raise BudgetExhausted(f"site {self.cfg.name} cannot pay for another round within its budget: refused")
        meta = dict(msg.meta)
        for key, sub in (("root", "checkpoint"), ("models_dir", "models")):  # only into its own folder
            if key in meta:
                meta[key] = str(self.folder / sub / (self.run_id or "run"))
        packets = [self._open(p) for p in msg.packets]
        reply = self.site.handle(step, Message(meta, [p for p in packets if p is not None]))
        return self._seal(step, reply)

    def _open(self, p: Packet) -> Packet | None:
        assert self.index is not None and self.run_id is not None
        if p.dst != self.index:
            raise PeerModelRejected(f"a packet for node {p.dst} was delivered to site {self.index}")
        if p.src >= len(self.order):  # the coordinator's server role: TLS to the coordinator, not sealed
            return p
        src = self.order[p.src]
        try:
            header = sealing.header_of(p.data)
            self.guard.check(src, header, self.round)
            _, data = sealing.open_sealed(p.data, run_id=self.run_id, src=src, dst=self.cfg.name,
                                          seal_key=self.seal_key, sender=self.sign_pub[src])
        except PeerModelRejected as e:
            log.warning("site %s refused a payload from %s: %s", self.cfg.name, src, e)
            self.refused.append(str(e))
            return None
        return Packet(p.src, p.dst, data)

    def _seal(self, step: str, reply: Message) -> Message:
        assert self.run_id is not None
        out, count = [], {}
        for p in reply.packets:
            if p.dst < len(self.order) and p.dst != self.index:
                i = count.get(p.dst, 0)
                count[p.dst] = i + 1
                dst = self.order[p.dst]
                p = Packet(p.src, p.dst, sealing.seal(p.data, run_id=self.run_id, src=self.cfg.name, dst=dst,
                                                      rnd=self.round or 0, step=step, index=i, sign_key=self.sign_key,
                                                      recipient=self.seal_pub[dst]))
            out.append(p)
        reply.packets = out
        if self.refused:
            reply.meta["refused_payloads"] = self.refused[-20:]
            self.refused = []
        return reply

    # ------------------------------------------------------------------ the local socket
    def serve(self, path: Path, stop: Any = None) -> None:
        """Answer frames on a Unix socket at ``path`` (mode 0600: only this user) until ``stop`` is set."""
        path.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(str(path))
        finally:
            os.umask(old)
        srv.listen(4)
        srv.settimeout(0.5)
        log.info("site %s serves %s", self.cfg.name, path)
        try:
            while stop is None or not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(600)
                    try:
                        frame = recv_frame(conn)
                    except (OSError, PeerModelRejected) as e:
                        log.warning("site %s: bad local request: %s", self.cfg.name, e)
                        continue
                    send_frame(conn, self.handle_frame(frame))
        finally:
            srv.close()
            path.unlink(missing_ok=True)


def send_frame(conn: socket.socket, data: bytes) -> None:
    """Length-prefixed bytes on a stream socket."""
    conn.sendall(struct.pack("<Q", len(data)) + data)


def recv_frame(conn: socket.socket, limit: int = MAX_FRAME + (1 << 20)) -> bytes:
    """Length-prefixed bytes from a stream socket, bounded before anything is allocated."""
    head = _exact(conn, 8)
    n = struct.unpack("<Q", head)[0]
    if n > limit:
        raise PeerModelRejected(f"a frame of {n} bytes exceeds the limit of {limit}")
    return _exact(conn, n)


def _exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise OSError("connection closed mid-frame")
        buf += chunk
    return bytes(buf)


def new_run_id() -> str:
    """A fresh run id (random: payloads sealed for one run never open in another)."""
    return secrets.token_hex(8)
