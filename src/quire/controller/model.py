"""The controller's records and their rules, as Pravega defines them (sans-IO).

A stream's key space is (0, 1]: each segment owns the routing keys in
``(min_key, max_key]``, and the active segments of every epoch cover it
exactly (the first starts at 0.0, each next one where the last ended, the
last ends at 1.0; the Pravega client asserts this).

* A segment id is ``(epoch << 32) | number``: the epoch that created it and
  its number, unique in the stream (numbers only grow).  Its name is
  ``scope/stream/<number>.#epoch.<epoch>``; a transaction's segment on it
  adds ``#transaction.<high:016x><low:016x>``.
* An epoch is a set of active segments.  A scale seals some of them and
  creates successors covering exactly their keys, as epoch ``e + 1``; the
  others are carried over with their ids.  A transaction committed after
  its epoch's segments were sealed *rolls over* (Pravega's rolling
  transactions): epoch ``c + 1`` duplicates the transaction's epoch (same
  segment numbers and key ranges, new epoch), takes the transaction's data
  and is sealed at once; epoch ``c + 2`` duplicates epoch ``c``, the new
  active one.  Readers and writers go c, c + 1, c + 2 through successors.
* A transaction id is 128 bits: the top 32 are its epoch, the low 64 bits
  have bit 63 clear (the client sign-extends them).

:class:`StreamRecord` and :class:`TxnRecord` are stored as JSON values in the
controller's table segments (:mod:`quire.controller.records`); stream cuts'
rules are in :mod:`quire.controller.cuts`.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field

from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerPreconditionError,
)

KEY_SPACE_END = 1.0
MAX_SEGMENT_NUMBER = (1 << 31) - 1


def segment_id(epoch: int, number: int) -> int:
    return (epoch << 32) | number


def segment_epoch(sid: int) -> int:
    return sid >> 32


def segment_number(sid: int) -> int:
    return sid & 0xFFFF_FFFF


def segment_name(scope: str, stream: str, sid: int) -> str:
    return f"{scope}/{stream}/{segment_number(sid)}.#epoch.{segment_epoch(sid)}"


def txn_id_parts(txn_id: int) -> tuple[int, int]:
    """``(high, low)`` signed 64-bit halves, as TxnId carries them."""
    high, low = txn_id >> 64, txn_id & ((1 << 64) - 1)
    return (high - (1 << 64) if high >= 1 << 63 else high,
            low - (1 << 64) if low >= 1 << 63 else low)


def txn_id_of(high: int, low: int) -> int:
    """The 128-bit id of a TxnId's signed halves."""
    return ((high & ((1 << 64) - 1)) << 64) | (low & ((1 << 64) - 1))


def txn_epoch(txn_id: int) -> int:
    return txn_id >> 96


def txn_segment_name(scope: str, stream: str, sid: int, txn_id: int) -> str:
    high, low = txn_id >> 64, txn_id & ((1 << 64) - 1)
    return f"{segment_name(scope, stream, sid)}#transaction.{high:016x}{low:016x}"


@dataclass(frozen=True)
class SegmentRange:
    """A segment and its routing keys ``(min_key, max_key]``."""

    id: int
    min_key: float
    max_key: float

    def overlaps(self, other: SegmentRange) -> bool:
        return self.min_key < other.max_key and other.min_key < self.max_key


@dataclass(frozen=True)
class Epoch:
    """The segments active from ``created_ms`` on, sorted by key, and why
    the epoch began (:data:`SCALE_REASONS`; "" for the first)."""

    epoch: int
    created_ms: int
    segments: tuple[SegmentRange, ...]
    reason: str = ""

    def ids(self) -> set[int]:
        return {s.id for s in self.segments}


class RetentionType(enum.Enum):
    NONE = "none"
    TIME = "time"
    SIZE = "size"


class ScaleType(enum.Enum):
    """A scaling policy's kind (the values are the interface's, and the
    segment store's ``ScaleType`` on the wire)."""

    FIXED = 0
    BY_RATE_IN_KBYTES_PER_SEC = 1
    BY_RATE_IN_EVENTS_PER_SEC = 2


