"""The coordinator's side of a Flower deployment: the engine over Flower's Message API, and the run.

:class:`FlowerEngine` implements the engine seam (:mod:`silofl.comm.engine`) with Flower's ``Grid``:
``call(step, {site: request})`` becomes one Flower message per site (type ``query.silofl``, one frame of
bytes: :func:`silofl.comm.messages.pack`), pushed to that site's SuperNode and pulled back. The
coordinator never opens what sites send each other: those packets are sealed end to end by the sites'
workers (:mod:`silofl.deploy.seal`) and only routed here. A site that does not answer within the timeout,
whose ClientApp fails, or whose worker refuses a step is *lost* (its reason recorded), exactly as in the
multi-process engine: the method's repair runs (PushSum mass reclaimed) and the others go on.

:func:`serve_run` is what the ServerApp runs: wait for the federation's nodes, check each site's signed
hello against its pinned key, send every site the run (it decides whether to join), then drive
:func:`silofl.runner.loop.run` with this engine. The coordinator holds no site data: the model shapes and
sizes it needs come from the sites' hellos.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from silofl.comm import batch
from silofl.comm.engine import Engine
from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import ConfigError, PeerModelRejected, SiloflError
from silofl.core.extras import require
from silofl.core.private import make_private, private_process
from silofl.deploy import seal as sealing
from silofl.deploy.site import (
    COORDINATOR,
    ERROR,
    HELLO,
    REPORT_FOR,
    REPORT_SIGNATURE,
    SETUP,
    hello_text,
    report_text,
)

log = logging.getLogger("silofl")

MESSAGE_TYPE = "query.silofl"
MAX_REPLY = 256 << 20
# the replies of a step out are pulled (one request for all pending sites) after poll_s, then a tenth of the
# time the step has taken so far, up to POLL_CAP_S: a reply waits at most that for the coordinator to see it
POLL_SHARE, POLL_CAP_S = 0.1, 0.05
ANY_ROUND = object()  # a request whose round the coordinator did not keep (sent outside a call)


@dataclass
class RemoteSplit:
    """What the coordinator knows of the data it never holds: shapes and the sites' public facts."""

    input_shape: tuple[int, ...]
    num_classes: int
    source: str
    test_set: str
    sites: list[str]
    internal: list | None = None
    parts: list = field(default_factory=list)
    preprocessing: list | None = None
    privacy_unit_warning: dict | None = None  # a site's repeated id-like column (no id column declared)


