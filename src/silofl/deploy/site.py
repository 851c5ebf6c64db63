"""A sovereign site: its folder, and the worker that runs its steps for a coordinator it does not control.

``silofl site init`` writes a site folder (:mod:`silofl.site.folder`: one identity, one lifetime budget and
one
ledger for deployment, PubSub-ML and simulations alike)::

    site.json         what the site decided: its name, data, private model, lifetime (ε, δ) budget, what it
                      reports, whether it accepts a research seed
    keys/             node (Flower node key, registered with the coordinator), seal.key (X25519), sign.key
                      (Ed25519), public.json (its public card, to hand to the coordinator and the other sites)
    federation.json   the other sites' public cards, pinned (payloads are sealed to and checked against them)
    ledger/           the site's privacy ledger: every step its DP mechanism ran, in every run, and every
    model it
                      published with PubSub-ML — one budget across protocols
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
import re
import secrets
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from silofl.comm import batch
from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import BudgetExhausted, ConfigError, PeerModelRejected, SiloflError
from silofl.core.names import NAME_RE, inside, plain_name
from silofl.core.private import make_private, private_process
from silofl.core.threads import apply as apply_threads
from silofl.deploy import seal as sealing
from silofl.deploy.hooks import ArmedHook, hooks_for
from silofl.deploy.pki import load_private
from silofl.site.folder import FORMAT, SiteConfig, SiteFolder
from silofl.site.folder import SiteState as _FolderState

__all__ = ["FORMAT", "NAME_RE", "SiteConfig", "SiteFolder", "SiteState", "SiteWorker", "inside", "plain_name"]

log = logging.getLogger("silofl")

HELLO, SETUP, ERROR = "__hello__", "__setup__", "__error__"
MAX_FRAME = 256 << 20  # one request to one site
NOT_DEPLOYABLE = {"joint": "Joint pools every site's data in one place: it is a reference, not a deployment"}
TRAIN_STEPS = ("train", "train_send", "train_upload")  # the steps that run a DP mechanism
SOCKET_NAME = "site.sock"
REPORT_SIGNATURE = "report_signature"  # a reply's meta signed by the site (report_text)
REPORT_FOR = "report_for"  # the [step, round] a signed reply answers
COORDINATOR = "coordinator"  # the name payloads to and from the coordinator's server role are sealed under
STEP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a step name
READ_TIMEOUT_S = 60.0  # a requester that stalls mid-frame for this long loses its request, never the worker
MAX_CONNECTIONS = 16  # requests read at once; more wait in the listen queue


def init_site(
    folder: Path, cfg: SiteConfig, federation: list[dict] | None = None, policy: Any = None
) -> dict:
    """Create a site folder with fresh keys, its ledger (naming the site, with its lifetime budget) and its
    signed policy (``policy``: a :class:`silofl.site.policy.SitePolicy`; default the safe one); returns the
    site's public card. Refuses an existing site folder."""
    card = SiteFolder.create(folder, cfg, policy).card
    if federation is not None:
        pin_federation(folder, federation)
    return card


def pin_federation(folder: Path, cards: list[dict], coordinator: dict | None = None) -> None:
    """Pin the federation's public cards (every site's, this one's included) in ``folder/federation.json``,
    and the coordinator's card (its keys sign and receive what a server role sends and gets; kept if already
    pinned)."""
    from silofl.deploy.pki import check_card, check_keys

    for i, c in enumerate(cards):  # a plain name and real keys, or nothing is pinned
        check_card(c, f"the card of site {i}")
    names = [c["name"] for c in cards]
    if len(set(names)) != len(names):
        raise ConfigError("two sites of the federation share a name")
    fed: dict = {"sites": cards}
    old = folder / "federation.json"
    if coordinator is None and old.is_file():
        try:
            coordinator = json.loads(old.read_text()).get("coordinator")
        except ValueError:
            coordinator = None
    if coordinator is not None:
        check_keys(coordinator, "the coordinator's card (coordinator.json)")
        fed["coordinator"] = {"seal": str(coordinator["seal"]), "sign": str(coordinator["sign"])}
    (folder / "federation.json").write_text(json.dumps(fed, indent=1) + "\n")


def export_data(
    path: Path,
    x: torch.Tensor,
    y: torch.Tensor,
    test: tuple[torch.Tensor, torch.Tensor],
    internal: tuple[torch.Tensor, torch.Tensor] | None,
    meta: dict,
    persons: torch.Tensor | None = None,
) -> None:
    """One site's data as a safetensors file (its training rows, the shared test set, its own held-out
    rows; with person-level DP each training row's person, and ``meta["id_column"]`` naming the column)."""
    from safetensors.torch import save_file

    t = {
        "x": x.cpu().contiguous(),
        "y": y.cpu().contiguous(),
        "test_x": test[0].cpu().contiguous(),
        "test_y": test[1].cpu().contiguous(),
    }
    if internal is not None:
        t["internal_x"], t["internal_y"] = internal[0].cpu().contiguous(), internal[1].cpu().contiguous()
    if persons is not None:
        if len(persons) != len(y) or not meta.get("id_column"):
            raise ConfigError("an export's persons give one person per training row and name their column")
        t["persons"] = persons.to(torch.long).cpu().contiguous()
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
    persons: torch.Tensor | None = None  # each training row's person (site.json's id_column)
    id_column: str | None = None
    unit_warning: dict | None = None  # no id_column, but a column looks like a repeated person id


