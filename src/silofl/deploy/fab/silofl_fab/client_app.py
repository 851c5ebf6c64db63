"""A site's ClientApp: it relays each message's bytes to the site's own worker and its reply back.

Flower starts a ClientApp process per message; the site's data, models and ledger live in the worker
(``silofl site run``), reached over a Unix socket in the site's folder that only the site's user can open.
This module imports nothing but Flower and the standard library, so a relay starts fast; everything it
relays is opaque to it (payloads between sites are sealed by the workers)."""

import socket
import struct

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()
LIMIT = (256 << 20) + (1 << 20)


def _exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("the site's worker closed the connection")
        buf += chunk
    return bytes(buf)


@app.query("silofl")
def relay(msg: Message, context: Context) -> Message:
    """Forward the frame to the site's worker; return its reply frame."""
    frame = msg.content["silofl"]["frame"]
    if not isinstance(frame, bytes) or len(frame) > LIMIT:
        raise ValueError("a silofl message carries one frame of bytes")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(float(context.node_config.get("site-timeout", 900)))
        conn.connect(str(context.node_config["site-socket"]))
        conn.sendall(struct.pack("<Q", len(frame)) + frame)
        n = struct.unpack("<Q", _exact(conn, 8))[0]
        if n > LIMIT:
            raise ValueError("the site's reply exceeds the frame limit")
        reply = _exact(conn, n)
    return Message(RecordDict({"silofl": ConfigRecord({"frame": reply})}), reply_to=msg)
