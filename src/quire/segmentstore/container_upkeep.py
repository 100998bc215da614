"""What a container does for its own upkeep: checkpoints, forgetting, quarantine,
ownership and lifecycle.

:class:`ContainerUpkeep` is the part of
:class:`~quire.segmentstore.container.SegmentContainer` that keeps it going
rather than serving a client: its checkpoints (one written when the
operation log says one is due, and one its storage writer asks for before
truncating tier-1), the deleted segments it forgets as it writes one (once
tier-2 no longer records them: :meth:`ContainerUpkeep.forget`; at once
without tier-2), the tier-1 bytes it counts for its ceiling
(:mod:`~quire.segmentstore.throttle`), the quarantine of a segment its
storage writer asks for (:mod:`~quire.segmentstore.quarantine`), the probes
that confirm it still owns its log (:meth:`ContainerUpkeep.confirm_ownership`),
why it stopped serving (:attr:`ContainerUpkeep.failure`) and its closing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from quire.errors import (
    ContainerClosedError,
    ContainerFencedError,
    QuireError,
    SegmentNotFoundError,
)
from quire.log import DurableDataLog, LogFencedError
from quire.segmentstore.committed_side import CommittedSide
from quire.segmentstore.futures import call_as_future, refused_after, retrieve
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.operation_log import OperationLog
from quire.segmentstore.operations import (
    AttributesOp,
    CheckpointOp,
    Operation,
    ProbeOp,
    SealOp,
)
from quire.segmentstore.read_index import ReadIndex
from quire.segmentstore.throttle import Tier1Throttle
from quire.segmentstore.types import QUARANTINED_ATTRIBUTE


class ContainerUpkeep:
    """See the module docstring; the container holds the state it uses."""

    accepted: ContainerMetadata
    committed_side: CommittedSide
    read_index: ReadIndex
    throttle: Tier1Throttle
    _log: DurableDataLog
    _oplog: OperationLog
    _clock_ms: Callable[[], int]
    _stamp_ms: int
    """The latest operation timestamp given (:meth:`_stamp`)."""
    _forgettable: set[int]

    def _next(self) -> tuple[int, int]:
        """The next operation's sequence and timestamp."""
        return self.accepted.sequence + 1, self._stamp()

    def _stamp(self) -> int:
        """The next operation's timestamp: the clock, but never below an
        earlier one of this owner's, nor (after a replay) below any
        segment's ``last_modified_ms``: a clock that steps back, or an
        owner's clock behind the one before, repeats the last time.  So a
        segment's times in the log never go back, and whoever replays it
        finds the append times (:mod:`~quire.segmentstore.append_times`) the
        owner that wrote it kept, however much of tier-1 is left to replay."""
        now = self._clock_ms()
        if now > self._stamp_ms:
            self._stamp_ms = now
        return self._stamp_ms

    def _log_op(self, op: Operation, result: object = None) -> asyncio.Future[Any]:
        """Accept ``op`` and log it; the future gives ``result`` once durable."""
        self.accepted.apply(op)
        return self._oplog.add(op, result)

    def _segment(self, name: str) -> SegmentMetadata:
        """The accepted segment ``name`` (SegmentNotFoundError; the container's
        failure if it failed)."""
        self._oplog.check()
        s = self.accepted.get(name)
        if s is None:
            raise SegmentNotFoundError(f"no segment {name!r}")
        return s

    def add_checkpoint(self) -> asyncio.Future[Any] | None:
        """Write a checkpoint now, unless nothing was logged since the last
        one and no segment is to be forgotten; its future completes when it
        is durable."""
        checkpoints = self.committed_side.checkpoints
        if checkpoints and checkpoints[-1][0] == self.accepted.sequence \
                and not self._forgettable:
            return None
        self._oplog.check()
        return self._add_checkpoint()

    def _add_checkpoint(self) -> asyncio.Future[Any]:
        accepted = self.accepted
        segments = accepted.segments
        if self.committed_side.tier2_read is None:  # no tier-2 data to wait for
            gone = {sid for sid, s in segments.items() if s.deleted}
        else:
            gone = {sid for sid in self._forgettable if sid in segments and segments[sid].deleted}
        self._forgettable.clear()
        accepted.purge(gone)
        op = CheckpointOp(accepted.sequence + 1, self._stamp(), accepted.checkpoint())
        if gone:
            self.committed_side.purge_at[op.sequence] = gone
        accepted.apply(op)
        return self._oplog.add(op)

    def forget(self, segment_ids: Iterable[int]) -> None:
        """These deleted segments are gone from tier-2 (the storage writer's
        word): the next checkpoint leaves them out."""
        self._forgettable.update(segment_ids)

    def _bytes_committed(self, size: int) -> None:
        self.committed_side.bytes_committed(size)
        if self.throttle.active:
            self.throttle.update()

    def _checkpoint_due(self) -> None:
        """The operation log's call once enough was logged since the last checkpoint."""
        # its failure, if any, is the log's and reaches every later request
        self._add_checkpoint().add_done_callback(retrieve)

    def quarantine(self, name: str) -> asyncio.Future[None]:
        """Mark the segment quarantined (:data:`QUARANTINED_ATTRIBUTE`) and seal
        it: its storage writer's call (:mod:`~quire.segmentstore.quarantine`)."""
        def make() -> asyncio.Future[None]:
            s = self._segment(name)
            if QUARANTINED_ATTRIBUTE not in s.attributes:
                seq, now = self._next()
                self._log_op(AttributesOp(seq, now, s.segment_id, ((QUARANTINED_ATTRIBUTE, now),)))
            if not s.sealed:
                seq, now = self._next()
                self._log_op(SealOp(seq, now, s.segment_id))
            return self._oplog.barrier()
        return call_as_future(make, self._oplog.barrier)

    # --- ownership and lifecycle ----------------------------------------------

    def confirm_ownership(self) -> asyncio.Future[Any]:
        """Done once a :class:`~quire.segmentstore.operations.ProbeOp` logged
        now (it changes nothing; it shares the next frame) is durable: the
        container still owned its log then.  Fails with ContainerFencedError,
        and fails the container, once another owner took the log."""
        return call_as_future(lambda: self._log_op(ProbeOp(*self._next())))

    def _refused_as_owner(self, error: QuireError) -> asyncio.Future[Any]:
        """A future failing with ``error`` once a probe confirmed ownership
        (with the container's fencing error if it did not)."""
        return refused_after(self.confirm_ownership(), error)

    @property
    def failure(self) -> BaseException | None:
        """Why the container stopped serving (fenced by another owner, a
        tier-1 append failed, closed), or None while it serves."""
        oplog = self._oplog
        if oplog.failure is not None:
            return oplog.failure
        return ContainerClosedError("the container is closed") if oplog.closed else None

    async def close(self) -> None:
        """Wait for the queued operations, then give up the log (idempotent)."""
        self.throttle.release_all()
        try:
            await self._oplog.close()
        except (ContainerFencedError, ContainerClosedError):
            pass
        except LogFencedError:
            pass
        finally:
            await self._log.close()
            self.read_index.notify_all()