class FlowerEngine(Engine):
    """The engine over a Flower ``Grid`` (see the module doc)."""

    name = "flower"

    def __init__(self, grid, nodes: dict[int, int], timeout_s: float, security: dict, poll_s: float = 0.02):
        super().__init__(sorted(nodes))
        # poll_s: the shortest wait between two pulls of the replies while a step is out (one request for all
        # the sites still pending; see POLL_SHARE); a paced SuperNode picks a message up within tens of
        # milliseconds (flower_shim)
        self.grid, self.nodes, self.timeout_s, self.security, self.poll_s = (
            grid,
            nodes,
            timeout_s,
            security,
            poll_s,
        )
        self.wire_sent: dict[int, int] = {
            k: 0 for k in nodes
        }  # frame bytes to / from each site, sealing included
        self.wire_received: dict[int, int] = {k: 0 for k in nodes}
        self.receive_seconds: dict[str, float] = {}
        self.refused: list[dict] = []
        self.round = 0
        self.status_path: Path | None = None  # where the round in progress is written (deploy's progress bar)
        self.cards: list[dict] = []  # the sites' pinned public cards (join)
        self.setup_meta: dict | None = (
            None  # the run as every site was sent it (join); a rejoining site gets it too
        )
        self.rejoin_timeout_s = min(60.0, timeout_s)
        self.seal_key = self.sign_key = (
            None  # the coordinator's keys (load_keys): a server role's payloads are sealed
        )
        self.guard = sealing.ReplayGuard()
        self.asked: dict[
            int, list[tuple[str | None, object]]
        ] = {}  # the steps and rounds of the call in flight
        self.heads = (
            None  # the last ledger head each site announced (a HeadStore in the coordinator's state folder)
        )

    def load_keys(self, folder: str | Path) -> None:
        """The coordinator's sealing keys (:func:`silofl.deploy.pki.make_coordinator_keys`)."""
        from silofl.deploy.pki import load_private

        folder = Path(folder)
        try:
            self.seal_key = load_private(folder / "coordinator.seal.key")
            self.sign_key = load_private(folder / "coordinator.sign.key")
        except (OSError, ValueError) as e:
            raise ConfigError(f"{folder}: the coordinator's keys cannot be read ({e})") from None

    def _run_id(self) -> str:
        if self.setup_meta is None:
            raise SiloflError("a payload before the run was set up")
        return str(self.setup_meta["run_id"])

    def seal_server(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        """Every packet a server role sends, sealed to its site and signed with the coordinator's key (sites
        take a server's model only so); in a batch, each part's under its own step and round."""
        out = {}
        for k, m in requests.items():
            if step == batch.BATCH:
                parts = [
                    (s, self._seal(s, pm.meta.get("round", self.round), k, pm)) for s, pm in batch.split(m)
                ]
                out[k] = batch.make(parts)
            else:
                out[k] = self._seal(step, self.round, k, m)
        return out

    def _seal(self, step: str, rnd: int, k: int, m: Message) -> Message:
        from silofl.deploy.pki import load_public

        if not m.packets:
            return m
        if self.sign_key is None:
            raise SiloflError("the coordinator has no keys to seal a server's payload (coordinator_keys)")
        packets, count = [], {}
        for p in m.packets:
            if p.src in self.nodes:  # a site's sealed payload, routed as it came
                packets.append(p)
                continue
            i = count.get(p.dst, 0)
            count[p.dst] = i + 1
            card = self.cards[k]
            packets.append(
                Packet(
                    p.src,
                    p.dst,
                    sealing.seal(
                        p.data,
                        run_id=self._run_id(),
                        src=COORDINATOR,
                        dst=card["name"],
                        rnd=int(rnd),
                        step=step,
                        index=i,
                        sign_key=self.sign_key,
                        recipient=load_public(card["seal"], "x25519"),
                    ),
                )
            )
        return Message(m.meta, packets)

    def open_upload(self, k: int, p: Packet) -> Packet | None:
        """A site's payload to a server role, opened (sealed to the coordinator's key by the site's pinned
        key); None (recorded) if it is not."""
        from silofl.deploy.pki import load_public

        name = self.cards[k]["name"]
        try:
            if self.seal_key is None:
                raise PeerModelRejected(
                    "the coordinator has no key to open a site's upload (coordinator_keys)"
                )
            header = sealing.header_of(p.data)
            self.guard.check(name, header, self.round)
            _, data = sealing.open_sealed(
                p.data,
                run_id=self._run_id(),
                src=name,
                dst=COORDINATOR,
                seal_key=self.seal_key,
                sender=load_public(self.cards[k]["sign"], "ed25519"),
            )
            self.guard.mark(name, header, self.round)
        except PeerModelRejected as e:
            log.warning("the coordinator refused an upload of site %d: %s", k, e)
            self.refused.append(
                {"client": self.server_id(), "round": self.round, "reason": f"from site {k}: {e}"[:300]}
            )
            return None
        return Packet(p.src, p.dst, data)

    def keep_head(self, k: int, head, sig) -> None:
        """Keep the ledger head site ``k`` announced (signed with its pinned key) after a round's spend."""
        from cryptography.exceptions import InvalidSignature

        from silofl.deploy.pki import load_public
        from silofl.deploy.site import head_text

        if self.heads is None or self.setup_meta is None:
            return
        name = self.cards[k]["name"]
        try:
            if not (isinstance(head, dict) and {"epoch", "entries", "mac"} <= set(head)):
                raise ValueError("malformed head")
            load_public(self.cards[k]["sign"], "ed25519").verify(
                bytes.fromhex(str(sig)), head_text(self._run_id(), name, head)
            )
            self.heads.accept(name, head)
        except (InvalidSignature, ValueError, TypeError, SiloflError) as e:
            log.warning("site %d announced a ledger head the coordinator does not keep: %s", k, e)
            self.refused.append({"client": k, "round": self.round, "reason": f"ledger head: {e}"[:300]})

    def server_id(self) -> int:
        """The node id of the coordinator's server role."""
        return len(self.nodes)

    @property
    def processes(self) -> int:
        return len(self.nodes) + 1

    def describe(self) -> dict:
        return {
            "name": self.name,
            "processes": self.processes,
            "flwr": _flwr_version(),
            **self.security,
            "frame_bytes_to_sites": {str(k): v for k, v in self.wire_sent.items()},
            "frame_bytes_from_sites": {str(k): v for k, v in self.wire_received.items()},
            "relay_sees": "message sizes and timing, the step names, who sends to whom in which round, and "
            "the "
            "figures sites choose to report; never a payload between sites (sealed end to end)",
        }

    def exchange(
        self, step: str, requests: dict[int, Message], timeout_s: float | None = None
    ) -> dict[int, Message]:
        """Send each addressed site its request and wait for the replies (lost sites are recorded)."""
        from flwr.app import ConfigRecord, RecordDict
        from flwr.app import Message as FlwrMessage

        msgs, ids = [], {}
        for k, m in requests.items():
            frame = pack(step, {k: m})
            self.wire_sent[k] = self.wire_sent.get(k, 0) + len(frame)
            msgs.append(
                FlwrMessage(
                    RecordDict({"silofl": ConfigRecord({"frame": frame})}),
                    dst_node_id=self.nodes[k],
                    message_type=MESSAGE_TYPE,
                    group_id=str(self.round),
                )
            )
        t0 = time.perf_counter()
        for k, mid in zip(requests, self.grid.push_messages(msgs), strict=True):
            ids[mid] = k
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            for r in self.grid.pull_messages(pending):
                mid = r.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                k = ids[mid]
                self.receive_seconds[str(k)] = (
                    self.receive_seconds.get(str(k), 0.0) + time.perf_counter() - t0
                )
                reply = self._reply(k, step, r)
                if reply is not None:
                    replies[k] = reply
            if pending:  # each poll is a request: a tenth of the time the step has taken, within bounds
                time.sleep(min(POLL_CAP_S, max(self.poll_s, POLL_SHARE * (time.perf_counter() - t0))))
        for mid in pending:
            self._lose(ids[mid], f"no answer within {timeout_s or self.timeout_s:g} s")
        log.debug(
            "step %s round %d: %d sites answered in %.3f s (sent at %.3f)",
            step,
            self.round,
            len(replies),
            time.perf_counter() - t0,
            time.time() - (time.perf_counter() - t0),
        )
        return replies

    def _reply(self, k: int, step: str, r) -> Message | None:
        if r.has_error():
            self._lose(k, f"its ClientApp failed: {r.error.reason}"[:300])
            return None
        try:
            frame = r.content["silofl"]["frame"]
        except KeyError:
            frame = None
        return self.reply_of(k, step, frame)

    def reply_of(self, k: int, step: str, frame) -> Message | None:
        """Site ``k``'s reply in ``frame``, checked; None (and the site lost, with the reason) if it is
        malformed, a refusal, an answer to another step or for another site, or speaks for another node."""
        try:
            if not isinstance(frame, bytes):
                raise PeerModelRejected("a reply carries one frame of bytes")
            self.wire_received[k] = self.wire_received.get(k, 0) + len(frame)
            got_step, got = unpack(frame, MAX_REPLY)
        except PeerModelRejected as e:
            self._lose(k, f"malformed reply: {e}")
            return None
        if got_step == ERROR:
            why = next(iter(got.values())).meta.get("error", "refused") if got else "refused"
            self._lose(k, f"refused {step}: {why}"[:500])
            return None
        if got_step != step or set(got) != {k}:
            self._lose(k, f"replied to {got_step!r} for {sorted(got)} when asked {step!r}")
            return None
        asked = self.asked.get(k) or [(step, ANY_ROUND)]
        if step != batch.BATCH:
            one = asked[-1] if asked[-1][0] == step else (step, ANY_ROUND)
            return self._accept(k, got[k], one)
        try:
            parts = [m for _, m in batch.split(got[k], replies=True)]
        except PeerModelRejected as e:
            self._lose(k, f"malformed batch reply: {e}")
            return None
        if k not in self.asked:  # a batch sent outside a call: its parts' steps as the site signed them
            asked = [(None, ANY_ROUND)] * len(parts)
        if len(parts) != len(asked):
            self._lose(k, f"answered a batch of {len(asked)} steps with {len(parts)} replies")
            return None
        accepted = [self._accept(k, m, a) for m, a in zip(parts, asked, strict=True)]
        return None if any(m is None for m in accepted) else batch.reply(accepted)  # type: ignore[arg-type]

    def verify_report(self, k: int, reply: Message, asked: tuple[str | None, object]) -> bool:
        """Whether site ``k`` signed ``reply``'s whole meta (every figure it reports) with its pinned key for
        this run and the step and round it was asked (:func:`silofl.deploy.site.report_text`); the signature
        is taken out of the meta. A reply it did not sign is refused, logged and the site lost."""
        from cryptography.exceptions import InvalidSignature

        from silofl.deploy.pki import load_public

        sig = reply.meta.pop(REPORT_SIGNATURE, None)
        name = self.cards[k]["name"]
        try:
            if not isinstance(sig, str) or len(sig) != 128:
                raise ValueError("no signature")
            text = report_text(self._run_id(), name, reply.meta)
            load_public(self.cards[k]["sign"], "ed25519").verify(bytes.fromhex(sig), text)
            for_ = reply.meta.pop(REPORT_FOR, None)
            if not isinstance(for_, list) or len(for_) != 2:
                raise ValueError("no step and round signed")
            if (asked[0] is not None and for_[0] != asked[0]) or (
                asked[1] is not ANY_ROUND and for_[1] != asked[1]
            ):
                raise ValueError(
                    f"signed for step {for_[0]!r} round {for_[1]!r}: an answer to another request"
                )
        except (InvalidSignature, ValueError, TypeError, SiloflError) as e:
            log.warning(
                "the coordinator refused a reply of site %s to %s: not signed by its key (%s)",
                name,
                asked[0],
                e,
            )
            self.refused.append(
                {"client": k, "round": self.round, "reason": f"reply to {asked[0]} not signed by its key"}
            )
            self._lose(
                k, f"its reply to {asked[0]} is not signed by its pinned key: refused (relay tampering?)"
            )
            return False
        return True

    def _accept(
        self, k: int, reply: Message, asked: tuple[str | None, object] = (HELLO, None)
    ) -> Message | None:
        """One reply of site ``k`` (or one part of its batch reply), checked: every figure in it signed by the
        site (:meth:`verify_report`; a hello is checked by :func:`greet`), uploads opened, its ledger head
        kept."""
        if asked[0] != HELLO and not self.verify_report(k, reply, asked):
            return None
        for p in reply.packets:
            if p.src != k:  # a site speaks only for itself
                self._lose(k, f"sent a packet as node {p.src}")
                return None
        if any(p.dst not in self.nodes for p in reply.packets):  # uploads to a server role: opened here
            opened = [p if p.dst in self.nodes else self.open_upload(k, p) for p in reply.packets]
            reply.packets = [p for p in opened if p is not None]
        if "head_signature" in reply.meta:  # a site's ledger head after a round's spend
            self.keep_head(k, reply.meta.pop("ledger_head", None), reply.meta.pop("head_signature"))
        for why in reply.meta.pop("refused_payloads", []) or []:
            self.refused.append({"client": k, "round": self.round, "reason": str(why)[:300]})
        return reply

    def rejoin_ready(self, rnd: int, candidates: set[int]) -> list[int]:
        """Lost sites whose node is connected again: greeted (signed hello), sent the run with ``resume`` (the
        site restores its latest checkpoint from its own folder; its ledger keeps its spend); those that
        joined."""
        if not self.lost or self.setup_meta is None:
            return []
        try:
            online = set(self.grid.get_node_ids())
        except Exception as e:  # noqa: BLE001 - the SuperLink's answer; retried next round
            log.warning("could not list the connected nodes: %s", e)
            return []
        back = []
        for k in sorted(set(self.lost) & candidates):
            if self.nodes[k] not in online:
                continue
            why = self.lost.pop(k)
            try:
                hello = greet(self, [k], self.cards, self.rejoin_timeout_s)
                if k not in self.exchange(
                    SETUP, {k: Message({**self.setup_meta, "resume": True})}, self.rejoin_timeout_s
                ):
                    raise SiloflError(self.lost.get(k, "no answer"))
                keep_heads(self, hello, [k])
            except SiloflError as e:
                log.info("site %d is connected but did not rejoin before round %d: %s", k, rnd, e)
                self.lost[k] = why
                continue
            back.append(k)
        return back

    def _lose(self, k: int, why: str) -> None:
        if k not in self.lost:
            log.warning("site %d lost: %s", k, why)
            self.lost[k] = why

    def _call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        for m in requests.values():
            r = batch.split(m)[-1][1].meta.get("round") if step == batch.BATCH else m.meta.get("round")
            if isinstance(r, int) and r != self.round:
                self.round = r
                if self.status_path is not None:
                    tmp = self.status_path.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"state": "running", "round": r}))
                    tmp.replace(self.status_path)
        self.asked = {  # what each site is asked (each part of a batch): the step and round its reply signs
            k: [(s, m.meta.get("round")) for s, m in (batch.split(m) if step == batch.BATCH else [(step, m)])]
            for k, m in requests.items()
        }
        try:
            return self.exchange(step, self.seal_server(step, requests))
        finally:
            self.asked = {}