def load_local(folder: Path, cfg: SiteConfig, seed: int | None = None) -> LocalData:
    """The site's data: silofl's safetensors export, or a table (with the site's schema) or image folder."""
    if cfg.data is None:
        raise ConfigError(f"site {cfg.name} has no data: set 'data' in its site.json")
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
        return _declared_unit(
            cfg,
            path,
            LocalData(
                t["x"],
                t["y"],
                (t["test_x"], t["test_y"]),
                internal,
                tuple(t["x"].shape[1:]),
                int(meta["num_classes"]),
                list(meta.get("classes") or []),
                meta.get("preprocessing"),
                meta.get("source", str(path)),
                t.get("persons"),
                meta.get("id_column"),
                meta.get("unit_warning"),
            ),
        )
    from silofl.data.sites import load_site_images, load_site_tables

    seed = (
        0 if seed is None else seed
    )  # the site's own held-out rows: the loaders' fixed default without a run seed
    if cfg.schema:
        src = load_site_tables(cfg.schema, [str(path)], None, cfg.test_fraction, seed, cfg.id_column)
    else:
        src = load_site_images([str(path)], 28, None, cfg.test_fraction, seed)
    x, y = src.parts[0]
    persons = getattr(src, "persons", None)
    return _declared_unit(
        cfg,
        path,
        LocalData(
            x,
            y,
            None,
            src.internal[0] if src.internal else None,
            tuple(x.shape[1:]),
            src.outputs or len(src.classes),  # a survival target: its model's outputs (1 + its time bins)
            list(src.classes),
            src.preprocessing[0].to_dict() if src.preprocessing else None,
            str(path),
            torch.as_tensor(persons[0], dtype=torch.long) if persons is not None else None,
            cfg.id_column if persons is not None else None,
            getattr(src, "unit_warning", None),
        ),
    )


def _declared_unit(cfg: SiteConfig, path: Path, d: LocalData) -> LocalData:
    """``d`` checked against the privacy unit site.json declares: with ``id_column`` every training row has
    its person (the export names the same column); without it, the repeated id-like column a table shows is
    logged (the site's ε then covers rows, not persons)."""
    if cfg.id_column is not None:
        if d.persons is None or d.id_column != cfg.id_column:
            found = f"column {d.id_column!r}" if d.persons is not None else "no person ids"
            raise ConfigError(
                f"site {cfg.name}: site.json declares the id column {cfg.id_column!r} "
                f"but {path} holds {found}"
            )
        if len(d.persons) != len(d.y):
            raise ConfigError(
                f"site {cfg.name}: {path} gives {len(d.persons)} person ids for {len(d.y)} rows"
            )
    elif d.persons is not None:
        raise ConfigError(
            f"site {cfg.name}: {path} holds person ids (column {d.id_column!r}) but site.json declares no "
            "id_column: set it, so that the site samples and accounts by person"
        )
    if d.unit_warning:
        log.warning("site %s: privacy unit: %s", cfg.name, d.unit_warning.get("message"))
    return d


class _Shape:
    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        self.input_shape, self.num_classes = input_shape, num_classes
        self.features: dict | None = None  # the feature stage's record, when the run has one


class SiteState(_FolderState):
    """The site's replay state (:class:`silofl.site.folder.SiteState`) with deployment's replay guards."""

    def guard_of(self, run_id: str) -> sealing.ReplayGuard:
        """Run ``run_id``'s replay guard as it was last kept."""
        g = sealing.ReplayGuard()
        g.seen = self.seen_of(run_id)
        return g


