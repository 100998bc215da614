"""One bookie node in the test's own process (server and storage engine,
real files), with connections on fake transports: what the unit tests of the
add pipeline and its durability strategies drive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from quire.bookie.config import BookieConfig
from quire.bookie.server import BookieServer
from quire.bookie.storage import StorageConfig
from quire.errors import StatusCode
from quire.node import BookieNode
from quire.protocol import AddResponse, Decoder, DigestManager, encode_add_request, master_key
from quire.types import DigestType
from tests.support.bookies import TEST_SETTINGS
from tests.support.fake_transport import FakeTransport

PASSWORD = b"pw"
KEY = master_key(PASSWORD)
Answer = tuple[int, StatusCode, int, int, int]
"""(request id, status, ledger, entry, LastAddSynced)"""


def node_config(tmp_path: Path, *, storage: dict[str, Any] | None = None,
                **bookie: Any) -> BookieConfig:
    """A bookie on a free port with its data and SQLite metadata under
    ``tmp_path``; ``storage`` and ``bookie`` override settings."""
    # the test bookie processes' disk thresholds (the machine's disk may be
    # full) and journal file size
    disk = {k: TEST_SETTINGS[k] for k in ("disk_usage_threshold", "disk_usage_lwm_threshold")}
    return BookieConfig(**{"bookie_id": "b1", "port": 0, "metrics_port": -1,
                           "metadata_uri": f"sqlite:///{tmp_path}/meta.db", **disk, **bookie},
                        storage=StorageConfig(**{
                            "journal_dirs": (tmp_path / "data",),
                            "ledger_dirs": (tmp_path / "data",),
                            "journal_file_size_bytes": TEST_SETTINGS["journal_file_size_bytes"],
                            **(storage or {})}))


@contextlib.asynccontextmanager
async def node_at(config: BookieConfig) -> AsyncIterator[BookieNode]:
    node = BookieNode(config)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def stored(ledger_id: int, entry_id: int) -> bytes:
    """Entry ``entry_id`` of a ledger as a client stores it (10-byte payload)."""
    return DigestManager(ledger_id, DigestType.CRC32C, PASSWORD).encode(
        entry_id, entry_id - 1, entry_id + 1, b"x" * 10)


class AddPeer:
    """One connection to the server on a fake transport, and its add answers."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.conn = server.new_connection()
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self._answers = Decoder("responses", 1 << 20)

    def send(self, *adds: tuple[int, int, int, int]) -> None:
        """One read holding ``(request id, ledger, entry id, flags)`` adds."""
        self.conn.data_received(b"".join(encode_add_request(rid, KEY, stored(lid, eid), flags)
                                         for rid, lid, eid, flags in adds))

    def answers(self) -> list[Answer]:
        """Every answer written so far, in the order written."""
        self._answers.feed(b"".join(self.transport.written))
        self.transport.written.clear()
        out = []
        for m in self._answers.next_messages():
            assert isinstance(m, AddResponse)
            out.append((m.request_id, m.status, m.ledger_id, m.entry_id, m.last_add_synced))
        return out

    async def flushed(self) -> list[Answer]:
        """The answers once the hub's flush, scheduled for the loop's next
        iteration, has written them."""
        await asyncio.sleep(0)
        return self.answers()

    async def durable(self) -> list[Answer]:
        """The answers once everything journaled so far is durable and written."""
        await self.server.committer.wait_durable(self.server.storage.journal.append_seq)
        return await self.flushed()


def count_add_runs(server: BookieServer) -> list[tuple[int | None, dict[str, Any]]]:
    """Record each ``BookieStorage.add_run`` call from now on: (its result,
    its keyword arguments)."""
    calls: list[tuple[int | None, dict[str, Any]]] = []
    real = server.storage.add_run

    def add_run(*args: Any, **kwargs: Any) -> int | None:
        result = real(*args, **kwargs)
        calls.append((result, kwargs))
        return result

    server.storage.add_run = add_run  # type: ignore[method-assign]
    return calls
