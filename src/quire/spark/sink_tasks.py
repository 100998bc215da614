"""What a Spark task does to write rows to streams: one transaction per
stream its rows go to (option ``stream``, or each row's ``stream``
column), registered before it is written (:mod:`quire.spark.stream_commits`),
pinged while it is written, handed to the driver's commit in the task's
commit message; aborted (and its registration removed) if the task fails.
A stream that does not exist is created first (unless option ``create``
is false: :class:`~quire.spark.sink_options.StreamPolicies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql.datasource import WriterCommitMessage

from quire.errors import QuireError, ScopeNotFoundError, StreamNotFoundError
from quire.spark._runtime import runtime
from quire.spark.fanout_commits import FanOutCommits
from quire.spark.sink_options import StreamSinkOptions
from quire.spark.stream_options import split_stream
from quire.spark.stream_read import stream_clients
from quire.streams import StreamTransaction

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("quire.spark.streams")


async def commits_of(opts: StreamSinkOptions) -> FanOutCommits:
    """The write records of this process's clients for ``opts``."""
    controller, segments = await stream_clients(opts.access)
    return FanOutCommits(controller, segments, lease_ms=opts.txn_lease_ms)


async def ensure_stream(opts: StreamSinkOptions, scope: str, stream: str) -> None:
    """Create ``scope/stream`` with the options' policies if it does not
    exist (StreamNotFoundError when option ``create`` is false)."""
    controller, _segments = await stream_clients(opts.access)
    try:
        await controller.current_segments(scope, stream)
        return
    except (StreamNotFoundError, ScopeNotFoundError):
        if not opts.create:
            raise
    if await opts.policies.create(controller, scope, stream):
        log.info("created stream %s/%s for a write (%s)", scope, stream, opts.policies)


@dataclass
class StreamCommitMessage(WriterCommitMessage):
    """One task attempt's transaction on option ``stream`` (None: it had no
    rows), or, when rows route themselves, its transaction per stream."""

    partition_id: int
    attempt: int
    txn_id: int | None
    rows: int
    txns: tuple[tuple[str, int], ...] = field(default=())
    """(``scope/stream``, transaction) of each stream a routed task wrote."""


def _events(batch: pa.RecordBatch, event: str, key: str | None
            ) -> tuple[list[bytes], list[str | None]]:
    import pyarrow as pa

    array = batch.column(batch.schema.get_field_index(event))
    if array.null_count:
        raise ValueError("column event holds nulls: an event cannot be null")
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary() if pa.types.is_string(array.type)
                           else pa.large_binary())
    events: list[bytes] = array.to_pylist()
    keys: list[str | None] = (batch.column(batch.schema.get_field_index(key)).to_pylist()
                              if key is not None else [None] * len(events))
    return events, keys


def _routed(batch: pa.RecordBatch, column: str) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows by their ``stream`` column, each stream's in row order."""
    import pyarrow.compute as pc

    targets = batch.column(batch.schema.get_field_index(column))
    if targets.null_count:
        raise ValueError("column stream holds nulls: each row names its scope/stream")
    for target in targets.unique().to_pylist():
        split_stream(target, "column stream")
        yield target, batch.filter(pc.equal(targets, target))