class SiteWorker:
    """The site's side of a deployment (see the module doc): frames in, frames out."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).resolve()
        private_process()  # everything it writes from now on: 0600 files in 0700 folders
        make_private(self.folder)  # and what is there already (a folder made under another umask)
        self.cfg = SiteConfig.load(self.folder)
        fed_path = self.folder / "federation.json"
        if not fed_path.is_file():
            raise ConfigError(
                f"{self.folder}: no federation.json (pin the other sites' public cards: `silofl site pin`)"
            )
        fed = json.loads(fed_path.read_text())
        self.cards = fed["sites"]
        self.names = [c["name"] for c in self.cards]
        if self.cfg.name not in self.names:
            raise ConfigError(f"{fed_path}: this site ({self.cfg.name}) is not in its own federation")
        from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

        self.seal_key = load_private(self.folder / "keys" / "seal.key")
        self.sign_key = load_private(self.folder / "keys" / "sign.key")
        assert isinstance(self.seal_key, x25519.X25519PrivateKey) and isinstance(
            self.sign_key, ed25519.Ed25519PrivateKey
        )
        self.seal_pub = {
            c["name"]: x25519.X25519PublicKey.from_public_bytes(bytes.fromhex(c["seal"])) for c in self.cards
        }
        self.sign_pub = {
            c["name"]: ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(c["sign"]))
            for c in self.cards
        }
        coord = fed.get(
            "coordinator"
        )  # the coordinator's pinned card: what a server role sends must be signed by it
        if coord is not None:
            self.seal_pub[COORDINATOR] = x25519.X25519PublicKey.from_public_bytes(
                bytes.fromhex(coord["seal"])
            )
            self.sign_pub[COORDINATOR] = ed25519.Ed25519PublicKey.from_public_bytes(
                bytes.fromhex(coord["sign"])
            )
        self.key_id = next(c["sign"] for c in self.cards if c["name"] == self.cfg.name)
        self.policy = SiteFolder(
            self.folder, self.cfg
        ).policy  # a tampered or malformed policy: refuses to start
        self.state = SiteState(self.folder)
        self.lifetime, self.budget_note = self.check_ledger()
        if self.cfg.data is None:
            raise ConfigError(
                f"site {self.cfg.name} has no data to train on: set 'data' in {self.folder / 'site.json'} "
                "(a folder made by PubSub-ML publishing has none)"
            )
        self.data = load_local(self.folder, self.cfg)
        self.site: Any = None
        self.hooks: list[
            ArmedHook
        ] = []  # armed by files the site's operator put in its folder (deploy.hooks)
        self.run_id: str | None = None
        self.order: list[str] = []  # the run's sites, by index
        self.index: int | None = None
        self.round: int | None = None
        self.has_server = False
        self.guard = sealing.ReplayGuard()
        self.refused: list[str] = []
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ the ledger, the budget of record
    def history(self) -> list[str]:
        """What shows that this site has run before (then its ledger cannot start from nothing)."""
        seen = []
        if self.state.runs:
            seen.append(f"{len(self.state.runs)} run id(s) it remembers")
        if self.state.head and int(self.state.head.get("entries", 0)) > 0:
            seen.append(f"a ledger head of {self.state.head['entries']} entries it announced")
        for sub in ("checkpoint", "models"):
            if (self.folder / sub).is_dir() and any(p.is_file() for p in (self.folder / sub).rglob("*")):
                seen.append(f"files in {sub}/")
        return seen

    @staticmethod
    def check_folder_ledger(folder: Path) -> None:
        """The checks of :meth:`check_ledger` for the site folder ``folder``, without starting a worker."""
        w = SiteWorker.__new__(SiteWorker)
        w.folder = Path(folder).resolve()
        w.cfg = SiteConfig.load(w.folder)
        w.key_id = json.loads((w.folder / "keys" / "public.json").read_text())["sign"]
        w.state = SiteState(w.folder)
        w.check_ledger()

    def check_ledger(self) -> tuple[tuple[float, float], str | None]:
        """Open and check the ledger; (the lifetime budget available, a note if site.json disagrees with the
        ledger). Refuses (LedgerTampered) a missing, shorter, foreign or broken ledger of a site that has
        history."""
        from silofl.privacy.ledger import (
            Ledger,
            LedgerTampered,
            announced_head,
            head_order,
            lifetime_of,
            require_identity,
            restored_spend,
            start_site_ledger,
        )

        led = Ledger(self.folder / "ledger")
        if not led.entries:
            past = self.history()
            if past:
                raise LedgerTampered(
                    f"site {self.cfg.name} has history ({'; '.join(past)}) but its ledger ({led.path}) is "
                    f"missing or "
                    "empty: its spend is unknown, so it refuses to run. If the ledger is lost, its operator "
                    "restores it "
                    "with `silofl site ledger-restore` declaring the prior spend"
                )
            start_site_ledger(
                led,
                self.cfg.name,
                self.key_id,
                (self.cfg.lifetime_epsilon, self.cfg.lifetime_delta),
                "the lifetime budget of site.json when the ledger started",
            )
        require_identity(led, self.cfg.name, self.key_id)
        if self.state.head is not None:
            now = announced_head(led)
            if head_order(self.state.head, now) < 0:
                raise LedgerTampered(
                    f"site {self.cfg.name}'s ledger ({now['entries']} entries, epoch {now['epoch']}) is "
                    f"older than the head of {self.state.head['entries']} entries it announced: it was "
                    "truncated or replaced; restore it with `silofl site ledger-restore`"
                )
            if int(self.state.head.get("epoch", 0)) == now["epoch"]:
                led.check_head(self.state.head)
        life = lifetime_of(led)
        assert life is not None
        note = None
        if (self.cfg.lifetime_epsilon, self.cfg.lifetime_delta) != life:
            note = (
                f"site.json says lifetime ε {self.cfg.lifetime_epsilon:g}, δ {self.cfg.lifetime_delta:g} but "
                f"the "
                f"ledger's budget is ε {life[0]:g}, δ {life[1]:g}: the ledger's wins (change it with `silofl "
                f"site "
                "budget`)"
            )
            log.warning("site %s: %s", self.cfg.name, note)
        self.outside = {
            "restored": restored_spend(led),
            "released": led.spent(),
        }  # one budget across protocols
        taken = [sum(v[i] for v in self.outside.values()) for i in (0, 1)]
        return (life[0] - taken[0], life[1] - taken[1]), note

    def _head(self) -> dict:
        from silofl.privacy.ledger import Ledger, announced_head

        return announced_head(
            self.site.ledger
            if self.site is not None and self.site.ledger is not None
            else Ledger(self.folder / "ledger")
        )

    # ------------------------------------------------------------------ frames
    def handle_frame(self, frame: bytes) -> bytes:
        """One request frame in, one reply frame out; never raises (a refusal is an error frame with the
        reason)."""
        try:
            step, msgs = unpack(frame, MAX_FRAME)
            plain_name(step, "a step", STEP_RE)
            if len(msgs) != 1:
                raise PeerModelRejected(
                    f"a request frame must address exactly this site, got {len(msgs)} messages"
                )
            ((k, msg),) = msgs.items()
            if step == HELLO:
                return pack(step, {k: self._hello(msg)})
            if step == SETUP:
                return pack(step, {k: self._signed(SETUP, None, self._setup(k, msg))})
            if self.site is None or k != self.index:
                raise PeerModelRejected(
                    f"step {step!r} for site {k} before this site joined a run as that index"
                )
            if step == batch.BATCH:  # several steps in one message: each checked, run and sealed as its own
                parts = batch.split(msg)
                for s, _ in parts:
                    plain_name(s, "a step", STEP_RE)
                    if s in (HELLO, SETUP):
                        raise PeerModelRejected(f"{s} is never part of a batch")
                return pack(step, {k: batch.reply([self._step(s, m) for s, m in parts])})
            return pack(step, {k: self._step(step, msg)})
        except Exception as e:  # noqa: BLE001 - whatever a request does, it costs that request, never the worker
            why = f"{type(e).__name__}: {e}"
            if not isinstance(e, SiloflError | PeerModelRejected | ValueError | KeyError | TypeError):
                log.exception("site %s: a request failed", self.cfg.name)
            log.warning("site %s refused a request: %s", self.cfg.name, why[:500])
            self.refused.append(why[:500])
            return pack(ERROR, {0: Message({"error": why[:2000]})})

    def _hello(self, msg: Message) -> Message:
        nonce = msg.meta.get("nonce")
        if not isinstance(nonce, str) or len(nonce) > 128:
            raise PeerModelRejected("hello needs a nonce")
        head = self._head()
        d = self.data
        from silofl.training.tasks import declared_task

        facts = {
            "n": len(d.y),
            **unit_facts(d),
            "input_shape": list(d.input_shape),
            "num_classes": d.num_classes,
            "internal": d.internal is not None,
            "test": d.test is not None,
            **declared_task(d.y),  # e.g. survival: the run's headline follows it (the C-index)
        }
        sig = self.sign_key.sign(hello_text(nonce, self.cfg.name, head, facts)).hex()
        return Message({"name": self.cfg.name, "signature": sig, "ledger_head": head, **facts})

    def _setup(self, k: int, msg: Message) -> Message:
        from silofl.runner.loop import make_site

        run_id, order, config, resume = self._addressed(k, msg.meta)
        self.lifetime, self.budget_note = self.check_ledger()
        cfg = self._planned(config, k)  # checked against the site's own policy before anything is built
        why = NOT_DEPLOYABLE.get(cfg.method)
        if why:
            raise ConfigError(f"method {cfg.method} is not run between institutions: {why}")
        field = "the site.json field"
        has_server = cfg.info.exchange == "server"
        if has_server and COORDINATOR not in self.sign_pub:
            raise ConfigError(
                f"site {self.cfg.name} refuses the run: method {cfg.method} takes models from the "
                "coordinator's server role, and this site pins no coordinator key (federation.json "
                "'coordinator': `silofl site pin --coordinator coordinator.json`)"
            )
        if cfg.is_private and cfg.delta > self.lifetime[1]:
            raise ConfigError(
                f"site {self.cfg.name} refuses the run: its δ {cfg.delta:g} exceeds this site's lifetime "
                f"δ {self.lifetime[1]:g} (the ledger's budget: `silofl site budget --lifetime-delta`; "
                f"{field} lifetime_delta records it)"
            )
        if self.cfg.private_model and hasattr(cfg.options, "private_model"):
            cfg = cfg.replace(private_model=self.cfg.private_model, private_models=None)
        cfg = cfg.replace(report_nonprivate=self.cfg.report_test_figures)
        method = cfg.info.cls(cfg)
        apply_threads(cfg.threads)  # one per process unless the run asks (silofl.core.threads)
        inputs, shape = self._inputs(cfg)
        site = make_site(
            method, k, inputs, shape, self.folder / "ledger", run_id, self.cfg.report_test_figures
        )
        planned = self._cap_budget(site, cfg)
        hooks = []
        for name, hook in hooks_for(self.folder):  # e.g. the auditor's gradient canaries (audit/spec.json)
            if resume and not hook.rejoins:
                raise ConfigError(
                    f"site {self.cfg.name} is armed by the {name} hook ({hook.marker} in its folder): such a "
                    "site does not rejoin a run, what the hook records starts with the run"
                )
            hooks.append(hook.arm(self.folder, site, k))
            log.info("site %s runs with the %s hook (%s)", self.cfg.name, name, self.folder / hook.marker)
        resumed = None
        if resume:  # rejoining a run it was lost from: its own latest checkpoint, its ledger's spend
            root = inside(self.folder, "checkpoint", run_id)
            rounds = site.on_checkpoints(Message({"root": str(root)})).meta["rounds"]
            if not rounds:
                raise ConfigError(f"site {self.cfg.name} has no checkpoint of run {run_id} to rejoin from")
            resumed = rounds[-1]
            site.on_load(Message({"root": str(root), "round": resumed}))
        self.site, self.run_id, self.order, self.index = site, run_id, list(order), k
        self.hooks = hooks
        self._secure_roles(site, cfg, order, run_id)
        self.has_server = has_server
        kept = self.state.runs.get(run_id, {}).get("round")
        known = [r for r in (kept, resumed) if r is not None]
        self.round = max(known) if known else None  # rounds only move forward, across re-setups too
        self.guard = self.state.guard_of(run_id)  # the replay state of this run, as the site kept it
        self.state.save_run(run_id, self.round, self.guard)
        head = self._head()
        self.state.save_head(head)
        log.info(
            "site %s %s run %s as site %d (%s)",
            self.cfg.name,
            f"rejoined from its round-{resumed} checkpoint" if resumed else "joined",
            run_id,
            k,
            cfg.method,
        )
        out = {
            "joined": True,
            "planned_epsilon": planned,
            "resumed_from": resumed,
            "ledger_head": head,
            "lifetime": [self.lifetime[0], self.lifetime[1]],
            "feature_shape": list(shape.input_shape),
        }
        if self.budget_note:
            out["budget_note"] = self.budget_note
        if cfg.is_client_level and cfg.is_private and not getattr(cfg, "secure_aggregation", False):
            out["trust_server_noise"] = True  # accepted only because its policy trusts the server's noise
            log.warning(
                "site %s uploads un-noised clipped sums: its policy trusts the coordinator to add the noise "
                "(trust-server-noise)",
                self.cfg.name,
            )
        return Message(out)

    def _addressed(self, k: int, m: dict) -> tuple[str, list[str], dict, bool]:
        """(run id, the run's sites, its config, whether it rejoins) of a setup addressed to this site as
        index ``k``; PeerModelRejected for a malformed setup, a foreign roster or a run id used before."""
        run_id, order, config = m.get("run_id"), m.get("sites"), m.get("config")
        if not (
            isinstance(order, list) and all(isinstance(s, str) for s in order) and isinstance(config, dict)
        ):
            raise PeerModelRejected("setup needs a run id, the run's sites and its config")
        run_id = plain_name(run_id, "the run id")
        if order.count(self.cfg.name) != 1 or order.index(self.cfg.name) != k:
            raise PeerModelRejected(f"setup addresses this site ({self.cfg.name}) as index {k} of {order}")
        unknown = [s for s in order if s not in self.names]
        if unknown:
            raise PeerModelRejected(f"the run names sites this site has no pinned keys for: {unknown}")
        resume = bool(m.get("resume"))
        if run_id in self.state.runs and not resume:
            raise PeerModelRejected(
                f"run id {run_id} was used before: site {self.cfg.name} joins a run id once (a "
                "re-sent setup would reset its replay state)"
            )
        if resume and run_id not in self.state.runs:
            raise PeerModelRejected(f"site {self.cfg.name} never joined run {run_id}: nothing to rejoin")
        return run_id, order, config, resume

    def _secure_roles(self, site: Any, cfg: Any, order: list[str], run_id: str) -> None:
        """Secure aggregation's parts of ``site``: its identity (its relayed key signed, the others' checked)
        and, for the client-level methods, its own floor: from its policy, never the coordinator's
        numbers."""
        if hasattr(site, "identity"):
            from silofl.fl.exchange.secure_round import SecAggIdentity

            roster = {i: self.sign_pub[name] for i, name in enumerate(order)}
            site.identity = SecAggIdentity(self.sign_key, roster, run_id)
        if hasattr(site, "secure_floor"):
            from silofl.fl.exchange.client_level import SecureFloor
            from silofl.privacy.ledger import lifetime_of

            pol = self.policy
            life = lifetime_of(site.ledger)  # the whole lifetime: the site accountant composes the rest
            assert life is not None
            site.secure_floor = SecureFloor(
                pol.min_noise,
                pol.survivors_floor(None),
                life[0],
                life[1],
                survivor_fraction=pol.survivor_fraction,
                colluders=pol.colluders,
            )
        if isinstance(getattr(type(site), "colluders", None), int):  # pooled noise: its per-threat ε
            site.colluders = self.policy.colluders

    def _planned(self, config: dict, k: int) -> Any:
        """The run's config, checked against this site's policy before anything is built or read: a backbone
        the run names is looked up among the ones this site registered (a path from the run is never opened,
        and the refusal does not depend on what exists here), then the plan (PolicyRefused, one line)."""
        import dataclasses

        from silofl.runner.config import RunConfig
        from silofl.runner.plan import policy_request
        from silofl.site.policy import PolicyRefused

        self.policy = SiteFolder(self.folder, self.cfg).policy  # verified again: edits apply to the next run
        try:
            raw = RunConfig.from_dict(config)
            asked = raw.features
            name, _, arg = str(asked).partition(":")
            if name == "backbone":
                raw = raw.replace(features=f"backbone:{self.policy.backbone_dir(arg)}")
            cfg = raw.resolve()
            self.policy.check(dataclasses.replace(policy_request(cfg, k), features=asked))
        except PolicyRefused as e:
            raise PolicyRefused(f"site {self.cfg.name} refuses the run: {e}") from None
        return cfg

    def _inputs(self, cfg: Any) -> tuple[Any, _Shape]:
        """The site's inputs after the run's feature stage (silofl.features), computed here, from the site's
        own data, and kept by content in its own folder (``features/``), with the shape the models see."""
        from silofl.features import apply, record, stage_from_config
        from silofl.runner.loop import SiteInputs

        d = self.data
        asked = getattr(cfg, "id_column", None)
        if asked and d.persons is None and cfg.is_private:
            raise ConfigError(
                f"site {self.cfg.name} refuses the run: it asks for person-level DP (id column {asked!r}) "
                "and this site declares no id column (the site.json field id_column)"
            )
        who = {"persons": d.persons, "id_column": d.id_column}
        stage = stage_from_config(cfg)
        if stage.identity:
            return SiteInputs(d.x, d.y, d.test, d.internal, d.preprocessing, **who), _Shape(
                d.input_shape, d.num_classes
            )
        rec = record(stage, d.input_shape, cfg)
        root = self.folder / "features"

        def f(pair, label):
            return None if pair is None else (apply(stage, pair[0], root, label), pair[1])

        shape = _Shape(tuple(rec["feature_shape"]), d.num_classes)
        shape.features = rec
        return (
            SiteInputs(
                apply(stage, d.x, root, "training data"),
                d.y,
                f(d.test, "test set"),
                f(d.internal, "held-out rows"),
                d.preprocessing,
                **who,
            ),
            shape,
        )

    def _cap_budget(self, site: Any, cfg: Any) -> float | None:
        """Refuse a run whose planned DP-SGD spend, composed with every mechanism the site's ledger records
        (secure rounds, releases, restores: its one accountant), would exceed the lifetime budget; make the
        same check before every step and cap the site's own accountant at what the lifetime leaves."""
        from silofl.privacy.site_accountant import SiteAccountant, planned_dpsgd

        acc, budget = getattr(site, "accountant", None), getattr(site, "budget", None)
        if acc is None or budget is None or not cfg.is_private:
            return None
        s = site.settings
        unit = site.privacy_unit if getattr(site, "persons", None) is not None else "row"
        books = SiteAccountant(site.ledger, colluders=self._colluders())
        plan = [planned_dpsgd(s.noise_multiplier, site.sample_rate, cfg.rounds * site.steps_per_round, unit)]
        if cfg.target_epsilon_of(site.cid) is None:
            try:
                books.require(plan, what=f"this run ({cfg.rounds} rounds)", who=f"site {self.cfg.name}")
            except BudgetExhausted as e:
                raise BudgetExhausted(
                    f"{e} (the ledger's budget: `silofl site budget "
                    "--lifetime-epsilon`; the site.json field lifetime_epsilon records it)"
                ) from None
        budget.lifetime = books.dpsgd_guard(unit)  # and before every step, whatever else ran since
        target = budget.target_epsilon
        budget.target_epsilon = min(target if target is not None else math.inf, self.lifetime[0])
        return books.epsilon(books.lifetime[1], "colluders", plan)  # type: ignore[index]

    def _colluders(self) -> int:
        """The colluding sites this site's policy assumes (0 without one)."""
        return int(getattr(getattr(self, "policy", None), "colluders", 0) or 0)

    def _step(self, step: str, msg: Message) -> Message:
        if "round" in msg.meta:
            r = msg.meta["round"]
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise PeerModelRejected("round must be a non-negative integer")
            if self.round is not None and r < self.round:
                raise PeerModelRejected(
                    f"step {step} for round {r}: site {self.cfg.name} is in round {self.round} of "
                    "this run, and rounds only move forward"
                )
            if r != self.round:  # the testing hook SILOFL_INJECT_FAULT=SITE:ROUND:KIND
                from silofl.comm.torchdist import inject_fault

                inject_fault(self.index or 0, r, "start")
                self.round = r
                assert self.run_id is not None
                self.state.save_run(self.run_id, r, self.guard)
        if step in TRAIN_STEPS and not self.site.can_continue():
            raise BudgetExhausted(
                f"site {self.cfg.name} cannot pay for another round within its budget: refused"
            )
        meta = dict(msg.meta)
        for key in (
            "to",
            "server",
        ):  # where the site will send: a pinned peer or the pinned server, checked first
            if key in meta:
                for d in meta[key] if isinstance(meta[key], list) else [meta[key]]:
                    self._destination(d)
        assert self.run_id is not None
        for key, sub in (("root", "checkpoint"), ("models_dir", "models")):  # only into its own folder
            if key in meta:
                meta[key] = str(inside(self.folder, sub, self.run_id))
        packets = [self._open(p) for p in msg.packets]
        request = Message(meta, [p for p in packets if p is not None])
        for hook in self.hooks:
            hook.before(step, request)
        reply = self.site.handle(step, request)
        for hook in self.hooks:
            hook.after(step, request, reply)
        out = self._seal(step, reply)
        if (
            step in TRAIN_STEPS
        ):  # the head after this round's spend: kept here, announced signed to the coordinator
            head = self._head()
            self.state.save_head(head)
            out.meta["ledger_head"] = head
            out.meta["head_signature"] = self.sign_key.sign(head_text(self.run_id, self.cfg.name, head)).hex()
        return self._signed(step, msg.meta.get("round"), out)

    def _signed(self, step: str, rnd: object, reply: Message) -> Message:
        """``reply`` with every figure it reports (its whole meta: ε, metrics, row counts, ledger head)
        signed with the site's Ed25519 key for this run, step and round (:func:`report_text`): a relay that
        rewrites any of them is caught by the coordinator."""
        assert self.run_id is not None
        reply.meta.pop(REPORT_SIGNATURE, None)
        reply.meta[REPORT_FOR] = [step, rnd]
        text = report_text(self.run_id, self.cfg.name, plain_json(reply.meta))
        reply.meta[REPORT_SIGNATURE] = self.sign_key.sign(text).hex()
        return reply

    def _destination(self, d: object) -> str:
        """The pinned name of node ``d`` a site may send to: another site of the run, or the server role of a
        method that has one (sealed to the pinned coordinator key); anything else is refused."""
        n = len(self.order)
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= n or d == self.index:
            raise PeerModelRejected(
                f"site {self.cfg.name} sends only to the other sites of the run (0..{n - 1}) or a "
                f"server role ({n}); refused destination {str(d)[:40]}"
            )
        if d == n:
            if not self.has_server or COORDINATOR not in self.seal_pub:
                raise PeerModelRejected(
                    f"site {self.cfg.name} refused destination {d}: this method has no server role "
                    "(or no coordinator key is pinned)"
                )
            return COORDINATOR
        return self.order[d]

    def _open(self, p: Packet) -> Packet | None:
        assert self.index is not None and self.run_id is not None
        if p.dst != self.index:
            raise PeerModelRejected(f"a packet for node {p.dst} was delivered to site {self.index}")
        try:
            if p.src == len(self.order) and self.has_server and COORDINATOR in self.sign_pub:
                src = COORDINATOR
            elif p.src < len(self.order) and p.src != self.index:
                src = self.order[p.src]
            else:
                raise PeerModelRejected(
                    f"a payload claiming to be from node {p.src}, which is neither another site of "
                    "the run nor this method's server role"
                )
            header = sealing.header_of(p.data)
            self.guard.check(src, header, self.round)
            _, data = sealing.open_sealed(
                p.data,
                run_id=self.run_id,
                src=src,
                dst=self.cfg.name,
                seal_key=self.seal_key,
                sender=self.sign_pub[src],
            )
            self.guard.mark(src, header, self.round)
        except PeerModelRejected as e:
            log.warning("site %s refused a payload from node %s: %s", self.cfg.name, p.src, e)
            self.refused.append(str(e))
            return None
        self.state.save_run(self.run_id, self.round, self.guard)
        return Packet(p.src, p.dst, data)

    def _seal(self, step: str, reply: Message) -> Message:
        assert self.run_id is not None
        out, count = [], {}
        for p in reply.packets:
            if p.src != self.index:
                raise PeerModelRejected(f"site {self.cfg.name} would send a packet as node {p.src}: refused")
            dst = self._destination(p.dst)  # never a clear payload, never to a node it has no pinned key for
            i = count.get(p.dst, 0)
            count[p.dst] = i + 1
            out.append(
                Packet(
                    p.src,
                    p.dst,
                    sealing.seal(
                        p.data,
                        run_id=self.run_id,
                        src=self.cfg.name,
                        dst=dst,
                        rnd=self.round or 0,
                        step=step,
                        index=i,
                        sign_key=self.sign_key,
                        recipient=self.seal_pub[dst],
                    ),
                )
            )
        reply.packets = out
        if self.refused:
            reply.meta["refused_payloads"] = self.refused[-20:]
            self.refused = []
        return reply

    # ------------------------------------------------------------------ the local socket
    def serve(self, path: Path, stop: Any = None) -> None:
        """Answer frames on a Unix socket at ``path`` (mode 0600: only this user) until ``stop`` is set. Each
        connection is read in its own thread with a timeout and answered under one lock: a requester that
        stalls, hangs up or sends garbage costs its own request, never the worker."""
        path.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(str(path))
        finally:
            os.umask(old)
        srv.listen(64)
        srv.settimeout(0.5)
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        log.info("site %s serves %s", self.cfg.name, path)
        try:
            while stop is None or not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                except OSError as e:  # e.g. out of file descriptors: wait and go on
                    log.warning("site %s: accept failed: %s", self.cfg.name, e)
                    if stop is not None:
                        stop.wait(0.5)
                    continue
                if not slots.acquire(timeout=READ_TIMEOUT_S):
                    conn.close()
                    continue
                threading.Thread(target=self._serve_one, args=(conn, slots), daemon=True).start()
        finally:
            srv.close()
            path.unlink(missing_ok=True)

    def _serve_one(self, conn: socket.socket, slots: threading.BoundedSemaphore) -> None:
        try:
            with conn:
                conn.settimeout(READ_TIMEOUT_S)
                try:
                    frame = recv_frame(conn)
                except (OSError, PeerModelRejected) as e:
                    log.warning("site %s: bad local request: %s", self.cfg.name, e)
                    return
                with self.lock:
                    reply = self.handle_frame(frame)
                try:
                    send_frame(conn, reply)
                except OSError as e:  # the requester hung up before the reply: its loss
                    log.warning("site %s: the requester left before the reply: %s", self.cfg.name, e)
        except Exception:  # noqa: BLE001 - never let one connection take the worker down
            log.exception("site %s: a connection failed", self.cfg.name)
        finally:
            slots.release()


