"""Container metadata: every segment of one container, by id and by name.

:class:`ContainerMetadata` is the state that the container's operations
change; :meth:`ContainerMetadata.apply` is the one state transition, used
both live and on replay, so a replayed container ends exactly where the
live one was.  An append's change to its segment is :func:`apply_append`,
which ``apply`` uses and so do the container's hot paths (accepting an
append, committing a frame of them) without building an operation.  A
container keeps two of them: the *accepted* state (every operation
queued, used to check and resolve new requests) and the
*committed* state (only operations whose frame is durable, the one readers
see).

A checkpoint (:meth:`checkpoint`, :meth:`restore`) is the whole state as
UTF-8 JSON::

    {"container": int, "sequence": int, "next_segment_id": int,
     "segments": [[id, name, type, length, start_offset, sealed, deleted,
                   storage_length, last_modified_ms, [[key, value], ...]], ...]}

Deleted segments stay (``deleted`` true, no longer found by name) until
tier-2 has deleted their data and records (:meth:`ContainerMetadata.purge`,
as a checkpoint is written).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from quire.errors import CorruptRecordError
from quire.segmentstore.operations import (
    AppendOp,
    Attributes,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    ProbeOp,
    SealOp,
    SegmentMapOp,
    TruncateOp,
)
from quire.segmentstore.types import SegmentInfo, SegmentType


@dataclass(slots=True)
class SegmentMetadata:
    segment_id: int
    name: str
    type: SegmentType
    length: int = 0
    start_offset: int = 0
    sealed: bool = False
    deleted: bool = False
    storage_length: int = 0
    last_modified_ms: int = 0
    attributes: dict[int, int] = field(default_factory=dict)
    appended_bytes: int = field(default=0, compare=False, repr=False)
    """Bytes appended since auto-scaling last took its counts
    (:meth:`~quire.segmentstore.segment_rates.AutoScaleMonitor.tick`): a
    counter of the live container's accepted state, never logged nor
    checkpointed, kept here so that the append path pays two additions."""
    appended_events: int = field(default=0, compare=False, repr=False)
    """Events appended since then (see :attr:`appended_bytes`)."""

    def info(self) -> SegmentInfo:
        return SegmentInfo(name=self.name, length=self.length, start_offset=self.start_offset,
                           storage_length=self.storage_length, sealed=self.sealed,
                           deleted=self.deleted, type=self.type,
                           attributes=dict(self.attributes),
                           last_modified_ms=self.last_modified_ms)


def apply_append(s: SegmentMetadata, end: int, attributes: Attributes,
                 timestamp_ms: int) -> None:
    """An append's change to its segment, the one rule of it: ``s`` is now
    ``end`` long (the append's offset plus its length), has ``attributes``
    (final values) set and was last modified at ``timestamp_ms``.

    The caller has checked that the append fits (``s`` live and unsealed,
    the append at its length): :meth:`ContainerMetadata.apply` on replay,
    the container when it accepts and commits.  A function of plain values
    because the appends' hot paths call it twice per append, once on the
    accepted state and once on the committed state (a loop, not
    ``dict.update``: cheaper for the one pair of a writer's number)."""
    s.length = end
    if attributes:
        stored = s.attributes
        for key, value in attributes:
            stored[key] = value
    s.last_modified_ms = timestamp_ms


class ContainerMetadata:
    """The segments of container ``container_id`` (see the module docstring)."""

    def __init__(self, container_id: int) -> None:
        self.container_id = container_id
        self.segments: dict[int, SegmentMetadata] = {}
        self.by_name: dict[str, int] = {}
        self.next_segment_id = 1
        self.sequence = 0
        """The sequence number of the last operation applied."""

    def get(self, name: str) -> SegmentMetadata | None:
        """The live (not deleted) segment called ``name``."""
        segment_id = self.by_name.get(name)
        return None if segment_id is None else self.segments[segment_id]

    def apply(self, op: Operation) -> None:
        """Apply one logged operation (its sequence must be the next one).
        CorruptRecordError if it does not fit this state: the log is corrupt."""
        if op.sequence != self.sequence + 1:
            raise CorruptRecordError(f"container {self.container_id}: operation {op.sequence} "
                                     f"after {self.sequence}")
        if type(op) is AppendOp:  # replay's hot path: one helper call
            s = self.segments.get(op.segment_id)
            if s is None or s.deleted:
                raise CorruptRecordError(f"container {self.container_id}: no live segment "
                                         f"{op.segment_id}")
            if op.offset != s.length or s.sealed:
                raise CorruptRecordError(f"segment {s.name!r}: append at {op.offset}, "
                                         f"length {s.length}{' (sealed)' if s.sealed else ''}")
            apply_append(s, op.offset + len(op.data), op.attributes, op.timestamp_ms)
        elif isinstance(op, SegmentMapOp):
            if op.name in self.by_name or op.segment_id in self.segments:
                raise CorruptRecordError(f"segment {op.name!r} ({op.segment_id}) mapped twice")
            self.segments[op.segment_id] = SegmentMetadata(
                op.segment_id, op.name, op.segment_type, attributes=dict(op.attributes),
                last_modified_ms=op.timestamp_ms)
            self.by_name[op.name] = op.segment_id
            self.next_segment_id = max(self.next_segment_id, op.segment_id + 1)
        elif isinstance(op, SealOp):
            s = self._segment(op.segment_id)
            s.sealed = True
            s.last_modified_ms = op.timestamp_ms
        elif isinstance(op, TruncateOp):
            s = self._segment(op.segment_id)
            if not s.start_offset <= op.start_offset <= s.length:
                raise CorruptRecordError(f"segment {s.name!r}: truncate at {op.start_offset}")
            s.start_offset = op.start_offset
            s.last_modified_ms = op.timestamp_ms
        elif isinstance(op, DeleteOp):
            s = self._segment(op.segment_id)
            s.deleted = True
            s.last_modified_ms = op.timestamp_ms
            del self.by_name[s.name]
        elif isinstance(op, AttributesOp):
            s = self._segment(op.segment_id)
            s.attributes.update(op.attributes)
            s.last_modified_ms = op.timestamp_ms
        elif isinstance(op, MergeOp):
            target = self._segment(op.target_id)
            source = self._segment(op.source_id)
            if (op.target_offset != target.length or target.sealed or not source.sealed
                    or source.start_offset != 0 or op.length != source.length
                    or source is target):
                raise CorruptRecordError(f"merge of {source.name!r} into {target.name!r} "
                                         "does not fit")
            target.length += op.length
            target.last_modified_ms = op.timestamp_ms
            source.deleted = True
            source.last_modified_ms = op.timestamp_ms
            del self.by_name[source.name]
        else:  # a checkpoint: the state is what it describes already; a probe: nothing
            assert isinstance(op, CheckpointOp | ProbeOp)
        self.sequence = op.sequence

    def purge(self, segment_ids: set[int]) -> None:
        """Drop these deleted segments (nothing refers to them any more)."""
        for segment_id in segment_ids:
            s = self.segments.get(segment_id)
            if s is not None and s.deleted:
                del self.segments[segment_id]

    def _segment(self, segment_id: int) -> SegmentMetadata:
        s = self.segments.get(segment_id)
        if s is None or s.deleted:
            raise CorruptRecordError(f"container {self.container_id}: no live segment "
                                     f"{segment_id}")
        return s

    # --- checkpoints ------------------------------------------------------

    def checkpoint(self) -> bytes:
        """The whole state (see the module docstring)."""
        return json.dumps({
            "container": self.container_id, "sequence": self.sequence,
            "next_segment_id": self.next_segment_id,
            "segments": [[s.segment_id, s.name, int(s.type), s.length, s.start_offset,
                          s.sealed, s.deleted, s.storage_length, s.last_modified_ms,
                          [[k, v] for k, v in s.attributes.items()]]
                         for s in self.segments.values()],
        }, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes) -> ContainerMetadata:
        """The state a :meth:`checkpoint` described (CorruptRecordError if malformed)."""
        try:
            doc = json.loads(data)
            m = cls(int(doc["container"]))
            m.sequence = int(doc["sequence"])
            m.next_segment_id = int(doc["next_segment_id"])
            for (sid, name, kind, length, start, sealed, deleted, storage, modified,
                 attributes) in doc["segments"]:
                s = SegmentMetadata(int(sid), str(name), SegmentType(kind), int(length),
                                    int(start), bool(sealed), bool(deleted), int(storage),
                                    int(modified), {int(k): int(v) for k, v in attributes})
                m.segments[s.segment_id] = s
                if not s.deleted:
                    m.by_name[s.name] = s.segment_id
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptRecordError(f"malformed container checkpoint: {e}") from e
        return m

    def copy(self) -> ContainerMetadata:
        return ContainerMetadata.restore(self.checkpoint())
