"""Several steps for one site in one message: what makes a deployed round one message per site.

A method's coordinator may *defer* a step whose reply it does not need at once (``receive`` of a gossip round,
``receive_global`` of a server's broadcast: their replies carry only the payloads the site refused) and send
it
with the next step it asks of the same site (:meth:`silofl.fl.coordinator.Coordinator.call`). The request is
the
step :data:`BATCH`, whose message lists its parts in order::

    meta = {"parts": [{"step": "receive", "meta": {...}, "packets": 2}, {"step": "train_send", ...}]}
    packets = the parts' packets, concatenated in order

and whose reply lists each part's reply the same way. A site runs the parts in order, as if it had received
them
one by one; the first part that fails fails the whole request (the engine loses the site, as it would have at
that
part). Every engine carries a batch like any step (its bytes are the parts' bytes); the deployed worker checks
and
seals each part as its own step (:meth:`silofl.deploy.site.SiteWorker.handle_frame`).
"""

from __future__ import annotations

from silofl.comm.messages import Message
from silofl.core.errors import PeerModelRejected

BATCH = "batch"
MAX_PARTS = 8  # a round asks a site at most: the last round's deliveries, a repair, this round's step


def make(parts: list[tuple[str, Message]]) -> Message:
    """One request of ``parts`` [(step, message), …] for one site."""
    return Message(
        {"parts": [{"step": s, "meta": m.meta, "packets": len(m.packets)} for s, m in parts]},
        [p for _, m in parts for p in m.packets],
    )


def split(msg: Message, replies: bool = False) -> list[tuple[str, Message]]:
    """The parts of a batch request (of a batch reply with ``replies``: no step names), checked: at most
    :data:`MAX_PARTS`, step names, no batch inside a batch, packet counts that add up; PeerModelRejected
    otherwise."""
    parts = msg.meta.get("parts")
    if not isinstance(parts, list) or not 0 < len(parts) <= MAX_PARTS:
        raise PeerModelRejected(f"a batch holds 1 to {MAX_PARTS} parts")
    out, i = [], 0
    for part in parts:
        if not isinstance(part, dict) or set(part) - {"step", "meta", "packets"}:
            raise PeerModelRejected("a batch part is {step, meta, packets}")
        step, meta, n = part.get("step"), part.get("meta"), part.get("packets")
        if (
            step is not None
            if replies
            else not isinstance(step, str) or not step.isidentifier() or step == BATCH
        ):
            raise PeerModelRejected(f"a batch part names a step, not {str(step)[:40]!r}")
        if (
            not isinstance(meta, dict)
            or isinstance(n, bool)
            or not isinstance(n, int)
            or not 0 <= n <= len(msg.packets) - i
        ):
            raise PeerModelRejected("a batch part's meta or packet count is malformed")
        out.append((step or "", Message(meta, msg.packets[i : i + n])))
        i += n
    if i != len(msg.packets):
        raise PeerModelRejected(f"a batch carries {len(msg.packets)} packets, its parts {i}")
    return out


def reply(replies: list[Message]) -> Message:
    """One reply of the parts' ``replies``, in order."""
    return Message(
        {"parts": [{"step": None, "meta": r.meta, "packets": len(r.packets)} for r in replies]},
        [p for r in replies for p in r.packets],
    )


def split_reply(msg: Message, n: int) -> list[Message]:
    """The ``n`` replies in a batch reply; PeerModelRejected if it does not hold exactly ``n``."""
    parts = [m for _, m in split(msg, replies=True)]
    if len(parts) != n:
        raise PeerModelRejected(f"a batch of {n} parts was answered with {len(parts)}")
    return parts


def phases(requests: dict[int, Message]) -> list[tuple[str, dict[int, int], dict[int, Message]]]:
    """Batch requests to several sites as steps to run one after another: the parts right-aligned across the
    sites (every site's last part — the step asked of all — together, so an ``evaluate`` runs as one call)
    and grouped by step name; each site's parts stay in its own order. [(step, {site: part index}, {site:
    part})]."""
    parts = {k: split(m) for k, m in requests.items()}
    n = max((len(p) for p in parts.values()), default=0)
    out: list[tuple[str, dict[int, int], dict[int, Message]]] = []
    for i in range(-n, 0):
        by_step: dict[str, tuple[dict[int, int], dict[int, Message]]] = {}
        for k, p in parts.items():
            if -i <= len(p):
                idx, reqs = by_step.setdefault(p[i][0], ({}, {}))
                idx[k], reqs[k] = len(p) + i, p[i][1]
        out += [(step, idx, reqs) for step, (idx, reqs) in by_step.items()]
    return out
