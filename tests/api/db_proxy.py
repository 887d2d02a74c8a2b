"""A real TCP proxy (asyncio, its own thread) in front of PostgreSQL, to inject faults into a
running service's database connections without touching the server.

Modes: ``pass`` forwards; ``refuse`` resets every connection, open or new (a database that is
down); ``stall`` holds all bytes in both directions (a host that hangs); ``reset`` forwards a
query to the server and resets the client's connection when the answer comes back (a
connection lost mid-query, after the server may have committed). ``fault_on`` switches to a
mode when a given statement is sent, so that one chosen call meets the fault (the statement is
held or dropped with everything after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from typing import Literal

Mode = Literal["pass", "refuse", "stall", "reset"]
CHUNK = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: what a crashed peer or a firewall does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class DbProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self._trigger: tuple[bytes, Mode, threading.Event] | None = None
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> DbProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def set_mode(self, mode: Mode) -> None:
        def apply() -> None:
            self.mode = mode
            if mode == "refuse":
                for client, upstream in list(self._pairs):
                    _reset(client)
                    _reset(upstream)

        self._loop.call_soon_threadsafe(apply)

    def fault_on(self, statement: bytes, mode: Mode) -> threading.Event:
        """Switch to ``mode`` as the next client bytes holding ``statement`` arrive (once);
        the event is set when that happens."""
        fired = threading.Event()
        self._trigger = (statement, mode, fired)
        return fired

    def stop(self) -> None:
        async def close() -> None:
            for client, upstream in list(self._pairs):
                _reset(client)
                _reset(upstream)
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, pair, upstream=True),
                self._pipe(up_reader, writer, pair, upstream=False),
            )
        finally:
            self._pairs.discard(pair)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        upstream: bool,
    ) -> None:
        try:
            while data := await src.read(CHUNK):
                trigger = self._trigger
                if upstream and trigger is not None and trigger[0] in data:
                    self.mode, self._trigger = trigger[1], None
                    if trigger[1] == "refuse":
                        self.set_mode("refuse")  # also reset the connections already open
                    trigger[2].set()
                while self.mode == "stall":
                    await asyncio.sleep(0.01)
                if self.mode == "refuse" or (self.mode == "reset" and not upstream):
                    _reset(pair[0])
                    _reset(pair[1])
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not dst.is_closing():
                dst.close()
