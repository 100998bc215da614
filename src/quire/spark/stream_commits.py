"""All-or-nothing writes of many stream transactions, rolled forward after a crash.

A Spark write to a stream is one transaction per task attempt; the driver
commits the successful attempts' transactions together.  Committing N
transactions is N controller calls, so a driver that dies part way would
leave some committed and some not.  :class:`StreamCommits` makes the commit
a decision recorded durably *before* the first transaction is committed,
in a table segment of the segment store, one per stream written::

    <scope>/_SPARK<stream>/0.#epoch.0
        txn/<write>/<txn id>      a task attempt's transaction (registered
                                  before it writes; aborted unless committed;
                                  a failing attempt aborts and removes its own)
        commit/<write>            a batch write's commit list: once it exists
                                  the write is committed, whoever finishes it
        sink/<scope>/<stream>/<sink id>
                                  a streaming sink: the last batch id committed
                                  and, until they are all committed, its
                                  transactions

The table is guarded like the stream itself
(:func:`quire.security.segment_resource` maps ``_SPARK<T>`` to stream T):
whoever may write the stream may record a write to it, and nobody else can
read or change the records.  Its name is shaped like a stream segment's,
so a client finds its segment store through the controller's ``getURI``.

Upgrade: the records used to live in one table for every stream,
``_system/_tables/_spark/stream_writes`` (:data:`LEGACY_WRITES_TABLE`),
which users cannot reach once auth is on.  Before upgrading, finish
interrupted writes with :func:`~quire.spark.recover_stream_writes` (a
crashed driver's transactions are aborted when their lease runs out
anyway).  A streaming sink's progress (the last batch committed) is
carried over: when a sink has no record in its stream's table, the old
table's record is read (if it can be) and used.

The record says what to commit; finishing (:meth:`StreamCommits.roll_forward`)
commits every transaction listed (committing a committed one is a no-op),
aborts the write's other registered transactions (failed and retried task
attempts), then removes the write's records.  Anyone can finish: the commit
itself, a later write to the stream, or :func:`recover_stream_writes`.

Leases: a transaction the controller does not hear from within its lease
is aborted.  Tasks ping their transaction while writing; the committer pings
every transaction before recording (refusing, and aborting them all, if one
is gone: nothing was visible yet) and keeps pinging the uncommitted ones
until each is committed.  After a driver crash the transactions live one
lease (``txn_lease``, at most the controller's ``txn_max_lease_ms``) from
their last ping; the roll-forward must come within it, which the next write
to the stream or a recovery call does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from quire.clock import SYSTEM_CLOCK
from quire.errors import (
    ControllerPreconditionError,
    PermissionDeniedError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
    TransactionNotFoundError,
)
from quire.security.resources import SPARK_WRITES_STREAM_PREFIX
from quire.segmentstore import NOT_EXISTS, SegmentType, TableEntry
from quire.streams import ControllerClient, RemoteSegmentStore, TxnState

log = logging.getLogger("quire.spark.streams")

LEGACY_WRITES_TABLE = "_system/_tables/_spark/stream_writes"
"""Where the records of every stream's writes were kept before (read only
for a sink's progress, see the module docstring)."""


def writes_table(scope: str, stream: str) -> str:
    """The table segment holding the records of Spark writes to ``scope/stream``."""
    return f"{scope}/{SPARK_WRITES_STREAM_PREFIX}{stream}/0.#epoch.0"


class StreamWriteError(QuireError):
    """A Spark write to a stream could not be committed."""


class StreamWriteAbortedError(StreamWriteError):
    """A transaction of the write was gone (its lease ran out, or it was
    aborted) before the commit was recorded: the whole write was aborted and
    nothing of it is visible."""


class StreamWriteIncompleteError(StreamWriteError):
    """Rolling a recorded commit forward found transactions aborted (their
    lease ran out before anyone finished the commit): the others were
    committed, these events are lost."""


class SinkConflictError(StreamWriteError):
    """Another committer moved the sink's record at the same time."""


def _hex(txn_id: int) -> str:
    return f"{txn_id:032x}"


@dataclass(frozen=True)
class CommitRecord:
    """What to commit for one write: transactions on one stream, in order."""

    scope: str
    stream: str
    txns: tuple[int, ...]
    created_ms: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"scope": self.scope, "stream": self.stream,
                           "txns": [_hex(t) for t in self.txns],
                           "created_ms": self.created_ms}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CommitRecord:
        doc = json.loads(data)
        return cls(doc["scope"], doc["stream"], tuple(int(t, 16) for t in doc["txns"]),
                   int(doc.get("created_ms", 0)))