@dataclass(frozen=True)
class StreamConfig:
    """A stream's configuration: its scaling policy (a fixed number of
    segments, scaled only by hand; or auto-scaling by event or byte rate,
    ``target_rate`` per segment, splits into up to ``scale_factor``, never
    below ``min_segments``), a retention policy (``param``: the minimum to
    keep, ``max``: the most to keep however far behind subscribers are, 0:
    no maximum; ms or bytes) and tags."""

    min_segments: int
    retention: RetentionType = RetentionType.NONE
    retention_param: int = 0
    retention_max: int = 0
    tags: tuple[str, ...] = ()
    scale_type: ScaleType = ScaleType.FIXED
    target_rate: int = 0
    scale_factor: int = 0

    def __post_init__(self) -> None:
        if self.min_segments <= 0:
            raise ControllerInvalidArgumentError(
                f"a stream needs at least one segment, got {self.min_segments}")
        if self.min_segments > 1024:
            raise ControllerInvalidArgumentError(
                f"at most 1024 initial segments, got {self.min_segments}")
        if self.retention_param < 0 or self.retention_max < 0:
            raise ControllerInvalidArgumentError("retention limits are not negative")
        if 0 < self.retention_max < self.retention_param:
            raise ControllerInvalidArgumentError(
                f"the retention maximum {self.retention_max} is below its minimum "
                f"{self.retention_param}")
        if self.auto_scaled and (self.target_rate <= 0 or self.scale_factor <= 0):
            raise ControllerInvalidArgumentError(
                "an auto-scaling policy needs a positive target rate and scale factor")

    @property
    def auto_scaled(self) -> bool:
        return self.scale_type is not ScaleType.FIXED


class StreamState(enum.Enum):
    CREATING = "creating"
    """Its record is written, its segments perhaps not all: a createStream
    again finishes it; it is invisible otherwise."""
    ACTIVE = "active"
    SEALED = "sealed"


SCALE_REASONS = ("manual", "auto-split", "auto-merge", "update", "rolling-txn")
"""Why an epoch began: a scale asked for (``scale``), auto-scaling's split
of a hot segment or merge of cold ones, ``updateStream`` changing the
segment count, a transaction rolled over a scale."""


@dataclass(frozen=True)
class PendingScale:
    """A scale written down before it is carried out (a restart finishes it):
    seal ``sealed``, create ``created`` as epoch ``epoch``."""

    sealed: tuple[int, ...]
    created: tuple[SegmentRange, ...]
    epoch: int
    created_ms: int
    reason: str = "manual"


@dataclass(frozen=True)
class PendingRoll:
    """A transaction rolled over a scale, written down before it is carried
    out: create ``duplicates`` (epoch ``c + 1``: the transaction's epoch
    again), merge the transaction's segments into them, seal them; create
    ``actives`` (epoch ``c + 2``: epoch ``c`` again), seal epoch ``c``."""

    txn_id: int
    duplicates: tuple[SegmentRange, ...]
    actives: tuple[SegmentRange, ...]
    created_ms: int

    def duplicate_of(self, sid: int) -> int:
        """The duplicate of segment ``sid`` of the transaction's epoch."""
        return segment_id(self.duplicates[0].id >> 32, segment_number(sid))


@dataclass(frozen=True)
class RecordedCut:
    """A stream cut recorded for retention: the active segments at their
    lengths at ``time_ms``, when the stream held ``size`` bytes in all
    (truncated ones included)."""

    time_ms: int
    size: int
    cut: dict[int, int]


