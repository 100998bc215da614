"""The tier-1 log seam on a named log: :class:`NamedDataLog`.

One :class:`~quire.log.LogWriter` does the work.  Its epoch is the log's
writer epoch in the metadata store, so :meth:`NamedDataLog.initialize`
(opening the writer) fences the previous owner; a ledger fenced under a
live owner only makes the writer roll.  Records are entries, addresses their
positions.  Reads see the owner's own latest appends at once: for the
ledger being written they use the writer's handle, whose LastAddConfirmed
is the last acknowledged entry, rather than asking the bookies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from quire.client import Client, Password, ReadHandle
from quire.log.catalog import LogCatalog
from quire.log.errors import LogError, LogFencedError
from quire.log.position import Position
from quire.log.reader import LogReader
from quire.log.writer import LogWriter, WriterOptions


class NamedDataLog:
    """A :class:`~quire.log.durable_data_log.DurableDataLog` on the named log
    ``name`` (created on :meth:`initialize` if needed, unless
    ``options.create`` is False).  ``password`` is its ledgers' password (a
    :class:`~quire.client.LedgerPasswords`: new ledgers get its current one,
    each older ledger opens with the one it was made with).

    Use PD_JOURNAL ledgers (the default): with VD_JOURNAL an append is
    acknowledged before it is durable, which this seam does not allow.
    """

    def __init__(self, client: Client, name: str, *, password: Password = b"",
                 options: WriterOptions | None = None) -> None:
        self._client = client
        self._name = name
        self._password = password
        self._options = options or WriterOptions()
        self._catalog = LogCatalog(client.metadata_store)
        self._writer: LogWriter | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def epoch(self) -> int:
        return self._owner().epoch

    def _owner(self) -> LogWriter:
        if self._writer is None:
            raise LogError(f"log {self._name!r}: initialize() the data log first")
        return self._writer

    async def initialize(self) -> None:
        if self._writer is not None:
            raise LogError(f"log {self._name!r}: the data log is initialized already")
        self._writer = await LogWriter.open(self._catalog, self._client, self._name,
                                            self._options, password=self._password)

    def append(self, data: bytes) -> asyncio.Future[Position]:
        return self._owner().append(data)

    async def read(self, from_address: Position | None = None
                   ) -> AsyncIterator[tuple[Position, bytes]]:
        writer = self._owner()
        if from_address is None:
            from_address = (await self._catalog.read_head(self._name)).value.truncated_before

        def own_handle(ledger_seq: int) -> ReadHandle | None:
            return writer.ledger_handle(ledger_seq)

        reader = LogReader(self._catalog, self._client, self._name, from_address,
                           password=self._password, follow=False, skip_truncated=True,
                           own_handle=own_handle)
        try:
            async for record in reader:
                yield record.position, record.payload
        finally:
            await reader.close()

    async def truncate(self, up_to: Position) -> None:
        await self._owner().truncate(up_to.next())

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(LogFencedError):  # fenced: the log is not ours to close
                await self._writer.close()
