"""A small Pravega wire client for tests, on quire.pravega_wire and asyncio streams."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct

from quire.pravega_wire import (
    OLDEST_COMPATIBLE_VERSION,
    REPLY_TYPES,
    WIRE_VERSION,
    AppendBlockEnd,
    Decoder,
    Hello,
    WireCommand,
)

TIMEOUT_S = 10.0
_EVENT_HEAD = struct.Struct(">ii")


def event(data: bytes) -> bytes:
    """One event as the Pravega writer frames it inside a block: type 0, length, data."""
    return _EVENT_HEAD.pack(0, len(data)) + data


def events_of(data: bytes) -> list[bytes]:
    """The events of a segment's bytes, framed by :func:`event`."""
    out = []
    at = 0
    while at < len(data):
        kind, length = _EVENT_HEAD.unpack_from(data, at)
        assert kind == 0
        out.append(data[at + 8:at + 8 + length])
        at += 8 + length
    assert at == len(data)
    return out


def block(writer_id: int, number: int, request_id: int, *payloads: bytes) -> AppendBlockEnd:
    """An AppendBlockEnd of ``payloads`` as events, the last one numbered ``number``."""
    data = b"".join(event(p) for p in payloads)
    return AppendBlockEnd(writer_id, len(data), data, len(payloads), number, request_id)


class WireClient:
    """One connection: the server's Hello checked, ours sent, then commands."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = Decoder(REPLY_TYPES)

    @classmethod
    async def connect(cls, host: str, port: int, hello: bool = True,
                      tls: ssl.SSLContext | None = None,
                      local_addr: tuple[str, int] | None = None) -> WireClient:
        """Connect (with ``tls``: over TLS, checking ``host``; from
        ``local_addr`` if given) and exchange Hellos."""
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None,
            local_addr=local_addr)
        client = cls(reader, writer)
        server_hello = await client.recv()
        assert server_hello == Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)
        if hello:
            await client.send(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION))
        return client

    async def send(self, *commands: WireCommand) -> None:
        self.writer.write(b"".join(c.encode() for c in commands))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self, timeout_s: float = TIMEOUT_S) -> WireCommand:
        async with asyncio.timeout(timeout_s):
            while (command := self.decoder.next()) is None:
                data = await self.reader.read(1 << 16)
                if not data:
                    raise ConnectionError("the server closed the connection")
                self.decoder.feed(data)
            return command

    async def request(self, command: WireCommand) -> WireCommand:
        await self.send(command)
        return await self.recv()

    async def closed_by_server(self, timeout_s: float = TIMEOUT_S) -> bool:
        """True once the server has closed the connection (replies before
        that are read and dropped); False if it is still open after the timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(1 << 16):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
