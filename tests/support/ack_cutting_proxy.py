"""A TCP proxy in front of a segment server that drops one connection
between an append and its acknowledgement, for exactly-once tests.

Bytes from the client are forwarded as they come.  Bytes from the server are
parsed as WireCommands frames (``type:i32 | length:i32 | payload``,
big-endian); the ``cut_at``-th ``DataAppended`` (type 7) seen across all
connections is not forwarded: both sides of that connection are closed
instead, once.  The server has then stored the block the client never saw
acknowledged, so the client must reconnect, learn its last event number from
``AppendSetup`` and resend only what is missing."""

from __future__ import annotations

import asyncio
import struct

DATA_APPENDED = 7
_HEADER = struct.Struct(">ii")


class AckCuttingProxy:
    """Listens on loopback; forwards every connection to ``target``."""

    def __init__(self, target: tuple[str, int], cut_at: int) -> None:
        self.target = target
        self.cut_at = cut_at  # which DataAppended (1-based, counted over all connections)
        self.acks_seen = 0
        self.cuts = 0  # connections cut so far (0 or 1)
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                     ) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        upstream = asyncio.create_task(self._pipe(client_r, server_w))
        try:
            await self._replies(server_r, client_w)
        finally:
            upstream.cancel()
            for writer in (client_w, server_w):
                writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def _replies(self, server_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                       ) -> None:
        """Forward the server's frames one by one until it closes, or until
        the frame chosen to be lost."""
        while True:
            try:
                header = await server_r.readexactly(_HEADER.size)
                kind, length = _HEADER.unpack(header)
                payload = await server_r.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if kind == DATA_APPENDED:
                self.acks_seen += 1
                if self.acks_seen == self.cut_at and self.cuts == 0:
                    self.cuts += 1
                    return  # the ack is lost with the connection
            client_w.write(header + payload)
            await client_w.drain()
