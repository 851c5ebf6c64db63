"""A site's warm executor: Flower's ClientApp tasks run inside the site's own long-lived worker.

Stock Flower starts a new ``flwr-clientapp`` process for every message a SuperNode receives (1.4–1.7 s of
imports before any app code runs). ``silofl site run`` instead runs its SuperNode with Flower's *process*
isolation — the SuperNode executes nothing itself and serves its runtime API on loopback, ``AcquireTask``
guarded by a secret only the site's processes know — and this executor, a thread of the site's worker process,
takes each task through that API exactly as ``flwr-clientapp`` does (pull the task's input, run, push the
reply and the task's output, heartbeat while it runs), with the site's data and models already in memory. One
process per site for the whole run.

The site no longer runs code the coordinator ships: a task's FAB is checked once, by its SHA-256, against the
FAB Flower builds from the silofl the site itself installed (the build is deterministic), and a task carrying
any other FAB is answered with an error; the message itself is handed to
:meth:`silofl.deploy.site.SiteWorker.handle_frame`, the same bounded, checked path the local socket serves.

The executor waits for work on a *doorbell* (a Unix datagram socket in the site's private run folder) that the
paced SuperNode (:mod:`silofl.deploy.flower_shim`) rings when it has stored a message, and polls every
:data:`POLL_S` besides (a stock SuperNode never rings)."""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from silofl.core.extras import require

log = logging.getLogger("silofl")

POLL_S = 1.0  # the wait for work when the doorbell stays silent
POLL_GAP_S = (
    0.1  # the wait before asking again when the SuperNode's runtime API does not answer (starting up)
)
HEARTBEAT_S = 20.0  # Flower expects a task's heartbeat within 30 s (HEARTBEAT_DEFAULT_INTERVAL)
FRAME_LIMIT = (256 << 20) + (1 << 20)
ACQUIRE = "/flwr.proto.Runtime/AcquireTask"


def own_fab_hash(fab_dir: Path) -> str:
    """The SHA-256 of the FAB Flower builds from silofl's app as installed here (Flower's build is
    deterministic: sorted files, fixed dates), the one FAB this site accepts."""
    require("flwr", "deploy")
    from flwr.cli.build import build_fab_from_disk

    return hashlib.sha256(build_fab_from_disk(fab_dir)).hexdigest()


def fab_refusal(content: bytes, claimed: str, mine: str) -> str | None:
    """None if the FAB ``content`` (whose hash the SuperNode says is ``claimed``) is this site's own; else
    why not."""
    got = hashlib.sha256(content).hexdigest()
    if got != claimed:
        return f"its content hashes to {got[:16]}…, not the {claimed[:16]}… it claims"
    if got != mine:
        return (
            f"FAB {got[:16]}… is not the FAB of this site's silofl ({mine[:16]}…): install the "
            f"coordinator's version"
        )
    return None


