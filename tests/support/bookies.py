"""Real bookie processes for integration tests, and a raw protocol client.

``BookieProcess`` is :class:`quire.sandbox.BookieProcess` (a real ``quire
bookie start`` child process) with short intervals for tests and power-loss
emulation.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from pathlib import Path
from typing import Any, cast

from quire import sandbox
from quire.bookie.config import BookieConfig
from quire.bookie.storage import BookieStorage
from quire.config import load_config
from quire.errors import StatusCode
from quire.protocol import Decoder, ReadRequest, Request, Response
from quire.testing.power_loss import emulate_power_loss

TEST_SETTINGS: dict[str, Any] = {
    **sandbox.LOCAL_BOOKIE_SETTINGS,
    "flush_interval_ms": 200,
    "gc_interval_ms": 600_000,
    # GC off unless a test turns it on: most tests write ledgers that have no
    # metadata, which GC rightly drops once it runs, so on a slow machine
    # their adds could vanish between the write and the read.
    "disk_check_interval_ms": 500,
    "compaction_disk_usage_threshold": 0.0,  # (a full test disk would run GC at once)
    "registration_lease_ms": 1500,
    "power_loss_tracking": True,
    "journal_file_size_bytes": 4 * 1024 * 1024,
    # (each test's bookies preallocate their journal files: at 64 MiB, a
    # suite run wrote 22 GB of them)
}


class BookieProcess(sandbox.BookieProcess):
    """A bookie process with test-friendly intervals and power-loss tracking."""

    def __init__(self, root: Path, metadata_uri: str, bookie_id: str, **settings: Any) -> None:
        super().__init__(root, metadata_uri, bookie_id, **{**TEST_SETTINGS, **settings})

    def power_loss(self) -> None:
        """kill -9, then drop everything that was never fsynced."""
        self.kill9()
        emulate_power_loss(self.dirs)

    def reboot_after_power_loss(self, timeout_s: float = 60.0) -> None:
        """kill -9, lose everything never fsynced, start again (same id,
        port and directories): an unclean reboot."""
        self.power_loss()
        self.start(timeout_s=timeout_s)


class RawBookieClient(asyncio.Protocol):
    """Minimal pipelined protocol client for bookie tests (not the real client)."""

    def __init__(self) -> None:
        self.decoder = Decoder("responses")
        self.waiting: dict[int, asyncio.Future[Response]] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, address: str, tls: ssl.SSLContext | None = None) -> RawBookieClient:
        """Connected to ``address`` (over TLS with ``tls``)."""
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _transport, protocol = await loop.create_connection(cls, host, int(port), ssl=tls)
        return protocol

    def next_id(self) -> int:
        return next(self._ids)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        for message in self.decoder:
            rid = message.request_id  # type: ignore[union-attr]
            future = self.waiting.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(message)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, request: Request) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.waiting[request.request_id] = future  # type: ignore[index,union-attr]
        assert self.transport is not None
        self.transport.write(request.encode())  # type: ignore[union-attr]
        return future

    async def call(self, request: Request, timeout_s: float = 10.0) -> Response:
        return await asyncio.wait_for(self.send(request), timeout_s)

    def write_raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def put_in_limbo(process: BookieProcess, ledger_ids: list[int]) -> None:
    """Fence the ledgers and put them in limbo on a stopped bookie's directories
    (BP-46's phase one, as the storage engine does it).  Phase two, which
    would recover and repair them, is held back at the bookie's next starts,
    so that they stay in limbo for the test."""
    process.settings["repair_start_delay_ms"] = 600_000
    config = load_config(BookieConfig, process.write_config(), section="bookie")
    storage = BookieStorage.open(config.storage)
    try:
        storage.mark_limbo(ledger_ids)
    finally:
        storage.close()


async def wait_until_stored(address: str, ledger_id: int, entry_id: int,
                            tls: ssl.SSLContext | None = None) -> None:
    """Poll one bookie until it serves ``entry_id`` (the third replica's add
    may still be on its way when the ack quorum answered)."""
    raw = await RawBookieClient.connect(address, tls)
    try:
        deadline = time.monotonic() + 10
        while True:
            answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, entry_id))
            if answer.status == StatusCode.OK:
                return
            assert time.monotonic() < deadline, f"{address} never stored entry {entry_id}"
            await asyncio.sleep(0.02)
    finally:
        raw.close()