def _flwr_version() -> str:
    return str(require("flwr", "deploy").__version__)


def _count(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 1 << 40:
        raise SiloflError(f"a site's hello declares {what} {v!r}")
    return v


def wait_for_nodes(grid, want: set[int], timeout_s: float) -> None:
    """Wait until every node of ``want`` is connected to the SuperLink."""
    deadline = time.monotonic() + timeout_s
    while True:
        have = set(grid.get_node_ids())
        if want <= have:
            return
        if time.monotonic() > deadline:
            raise SiloflError(f"nodes {sorted(want - have)} did not connect within {timeout_s:g} s")
        time.sleep(0.2)


def serve_run(grid, coordinator_path: str) -> dict:
    """Run the deployment described in ``coordinator_path`` (coordinator.json) and write its run folder; the
    outcome (or the error) is written to ``status.json`` beside it."""
    path = Path(coordinator_path)
    private_process()  # the coordinator's files: 0600 in 0700 folders, from its keys to its run folder
    make_private(path.parent)
    status = path.parent / "status.json"
    status.write_text(json.dumps({"state": "running"}))
    try:
        summary = _serve(grid, json.loads(path.read_text()), status)
        status.write_text(json.dumps({"state": "done", "rounds_run": summary["rounds_run"]}))
        return summary
    except BaseException as e:
        status.write_text(
            json.dumps(
                {
                    "state": "failed",
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
        )
        raise


def _serve(grid, spec: dict, status: Path) -> dict:
    from silofl.deploy.flower_shim import fast_pulls
    from silofl.runner.loop import run

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fast_pulls()  # a site's reply is pulled as soon as its content is there, not after Flower's 1 s backoff
    nodes = {k: int(s["node_id"]) for k, s in enumerate(spec["sites"])}
    wait_for_nodes(grid, set(nodes.values()), float(spec.get("connect_timeout_s", 300)))
    engine = FlowerEngine(grid, nodes, float(spec.get("timeout_s", 600)), dict(spec["security"]))
    engine.status_path = status
    cfg, remote = join(engine, spec)
    return run(cfg, progress=False, engine_factory=lambda make, n: engine, remote=remote)


def greet(
    engine: FlowerEngine, ks: list[int], cards: list[dict], timeout_s: float | None = None
) -> dict[int, Message]:
    """Each site's hello, its signature over a fresh nonce checked against its pinned key; SiloflError if a
    site does not answer or answers without its key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ed25519

    nonce = secrets.token_hex(16)
    hellos = engine.exchange(HELLO, {k: Message({"nonce": nonce}) for k in ks}, timeout_s)
    for k in ks:
        name = cards[k]["name"]
        h = hellos.get(k)
        if h is None:
            raise SiloflError(f"site {name} did not say hello: {engine.lost.get(k)}")
        head = h.meta.get("ledger_head")
        try:
            if not (isinstance(head, dict) and {"epoch", "entries", "mac"} <= set(head)):
                raise ValueError("no ledger head")
            ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(cards[k]["sign"])).verify(
                bytes.fromhex(str(h.meta.get("signature", ""))),
                hello_text(
                    nonce,
                    name,
                    head,
                    {x: v for x, v in h.meta.items() if x not in ("name", "signature", "ledger_head")},
                ),
            )
        except (InvalidSignature, ValueError, TypeError):
            raise SiloflError(
                f"node {engine.nodes[k]} answered for site {name} with a hello its pinned key did not sign"
            ) from None
        if (
            engine.heads is not None
        ):  # a site whose ledger is older than the head it announced before is refused
            try:
                engine.heads.check(name, head)
            except SiloflError as e:
                raise SiloflError(f"site {name}: {e}") from None
    return hellos


def keep_heads(engine: FlowerEngine, hellos: dict[int, Message], ks) -> None:
    """Keep the ledger head each of ``ks`` announced in its (signed) hello as its last."""
    if engine.heads is not None:
        for k in ks:
            engine.heads.accept(engine.cards[k]["name"], hellos[k].meta["ledger_head"])


def join(engine: FlowerEngine, spec: dict):
    """Greet every site (its signed hello checked against its pinned key), fill the run's data-dependent
    settings from the sizes the sites declare, and send every site the run, which each decides to join or
    refuses; (the config, the :class:`RemoteSplit`). SiloflError if a site is missing, impersonated or
    refuses."""
    from silofl.privacy.ledger import HeadStore
    from silofl.runner.config import RunConfig

    sites = spec["sites"]
    nodes = engine.nodes
    engine.cards = sites
    if spec.get("coordinator_keys"):
        engine.load_keys(spec["coordinator_keys"])
    if spec.get("state_dir"):
        engine.heads = HeadStore(Path(spec["state_dir"]) / "ledger_heads.json")
    hellos = greet(engine, list(nodes), sites)
    try:
        shapes = {
            (
                tuple(_count(v, "input shape") for v in h.meta["input_shape"]),
                _count(h.meta["num_classes"], "classes"),
            )
            for h in hellos.values()
        }
        # what a batch size counts: each site's persons where it declares an id column, else its rows
        sizes = [_count(hellos[k].meta.get("units", hellos[k].meta["n"]), "units") for k in range(len(sites))]
    except (KeyError, TypeError) as e:
        raise SiloflError(f"a site's hello is malformed: {e}") from None
    if len(shapes) != 1:
        raise ConfigError(f"the sites' data differ in input shape or classes: {sorted(shapes)}")
    ((input_shape, num_classes),) = shapes
    from silofl.training.tasks import agreed_task

    declared = agreed_task([h.meta.get("task") for h in hellos.values()])  # e.g. survival: the C-index
    config = {**spec["config"], "sites_task": declared}  # only ever what the sites declared
    cfg = RunConfig.from_dict(config).resolve().with_data(sum(sizes), smallest=min(sizes))
    run_id = spec.get("run_id") or secrets.token_hex(8)
    names = [s["name"] for s in sites]
    engine.cards = sites
    engine.setup_meta = {"run_id": run_id, "sites": names, "config": cfg.to_dict()}
    joined = engine.exchange(SETUP, {k: Message(dict(engine.setup_meta)) for k in nodes})
    keep_heads(engine, hellos, joined)
    if len(joined) != len(nodes):
        raise SiloflError(
            "sites refused the run: " + "; ".join(f"{names[k]}: {why}" for k, why in engine.lost.items())
        )
    # after a feature stage each site reports the shape its models read (its own features of its own data)
    try:
        fshapes = {
            tuple(_count(v, "feature shape") for v in (r.meta.get("feature_shape") or input_shape)[:9])
            for r in joined.values()
        }
    except (TypeError, AttributeError) as e:
        raise SiloflError(f"a site's setup reply is malformed: {e}") from None
    if len(fshapes) != 1:
        raise ConfigError(f"the sites' features differ in shape: {sorted(fshapes)}")
    (input_shape,) = fshapes
    internal = [None] * len(sites) if all(h.meta.get("internal") for h in hellos.values()) else None
    remote = RemoteSplit(
        input_shape,
        num_classes,
        source=f"each site's own data ({', '.join(names)})",
        test_set="each site's own copy of the shared test set"
        if all(h.meta.get("test") for h in hellos.values())
        else "none (the sites hold no shared test set)",
        sites=names,
        internal=internal,
    )
    warnings = [
        h.meta["unit_warning"] for h in hellos.values() if isinstance(h.meta.get("unit_warning"), dict)
    ]
    if warnings and not getattr(cfg, "id_column", None):  # as the sites declared it, signed in their hellos
        remote.privacy_unit_warning = warnings[0]
        log.warning("privacy unit: %s", str(warnings[0].get("message", ""))[:500])
    engine.security["run_id"] = run_id
    trusted = [names[k] for k, r in sorted(joined.items()) if r.meta.get("trust_server_noise") is True]
    if trusted:  # their policies trust the coordinator to add the noise: named in summary.json and here
        engine.security["trust_server_noise"] = trusted
        log.warning(
            "sites %s upload clipped, un-noised sums: their policies trust this coordinator to add the noise "
            "(trust-server-noise)",
            ", ".join(trusted),
        )
    return cfg, remote