@dataclass(frozen=True)
class SinkRecord:
    """A streaming sink's progress: the last batch id committed, and the
    transactions of that batch while they are not all committed yet (a
    fan-out batch's: those of its other streams too, and the write id its
    tasks registered under: :mod:`quire.spark.fanout_commits`)."""

    batch_id: int
    txns: tuple[int, ...] = ()
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """A fan-out batch's other streams (``scope/stream``) and their transactions."""
    write_id: str | None = None
    """A fan-out batch's write id (None: :func:`sink_batch_write_id`'s)."""

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"batch_id": self.batch_id, "txns": [_hex(t) for t in self.txns]}
        if self.write_id is not None:
            doc["write_id"] = self.write_id
            doc["others"] = {k: [_hex(t) for t in v] for k, v in self.others}
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SinkRecord:
        doc = json.loads(data)
        return cls(int(doc["batch_id"]), tuple(int(t, 16) for t in doc["txns"]),
                   tuple((k, tuple(int(t, 16) for t in v))
                         for k, v in sorted(doc.get("others", {}).items())),
                   doc.get("write_id"))

    @property
    def pending(self) -> bool:
        """Transactions are left to commit."""
        return bool(self.txns) or any(txns for _key, txns in self.others)


@dataclass
class RecoveryReport:
    """What :meth:`StreamCommits.recover` finished."""

    rolled_forward: list[str] = field(default_factory=list)
    """Writes (batch writes and sink batches) whose recorded commit was finished."""
    committed_txns: int = 0
    aborted_txns: int = 0
    """Transactions of failed or retried task attempts aborted."""
    forgotten: int = 0
    """Registrations of abandoned attempts (transactions already ended) removed."""


def write_key(write_id: str) -> str:
    return f"commit/{write_id}"


def txn_key(write_id: str, txn_id: int) -> str:
    """The key of a task attempt's registration."""
    return f"txn/{write_id}/{_hex(txn_id)}"


def sink_key(scope: str, stream: str, sink_id: str) -> str:
    return f"sink/{scope}/{stream}/{sink_id}"


def sink_batch_write_id(scope: str, stream: str, sink_id: str, batch_id: int) -> str:
    """The write id under which a sink batch's task attempts register."""
    return f"sink/{scope}/{stream}/{sink_id}/{batch_id}"


Hook = Callable[[], Awaitable[None] | None]


