"""Writing events in a transaction: :class:`StreamTransaction`.

The controller opens a transaction with one transaction segment per open
segment of the stream (``<segment>#transaction.<32 hex id>``, in the
segment's container); events go to them by routing key exactly as a
:class:`~quire.streams.writer.StreamWriter` routes them (same writer, same
dedup and resends), and are invisible to readers until :meth:`commit`
merges every transaction segment into its parent at once.  :meth:`abort`
discards them.  A transaction whose lease runs out before it is committed
is aborted by the controller; :meth:`ping` extends it.
"""

from __future__ import annotations

import asyncio
import contextlib

from quire.errors import ControllerPreconditionError, QuireError, SegmentNotFoundError
from quire.streams.controller import ControllerClient, Transaction, TxnState
from quire.streams.model import Segment
from quire.streams.segments import RemoteSegmentStore
from quire.streams.writer import SegmentWriterState, StreamWriter, WriterConfig


class _TransactionWriter(StreamWriter):
    """A StreamWriter over a transaction's segments: no scaling (a sealed
    transaction segment means the transaction is no longer open, a missing
    one that it was committed or aborted)."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 scope: str, stream: str, txn: Transaction, writer_id: int | None,
                 config: WriterConfig | None) -> None:
        super().__init__(controller, segments, scope, stream, writer_id, config)
        self.txn = txn
        self._routes = list(txn.segments)

    async def start(self) -> None:
        """Nothing to ask: the transaction's segments are its routes."""

    def name_of(self, segment: Segment) -> str:
        return f"{segment.name}#transaction.{self.txn.id:032x}"

    def _sealed(self, writer: SegmentWriterState) -> None:
        self._fail(writer, ControllerPreconditionError(
            f"transaction {self.txn.id:032x} on {self.scope}/{self.stream} is no longer open"))

    def _gone(self, writer: SegmentWriterState, error: SegmentNotFoundError,
              in_doubt: int) -> None:
        """No transaction segment: the transaction was committed or aborted
        (its parent's successors are no place for its events)."""
        self._fail(writer, error)


class StreamTransaction:
    """An open transaction on ``scope/stream``; get one with :meth:`begin`."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 scope: str, stream: str, txn: Transaction, writer_id: int | None = None,
                 config: WriterConfig | None = None) -> None:
        self.controller = controller
        self.scope = scope
        self.stream = stream
        self.txn = txn
        self._writer = _TransactionWriter(controller, segments, scope, stream, txn, writer_id,
                                          config)

    @classmethod
    async def begin(cls, controller: ControllerClient, segments: RemoteSegmentStore,
                    scope: str, stream: str, lease_ms: int = 30_000,
                    writer_id: int | None = None,
                    config: WriterConfig | None = None) -> StreamTransaction:
        txn = await controller.create_transaction(scope, stream, lease_ms)
        return cls(controller, segments, scope, stream, txn, writer_id, config)

    @property
    def id(self) -> int:
        """The transaction's 128-bit id."""
        return self.txn.id

    def write_event(self, data: bytes, routing_key: str | None = None) -> asyncio.Future[None]:
        """Queue one event; the future completes once it is durable in its
        transaction segment (still invisible to readers)."""
        return self._writer.write_event(data, routing_key)

    async def flush(self) -> None:
        await self._writer.flush()

    async def commit(self) -> None:
        """Wait for every event written, then commit: all of them become
        visible at once, or (on an error) none is known to."""
        await self._writer.close()
        await self.controller.commit_transaction(self.scope, self.stream, self.id)

    async def abort(self) -> None:
        """Discard the transaction (events still in flight included)."""
        with contextlib.suppress(QuireError):  # its events are being discarded anyway
            await self._writer.close()
        await self.controller.abort_transaction(self.scope, self.stream, self.id)

    async def ping(self, lease_ms: int) -> bool:
        """Extend the lease; False if the transaction is no longer open."""
        return await self.controller.ping_transaction(self.scope, self.stream, self.id,
                                                      lease_ms)

    async def state(self) -> TxnState:
        return await self.controller.transaction_state(self.scope, self.stream, self.id)
