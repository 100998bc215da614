"""One exactly-once commit across several streams: a Spark write whose
``stream`` column routes each row to its stream.

Each task attempt opens a transaction on every stream its rows go to and
registers each in that stream's own table (``txn/<write>/<txn>``, as
:mod:`quire.spark.stream_commits` does for one stream).  The commit is one
decision, in one place, with every record where the writing user's own
permissions guard it (each stream's table is guarded by its stream, and the
user writes every stream):

1. every transaction is pinged (one gone: all are aborted, nothing was
   visible);
2. each stream but the *coordinator* (the first of the write's streams in
   name order) gets a pointer ``fanout/<write>`` -> ``{"coordinator":
   "scope/stream"}`` in its table;
3. the decision, one conditional put in the coordinator's table, is the
   commit point: ``fanout/<write>`` -> the transactions of every stream
   (a streaming sink's batch: the sink's record
   ``sink/<scope>/<stream>/<sink id>`` there, holding the batch id, its
   transactions on the coordinator and on the ``others``, and the write id);
4. finishing commits every stream's transactions (pinging all the others
   meanwhile), aborts the write's other attempts, removes the pointers,
   then the decision (a sink's record keeps only the batch id).

Anyone finishes a decided write: the commit itself, :meth:`FanOutCommits.recover`
of any of its streams (a participant's pointer leads to the decision), or
:func:`~quire.spark.recover_stream_writes`; within ``txn_lease``, as for one
stream.  A write that dies before the decision commits nothing anywhere:
its transactions end with their leases, its pointers and registrations are
forgotten once stale.  So after a crash at any instant each stream holds the
write exactly once, or none of them does.

A streaming sink's exactly-once: the coordinator's sink record says which
batch was committed last; a replayed batch (Spark re-runs the last one,
with the same rows, so the same streams and coordinator) finds it and is
aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from quire.clock import SYSTEM_CLOCK
from quire.errors import QuireError, TableKeyBadVersionError, TableKeyNotFoundError
from quire.segmentstore import NOT_EXISTS
from quire.spark.stream_commits import (
    RecoveryReport,
    SinkConflictError,
    SinkRecord,
    StreamCommits,
    StreamWriteAbortedError,
    StreamWriteIncompleteError,
    sink_key,
    writes_table,
)

log = logging.getLogger("quire.spark.streams")

Txns = Mapping[str, Sequence[int]]
"""``scope/stream`` -> its transactions, in commit order."""


def fanout_key(write_id: str) -> str:
    return f"fanout/{write_id}"


def fanout_sink_write_id(sink_id: str, batch_id: int) -> str:
    """The write id a fan-out sink batch's task attempts register under."""
    return f"sinkbatch/{sink_id}/{batch_id}"


def _split(key: str) -> tuple[str, str]:
    scope, _, stream = key.partition("/")
    return scope, stream


def _table(key: str) -> str:
    return writes_table(*_split(key))


def _hex_all(txns: Sequence[int]) -> list[str]:
    return [f"{t:032x}" for t in txns]


