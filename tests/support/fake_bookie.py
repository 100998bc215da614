"""In-process fake bookies for client unit tests (no child processes).

A :class:`FakeBookie` speaks the real wire protocol on a loopback port and
keeps entries in a dict, with the bookie's fencing and master-key rules.
Knobs let a test make it misbehave: answer adds with an error, hold add
answers back, stay silent, corrupt what it returns, or vanish.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client, ClientConfig
from quire.errors import StatusCode
from quire.metadata import BookieInfo, MetadataStore, open_store
from quire.protocol import (
    LAST_ENTRY_ID,
    AddRequest,
    AddResponse,
    Decoder,
    ErrorResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from quire.types import BookieState

_LAC = struct.Struct(">q")


@dataclass
class _Ledger:
    key: bytes | None = None
    entries: dict[int, bytes] = field(default_factory=dict)
    fenced: bool = False
    explicit_lac: int = -1


class _Conn(asyncio.Protocol):
    def __init__(self, bookie: FakeBookie) -> None:
        self.bookie = bookie
        self.decoder = Decoder("requests")
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.bookie.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.bookie.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        for request in self.decoder:
            self.bookie.handle(self, request)  # type: ignore[arg-type]

    def send(self, frame: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)


class FakeBookie:
    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.ledgers: dict[int, _Ledger] = {}
        self.connections: set[_Conn] = set()
        self.server: asyncio.Server | None = None
        self.address = ""
        # --- knobs ---
        self.add_status: StatusCode | None = None
        """Answer every (non-recovery) add with this status instead of storing it."""
        self.silent = False
        """Answer nothing at all."""
        self.hold_adds: set[int] | None = None
        """Entry ids whose (non-recovery) add answers wait in ``held`` until
        :meth:`release`."""
        self.held: list[tuple[_Conn, bytes]] = []
        self.corrupt_reads = False
        """Flip the last byte of every entry a read returns."""
        self.read_status: Callable[[int, int], StatusCode | None] | None = None
        """(ledger, entry) -> a status to answer a read with instead of the entry."""
        self.fence_at: dict[int, int] = {}
        """ledger -> entry id: the ledger is fenced when an add of that entry
        (or a later one) arrives, as a bookie's own fencing between two adds."""
        self.requests: list[str] = []
        self.add_flags: list[int] = []

    async def start(self, registry: MetadataStore) -> FakeBookie:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Conn(self), "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        await registry.register_bookie(BookieInfo(self.bookie_id, self.address,
                                                  BookieState.WRITABLE))
        return self

    async def stop(self, registry: MetadataStore | None = None) -> None:
        """Vanish: stop listening, drop every connection, leave the registry."""
        if self.server is not None:
            self.server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            await self.server.wait_closed()
            self.server = None
        if registry is not None:
            await registry.unregister_bookie(self.bookie_id)

    def release(self) -> None:
        held, self.held = self.held, []
        self.hold_adds = None
        for conn, frame in held:
            conn.send(frame)

    def stored(self, ledger_id: int) -> dict[int, bytes]:
        ledger = self.ledgers.get(ledger_id)
        return dict(ledger.entries) if ledger else {}

    # --- request handling ---------------------------------------------------

    def handle(self, conn: _Conn, request: object) -> None:
        self.requests.append(type(request).__name__)
        if self.silent:
            return
        if isinstance(request, AddRequest):
            self._add(conn, request)
        elif isinstance(request, ReadRequest):
            self._read(conn, request)
        elif isinstance(request, ReadLacRequest):
            self._read_lac(conn, request)
        elif isinstance(request, WriteLacRequest):
            ledger = self.ledgers.get(request.ledger_id)
            status = StatusCode.NO_SUCH_LEDGER if ledger is None else StatusCode.OK
            if ledger is not None:
                ledger.explicit_lac = max(ledger.explicit_lac, request.lac)
            conn.send(WriteLacResponse(request.request_id, status, request.ledger_id).encode())
        else:
            rid = getattr(request, "request_id", 0) or 0
            conn.send(ErrorResponse(int(getattr(request, "op", 0)), rid,
                                    StatusCode.UNSUPPORTED).encode())

    def _add(self, conn: _Conn, req: AddRequest) -> None:
        self.add_flags.append(req.flags)
        def answer(status: StatusCode) -> None:
            frame = AddResponse(req.request_id, status, req.ledger_id, req.entry_id).encode()
            if (self.hold_adds is not None and req.entry_id in self.hold_adds
                    and not req.is_recovery):
                self.held.append((conn, frame))
            else:
                conn.send(frame)

        if self.add_status is not None and not req.is_recovery:
            answer(self.add_status)
            return
        ledger = self.ledgers.setdefault(req.ledger_id, _Ledger())
        if req.entry_id >= self.fence_at.get(req.ledger_id, req.entry_id + 1):
            ledger.fenced = True
        if ledger.key is None:
            ledger.key = req.master_key
        if ledger.key != req.master_key:
            answer(StatusCode.UNAUTHORIZED)
            return
        if ledger.fenced and not req.is_recovery:
            answer(StatusCode.FENCED)
            return
        ledger.entries[req.entry_id] = req.entry
        answer(StatusCode.OK)

    def _read(self, conn: _Conn, req: ReadRequest) -> None:
        def answer(status: StatusCode, entry: bytes | None = None) -> None:
            conn.send(ReadResponse(req.request_id, status, req.ledger_id, req.entry_id,
                                   entry).encode())

        ledger = self.ledgers.get(req.ledger_id)
        if req.is_fencing:
            if ledger is None:
                ledger = self.ledgers[req.ledger_id] = _Ledger(key=req.master_key)
            if ledger.key is not None and ledger.key != req.master_key:
                answer(StatusCode.UNAUTHORIZED)
                return
            ledger.fenced = True
        if self.read_status is not None:
            status = self.read_status(req.ledger_id, req.entry_id)
            if status is not None:
                answer(status)
                return
        if ledger is None:
            answer(StatusCode.NO_SUCH_LEDGER)
            return
        entry_id = req.entry_id
        if entry_id == LAST_ENTRY_ID:
            if not ledger.entries:
                answer(StatusCode.NO_SUCH_ENTRY)
                return
            entry_id = max(ledger.entries)
        entry = ledger.entries.get(entry_id)
        if entry is None:
            answer(StatusCode.NO_SUCH_ENTRY)
            return
        if self.corrupt_reads:
            entry = entry[:-1] + bytes([entry[-1] ^ 0xFF])
        answer(StatusCode.OK, entry)

    def _read_lac(self, conn: _Conn, req: ReadLacRequest) -> None:
        ledger = self.ledgers.get(req.ledger_id)
        if ledger is None:
            conn.send(ReadLacResponse(req.request_id, StatusCode.NO_SUCH_LEDGER,
                                      req.ledger_id).encode())
            return
        lac = ledger.explicit_lac
        if ledger.entries:
            lac = max(lac, _LAC.unpack_from(ledger.entries[max(ledger.entries)], 16)[0])
        conn.send(ReadLacResponse(req.request_id, StatusCode.OK, req.ledger_id, lac).encode())


class FakeCluster:
    """N fake bookies registered in a private ``memory://`` store, and the
    clients a test makes on it (all closed by :meth:`close`)."""

    def __init__(self, uri: str, registry: MetadataStore, bookies: list[FakeBookie]) -> None:
        self.uri = uri
        self.registry = registry
        self.bookies = bookies
        self._clients: list[Any] = []

    @classmethod
    async def start(cls, count: int, uri: str | None = None) -> FakeCluster:
        """``count`` fake bookies on the store at ``uri`` (default: a private
        ``memory://`` one)."""
        uri = uri or f"memory://fake-cluster-{uuid.uuid4().hex}"
        registry = await open_store(uri)
        bookies = [await FakeBookie(f"fake-{i}").start(registry) for i in range(count)]
        return cls(uri, registry, bookies)

    def bookie(self, bookie_id: str) -> FakeBookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def client(self, **config: Any) -> Client:
        client = await Client.connect(self.uri, ClientConfig(**config))
        self._clients.append(client)
        return client

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        for bookie in self.bookies:
            await bookie.stop()
        await self.registry.close()
