"""Seeded bugs of the stream path: product functions patched for one run
(:func:`~quire.simulation.bugs.seeded_bug` switches them), each a mistake
one of the stream layer's invariants must catch within CI's seeds.

* ``index-before-data``: the storage writer flushes a table segment's
  ``$index`` ahead of its data: the batch is taken from the table as it is
  once the data flush is done (not from the snapshot whose data was
  flushed), and no longer waits for the data to be in tier-2 up to the
  length it records; entries put meanwhile are indexed at offsets tier-2
  does not hold yet, which ``quire tier2 check`` reports (PDP-40 rule 9).
* ``metadata-not-last``: the storage writer flushes the container-metadata
  bucket first, then the user and system segments, and still truncates
  tier-1 at the end of the iteration: the layouts written by this
  iteration are not recorded anywhere yet when tier-1 drops the operations
  they cover, so an owner that takes over after a crash finds neither.
* ``dedup-forgets-writer``: a container restored from a checkpoint (every
  open, every replay) forgets the writers' event numbers, so a writer's
  resent blocks are written again after a container restart.
* ``owner-writes-after-lease``: a tier-1 log writer's hold never notices
  that another owner took the log (:class:`~quire.log.catalog.LogHold`
  always believes it holds it): fenced at its ledger, the old owner rolls
  to a new ledger of the log and keeps writing beside the new owner (or,
  when containers move between stores as they start, the two owners
  fence each other for good and the run never ends).
* ``merge-applied-twice``: merging a transaction segment leaves it in
  place (sealed), so a merge asked again (a commit retried after its
  answer was lost, a controller finishing another's commit) appends it
  to its parent a second time.
* ``seal-before-successors``: a scale seals the segments it replaces
  before it creates their successors, so a writer sent to the successors
  in between finds no such segment (and one whose controller died there
  finds none until another controller finishes the scale).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from quire.controller.scaling import ScalingOps
from quire.controller.state import create_if_missing
from quire.errors import SegmentSealedError
from quire.log.catalog import LogHold
from quire.segmentstore.metadata import ContainerMetadata
from quire.segmentstore.operations import MergeOp, Operation
from quire.segmentstore.recorded_layouts import SYSTEM, USER
from quire.segmentstore.segment_flush import IterationReport, SegmentFlushing, SegmentSnapshot
from quire.segmentstore.storage_writer import StorageWriter
from quire.segmentstore.types import SegmentType

STREAM_BUGS = ("index-before-data", "metadata-not-last", "dedup-forgets-writer",
               "owner-writes-after-lease", "merge-applied-twice", "seal-before-successors")
WRITER_KEYS = 1 << 64
"""Attribute keys from here up are writers' ids (128-bit, random)."""


async def _index_ahead(self: SegmentFlushing, segment_id: int, report: IterationReport) -> None:
    snapshot = self._snapshot(segment_id)
    await self._flush_data(snapshot, report)
    await self._flush_index(self._snapshot(segment_id), report)  # the bug: the table now
    await self._flush_attributes(snapshot, report)


def _always_flushed(self: SegmentFlushing, snapshot: SegmentSnapshot) -> bool:
    return True


async def _metadata_first(self: StorageWriter, plan: list[list[int]],
                          report: IterationReport) -> None:
    await self._flush_metadata(report)  # the bug: first, not last
    for bucket in (USER, SYSTEM):
        for segment_id in plan[bucket]:
            await self._flush_segment(segment_id, report)
    await self._truncate_tier1()


def _forgetting_restore(restore: Callable[[bytes], ContainerMetadata]
                        ) -> Callable[[bytes], ContainerMetadata]:
    def forgetful(data: bytes) -> ContainerMetadata:
        metadata = restore(data)
        for s in metadata.segments.values():
            for key in [k for k in s.attributes if k >= WRITER_KEYS]:
                del s.attributes[key]  # the bug: the writers' numbers are gone
        return metadata
    return forgetful


def _holds_always(self: LogHold, head: Any) -> bool:
    return True  # the bug: whoever holds the log now, it believes it is itself


def _keeping_merge_source(apply: Callable[[ContainerMetadata, Operation], None]
                          ) -> Callable[[ContainerMetadata, Operation], None]:
    def keep(self: ContainerMetadata, op: Operation) -> None:
        apply(self, op)
        if isinstance(op, MergeOp):  # the bug: the source stays, to be merged again
            source = self.segments[op.source_id]
            source.deleted = False
            self.by_name[source.name] = source.segment_id
    return keep


async def _seal_then_create(self: ScalingOps, scope: str, stream: str) -> None:
    from quire.controller.base import segment_policy
    from quire.controller.model import segment_name

    record, version = await self._stream(scope, stream)
    pending = record.scale
    if pending is None:
        return
    sealed_bytes = 0
    for sid in pending.sealed:  # the bug: sealed first
        name = segment_name(scope, stream, sid)
        with contextlib.suppress(SegmentSealedError):
            await self.store.seal(name)
        sealed_bytes += (await self.store.get_info(name)).length
    policy = segment_policy(record.config)
    for s in pending.created:
        await create_if_missing(self.store, segment_name(scope, stream, s.id),
                                SegmentType.STREAM, policy)
    record.apply_scale(pending, sealed_bytes)
    await self.state.put_stream(scope, stream, record, version)


@contextlib.contextmanager
def stream_bug(name: str) -> Iterator[None]:
    """Switch stream bug ``name`` on inside the block."""
    saved = (SegmentFlushing._flush_segment, SegmentFlushing._data_flushed,
             StorageWriter._flush_planned, ContainerMetadata.__dict__["restore"],
             LogHold.holds, ContainerMetadata.apply, ScalingOps.finish_scale)
    if name == "index-before-data":
        SegmentFlushing._flush_segment = _index_ahead  # type: ignore[method-assign]
        SegmentFlushing._data_flushed = _always_flushed  # type: ignore[method-assign]
    elif name == "metadata-not-last":
        StorageWriter._flush_planned = _metadata_first  # type: ignore[method-assign]
    elif name == "dedup-forgets-writer":
        ContainerMetadata.restore = staticmethod(  # type: ignore[method-assign,assignment]
            _forgetting_restore(ContainerMetadata.restore))
    elif name == "owner-writes-after-lease":
        LogHold.holds = _holds_always  # type: ignore[method-assign]
    elif name == "merge-applied-twice":
        ContainerMetadata.apply = _keeping_merge_source(  # type: ignore[method-assign,assignment]
            ContainerMetadata.apply)
    elif name == "seal-before-successors":
        ScalingOps.finish_scale = _seal_then_create  # type: ignore[method-assign]
    try:
        yield
    finally:
        SegmentFlushing._flush_segment = saved[0]  # type: ignore[method-assign]
        SegmentFlushing._data_flushed = saved[1]  # type: ignore[method-assign]
        StorageWriter._flush_planned = saved[2]  # type: ignore[method-assign]
        ContainerMetadata.restore = saved[3]  # type: ignore[method-assign]
        LogHold.holds = saved[4]  # type: ignore[method-assign]
        ContainerMetadata.apply = saved[5]  # type: ignore[method-assign]
        ScalingOps.finish_scale = saved[6]  # type: ignore[method-assign]