def runtime_client(
    address: str,
    secret: bytes | None = None,
    token: str | None = None,
    root_certificates: bytes | None = None,
):
    """A client of a Flower runtime API (a SuperNode's or the SuperLink's) at ``address``: as the
    SuperExec (``secret`` signs ``AcquireTask``) or as a task's app (``token``). TLS with
    ``root_certificates``, plain on loopback without. The task loops retry ``AcquireTask`` themselves every
    :data:`POLL_GAP_S` (Flower's invoker backs off to seconds while the API is still starting); a task's own
    requests keep Flower's retries."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.interceptors.http.superexec_auth import SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    if token is None:
        interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if secret is not None:
            interceptors.append(
                SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods={ACQUIRE})
            )
    else:
        interceptors = [
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(token),
        ]
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker() if token else None,
    )


class WarmExecutor:
    """Takes this SuperNode's ClientApp tasks from its runtime API at ``address`` and answers each with
    ``handle(frame) -> frame`` (see the module doc), until ``stop`` is set."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        handle: Callable[[bytes], bytes],
        doorbell: Path,
        fab_dir: Path,
        name: str,
        stop: threading.Event,
    ):
        self.address, self.secret, self.handle, self.name, self.stop = address, secret, handle, name, stop
        self.fab_dir = fab_dir
        self.mine = (
            ""  # the hash of this site's own FAB: computed as run() starts (beside the SuperNode's start)
        )
        self.checked: dict[str, str | None] = {}  # FAB hash → None (this site's own) or why it is refused
        self.tasks = 0
        self.bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        doorbell.unlink(missing_ok=True)
        self.bell.bind(str(doorbell))
        self.bell.settimeout(POLL_S)

    def _client(self, token: str | None = None):
        return runtime_client(self.address, secret=None if token else self.secret, token=token)

    def run(self) -> None:
        """Take and run tasks until stopped; a failure costs its task, never the loop."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        self.mine = own_fab_hash(self.fab_dir)
        client = self._client()
        try:
            while not self.stop.is_set():
                self._drain()
                try:
                    res = client.AcquireTask(
                        AcquireTaskRequest(supported_task_types=[str(TaskType.CLIENT_APP)])
                    )
                except Exception as e:  # noqa: BLE001 - the SuperNode restarting or not up yet: wait, retry
                    log.debug("site %s: AcquireTask failed: %s", self.name, e)
                    self.stop.wait(POLL_GAP_S)
                    continue
                if res.HasField("task") and res.token:
                    self.execute(res.token)
                    continue
                try:
                    self.bell.recv(64)
                except (TimeoutError, OSError):
                    pass
        finally:
            client.close()
            self.bell.close()

    def _drain(self) -> None:
        self.bell.setblocking(False)
        try:
            while True:
                self.bell.recv(64)
        except OSError:
            pass
        finally:
            self.bell.settimeout(POLL_S)

    def execute(self, token: str) -> None:
        """One task: pull its input, answer it, push the reply and the task's output (as
        ``flwr-clientapp``)."""
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

        t0 = time.time()
        client = self._client(token)
        beat = threading.Event()
        threading.Thread(target=self._heartbeat, args=(client, beat), daemon=True).start()
        message = context = reply = None
        status, details = SubStatus.FAILED, "the site's executor failed"
        try:
            message, context, _run, fab = pull_task_input(client)
            t1 = time.time()
            if fab.hash_str not in self.checked:  # once per FAB
                self.checked[fab.hash_str] = fab_refusal(fab.content, fab.hash_str, self.mine)
                if self.checked[fab.hash_str]:
                    log.warning(
                        "site %s refuses the FAB %s: %s",
                        self.name,
                        fab.hash_str[:16],
                        self.checked[fab.hash_str],
                    )
            if why := self.checked[fab.hash_str]:
                raise PermissionError(f"site {self.name} refuses the run's FAB: {why}"[:500])
            frame = message.content["silofl"]["frame"]
            if not isinstance(frame, bytes) or len(frame) > FRAME_LIMIT:
                raise ValueError("a silofl message carries one frame of bytes")
            reply = Message(
                RecordDict({"silofl": ConfigRecord({"frame": self.handle(frame)})}), reply_to=message
            )
            status, details = SubStatus.COMPLETED, ""
            t2 = time.time()
        except Exception as e:  # noqa: BLE001 - a bad task costs that task
            log.warning("site %s: a task failed: %s: %s", self.name, type(e).__name__, str(e)[:300])
            details = f"{type(e).__name__}: {e}"[:500]
            if message is not None:
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message
                )
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
                push_task_output(client, context, status, details)
                if status == SubStatus.COMPLETED and message is not None:
                    self.trace(message, t0, t1, t2, time.time())
            except Exception as e:  # noqa: BLE001 - the run ended or the SuperNode went away: the task is lost
                log.warning("site %s: could not push a task's reply: %s", self.name, str(e)[:300])
            beat.set()
            client.close()
            self.tasks += 1

    def trace(self, message, t0: float, t1: float, t2: float, t3: float) -> None:
        """One line per task in the site's log: where its seconds went (the coordinator's clock is not needed:
        ``queued`` is from the message's creation, as Flower stamps it, to the executor taking it)."""
        created = float(getattr(message.metadata, "created_at", 0.0) or 0.0)
        queued = t0 - created if created else float("nan")
        log.info(
            "site %s task %d (round %s) at %.3f: queued %.3f s, input %.3f s, work %.3f s, reply %.3f s",
            self.name,
            self.tasks,
            message.metadata.group_id,
            t0,
            queued,
            t1 - t0,
            t2 - t1,
            t3 - t2,
        )

    def _heartbeat(self, client, done: threading.Event) -> None:
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

        while not done.wait(HEARTBEAT_S):
            try:
                client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            except Exception as e:  # noqa: BLE001 - retried at the next beat
                log.debug("site %s: heartbeat failed: %s", self.name, e)