class _TaskTransaction:
    """A task attempt's transaction on one stream, written from Spark's
    thread through the process's runtime loop, pinged while it is written."""

    def __init__(self, opts: StreamSinkOptions, scope: str, stream: str, write_id: str,
                 task: str) -> None:
        self.opts = opts
        self.scope = scope
        self.stream = stream
        self.write_id = write_id
        self.task = task
        self.txn: StreamTransaction | None = None
        self.rows = 0
        self._pending: list[asyncio.Future[None]] = []
        self._pinger: asyncio.Task[None] | None = None

    async def _begin(self) -> None:
        opts = self.opts
        commits = await commits_of(opts)
        try:
            self.txn = await StreamTransaction.begin(commits.controller, commits.segments,
                                                     self.scope, self.stream,
                                                     lease_ms=opts.txn_lease_ms)
        except (StreamNotFoundError, ScopeNotFoundError):
            await ensure_stream(opts, self.scope, self.stream)
            self.txn = await StreamTransaction.begin(commits.controller, commits.segments,
                                                     self.scope, self.stream,
                                                     lease_ms=opts.txn_lease_ms)
        try:
            await commits.register(self.write_id, self.scope, self.stream, self.txn.id,
                                   self.task)
        except BaseException:
            with contextlib.suppress(QuireError):
                await self.txn.abort()
            raise
        self._pinger = asyncio.ensure_future(self._keep_alive())

    async def _keep_alive(self) -> None:
        assert self.txn is not None
        while True:
            await asyncio.sleep(self.opts.txn_lease_ms / 4000)  # the lease renewal period
            try:
                await self.txn.ping(self.opts.txn_lease_ms)
            except QuireError as e:
                log.warning("ping of transaction %032x failed: %s", self.txn.id, e)

    async def _write(self, events: list[bytes], keys: list[str | None]) -> None:
        if self.txn is None:
            await self._begin()
        assert self.txn is not None
        previous, self._pending = self._pending, [
            self.txn.write_event(data, key) for data, key in zip(events, keys, strict=True)]
        if previous:  # one batch in flight while the next is converted
            await asyncio.gather(*previous)

    def write(self, events: list[bytes], keys: list[str | None]) -> None:
        runtime().run(self._write(events, keys))
        self.rows += len(events)

    async def _finish(self) -> int | None:
        if self.txn is None:
            return None
        await self.txn.flush()
        await self._stop_pinging()
        if not await self.txn.ping(self.opts.txn_lease_ms):  # a full lease for the commit
            raise QuireError(f"transaction {self.txn.id:032x} on {self.scope}/"
                             f"{self.stream} ended before its task did")
        return self.txn.id

    def finish(self) -> int | None:
        """Wait until every event is durable in the transaction; its id."""
        return runtime().run(self._finish())

    async def _stop_pinging(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
            self._pinger = None

    async def _discard(self) -> None:
        await self._stop_pinging()
        if self.txn is None:
            return
        try:
            await self.txn.abort()
        except QuireError:
            return  # the registration stays: the driver's abort or a recovery ends it
        # Aborted: the registration has done its job.  The driver may already
        # have aborted the write: Spark fails a job without waiting for every
        # Python worker, so a worker can register after the driver's abort has
        # listed the registrations, and only the attempt itself removes that one.
        with contextlib.suppress(QuireError):
            commits = await commits_of(self.opts)
            await commits.unregister(self.write_id, self.scope, self.stream, self.txn.id)

    def discard(self) -> None:
        """Abort the transaction (a failed attempt)."""
        runtime().run(self._discard())


def _write_task(opts: StreamSinkOptions, write_id: str, event: str, key: str | None,
                batches: Iterator[pa.RecordBatch], routed: str | None = None
                ) -> StreamCommitMessage:
    """Write a task's rows: to option ``stream``, or (``routed``: the
    ``stream`` column's name) to each row's stream."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    task = f"partition {partition} attempt {attempt}"
    txns: dict[str, _TaskTransaction] = {}

    def txn_for(target: str) -> _TaskTransaction:
        found = txns.get(target)
        if found is None:
            found = txns[target] = _TaskTransaction(opts, *split_stream(target), write_id, task)
        return found

    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if routed is None:
                txn_for(opts.key).write(*_events(batch, event, key))
                continue
            for target, rows in _routed(batch, routed):
                txn_for(target).write(*_events(rows, event, key))
        finished = [(target, txn.finish()) for target, txn in sorted(txns.items())]
    except BaseException:
        for txn in txns.values():
            txn.discard()
        raise
    rows = sum(txn.rows for txn in txns.values())
    if routed is None:
        return StreamCommitMessage(partition, attempt, finished[0][1] if finished else None,
                                   rows)
    return StreamCommitMessage(partition, attempt, None, rows,
                               tuple((t, i) for t, i in finished if i is not None))


def ordered_txns(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    """The successful attempts' transactions on option ``stream``, in partition order."""
    ordered = sorted((m for m in messages if isinstance(m, StreamCommitMessage)),
                     key=lambda m: m.partition_id)
    return [m.txn_id for m in ordered if m.txn_id is not None]


def reported_txns(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    return [m.txn_id for m in messages
            if isinstance(m, StreamCommitMessage) and m.txn_id is not None]


def routed_txns(messages: Sequence[WriterCommitMessage | None]) -> dict[str, list[int]]:
    """The routed attempts' transactions by stream, each in partition order."""
    found: dict[str, list[int]] = {}
    ordered = sorted((m for m in messages if isinstance(m, StreamCommitMessage)),
                     key=lambda m: m.partition_id)
    for message in ordered:
        for target, txn in message.txns:
            found.setdefault(target, []).append(txn)
    return found
