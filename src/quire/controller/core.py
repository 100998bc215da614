"""The controller's operations on scopes, streams, segments and transactions.

:class:`ControllerCore` is the controller without gRPC: plain arguments and
results, typed errors from :mod:`quire.errors` (the service turns each into
one gRPC status).  Its state is :class:`~quire.controller.state.ControllerState`;
the segments it manages are created, sealed, merged, truncated and deleted
through the :class:`~quire.controller.state.ControllerSegmentStore` seam.

A change that touches both segments and records is written so that doing it
again finishes it: a stream is recorded as CREATING before its segments are
created; a scale is recorded as pending before segments are sealed and
created; a transaction is recorded as COMMITTING / ABORTING before its
segments are merged / deleted.  Creating a segment that exists, sealing a
sealed one and deleting a missing one count as done.  The sweeper
(:meth:`ControllerCore.sweep`) finishes what a crash interrupted, aborts
transactions whose lease ran out and forgets completed ones after
``completed_txn_retention_ms``.

One controller per cluster: changes to a scope or a stream are serialised
by this process's locks; the tables' conditional versions turn a second
writer into ControllerConcurrentUpdateError instead of lost updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, replace

from quire.clock import SYSTEM_CLOCK, Clock
from quire.controller.metrics import ControllerMetrics
from quire.controller.model import (
    Epoch,
    PendingScale,
    RecordedCut,
    RetentionType,
    SegmentRange,
    StreamConfig,
    StreamRecord,
    StreamState,
    TxnRecord,
    TxnState,
    segment_name,
    txn_segment_name,
)
from quire.controller.state import (
    ControllerSegmentStore,
    ControllerState,
    create_if_missing,
    delete_if_present,
    txns_table,
)
from quire.errors import (
    ConfigError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ControllerPreconditionError,
    ScopeNotFoundError,
    SegmentNotFoundError,
    SegmentSealedError,
    StreamNotFoundError,
    TransactionNotFoundError,
)
from quire.segmentstore import NOT_EXISTS, SegmentType
from quire.segmentstore.names import check_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's settings (times in ms)."""

    txn_max_lease_ms: int = 120_000
    """The longest lease a transaction may ask for (Pravega's default; the
    client asks for 90 s and pings)."""
    txn_sweep_interval_ms: int = 1_000
    """How often expired leases are looked for (and interrupted work finished)."""
    completed_txn_retention_ms: int = 600_000
    """How long a committed or aborted transaction's state is kept for
    checkTransactionState and pings."""
    list_page_size: int = 1_000
    """Names per listScopes / listStreamsInScope answer."""
    retention_interval_ms: int = 60_000
    """How often a stream cut is recorded for each stream with a retention
    policy, and the stream truncated as the policy says."""
    max_retention_cuts: int = 1_000
    """Recorded cuts kept per stream (the oldest are dropped)."""
    metrics_port: int = -1
    """HTTP port of ``/metrics``; 0 picks a free one, -1 disables it."""

    def __post_init__(self) -> None:
        for name in ("txn_max_lease_ms", "txn_sweep_interval_ms", "list_page_size",
                     "retention_interval_ms", "max_retention_cuts"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller: {name} must be positive")


@dataclass(frozen=True)
class ScaleStarted:
    """A scale done: the segments created and the epoch it started from."""

    created: tuple[SegmentRange, ...]
    from_epoch: int


class ControllerCore:
    """The controller's operations (see the module docstring); ``start()``
    before the first one.  ``clock`` is the wall clock of leases, epochs
    and retention; ``metrics`` what it counts."""

    def __init__(self, store: ControllerSegmentStore, config: ControllerConfig,
                 clock: Clock = SYSTEM_CLOCK,
                 metrics: ControllerMetrics | None = None) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics or ControllerMetrics()
        self.state = ControllerState(store)
        self._clock_ms = clock.wall_ms
        self._scope_locks: dict[str, asyncio.Lock] = {}
        self._stream_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._txn_streams: set[tuple[str, str]] = set()
        """Streams that may hold transaction records: the sweeper's work list."""

    async def start(self) -> None:
        """Create the scopes table if needed; finish the scales a crash
        interrupted (until then writers would find sealed segments without
        successors); find the streams with transactions, for the sweeper to
        pick their leases and interrupted commits and aborts up again."""
        await self.state.start()
        async for scope, stream in self.state.all_streams():
            async with self._stream_lock(scope, stream):
                found = await self.state.stream(scope, stream)
                if found is not None and found[0].scale is not None:
                    log.info("stream %s/%s: finishing an interrupted scale", scope, stream)
                    await self._finish_scale(scope, stream, *found)
            if await self.state.txns(scope, stream):
                self._txn_streams.add((scope, stream))

    def _scope_lock(self, scope: str) -> asyncio.Lock:
        return self._scope_locks.setdefault(scope, asyncio.Lock())

    def _stream_lock(self, scope: str, stream: str) -> asyncio.Lock:
        return self._stream_locks.setdefault((scope, stream), asyncio.Lock())

    # --- scopes ----------------------------------------------------------------

    async def create_scope(self, scope: str) -> bool:
        """Create ``scope``; False if it exists (ControllerInvalidArgumentError
        for a bad name)."""
        check_name("scope", scope)
        async with self._scope_lock(scope):
            return await self.state.add_scope(scope)

    async def scope_exists(self, scope: str) -> bool:
        return await self.state.scope_version(scope) is not None

    async def delete_scope(self, scope: str) -> None:
        """ScopeNotFoundError; ControllerPreconditionError if it has streams."""
        async with self._scope_lock(scope):
            version = await self.state.scope_version(scope)
            if version is None:
                raise ScopeNotFoundError(f"no scope {scope!r}")
            streams, _ = await self.state.streams(scope, "", 1)
            if streams:
                raise ControllerPreconditionError(f"scope {scope!r} has streams")
            await self.state.remove_scope(scope, version)

    async def list_scopes(self, token: str) -> tuple[list[str], str]:
        return await self.state.scopes(token, self.config.list_page_size)

    async def list_streams(self, scope: str, token: str) -> tuple[list[str], str]:
        if not await self.scope_exists(scope):
            raise ScopeNotFoundError(f"no scope {scope!r}")
        while True:  # an empty answer ends the client's listing: skip pages of CREATING only
            streams, token = await self.state.streams(scope, token, self.config.list_page_size)
            names = [name for name, r in streams if r.state is not StreamState.CREATING]
            if names or not streams:
                return names, token

    # --- streams ---------------------------------------------------------------

    async def _stream(self, scope: str, stream: str) -> tuple[StreamRecord, int]:
        found = await self.state.stream(scope, stream)
        if found is None or found[0].state is StreamState.CREATING:
            if not await self.scope_exists(scope):
                raise ScopeNotFoundError(f"no scope {scope!r}")
            raise StreamNotFoundError(f"no stream {scope}/{stream}")
        return found

    async def stream(self, scope: str, stream: str) -> StreamRecord:
        """The stream's record (ScopeNotFoundError / StreamNotFoundError)."""
        return (await self._stream(scope, stream))[0]

    async def stream_exists(self, scope: str, stream: str) -> bool:
        try:
            await self._stream(scope, stream)
        except ControllerNotFoundError:
            return False
        return True

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> bool:
        """Create the stream with ``config.min_segments`` segments; False if it
        exists (ScopeNotFoundError; ControllerInvalidArgumentError)."""
        check_name("stream", stream)
        async with self._scope_lock(scope), self._stream_lock(scope, stream):
            if not await self.scope_exists(scope):
                raise ScopeNotFoundError(f"no scope {scope!r}")
            found = await self.state.stream(scope, stream)
            if found is None:
                record = StreamRecord.new(config, self._clock_ms())
                version = await self.state.put_stream(scope, stream, record, NOT_EXISTS)
            elif found[0].state is StreamState.CREATING:
                record, version = found  # an interrupted creation: finish it
            else:
                return False
            await create_if_missing(self.store, txns_table(scope, stream), SegmentType.TABLE)
            for s in record.current.segments:
                await create_if_missing(self.store, segment_name(scope, stream, s.id),
                                        SegmentType.STREAM)
            record.state = StreamState.ACTIVE
            await self.state.put_stream(scope, stream, record, version)
            return True

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Replace the stream's configuration (its segments stay as they are)."""
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            record.config = config
            await self.state.put_stream(scope, stream, record, version)

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Seal every active segment (open transactions are aborted first)."""
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                return
            record, version = await self._settle(scope, stream, record, version,
                                                 abort_open=True)
            for s in record.current.segments:
                await self._seal(segment_name(scope, stream, s.id))
            record.state = StreamState.SEALED
            await self.state.put_stream(scope, stream, record, version)

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Delete a sealed stream: its segments, transactions and record
        (ControllerPreconditionError if it is not sealed)."""
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            if record.state is not StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is not sealed")
            for txn, _v in await self.state.txns(scope, stream):
                if not txn.state.completed:
                    await self._delete_txn_segments(scope, stream, txn)
            for sid in sorted(record.all_segments()):
                await delete_if_present(self.store, segment_name(scope, stream, sid))
            await delete_if_present(self.store, txns_table(scope, stream))
            await self.state.remove_stream(scope, stream, version)
            self._txn_streams.discard((scope, stream))

    async def truncate_stream(self, scope: str, stream: str, cut: dict[int, int]) -> None:
        """Make ``cut`` the stream's head: truncate each of its segments at its
        offset and delete the segments wholly before it."""
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            record, version = await self._settle(scope, stream, record, version,
                                                 abort_open=False)
            await self._truncate(scope, stream, record, cut)
            await self.state.put_stream(scope, stream, record, version)

    async def _truncate(self, scope: str, stream: str, record: StreamRecord,
                        cut: dict[int, int]) -> None:
        """Truncate at ``cut`` and make it ``record``'s head (written by the caller)."""
        before = record.check_cut(cut)
        for sid, offset in sorted(cut.items()):  # every offset checked before any change
            try:
                length = (await self.store.get_info(segment_name(scope, stream, sid))).length
            except SegmentNotFoundError as e:
                raise ControllerInvalidArgumentError(
                    f"segment {sid} of the cut was deleted") from e
            if offset > length:
                raise ControllerInvalidArgumentError(
                    f"segment {sid}: offset {offset} is past its length {length}")
        for sid, offset in sorted(cut.items()):
            await self.store.truncate(segment_name(scope, stream, sid), offset)
        for sid in before:
            await delete_if_present(self.store, segment_name(scope, stream, sid))
        record.head = dict(cut)
        record.truncated_ms = self._clock_ms()
        record.retention_cuts = [r for r in record.retention_cuts if record.after_head(r.cut)]

    # --- segments --------------------------------------------------------------

    async def current_segments(self, scope: str, stream: str) -> Epoch:
        return (await self.stream(scope, stream)).current

    async def epoch_segments(self, scope: str, stream: str, epoch: int) -> Epoch:
        if epoch < 0:
            raise ControllerInvalidArgumentError(f"epoch {epoch} < 0")
        record = await self.stream(scope, stream)
        if epoch >= len(record.epochs):
            raise ControllerNotFoundError(f"stream {scope}/{stream} has no epoch {epoch}")
        return record.epochs[epoch]

    async def segments_at(self, scope: str, stream: str, timestamp_ms: int
                          ) -> dict[int, int]:
        """Where readers starting at ``timestamp_ms`` begin (0 or a time
        before the last truncation: the stream's head): segment id -> offset."""
        record = await self.stream(scope, stream)
        head = record.head_cut()
        if timestamp_ms <= 0 or (record.head and timestamp_ms < record.truncated_ms):
            return head
        return {s.id: head.get(s.id, 0) for s in record.epoch_at(timestamp_ms).segments}

    async def successors(self, scope: str, stream: str, sid: int
                         ) -> list[tuple[SegmentRange, list[int]]]:
        record = await self.stream(scope, stream)
        if record.find(sid) is None:
            raise ControllerNotFoundError(f"stream {scope}/{stream} has no segment {sid}")
        return record.successors(sid)

    async def scale(self, scope: str, stream: str, sealed: list[int],
                    ranges: list[tuple[float, float]]) -> ScaleStarted:
        """Seal ``sealed`` and create segments for ``ranges`` (which must cover
        exactly their keys) as the next epoch.  ControllerPreconditionError if
        the stream is sealed, has open transactions or the segments do not fit."""
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            record, version = await self._settle(scope, stream, record, version,
                                                 abort_open=False)
            if any(t.state is TxnState.OPEN for t, _v in await self.state.txns(scope, stream)):
                raise ControllerPreconditionError(
                    f"stream {scope}/{stream} has open transactions: scale after they end")
            from_epoch = record.current.epoch
            record.scale = record.plan_scale(sealed, ranges, self._clock_ms())
            version = await self.state.put_stream(scope, stream, record, version)
            created = record.scale.created
            await self._finish_scale(scope, stream, record, version)
            return ScaleStarted(created, from_epoch)

    async def scale_done(self, scope: str, stream: str, from_epoch: int) -> bool | None:
        """True if a scale from ``from_epoch`` is done, False if it is under
        way, None if there is no such scale."""
        record = await self.stream(scope, stream)
        if 0 <= from_epoch < record.current.epoch:
            return True
        if record.scale is not None and record.scale.epoch == from_epoch + 1:
            return False
        return None

    async def _seal(self, name: str) -> None:
        with contextlib.suppress(SegmentSealedError):
            await self.store.seal(name)

    async def _finish_scale(self, scope: str, stream: str, record: StreamRecord,
                            version: int) -> int:
        scale: PendingScale | None = record.scale
        if scale is None:
            return version
        for s in scale.created:
            await create_if_missing(self.store, segment_name(scope, stream, s.id),
                                    SegmentType.STREAM)
        sealed_bytes = 0
        for sid in scale.sealed:
            name = segment_name(scope, stream, sid)
            await self._seal(name)
            sealed_bytes += (await self.store.get_info(name)).length
        record.apply_scale(scale, sealed_bytes)
        self.metrics.scales.inc()
        return await self.state.put_stream(scope, stream, record, version)

    async def _settle(self, scope: str, stream: str, record: StreamRecord, version: int,
                      *, abort_open: bool) -> tuple[StreamRecord, int]:
        """Finish an interrupted scale, commits and aborts (and abort the open
        transactions too if ``abort_open``)."""
        version = await self._finish_scale(scope, stream, record, version)
        for txn, txn_version in await self.state.txns(scope, stream):
            if txn.state in (TxnState.COMMITTING, TxnState.ABORTING) or \
                    (abort_open and txn.state is TxnState.OPEN):
                await self._finish_txn(scope, stream, txn, txn_version,
                                       "stream sealed" if txn.state is TxnState.OPEN
                                       else "request")
        return record, version

    # --- transactions ------------------------------------------------------------

    def _check_lease(self, lease_ms: int) -> None:
        if lease_ms <= 0:
            raise ControllerInvalidArgumentError(f"a lease is positive, got {lease_ms} ms")

    async def create_transaction(self, scope: str, stream: str, lease_ms: int
                                 ) -> tuple[int, Epoch]:
        """Open a transaction: its id and the epoch whose segments it writes;
        its segments exist when this returns."""
        self._check_lease(lease_ms)
        if lease_ms > self.config.txn_max_lease_ms:
            raise ControllerInvalidArgumentError(
                f"lease {lease_ms} ms is above the maximum {self.config.txn_max_lease_ms} ms")
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            record, version = await self._settle(scope, stream, record, version,
                                                 abort_open=False)
            epoch = record.current
            while True:
                txn_id = (epoch.epoch << 96) | secrets.randbits(63)
                txn = TxnRecord(txn_id, tuple(s.id for s in epoch.segments), TxnState.OPEN,
                                self._clock_ms() + lease_ms)
                if await self.state.txn(scope, stream, txn_id) is None:
                    break
            await self.state.put_txn(scope, stream, txn, NOT_EXISTS)
            self.metrics.transactions_created.inc()
            self._txn_streams.add((scope, stream))
            for sid in txn.segments:
                await create_if_missing(self.store, txn_segment_name(scope, stream, sid, txn_id),
                                        SegmentType.STREAM)
            return txn_id, epoch

    async def _txn(self, scope: str, stream: str, txn_id: int) -> tuple[TxnRecord, int]:
        await self._stream(scope, stream)
        found = await self.state.txn(scope, stream, txn_id)
        if found is None:
            raise TransactionNotFoundError(f"no transaction {txn_id:032x} on {scope}/{stream}")
        return found

    async def ping_transaction(self, scope: str, stream: str, txn_id: int,
                               lease_ms: int) -> TxnState:
        """Extend an open transaction's lease to ``lease_ms`` from now; its
        state (an expired one is aborted first)."""
        self._check_lease(lease_ms)
        async with self._stream_lock(scope, stream):
            txn, version = await self._txn(scope, stream, txn_id)
            if txn.state is not TxnState.OPEN:
                return txn.state
            now = self._clock_ms()
            if txn.lease_expiry_ms < now:
                txn = replace(txn, state=TxnState.ABORTING)
                return await self._finish_txn(scope, stream, txn, version, "lease expired")
            await self.state.put_txn(scope, stream, replace(txn, lease_expiry_ms=now + lease_ms),
                                     version)
            return TxnState.OPEN

    async def commit_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        """Merge the transaction's segments into their parents (again: no-op).
        ControllerPreconditionError if it was aborted."""
        async with self._stream_lock(scope, stream):
            txn, version = await self._txn(scope, stream, txn_id)
            if txn.state in (TxnState.ABORTING, TxnState.ABORTED):
                raise ControllerPreconditionError(f"transaction {txn_id:032x} was aborted")
            if txn.state is TxnState.OPEN:
                txn = replace(txn, state=TxnState.COMMITTING)
                version = await self.state.put_txn(scope, stream, txn, version)
            await self._finish_txn(scope, stream, txn, version)

    async def abort_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        """Discard the transaction's segments (again: no-op).
        ControllerPreconditionError if it was committed."""
        async with self._stream_lock(scope, stream):
            txn, version = await self._txn(scope, stream, txn_id)
            if txn.state in (TxnState.COMMITTING, TxnState.COMMITTED):
                raise ControllerPreconditionError(f"transaction {txn_id:032x} was committed")
            if txn.state is TxnState.OPEN:
                txn = replace(txn, state=TxnState.ABORTING)
            await self._finish_txn(scope, stream, txn, version)

    async def transaction_state(self, scope: str, stream: str, txn_id: int
                                ) -> TxnState | None:
        """The transaction's state; None if it is unknown (or long completed)."""
        await self._stream(scope, stream)
        found = await self.state.txn(scope, stream, txn_id)
        return None if found is None else found[0].state

    async def _finish_txn(self, scope: str, stream: str, txn: TxnRecord,
                          version: int, reason: str = "request") -> TxnState:
        """Carry a COMMITTING transaction to COMMITTED, an ABORTING (or OPEN)
        one to ABORTED, writing the intent first; the final state."""
        if txn.state.completed:
            return txn.state
        if txn.state is TxnState.OPEN:
            txn = replace(txn, state=TxnState.ABORTING)
            version = await self.state.put_txn(scope, stream, txn, version)
        if txn.state is TxnState.COMMITTING:
            for sid in txn.segments:
                # a missing source was merged before an interruption
                with contextlib.suppress(SegmentNotFoundError):
                    await self.store.merge(segment_name(scope, stream, sid),
                                           txn_segment_name(scope, stream, sid, txn.txn_id))
            final = TxnState.COMMITTED
        else:
            await self._delete_txn_segments(scope, stream, txn)
            final = TxnState.ABORTED
        await self.state.put_txn(scope, stream, replace(txn, state=final,
                                                        completed_ms=self._clock_ms()), version)
        self.metrics.transactions_ended.labels(final.value, reason).inc()
        return final

    async def _delete_txn_segments(self, scope: str, stream: str, txn: TxnRecord) -> None:
        for sid in txn.segments:
            await delete_if_present(self.store, txn_segment_name(scope, stream, sid, txn.txn_id))

    # --- sweeping ----------------------------------------------------------------

    async def sweep(self) -> None:
        """One pass over the streams with transactions: abort those whose
        lease ran out, finish interrupted commits and aborts, forget
        completed ones past their retention."""
        now = self._clock_ms()
        for scope, stream in sorted(self._txn_streams):
            async with self._stream_lock(scope, stream):
                if await self.state.stream(scope, stream) is None:
                    self._txn_streams.discard((scope, stream))
                    continue
                txns = await self.state.txns(scope, stream)
                if not txns:
                    self._txn_streams.discard((scope, stream))
                for txn, version in txns:
                    if txn.state.completed:
                        if now - txn.completed_ms >= self.config.completed_txn_retention_ms:
                            await self.state.remove_txn(scope, stream, txn.txn_id, version)
                    elif txn.state is not TxnState.OPEN or txn.lease_expiry_ms < now:
                        reason = "request"
                        if txn.state is TxnState.OPEN:
                            log.info("transaction %032x on %s/%s: lease expired, aborting",
                                     txn.txn_id, scope, stream)
                            reason = "lease expired"
                        await self._finish_txn(scope, stream, txn, version, reason)


    # --- retention ---------------------------------------------------------------

    async def enforce_retention(self) -> None:
        """One retention pass: for each stream with a retention policy, record
        a cut at its active segments' lengths, then truncate it at the latest
        recorded cut that keeps what the policy asks (Pravega's way: the
        stream is truncated only at cuts it recorded)."""
        async for scope, stream in self.state.all_streams():
            async with self._stream_lock(scope, stream):
                found = await self.state.stream(scope, stream)
                if found is None:
                    continue
                record, version = found
                if record.state is StreamState.CREATING or \
                        record.config.retention is RetentionType.NONE:
                    continue
                record, version = await self._settle(scope, stream, record, version,
                                                     abort_open=False)
                now = self._clock_ms()
                cut = {s.id: (await self.store.get_info(segment_name(scope, stream, s.id))).length
                       for s in record.current.segments}
                size = record.sealed_bytes + sum(cut.values())
                last = record.retention_cuts[-1] if record.retention_cuts else None
                if (last is None or last.cut != cut) and record.after_head(cut):
                    record.retention_cuts.append(RecordedCut(now, size, cut))
                    del record.retention_cuts[:-self.config.max_retention_cuts]
                chosen = record.retention_cut(now, size)
                if chosen is not None:
                    log.info("stream %s/%s: retention truncates at %s", scope, stream,
                             chosen.cut)
                    await self._truncate(scope, stream, record, dict(chosen.cut))
                    self.metrics.retention_truncations.inc()
                await self.state.put_stream(scope, stream, record, version)
