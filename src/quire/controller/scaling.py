"""Scaling a stream: by hand (``scale``), by ``updateStream`` changing the
segment count, and by auto-scaling's requests (Pravega's ``AutoScaleTask``).

A scale is written down (``StreamRecord.scale``) before it is carried out:
its successors are created, then the segments it replaces are sealed, then
the new epoch is recorded.  Auto-scaling, the leader's duty: a hot segment
is split into ``min(max(2, requested), max(2, scale_factor))`` equal parts;
a cold one is marked cold for the request validity, and merged with its
key-neighbours that are cold too (two, or three when more than one merge
is allowed above the minimum), never below ``min_segments``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging

from quire.controller.base import CoreBase, segment_policy
from quire.controller.model import (
    KEY_SPACE_END,
    SegmentRange,
    StreamConfig,
    StreamState,
    segment_name,
)
from quire.controller.state import create_if_missing
from quire.errors import (
    ControllerNotFoundError,
    ControllerPreconditionError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from quire.segmentstore import SegmentType
from quire.segmentstore.segment_rates import ScaleRequest

log = logging.getLogger("quire.controller")


def split(low: float, high: float, parts: int) -> list[tuple[float, float]]:
    """``(low, high]`` in ``parts`` equal ranges, the last ending at ``high``."""
    bounds = [low + (high - low) * i / parts for i in range(parts)] + [high]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


class ScalingOps(CoreBase):
    """The scaling part of ControllerCore."""

    async def scale(self, scope: str, stream: str, sealed: list[int],
                    ranges: list[tuple[float, float]], reason: str = "manual"
                    ) -> tuple[tuple[SegmentRange, ...], int]:
        """Seal ``sealed`` and create segments for ``ranges`` (which must cover
        exactly their keys) as the next epoch; ``(created, from_epoch)``.
        ControllerPreconditionError if the stream is sealed or the segments
        do not fit; open transactions roll over it when they commit."""
        async def plan() -> tuple[tuple[SegmentRange, ...], int, int]:
            await self.settle(scope, stream)
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            pending = record.plan_scale(sealed, ranges, self.now_ms(), reason)
            record.scale = pending
            await self.state.put_stream(scope, stream, record, version)
            return pending.created, record.current.epoch, pending.epoch

        async with self.changing(scope, stream):
            created, from_epoch, epoch = await self.retrying(plan)
            await self.pause("scale")
            await self.retrying(lambda: self.finish_scale(scope, stream))
        log.info("stream %s/%s: scaled (%s) to epoch %d, sealing %s", scope, stream, reason,
                 epoch, sealed)
        return created, from_epoch

    async def scale_done(self, scope: str, stream: str, from_epoch: int) -> bool | None:
        """True if a scale from ``from_epoch`` is done, False if it is under
        way, None if there is no such scale."""
        record, _version = await self._stream(scope, stream)
        if 0 <= from_epoch < record.current.epoch:
            return True
        if record.scale is not None and record.scale.epoch == from_epoch + 1:
            return False
        return None

    async def finish_scale(self, scope: str, stream: str) -> None:
        """Carry out the stream's pending scale, if any (again: no-op)."""
        record, version = await self._stream(scope, stream)
        pending = record.scale
        if pending is None:
            return
        policy = segment_policy(record.config)
        for s in pending.created:
            await create_if_missing(self.store, segment_name(scope, stream, s.id),
                                    SegmentType.STREAM, policy)
        sealed_bytes = 0
        for sid in pending.sealed:
            name = segment_name(scope, stream, sid)
            with contextlib.suppress(SegmentSealedError):
                await self.store.seal(name)
            sealed_bytes += (await self.store.get_info(name)).length
        record.apply_scale(pending, sealed_bytes)
        await self.state.put_stream(scope, stream, record, version)
        self.metrics.scales.inc()
        self.metrics.scales_by_reason.labels(pending.reason).inc()

    async def apply_config(self, scope: str, stream: str, old: StreamConfig,
                           new: StreamConfig) -> None:
        """After ``updateStream``: tell the active segments of a changed
        policy, then scale to a changed fixed count (or up to a raised
        minimum) over equal key ranges (Pravega's ``UpdateStreamTask``)."""
        record, _version = await self._stream(scope, stream)
        active = record.current.segments
        if (old.scale_type, old.target_rate) != (new.scale_type, new.target_rate):
            for s in active:
                with contextlib.suppress(SegmentSealedError, SegmentNotFoundError):
                    await self.store.update_segment_policy(
                        segment_name(scope, stream, s.id), new.scale_type.value,
                        new.target_rate if new.auto_scaled else 0)
        count = new.min_segments
        if (not new.auto_scaled and len(active) != count) or len(active) < count:
            await self.scale(scope, stream, [s.id for s in active],
                             split(0.0, KEY_SPACE_END, count), "update")

    # --- auto-scaling: the leader's duty ---------------------------------------------

    async def handle_scale_request(self, request: ScaleRequest) -> str:
        """Act on one auto-scaling request; what was done (for metrics and logs)."""
        now = self.now_ms()
        if request.timestamp_ms + self.config.autoscale_request_validity_ms < now:
            return "expired"
        try:
            record, _version = await self._stream(request.scope, request.stream)
        except ControllerNotFoundError:
            return "no-stream"
        policy = record.config
        if not policy.auto_scaled or record.state is not StreamState.ACTIVE:
            return "not-auto-scaled"
        active = {s.id: s for s in record.current.segments}
        segment = active.get(request.segment_id)
        if segment is None:
            return "not-active"
        if request.up:
            parts = min(max(2, request.splits), max(2, policy.scale_factor))
            await self.scale(request.scope, request.stream, [segment.id],
                             split(segment.min_key, segment.max_key, parts), "auto-split")
            return "split"
        merged = await self.retrying(lambda: self._mark_cold(request, now))
        if merged is None:
            return "marked-cold"
        await self.scale(request.scope, request.stream, [s.id for s in merged],
                         [(merged[0].min_key, merged[-1].max_key)], "auto-merge")
        return "merged"

    async def _mark_cold(self, request: ScaleRequest, now: int) -> list[SegmentRange] | None:
        """Mark the segment cold; the cold neighbours to merge it with, if any."""
        scope, stream = request.scope, request.stream
        async with self._stream_lock(scope, stream):
            record, version = await self._stream(scope, stream)
            record.cold = {sid: until for sid, until in record.cold.items() if until > now}
            record.cold[request.segment_id] = now + self.config.autoscale_request_validity_ms
            await self.state.put_stream(scope, stream, record, version)
        current = list(record.current.segments)
        allowed = len(current) - record.config.min_segments
        segment = next((s for s in current if s.id == request.segment_id), None)
        if segment is None or allowed <= 0:
            return None
        candidates = [s for s in current if s.id == segment.id or s.max_key == segment.min_key
                      or s.min_key == segment.max_key]
        cold = [s for s in candidates if s.id in record.cold]
        if allowed == 1 and len(cold) == 3:
            cold = cold[:2]
        if len(cold) < 2 or any(a.max_key != b.min_key for a, b in itertools.pairwise(cold)):
            return None
        return cold