class FanOutCommits(StreamCommits):
    """:class:`StreamCommits` with commits across several streams (module docstring)."""

    # --- records -------------------------------------------------------------------------

    async def _pointers(self, write_id: str, coordinator: str, others: Sequence[str],
                        extra: dict[str, Any]) -> None:
        doc = json.dumps({"coordinator": coordinator, "created_ms": SYSTEM_CLOCK.wall_ms(),
                          **extra}).encode()
        for key in others:
            await self._put(_table(key), fanout_key(write_id), doc, None)

    async def _ping_streams(self, txns: Txns) -> list[tuple[str, int]]:
        gone = []
        for key, ids in sorted(txns.items()):
            gone += [(key, t) for t in await self._ping_all(*_split(key), ids)]
        return gone

    async def _prepare(self, write_id: str, txns: Txns) -> tuple[str, list[str]]:
        """Tables, pings (all or nothing), pointers: the coordinator and the others."""
        keys = sorted(txns)
        for key in keys:
            await self.ensure_table(_table(key))
        gone = await self._ping_streams(txns)
        if gone:
            await self.abort_fanout(write_id, txns)
            raise StreamWriteAbortedError(
                f"write {write_id}: transactions {', '.join(f'{k}:{t:032x}' for k, t in gone)} "
                "were no longer open; the whole write was aborted on every stream")
        return keys[0], keys[1:]

    # --- batch writes --------------------------------------------------------------------

    async def commit_fanout(self, write_id: str, txns: Txns) -> int:
        """Commit a batch write's transactions on every stream, or none;
        how many were committed."""
        coordinator, others = await self._prepare(write_id, txns)
        await self._pointers(write_id, coordinator, others, {})
        decision = {"streams": {k: _hex_all(v) for k, v in sorted(txns.items())},
                    "created_ms": SYSTEM_CLOCK.wall_ms()}
        try:
            await self._put(_table(coordinator), fanout_key(write_id),
                            json.dumps(decision).encode(), NOT_EXISTS)
        except TableKeyBadVersionError:  # decided before (a retried commit): finish that
            entry = await self._get(_table(coordinator), fanout_key(write_id))
            if entry is not None and entry.value is not None:
                decision = json.loads(entry.value)
        await self._hook()
        report = RecoveryReport()
        await self._finish_decision(write_id, coordinator, decision, report)
        return report.committed_txns

    async def _finish_decision(self, write_id: str, coordinator: str, decision: dict[str, Any],
                               report: RecoveryReport) -> None:
        txns = {k: [int(t, 16) for t in v] for k, v in decision["streams"].items()}
        lost = await self._commit_streams(write_id, txns, report)
        for key in txns:
            if key != coordinator:
                await self._remove(_table(key), [fanout_key(write_id)])
        await self._remove(_table(coordinator), [fanout_key(write_id)])
        report.rolled_forward.append(write_id)
        self._raise_lost(write_id, lost)

    async def _commit_streams(self, write_id: str, txns: Txns, report: RecoveryReport
                              ) -> list[tuple[str, int]]:
        """Commit each stream's transactions (pinging every stream's
        uncommitted ones meanwhile) and abort the write's other attempts;
        those found aborted."""
        waiting = {k: list(v) for k, v in txns.items()}

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(max(self.lease_ms / 4000, 0.05))  # the renewal period
                with contextlib.suppress(QuireError):
                    await self._ping_streams(waiting)

        pinger = asyncio.ensure_future(keep_alive())
        lost: list[tuple[str, int]] = []
        try:
            for key, ids in sorted(txns.items()):
                scope, stream = _split(key)
                committed, gone = await self._commit_all(scope, stream, ids)
                waiting.pop(key)
                report.committed_txns += committed
                lost += [(key, t) for t in gone]
                report.aborted_txns += await self._clean_attempts(write_id, scope, stream,
                                                                  set(ids))
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
        return lost

    @staticmethod
    def _raise_lost(write_id: str, lost: list[tuple[str, int]]) -> None:
        if lost:
            raise StreamWriteIncompleteError(
                f"write {write_id}: transactions "
                f"{', '.join(f'{k}:{t:032x}' for k, t in lost)} were aborted before the "
                "recorded commit was finished (finish recorded commits within txn_lease)")

    async def abort_fanout(self, write_id: str, txns: Txns) -> RecoveryReport:
        """Abort a write on every stream it touched (``txns``: those
        reported), unless it was decided (then finish it)."""
        report = RecoveryReport()
        for key in sorted(txns):
            entry = await self._get(_table(key), fanout_key(write_id))
            doc = None if entry is None or entry.value is None else json.loads(entry.value)
            if doc is not None and "streams" in doc:  # decided: this is its coordinator
                await self._finish_decision(write_id, key, doc, report)
                return report
        for key, ids in sorted(txns.items()):
            scope, stream = _split(key)
            report.aborted_txns += await self._clean_attempts(write_id, scope, stream, set())
            report.aborted_txns += await self._abort(scope, stream, ids)
            await self._remove(_table(key), [fanout_key(write_id)])
        return report

    # --- streaming sinks -----------------------------------------------------------------

    async def commit_fanout_sink(self, sink_id: str, batch_id: int, txns: Txns) -> bool:
        """Commit micro-batch ``batch_id`` of a fan-out sink exactly once:
        False (its transactions aborted) if the batch was committed before."""
        write_id = fanout_sink_write_id(sink_id, batch_id)
        keys = sorted(txns)
        scope, stream = _split(keys[0])
        await self.ensure_table(_table(keys[0]))
        record, version = await self.sink_progress(scope, stream, sink_id)
        if record is not None and record.pending:  # an earlier commit to finish first
            version = await self._finish_sink(scope, stream, sink_id, record, version,
                                              RecoveryReport())
        if record is not None and batch_id <= record.batch_id:
            await self.abort_fanout(write_id, txns)
            return False
        coordinator, others = await self._prepare(write_id, txns)
        await self._pointers(write_id, coordinator, others, {"sink": sink_id,
                                                             "batch_id": batch_id})
        decided = SinkRecord(batch_id, tuple(txns[coordinator]),
                             tuple((k, tuple(txns[k])) for k in others), write_id)
        try:
            version = await self._put(_table(coordinator), sink_key(scope, stream, sink_id),
                                      decided.to_json(), version)
        except (TableKeyBadVersionError, TableKeyNotFoundError) as e:
            await self.abort_fanout(write_id, txns)
            raise SinkConflictError(f"sink {sink_id} of {coordinator} moved while batch "
                                    f"{batch_id} was committed: two queries with one "
                                    "sink_id?") from e
        await self._hook()
        await self._finish_sink(scope, stream, sink_id, decided, version, RecoveryReport())
        return True

    async def _commit_sink_txns(self, scope: str, stream: str, sink_id: str,
                                record: SinkRecord, report: RecoveryReport
                                ) -> tuple[str, list[int]]:
        if record.write_id is None:  # a sink of one stream
            return await super()._commit_sink_txns(scope, stream, sink_id, record, report)
        coordinator = f"{scope}/{stream}"
        txns = {coordinator: record.txns, **dict(record.others)}
        lost = await self._commit_streams(record.write_id, txns, report)
        for key, _ids in record.others:
            await self._remove(_table(key), [fanout_key(record.write_id)])
        self._raise_lost(record.write_id, lost)
        return record.write_id, []

    # --- recovery ------------------------------------------------------------------------

    async def _recover_stream(self, scope: str, stream: str, abandoned_after_ms: int | None,
                              report: RecoveryReport) -> None:
        key = f"{scope}/{stream}"
        cutoff = SYSTEM_CLOCK.wall_ms() - (abandoned_after_ms if abandoned_after_ms is not None
                                           else 2 * self.lease_ms)
        async for entry in self._entries(_table(key), "fanout/"):
            write_id = entry.key.decode().removeprefix("fanout/")
            doc = json.loads(entry.value or b"{}")
            if "streams" in doc:  # a decision: this stream coordinates it
                await self._finish_decision(write_id, key, doc, report)
            elif await self._follow_pointer(write_id, doc, report):
                await self._remove(_table(key), [entry.key.decode()])
            elif int(doc.get("created_ms", 0)) <= cutoff:
                # never decided, and long abandoned: its transactions ended with their leases
                await self._remove(_table(key), [entry.key.decode()])
                report.forgotten += 1
        await super()._recover_stream(scope, stream, abandoned_after_ms, report)

    async def _follow_pointer(self, write_id: str, doc: dict[str, Any],
                              report: RecoveryReport) -> bool:
        """Finish the write a participant's pointer leads to, if it was
        decided; whether it was (the pointer is then gone)."""
        coordinator = str(doc["coordinator"])
        scope, stream = _split(coordinator)
        if "sink" in doc:
            record, version = await self.sink_progress(scope, stream, str(doc["sink"]))
            if record is None or record.batch_id < int(doc["batch_id"]):
                return False
            if record.pending and record.write_id == write_id:
                await self._finish_sink(scope, stream, str(doc["sink"]), record, version,
                                        report)
            return True
        entry = await self._get(_table(coordinator), fanout_key(write_id))
        if entry is None or entry.value is None:
            return False
        await self._finish_decision(write_id, coordinator, json.loads(entry.value), report)
        return True