def unit_facts(d: LocalData) -> dict:
    """What a site's hello declares of its privacy unit: ``unit`` (``row`` or ``person (column X)``),
    ``units`` (its training rows, or persons: what a batch size counts) and the repeated id-like column it
    found, if any."""
    if d.persons is not None:
        count = int(d.persons.max()) + 1 if len(d.persons) else 0
        return {"unit": f"person (column {d.id_column})", "units": count}
    return {"unit": "row", "units": len(d.y), **({"unit_warning": d.unit_warning} if d.unit_warning else {})}


def plain_json(meta: dict) -> dict:
    """``meta`` as the other side reads it after the frame's JSON (string keys, lists for tuples)."""
    return json.loads(json.dumps(meta, allow_nan=False))


def report_text(run_id: str, name: str, meta: dict) -> bytes:
    """What a site signs of each reply (issue 41: everything a site reports is signed): the run, its name and
    the reply's whole meta — its ε, metrics, row counts, ledger head, and ``report_for``: the step and round
    it answers."""
    from silofl.privacy.ledger import canonical_json

    return f"silofl report|{run_id}|{name}|".encode() + canonical_json(meta)


def head_text(run_id: str, name: str, head: dict) -> bytes:
    """What a site signs when it announces its ledger head in a run."""
    from silofl.privacy.ledger import canonical_json

    return f"silofl head|{run_id}|{name}|".encode() + canonical_json(head)


def hello_text(nonce: str, name: str, head: dict, facts: dict) -> bytes:
    """What a site signs in its hello: the coordinator's nonce, its name, its ledger head and every other fact
    the hello states (``facts``: its size, shapes, task), so a relay can change none of them unnoticed."""
    from silofl.privacy.ledger import canonical_json

    return f"silofl hello|{nonce}|{name}|".encode() + canonical_json(head) + b"|" + canonical_json(facts)


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
