"""An in-memory twin of the tier-1 log seam, for tests of what sits on it.

:class:`MemoryDataLogs` holds named logs in this process (what the metadata
store and the bookies hold for a :class:`~quire.log.named_data_log.NamedDataLog`);
:meth:`MemoryDataLogs.open` gives a :class:`MemoryDataLog` instance on one of
them, a :class:`~quire.log.durable_data_log.DurableDataLog` with the same
contract (the same tests run against both).  Appends are durable as soon as
they are made, and each owner writes its own "ledger": its addresses are
``Position(owner's generation, n)``, so they keep increasing across owners.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from quire.log.errors import LogError, LogFencedError, LogWriterClosedError
from quire.log.position import Position


@dataclass
class _SharedLog:
    """One log as every instance on it sees it."""

    epoch: int = 0
    generations: int = 0
    records: list[tuple[Position, bytes]] = field(default_factory=list)


class MemoryDataLogs:
    """Named in-memory logs, shared by the instances :meth:`open` gives."""

    def __init__(self) -> None:
        self._logs: dict[str, _SharedLog] = {}

    def open(self, name: str) -> MemoryDataLog:
        """A new, uninitialized instance on the log ``name``."""
        return MemoryDataLog(name, self._logs.setdefault(name, _SharedLog()))


class MemoryDataLog:
    """One owner's instance of an in-memory log; see the module docstring."""

    def __init__(self, name: str, shared: _SharedLog) -> None:
        self._name = name
        self._shared = shared
        self._epoch: int | None = None
        self._generation = -1
        self._next_entry = 0
        self._closed = False

    @property
    def epoch(self) -> int:
        return self._initialized()

    def _initialized(self) -> int:
        if self._epoch is None:
            raise LogError(f"log {self._name!r}: initialize() the data log first")
        return self._epoch

    def _check_owner(self) -> None:
        epoch = self._initialized()
        if self._shared.epoch != epoch:
            raise LogFencedError(f"log {self._name!r}: epoch {epoch} was fenced out by epoch "
                                 f"{self._shared.epoch}")
        if self._closed:
            raise LogWriterClosedError(f"log {self._name!r}: the data log is closed")

    async def initialize(self) -> None:
        if self._epoch is not None:
            raise LogError(f"log {self._name!r}: the data log is initialized already")
        shared = self._shared
        shared.epoch += 1
        self._epoch = shared.epoch
        self._generation = shared.generations
        shared.generations += 1

    def append(self, data: bytes) -> asyncio.Future[Position]:
        self._check_owner()
        address = Position(self._generation, self._next_entry)
        self._next_entry += 1
        self._shared.records.append((address, bytes(data)))
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        future.set_result(address)
        return future

    async def read(self, from_address: Position | None = None
                   ) -> AsyncIterator[tuple[Position, bytes]]:
        self._initialized()
        start = from_address or Position.START
        for address, data in list(self._shared.records):
            if address >= start:
                yield address, data

    async def truncate(self, up_to: Position) -> None:
        self._check_owner()
        self._shared.records = [r for r in self._shared.records if r[0] > up_to]

    async def close(self) -> None:
        self._closed = True
