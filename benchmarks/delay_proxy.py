"""A TCP proxy that delays every byte by a fixed time in each direction (this kernel has no netem).

It also counts round trips: each time the server starts answering after the
client has sent something, one request/response turn has completed.
"""
from __future__ import annotations

import asyncio
import threading
import time


class DelayProxy:
    def __init__(self, *, target_port: int, one_way_delay_s: float, target_host: str = "127.0.0.1"):
        if one_way_delay_s < 0:
            raise ValueError(f"one_way_delay_s must be >= 0, got {one_way_delay_s!r}")
        self.target = (target_host, target_port)
        self.delay = one_way_delay_s
        self.round_trips = 0
        self.connections = 0
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait()

    def reset(self) -> None:
        self.round_trips = self.connections = 0

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, client_reader, client_writer):
        self.connections += 1
        server_reader, server_writer = await asyncio.open_connection(*self.target)
        last_sender = {"who": None}

        async def pump(reader, writer, who):
            queue: asyncio.Queue = asyncio.Queue()

            async def deliver():
                while True:
                    due, data = await queue.get()
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    if data is None:
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()

            sender = asyncio.ensure_future(deliver())
            while data := await reader.read(65536):
                if who == "server" and last_sender["who"] == "client":
                    self.round_trips += 1
                last_sender["who"] = who
                queue.put_nowait((time.monotonic() + self.delay, data))
            queue.put_nowait((time.monotonic() + self.delay, None))
            await sender

        await asyncio.gather(pump(client_reader, server_writer, "client"), pump(server_reader, client_writer, "server"),
                             return_exceptions=True)
