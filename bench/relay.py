"""A TCP relay on loopback that delays every chunk both ways: ``bench/deployment.py``'s wide-area stand-in
between the sites and the SuperLink of a ``deploy local`` (as this kernel has no ``netem``), hooked in by
``bench/delayed_deploy.py`` through :data:`silofl.deploy.local.SITE_RELAY`."""

from __future__ import annotations

import socket
import threading


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayRelay:
    """A TCP relay on loopback that holds every chunk ``delay_s`` before passing it on, both ways: the
    wide-area stand-in of ``bench/deployment.py`` where the kernel has no ``netem``. Bytes pass unchanged (TLS
    end to end)."""

    def __init__(self, target: tuple[str, int], delay_s: float):
        import asyncio

        self.target, self.delay_s = target, delay_s
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        ready = threading.Event()

        async def pipe(reader, writer):
            q: asyncio.Queue = asyncio.Queue()

            async def send():
                while (item := await q.get()) is not None:
                    due, data = item
                    await asyncio.sleep(max(0.0, due - self.loop.time()))
                    writer.write(data)
                    await writer.drain()
                writer.close()

            sender = asyncio.ensure_future(send())
            try:
                while data := await reader.read(1 << 16):
                    q.put_nowait((self.loop.time() + self.delay_s, data))
            except OSError:
                pass
            q.put_nowait(None)
            await sender

        async def serve(reader, writer):
            try:
                r2, w2 = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, w2), pipe(r2, writer), return_exceptions=True)

        async def main():
            self.server = await asyncio.start_server(serve, "127.0.0.1", self.port)
            ready.set()
            try:
                await self.server.serve_forever()
            except asyncio.CancelledError:  # close(): the server stopped as asked
                pass

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        ready.wait(10)

    def close(self) -> None:
        """Stop accepting connections."""
        self.loop.call_soon_threadsafe(self.server.close)
