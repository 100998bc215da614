"""Transactions: open, ping, commit (rolling over scales), abort, and the
leader's sweep of expired leases.

A transaction writes to one transaction segment per segment of the epoch
it was opened in.  Committing merges each into its parent while the
parents are active; once a scale sealed a parent that the transaction
wrote to, the commit *rolls over* instead (Pravega's rolling
transactions, see :mod:`quire.controller.model`): written down as the
stream's pending roll, then its duplicates created, the transaction's
segments merged into them, the transaction recorded COMMITTED, the
duplicates sealed, the new active epoch created and the old one sealed.
A roll left half done is finished by whoever touches the stream next, or
by the leader.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import replace

from quire.controller.base import CoreBase, segment_policy
from quire.controller.model import (
    Epoch,
    StreamState,
    TxnRecord,
    TxnState,
    segment_name,
    txn_segment_name,
)
from quire.controller.state import create_if_missing, delete_if_present
from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerPreconditionError,
    SegmentNotFoundError,
    SegmentSealedError,
    TransactionNotFoundError,
)
from quire.segmentstore import NOT_EXISTS, SegmentType

log = logging.getLogger("quire.controller")


class TxnOps(CoreBase):
    """The transaction part of ControllerCore."""

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
            record, _version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            epoch = record.current
            while True:
                txn_id = (epoch.epoch << 96) | secrets.randbits(63)
                txn = TxnRecord(txn_id, tuple(s.id for s in epoch.segments), TxnState.OPEN,
                                self.now_ms() + lease_ms)
                if await self.state.txn(scope, stream, txn_id) is None:
                    break
            await self.state.put_txn(scope, stream, txn, NOT_EXISTS)
            await self.state.mark_txn_stream(scope, stream)
            self.metrics.transactions_created.inc()
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

        async def ping() -> TxnState:
            txn, version = await self._txn(scope, stream, txn_id)
            if txn.state is not TxnState.OPEN:
                return txn.state
            now = self.now_ms()
            if txn.lease_expiry_ms < now:
                return await self.end_transaction(scope, stream, txn_id, commit=False,
                                                  reason="lease expired")
            await self.state.put_txn(scope, stream, replace(txn, lease_expiry_ms=now + lease_ms),
                                     version)
            return TxnState.OPEN
        return await self.retrying(ping)

    async def end_transaction(self, scope: str, stream: str, txn_id: int, *, commit: bool,
                              reason: str = "request") -> TxnState:
        """Commit (merge its segments into the stream) or abort (discard
        them) the transaction, again a no-op; its final state.
        ControllerPreconditionError if it ended the other way."""
        wanted = TxnState.COMMITTING if commit else TxnState.ABORTING
        other = (TxnState.ABORTING, TxnState.ABORTED) if commit else \
            (TxnState.COMMITTING, TxnState.COMMITTED)

        async def intent() -> None:
            txn, version = await self._txn(scope, stream, txn_id)
            if txn.state in other:
                raise ControllerPreconditionError(
                    f"transaction {txn_id:032x} was {txn.state.value.lower()}")
            if txn.state is TxnState.OPEN:
                await self.state.put_txn(scope, stream, replace(txn, state=wanted), version)

        async with self.changing(scope, stream):
            await self.retrying(intent)
            await self.pause("commit" if commit else "abort")
            return await self.retrying(lambda: self.finish_txn(scope, stream, txn_id, reason))

    async def transaction_state(self, scope: str, stream: str, txn_id: int
                                ) -> TxnState | None:
        """The transaction's state; None if it is unknown (or long completed)."""
        await self._stream(scope, stream)
        found = await self.state.txn(scope, stream, txn_id)
        return None if found is None else found[0].state

    async def finish_txn(self, scope: str, stream: str, txn_id: int,
                         reason: str = "request") -> TxnState:
        """Carry a COMMITTING transaction to COMMITTED, an ABORTING (or OPEN)
        one to ABORTED; its final state (the stream's lock held).

        A scale or roll left half done is finished first, even when this
        transaction is already COMMITTED: a roll marks its transaction
        COMMITTED before it seals the duplicates and switches epochs, so a
        commit that failed after that point and is asked again must not
        answer COMMITTED (and end the workflow note) while the transaction's
        data sits in segments of no epoch (the stream simulation, seed
        100065); and a commit merges into the current epoch's segments."""
        await self.finish_epoch_change(scope, stream)
        txn, version = await self._txn(scope, stream, txn_id)
        if txn.state.completed:
            return txn.state
        if txn.state is TxnState.OPEN:
            txn = replace(txn, state=TxnState.ABORTING)
            version = await self.state.put_txn(scope, stream, txn, version)
        if txn.state is TxnState.ABORTING:
            await self._delete_txn_segments(scope, stream, txn)
            await self._completed(scope, stream, txn, version, TxnState.ABORTED, reason)
            return TxnState.ABORTED
        record, record_version = await self._stream(scope, stream)
        active = record.current.ids()
        roll = False
        for sid in txn.segments:
            if sid not in active:
                with contextlib.suppress(SegmentNotFoundError):  # merged before a scale
                    info = await self.store.get_info(
                        txn_segment_name(scope, stream, sid, txn_id))
                    roll = roll or info.length > 0
        if roll:
            record.roll = record.plan_roll(txn, self.now_ms())
            await self.state.put_stream(scope, stream, record, record_version)
            await self.pause("roll")
            await self.finish_roll(scope, stream)
            return TxnState.COMMITTED
        for sid in txn.segments:
            source = txn_segment_name(scope, stream, sid, txn_id)
            if sid not in active:
                await delete_if_present(self.store, source)  # empty: nothing to roll
                continue
            try:
                await self.store.merge(segment_name(scope, stream, sid), source)
            except SegmentNotFoundError:
                pass  # merged before an interruption
            except SegmentSealedError as e:  # a scale sealed the parent meanwhile: roll
                raise ControllerConcurrentUpdateError(f"segment {sid} sealed under a "
                                                      "commit") from e
        await self._completed(scope, stream, txn, version, TxnState.COMMITTED, reason)
        return TxnState.COMMITTED

    async def _completed(self, scope: str, stream: str, txn: TxnRecord, version: int,
                         final: TxnState, reason: str) -> None:
        await self.state.put_txn(scope, stream, replace(txn, state=final,
                                                        completed_ms=self.now_ms()), version)
        self.metrics.transactions_ended.labels(final.value, reason).inc()

    async def finish_roll(self, scope: str, stream: str) -> None:
        """Carry out the stream's pending roll, if any (again: no-op)."""
        record, record_version = await self._stream(scope, stream)
        roll = record.roll
        if roll is None:
            return
        for d in roll.duplicates:
            await create_if_missing(self.store, segment_name(scope, stream, d.id),
                                    SegmentType.STREAM)
        found = await self.state.txn(scope, stream, roll.txn_id)
        if found is not None and found[0].state is TxnState.COMMITTING:
            txn, version = found
            for sid in txn.segments:
                with contextlib.suppress(SegmentNotFoundError):  # merged already
                    await self.store.merge(
                        segment_name(scope, stream, roll.duplicate_of(sid)),
                        txn_segment_name(scope, stream, sid, txn.txn_id))
            await self._completed(scope, stream, txn, version, TxnState.COMMITTED, "request")
        sealed_bytes = 0
        for d in roll.duplicates:
            sealed_bytes += await self._seal_length(segment_name(scope, stream, d.id))
        policy = segment_policy(record.config)
        for a in roll.actives:
            await create_if_missing(self.store, segment_name(scope, stream, a.id),
                                    SegmentType.STREAM, policy)
        for s in record.current.segments:
            sealed_bytes += await self._seal_length(segment_name(scope, stream, s.id))
        record.apply_roll(roll, sealed_bytes)
        await self.state.put_stream(scope, stream, record, record_version)
        self.metrics.scales_by_reason.labels("rolling-txn").inc()
        log.info("stream %s/%s: transaction %032x rolled over to epoch %d", scope, stream,
                 roll.txn_id, record.current.epoch)

    async def _seal_length(self, name: str) -> int:
        with contextlib.suppress(SegmentSealedError):
            await self.store.seal(name)
        return (await self.store.get_info(name)).length

    async def _delete_txn_segments(self, scope: str, stream: str, txn: TxnRecord) -> None:
        for sid in txn.segments:
            await delete_if_present(self.store, txn_segment_name(scope, stream, sid, txn.txn_id))

    async def sweep_transactions(self, scope: str, stream: str, version: int) -> None:
        """The leader's pass over one stream's transactions: abort those
        whose lease ran out, finish commits and aborts left behind, forget
        completed ones past their retention; unmark the stream if it has
        none left."""
        now = self.now_ms()
        async with self._stream_lock(scope, stream):
            if await self.state.stream(scope, stream) is None:
                await self.state.unmark_txn_stream(scope, stream, version)
                return
            txns = await self.state.txns(scope, stream)
            if not txns:
                await self.state.unmark_txn_stream(scope, stream, version)
            for txn, txn_version in txns:
                if txn.state.completed:
                    if now - txn.completed_ms >= self.config.completed_txn_retention_ms:
                        with contextlib.suppress(ControllerConcurrentUpdateError):
                            await self.state.remove_txn(scope, stream, txn.txn_id, txn_version)
                elif txn.state is not TxnState.OPEN or txn.lease_expiry_ms < now:
                    reason = "request"
                    if txn.state is TxnState.OPEN:
                        log.info("transaction %032x on %s/%s: lease expired, aborting",
                                 txn.txn_id, scope, stream)
                        reason = "lease expired"
                    await self._finish_retrying(scope, stream, txn.txn_id, reason)

    async def _finish_retrying(self, scope: str, stream: str, txn_id: int, reason: str) -> None:
        async def finish() -> TxnState:
            return await self.finish_txn(scope, stream, txn_id, reason)
        await self.retrying(finish)