@dataclass
class StreamRecord:
    """Everything the controller keeps about one stream."""

    config: StreamConfig
    state: StreamState
    epochs: list[Epoch]
    next_number: int
    scale: PendingScale | None = None
    roll: PendingRoll | None = None
    head: dict[int, int] = field(default_factory=dict)
    """The last truncation's stream cut (segment id -> offset); empty: the
    first epoch's segments from offset 0."""
    truncated_ms: int = 0
    sealed_bytes: int = 0
    """Bytes in the segments sealed by scales: the stream's size is this plus
    the active segments' lengths."""
    retention_cuts: list[RecordedCut] = field(default_factory=list)
    """Cuts recorded for retention, oldest first, none before the head."""
    cold: dict[int, int] = field(default_factory=dict)
    """Active segments reported cold by auto-scaling: id -> when the mark
    ends (ms); two cold neighbours are merged."""
    creator: str = ""
    """While CREATING: the controller making its first segments (claimed
    by compare-and-set, so one at a time), and since when (ms)."""
    creator_ms: int = 0

    @classmethod
    def new(cls, config: StreamConfig, now_ms: int) -> StreamRecord:
        n = config.min_segments
        segments = tuple(SegmentRange(segment_id(0, i), i / n,
                                      KEY_SPACE_END if i == n - 1 else (i + 1) / n)
                         for i in range(n))
        return cls(config, StreamState.CREATING, [Epoch(0, now_ms, segments)], n)

    @property
    def current(self) -> Epoch:
        return self.epochs[-1]

    def find(self, sid: int) -> SegmentRange | None:
        """The segment ``sid`` from any epoch (a pending one too), or None if
        it never existed."""
        first = segment_epoch(sid)
        for epoch in [*self.epochs, *self.pending_epochs()][first:first + 1]:
            for s in epoch.segments:
                if s.id == sid:
                    return s
        return None

    def all_segments(self) -> dict[int, SegmentRange]:
        return {s.id: s for e in self.epochs for s in e.segments}

    def pending_epochs(self) -> list[Epoch]:
        """The epochs a pending scale or roll will add (its successors exist
        before anything is sealed, so a sealed segment's are known)."""
        if self.scale is not None:
            kept = [s for s in self.current.segments if s.id not in self.scale.sealed]
            return [Epoch(self.scale.epoch, self.scale.created_ms,
                          tuple(sorted([*kept, *self.scale.created], key=lambda s: s.min_key)))]
        if self.roll is not None:
            c = self.current.epoch
            return [Epoch(c + 1, self.roll.created_ms, self.roll.duplicates),
                    Epoch(c + 2, self.roll.created_ms, self.roll.actives)]
        return []

    def successors(self, sid: int) -> list[tuple[SegmentRange, list[int]]]:
        """The segments that replaced ``sid`` when it was sealed by a scale
        (a pending one too), each with all its predecessors; empty while
        ``sid`` is active (or it was sealed with the stream)."""
        epochs = [*self.epochs, *self.pending_epochs()]
        for before, after in itertools.pairwise(epochs):
            if sid in before.ids() and sid not in after.ids():
                sealed = next(s for s in before.segments if s.id == sid)
                kept = before.ids()
                new = [s for s in after.segments if s.id not in kept]
                gone = [s for s in before.segments if s.id not in after.ids()]
                return [(s, [p.id for p in gone if p.overlaps(s)])
                        for s in new if s.overlaps(sealed)]
        return []

    def plan_scale(self, sealed: list[int], ranges: list[tuple[float, float]],
                   now_ms: int, reason: str = "manual") -> PendingScale:
        """The scale that seals ``sealed`` and covers their keys with ``ranges``.
        ControllerInvalidArgumentError for malformed ranges;
        ControllerPreconditionError when they do not fit the current epoch;
        ControllerConcurrentUpdateError while another is pending (see
        :meth:`check_idle`)."""
        self.check_idle()
        if not sealed or not ranges:
            raise ControllerInvalidArgumentError("a scale needs segments to seal and new ranges")
        for start, end in ranges:
            if not (math.isfinite(start) and math.isfinite(end)
                    and 0.0 <= start < end <= KEY_SPACE_END):
                raise ControllerInvalidArgumentError(
                    f"key range ({start}, {end}] is not within (0, 1] or is empty")
        if len(set(sealed)) != len(sealed):
            raise ControllerInvalidArgumentError("a segment to seal is named twice")
        active = {s.id: s for s in self.current.segments}
        missing = [sid for sid in sealed if sid not in active]
        if missing:
            raise ControllerPreconditionError(f"segments {missing} are not active")
        old = merged([(active[sid].min_key, active[sid].max_key) for sid in sealed])
        new = sorted(ranges)
        for (_, end), (start, _) in itertools.pairwise(new):
            if start < end:
                raise ControllerPreconditionError("the new key ranges overlap")
        if merged(new) != old:
            raise ControllerPreconditionError(
                "the new key ranges do not cover exactly the keys of the sealed segments")
        epoch = self.current.epoch + 1
        if self.next_number + len(new) > MAX_SEGMENT_NUMBER:
            raise ControllerPreconditionError("the stream has used every segment number")
        created = tuple(SegmentRange(segment_id(epoch, self.next_number + i), start, end)
                        for i, (start, end) in enumerate(new))
        return PendingScale(tuple(sealed), created, epoch, now_ms, reason)

    def apply_scale(self, scale: PendingScale, sealed_bytes: int = 0) -> None:
        """Make ``scale``'s epoch the current one; ``sealed_bytes``: the
        lengths of the segments it sealed."""
        self.sealed_bytes += sealed_bytes
        kept = [s for s in self.current.segments if s.id not in scale.sealed]
        segments = tuple(sorted([*kept, *scale.created], key=lambda s: s.min_key))
        self.epochs.append(Epoch(scale.epoch, scale.created_ms, segments, scale.reason))
        self.next_number += len(scale.created)
        for sid in scale.sealed:
            self.cold.pop(sid, None)
        self.scale = None

    def epoch_at(self, timestamp_ms: int) -> Epoch:
        """The epoch active at ``timestamp_ms`` (the first one before it)."""
        found = self.epochs[0]
        for epoch in self.epochs:
            if epoch.created_ms <= timestamp_ms:
                found = epoch
        return found

    def head_cut(self) -> dict[int, int]:
        """Where the stream begins: the last truncation's cut, or epoch 0 at 0."""
        return dict(self.head) if self.head else {s.id: 0 for s in self.epochs[0].segments}

    @property
    def busy(self) -> bool:
        """Whether a scale or a roll is written down and not yet done."""
        return self.scale is not None or self.roll is not None

    def check_idle(self) -> None:
        """A plan never replaces a pending scale or roll: ControllerConcurrentUpdateError
        if one is written down, so that the workflow, retried, finishes that
        one first.  (Two controllers committing two transactions of one
        stream each read it idle and then the other's roll: the second
        plan replaced the first, whose half-done steps had sealed the
        duplicates both named, and every later attempt failed; the stream
        simulation, seed 102487.)"""
        if self.busy:
            raise ControllerConcurrentUpdateError(
                "another scale or roll of the stream is pending: it is finished first")

    def plan_roll(self, txn: TxnRecord, now_ms: int) -> PendingRoll:
        """The roll that commits ``txn`` past the scales since its epoch
        (ControllerConcurrentUpdateError while another is pending)."""
        self.check_idle()
        current = self.current.epoch
        dup_epoch, active_epoch = current + 1, current + 2
        original = self.epochs[txn_epoch(txn.txn_id)].segments
        duplicates = tuple(SegmentRange(segment_id(dup_epoch, segment_number(s.id)),
                                        s.min_key, s.max_key) for s in original)
        actives = tuple(SegmentRange(segment_id(active_epoch, segment_number(s.id)),
                                     s.min_key, s.max_key) for s in self.current.segments)
        return PendingRoll(txn.txn_id, duplicates, actives, now_ms)

    def apply_roll(self, roll: PendingRoll, sealed_bytes: int) -> None:
        """Make the roll's two epochs the stream's last; ``sealed_bytes``:
        the lengths of the segments it sealed (duplicates included)."""
        self.sealed_bytes += sealed_bytes
        dup_epoch = self.current.epoch + 1
        self.epochs.append(Epoch(dup_epoch, roll.created_ms, roll.duplicates, "rolling-txn"))
        self.epochs.append(Epoch(dup_epoch + 1, roll.created_ms, roll.actives, "rolling-txn"))
        self.roll = None


class TxnState(enum.Enum):
    """A transaction's life (the names are TxnState's in the interface)."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"

    @property
    def completed(self) -> bool:
        return self in (TxnState.COMMITTED, TxnState.ABORTED)


@dataclass
class TxnRecord:
    """One transaction: the parent segments it writes to (those of its epoch),
    its state and the wall-clock time its lease ends."""

    txn_id: int
    segments: tuple[int, ...]
    state: TxnState
    lease_expiry_ms: int
    completed_ms: int = 0


def merged(ranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted ranges with touching ones joined."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