class StreamCommits:
    """The records of Spark writes to streams, and committing them.

    ``lease_ms`` is the lease every ping asks for."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 lease_ms: int = 120_000) -> None:
        self.controller = controller
        self.segments = segments
        self.lease_ms = lease_ms
        self.after_record: Hook | None = None
        """Test hook: called once a commit decision is recorded, before the
        first transaction is committed."""

    # --- the table ----------------------------------------------------------------------

    async def ensure_table(self, table: str) -> None:
        with contextlib.suppress(SegmentExistsError):
            await self.segments.create_segment(table, SegmentType.TABLE)

    async def _get(self, table: str, key: str) -> TableEntry | None:
        try:
            return (await self.segments.table_get(table, [key.encode()]))[0]
        except SegmentNotFoundError:
            return None

    async def _put(self, table: str, key: str, value: bytes, version: int | None) -> int:
        return (await self.segments.table_put(table, [(key.encode(), value, version)]))[0]

    async def _remove(self, table: str, keys: Sequence[str]) -> None:
        if keys:
            with contextlib.suppress(TableKeyNotFoundError, SegmentNotFoundError):
                await self.segments.table_remove(table, [(k.encode(), None) for k in keys])

    async def _entries(self, table: str, prefix: str) -> AsyncIterator[TableEntry]:
        token: bytes | None = None
        while True:
            try:
                page = await self.segments.table_iterate(table, False, token, 1000)
            except SegmentNotFoundError:
                return
            for entry in page.entries:
                if entry.key.decode().startswith(prefix):
                    yield entry
            if page.token is None or not page.entries:
                return
            token = page.token

    # --- task side ----------------------------------------------------------------------

    async def register(self, write_id: str, scope: str, stream: str, txn_id: int,
                       task: str) -> None:
        """Record a task attempt's transaction before it writes, so that it
        is aborted unless committed (even if the task dies)."""
        table = writes_table(scope, stream)
        await self.ensure_table(table)
        record = {"scope": scope, "stream": stream, "task": task,
                  "created_ms": SYSTEM_CLOCK.wall_ms()}
        await self._put(table, txn_key(write_id, txn_id), json.dumps(record).encode(), None)

    async def unregister(self, write_id: str, scope: str, stream: str, txn_id: int) -> None:
        """Forget a task attempt's registration once its transaction is
        aborted (what the registration was there to make sure of)."""
        await self._remove(writes_table(scope, stream), [txn_key(write_id, txn_id)])

    async def _registered(self, write_id: str, scope: str, stream: str
                          ) -> list[tuple[str, str, str, int]]:
        """(key, scope, stream, txn id) of the attempts registered for ``write_id``."""
        prefix = f"txn/{write_id}/"
        found = []
        async for entry in self._entries(writes_table(scope, stream), prefix):
            key = entry.key.decode()
            doc = json.loads(entry.value or b"{}")
            found.append((key, doc["scope"], doc["stream"], int(key[len(prefix):], 16)))
        return found

    # --- transactions -------------------------------------------------------------------

    async def _ping_all(self, scope: str, stream: str, txns: Sequence[int]) -> list[int]:
        """Ping every transaction; those no longer open."""
        async def ping(txn: int) -> bool:
            try:
                return await self.controller.ping_transaction(scope, stream, txn, self.lease_ms)
            except TransactionNotFoundError:
                return False
        alive = await asyncio.gather(*(ping(t) for t in txns))
        return [t for t, ok in zip(txns, alive, strict=True) if not ok]

    async def _abort(self, scope: str, stream: str, txns: Sequence[int]) -> int:
        """Abort transactions (committed or unknown ones are left alone); how many."""
        aborted = 0
        for txn in txns:
            try:
                await self.controller.abort_transaction(scope, stream, txn)
                aborted += 1
            except (ControllerPreconditionError, TransactionNotFoundError) as e:
                log.debug("transaction %032x on %s/%s not aborted: %s", txn, scope, stream, e)
        return aborted

    async def _commit_all(self, scope: str, stream: str, txns: Sequence[int]
                          ) -> tuple[int, list[int]]:
        """Commit each transaction in order, pinging the rest meanwhile;
        (committed, aborted ones found)."""
        pending = list(txns)
        interval = max(self.lease_ms / 4000, 0.05)

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(interval)  # the lease renewal period
                with contextlib.suppress(QuireError):
                    await self._ping_all(scope, stream, list(pending))

        pinger = asyncio.ensure_future(keep_alive())
        lost: list[int] = []
        committed = 0
        try:
            for txn in txns:
                try:
                    await self.controller.commit_transaction(scope, stream, txn)
                    committed += 1
                except ControllerPreconditionError:
                    lost.append(txn)  # aborted: its lease ran out before this
                except TransactionNotFoundError:
                    # completed long ago and forgotten; it was open when the
                    # commit was recorded and only a commit or an abort ends it
                    log.warning("transaction %032x on %s/%s: forgotten by the controller; "
                                "counted as committed", txn, scope, stream)
                pending.remove(txn)
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
        return committed, lost

    # --- batch writes -------------------------------------------------------------------

    async def commit_write(self, write_id: str, scope: str, stream: str,
                           txns: Sequence[int]) -> int:
        """Commit a batch write: every transaction of ``txns`` (in order) or
        none.  Returns the number committed.  StreamWriteAbortedError if one
        was gone before the decision (then all are aborted)."""
        table = writes_table(scope, stream)
        await self.ensure_table(table)
        gone = await self._ping_all(scope, stream, txns)
        if gone:
            await self.abort_write(write_id, scope, stream, txns)
            raise StreamWriteAbortedError(
                f"write {write_id} to {scope}/{stream}: transactions "
                f"{', '.join(_hex(t) for t in gone)} were no longer open (lease of "
                f"{self.lease_ms} ms ran out?); the whole write was aborted")
        record = CommitRecord(scope, stream, tuple(txns), SYSTEM_CLOCK.wall_ms())
        try:
            await self._put(table, write_key(write_id), record.to_json(), NOT_EXISTS)
        except TableKeyBadVersionError:  # recorded before (a retried commit): finish that
            entry = await self._get(table, write_key(write_id))
            if entry is not None and entry.value is not None:
                record = CommitRecord.from_json(entry.value)
        await self._hook()
        report = RecoveryReport()
        await self._finish_write(write_id, record, report)
        return report.committed_txns

    async def abort_write(self, write_id: str, scope: str, stream: str,
                          txns: Sequence[int] = ()) -> RecoveryReport:
        """Abort a batch write, unless its commit was recorded (then finish it)."""
        report = RecoveryReport()
        table = writes_table(scope, stream)
        entry = await self._get(table, write_key(write_id))
        if entry is not None and entry.value is not None:
            await self._finish_write(write_id, CommitRecord.from_json(entry.value), report)
            return report
        registered = await self._registered(write_id, scope, stream)
        report.aborted_txns += await self._abort(scope, stream, sorted(
            set(txns) | {t for _, _, _, t in registered}))
        await self._remove(table, [k for k, _, _, _ in registered])
        return report

    async def _finish_write(self, write_id: str, record: CommitRecord,
                            report: RecoveryReport) -> None:
        committed, lost = await self._commit_all(record.scope, record.stream, record.txns)
        report.committed_txns += committed
        report.aborted_txns += await self._clean_attempts(write_id, record.scope, record.stream,
                                                          set(record.txns))
        await self._remove(writes_table(record.scope, record.stream), [write_key(write_id)])
        report.rolled_forward.append(write_id)
        if lost:
            raise StreamWriteIncompleteError(
                f"write {write_id} to {record.scope}/{record.stream}: transactions "
                f"{', '.join(_hex(t) for t in lost)} were aborted before the recorded commit "
                "was finished (finish recorded commits within txn_lease)")

    async def _clean_attempts(self, write_id: str, scope: str, stream: str,
                              keep: set[int]) -> int:
        """Abort the write's registered transactions not in ``keep`` and
        forget its registrations."""
        registered = await self._registered(write_id, scope, stream)
        aborted = 0
        for _, txn_scope, txn_stream, txn in registered:
            if txn not in keep:
                aborted += await self._abort(txn_scope, txn_stream, [txn])
        await self._remove(writes_table(scope, stream), [k for k, _, _, _ in registered])
        return aborted

    async def _hook(self) -> None:
        if self.after_record is not None:
            result = self.after_record()
            if result is not None:
                await result

    # --- streaming sinks ----------------------------------------------------------------

    async def sink_progress(self, scope: str, stream: str, sink_id: str
                            ) -> tuple[SinkRecord | None, int]:
        """The sink's record and its version (NOT_EXISTS: none in the
        stream's table; the record may then come from the legacy table)."""
        entry = await self._get(writes_table(scope, stream), sink_key(scope, stream, sink_id))
        if entry is None or entry.value is None:
            return await self._legacy_sink_progress(scope, stream, sink_id), NOT_EXISTS
        return SinkRecord.from_json(entry.value), entry.version

    async def _legacy_sink_progress(self, scope: str, stream: str, sink_id: str
                                    ) -> SinkRecord | None:
        """The sink's record in :data:`LEGACY_WRITES_TABLE`, if it has one
        there and this client may read it (an upgrade's carry-over)."""
        try:
            entry = await self._get(LEGACY_WRITES_TABLE, sink_key(scope, stream, sink_id))
        except QuireError as e:  # refused (auth on) or unreachable: nothing to carry over
            log.debug("no legacy progress of sink %s of %s/%s: %s", sink_id, scope, stream, e)
            return None
        if entry is None or entry.value is None:
            return None
        return SinkRecord.from_json(entry.value)

    async def _commit_sink_txns(self, scope: str, stream: str, sink_id: str,
                                record: SinkRecord, report: RecoveryReport
                                ) -> tuple[str, list[int]]:
        """Commit a recorded sink batch's transactions and abort its other
        attempts; (its write id, the transactions found aborted)."""
        committed, lost = await self._commit_all(scope, stream, record.txns)
        report.committed_txns += committed
        write_id = sink_batch_write_id(scope, stream, sink_id, record.batch_id)
        report.aborted_txns += await self._clean_attempts(write_id, scope, stream,
                                                          set(record.txns))
        return write_id, lost

    async def _finish_sink(self, scope: str, stream: str, sink_id: str, record: SinkRecord,
                           version: int, report: RecoveryReport) -> int:
        write_id, lost = await self._commit_sink_txns(scope, stream, sink_id, record, report)
        try:
            version = await self._put(writes_table(scope, stream), sink_key(scope, stream, sink_id),
                                      SinkRecord(record.batch_id).to_json(), version)
        except (TableKeyBadVersionError, TableKeyNotFoundError) as e:
            # a recovery (another write to the stream) may have finished it first
            now, now_version = await self.sink_progress(scope, stream, sink_id)
            if now != SinkRecord(record.batch_id):
                raise SinkConflictError(f"sink {sink_id} of {scope}/{stream} moved while "
                                        f"batch {record.batch_id} was finished: two queries "
                                        "with one sink_id?") from e
            version = now_version
        report.rolled_forward.append(write_id)
        if lost:
            raise StreamWriteIncompleteError(
                f"sink {sink_id} of {scope}/{stream}, batch {record.batch_id}: transactions "
                f"{', '.join(_hex(t) for t in lost)} were aborted before the recorded commit "
                "was finished")
        return version

    async def commit_sink_batch(self, scope: str, stream: str, sink_id: str, batch_id: int,
                                txns: Sequence[int]) -> bool:
        """Commit micro-batch ``batch_id`` of the sink exactly once: False (and
        its transactions aborted) if that batch was committed before."""
        table = writes_table(scope, stream)
        await self.ensure_table(table)
        record, version = await self.sink_progress(scope, stream, sink_id)
        if record is not None and record.pending:  # an earlier commit to finish first
            version = await self._finish_sink(scope, stream, sink_id, record, version,
                                              RecoveryReport())
        write_id = sink_batch_write_id(scope, stream, sink_id, batch_id)
        if record is not None and batch_id <= record.batch_id:
            await self.abort_write(write_id, scope, stream, txns)
            return False
        gone = await self._ping_all(scope, stream, txns)
        if gone:
            await self.abort_write(write_id, scope, stream, txns)
            raise StreamWriteAbortedError(
                f"sink {sink_id} of {scope}/{stream}, batch {batch_id}: transactions "
                f"{', '.join(_hex(t) for t in gone)} were no longer open; the batch was "
                "aborted")
        decided = SinkRecord(batch_id, tuple(txns))
        try:
            version = await self._put(table, sink_key(scope, stream, sink_id), decided.to_json(),
                                      version)
        except (TableKeyBadVersionError, TableKeyNotFoundError) as e:
            await self.abort_write(write_id, scope, stream, txns)
            raise SinkConflictError(f"sink {sink_id} of {scope}/{stream} moved while batch "
                                    f"{batch_id} was committed: two queries with one "
                                    "sink_id?") from e
        await self._hook()
        await self._finish_sink(scope, stream, sink_id, decided, version, RecoveryReport())
        return True

    # --- recovery -----------------------------------------------------------------------

    async def recover(self, scope: str | None = None, stream: str | None = None,
                      abandoned_after_ms: int | None = None) -> RecoveryReport:
        """Finish every recorded commit (of every stream this client may
        list, of ``scope``'s, or of ``scope/stream``), and forget the
        registered attempts of writes that never recorded one, older than
        ``abandoned_after_ms`` (default: twice the lease) and whose
        transaction has ended (the controller aborts an abandoned one when
        its lease runs out)."""
        report = RecoveryReport()
        for one_scope, one_stream in await self._streams(scope, stream):
            try:
                await self._recover_stream(one_scope, one_stream, abandoned_after_ms, report)
            except PermissionDeniedError:
                if stream is not None:
                    raise
                log.info("not recovering writes to %s/%s: this user may not write it",
                         one_scope, one_stream)
        return report

    async def _streams(self, scope: str | None, stream: str | None) -> list[tuple[str, str]]:
        if scope is not None and stream is not None:
            return [(scope, stream)]
        scopes = [scope] if scope is not None else await self.controller.list_scopes()
        return [(s, name) for s in scopes for name in await self.controller.list_streams(s)]

    async def _recover_stream(self, scope: str, stream: str, abandoned_after_ms: int | None,
                              report: RecoveryReport) -> None:
        table = writes_table(scope, stream)
        async for entry in self._entries(table, "commit/"):
            record = CommitRecord.from_json(entry.value or b"{}")
            write_id = entry.key.decode().removeprefix("commit/")
            await self._finish_write(write_id, record, report)
        async for entry in self._entries(table, "sink/"):
            sink = SinkRecord.from_json(entry.value or b"{}")
            if sink.pending:
                sink_id = entry.key.decode().removeprefix(f"sink/{scope}/{stream}/")
                await self._finish_sink(scope, stream, sink_id, sink, entry.version, report)
        cutoff = SYSTEM_CLOCK.wall_ms() - (abandoned_after_ms if abandoned_after_ms is not None
                                           else 2 * self.lease_ms)
        stale: list[tuple[str, dict[str, Any]]] = []
        async for entry in self._entries(table, "txn/"):
            doc = json.loads(entry.value or b"{}")
            if int(doc.get("created_ms", 0)) <= cutoff:
                stale.append((entry.key.decode(), doc))
        for key, doc in stale:
            # an attempt of a write that never recorded a commit: forget it
            # once its transaction is over (an open one may still be part of
            # a live write; if not, its lease ends it)
            txn = int(key.rsplit("/", 1)[1], 16)
            try:
                state = await self.controller.transaction_state(doc["scope"], doc["stream"],
                                                                txn)
            except TransactionNotFoundError:
                state = TxnState.UNKNOWN
            if state is not TxnState.OPEN and state is not TxnState.COMMITTING:
                await self._remove(table, [key])
                report.forgotten += 1
