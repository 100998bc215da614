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
  others are carried over with their ids.
* A transaction id is 128 bits: the top 32 are its epoch, the low 64 bits
  have bit 63 clear (the client sign-extends them).

:class:`StreamRecord` and :class:`TxnRecord` are stored as JSON values in the
controller's table segments (:mod:`quire.controller.state`).
"""

from __future__ import annotations

import enum
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from quire.errors import ControllerInvalidArgumentError, ControllerPreconditionError

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
    """The segments active from ``created_ms`` on, sorted by key."""

    epoch: int
    created_ms: int
    segments: tuple[SegmentRange, ...]

    def ids(self) -> set[int]:
        return {s.id for s in self.segments}


class RetentionType(enum.Enum):
    NONE = "none"
    TIME = "time"
    SIZE = "size"


@dataclass(frozen=True)
class StreamConfig:
    """A stream's configuration: a fixed number of segments (scaled only by
    hand), a retention policy (``param``/``max`` in ms or bytes) and tags."""

    min_segments: int
    retention: RetentionType = RetentionType.NONE
    retention_param: int = 0
    retention_max: int = 0
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.min_segments <= 0:
            raise ControllerInvalidArgumentError(
                f"a stream needs at least one segment, got {self.min_segments}")
        if self.min_segments > 1024:
            raise ControllerInvalidArgumentError(
                f"at most 1024 initial segments, got {self.min_segments}")
        if self.retention_param < 0 or self.retention_max < 0:
            raise ControllerInvalidArgumentError("retention limits are not negative")


class StreamState(enum.Enum):
    CREATING = "creating"
    """Its record is written, its segments perhaps not all: a createStream
    again finishes it; it is invisible otherwise."""
    ACTIVE = "active"
    SEALED = "sealed"


@dataclass(frozen=True)
class PendingScale:
    """A scale written down before it is carried out (a restart finishes it):
    seal ``sealed``, create ``created`` as epoch ``epoch``."""

    sealed: tuple[int, ...]
    created: tuple[SegmentRange, ...]
    epoch: int
    created_ms: int


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
    head: dict[int, int] = field(default_factory=dict)
    """The last truncation's stream cut (segment id -> offset); empty: the
    first epoch's segments from offset 0."""
    truncated_ms: int = 0
    sealed_bytes: int = 0
    """Bytes in the segments sealed by scales: the stream's size is this plus
    the active segments' lengths."""
    retention_cuts: list[RecordedCut] = field(default_factory=list)
    """Cuts recorded for retention, oldest first, none before the head."""

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
        """The segment ``sid`` from any epoch, or None if it never existed."""
        first = segment_epoch(sid)
        for epoch in self.epochs[first:first + 1]:
            for s in epoch.segments:
                if s.id == sid:
                    return s
        return None

    def all_segments(self) -> dict[int, SegmentRange]:
        return {s.id: s for e in self.epochs for s in e.segments}

    def successors(self, sid: int) -> list[tuple[SegmentRange, list[int]]]:
        """The segments that replaced ``sid`` when it was sealed by a scale,
        each with all its predecessors; empty while ``sid`` is active (or it
        was sealed with the stream)."""
        for before, after in zip(self.epochs, self.epochs[1:], strict=False):
            if sid in before.ids() and sid not in after.ids():
                sealed = next(s for s in before.segments if s.id == sid)
                kept = before.ids()
                new = [s for s in after.segments if s.id not in kept]
                gone = [s for s in before.segments if s.id not in after.ids()]
                return [(s, [p.id for p in gone if p.overlaps(s)])
                        for s in new if s.overlaps(sealed)]
        return []

    def plan_scale(self, sealed: list[int], ranges: list[tuple[float, float]],
                   now_ms: int) -> PendingScale:
        """The scale that seals ``sealed`` and covers their keys with ``ranges``.
        ControllerInvalidArgumentError for malformed ranges;
        ControllerPreconditionError when they do not fit the current epoch."""
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
        old = _merged([(active[sid].min_key, active[sid].max_key) for sid in sealed])
        new = sorted(ranges)
        for (_, end), (start, _) in itertools.pairwise(new):
            if start < end:
                raise ControllerPreconditionError("the new key ranges overlap")
        if _merged(new) != old:
            raise ControllerPreconditionError(
                "the new key ranges do not cover exactly the keys of the sealed segments")
        epoch = self.current.epoch + 1
        if self.next_number + len(new) > MAX_SEGMENT_NUMBER:
            raise ControllerPreconditionError("the stream has used every segment number")
        created = tuple(SegmentRange(segment_id(epoch, self.next_number + i), start, end)
                        for i, (start, end) in enumerate(new))
        return PendingScale(tuple(sealed), created, epoch, now_ms)

    def apply_scale(self, scale: PendingScale, sealed_bytes: int = 0) -> None:
        """Make ``scale``'s epoch the current one; ``sealed_bytes``: the
        lengths of the segments it sealed."""
        self.sealed_bytes += sealed_bytes
        kept = [s for s in self.current.segments if s.id not in scale.sealed]
        segments = tuple(sorted([*kept, *scale.created], key=lambda s: s.min_key))
        self.epochs.append(Epoch(scale.epoch, scale.created_ms, segments))
        self.next_number += len(scale.created)
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

    def check_cut(self, cut: dict[int, int]) -> list[int]:
        """Check a stream cut (its segments cover (0, 1] exactly, offsets are
        not negative, it is not before the current head) and return the ids of
        the segments wholly before it (ControllerInvalidArgumentError if not)."""
        known = self.all_segments()
        segments = []
        for sid, offset in cut.items():
            s = known.get(sid)
            if s is None:
                raise ControllerInvalidArgumentError(f"segment {sid} is not in the stream")
            if offset < 0:
                raise ControllerInvalidArgumentError(f"segment {sid}: offset {offset} < 0")
            segments.append(s)
        segments.sort(key=lambda s: s.min_key)
        if not segments or _merged([(s.min_key, s.max_key) for s in segments]) != \
                [(0.0, KEY_SPACE_END)] or any(a.max_key > b.min_key for a, b in
                                               itertools.pairwise(segments)):
            raise ControllerInvalidArgumentError("a stream cut must cover the keys (0, 1] "
                                                 "exactly once")
        head = self.head_cut()
        for h, h_offset in head.items():
            hs = known[h]
            for s in segments:
                if s.overlaps(hs) and (segment_epoch(s.id) < segment_epoch(h)
                                       or (s.id == h and cut[s.id] < h_offset)):
                    raise ControllerInvalidArgumentError(
                        f"the stream cut is before the stream's head at segment {h}")
        return sorted(sid for sid, s in known.items() if sid not in cut and any(
            c.overlaps(s) and segment_epoch(c.id) > segment_epoch(sid) for c in segments))

    def after_head(self, cut: dict[int, int]) -> bool:
        """Whether ``cut`` is a valid cut past the stream's head."""
        try:
            self.check_cut(cut)
        except ControllerInvalidArgumentError:
            return False
        return cut != self.head_cut()

    def retention_cut(self, now_ms: int, size: int) -> RecordedCut | None:
        """The recorded cut to truncate at under the retention policy, the
        stream holding ``size`` bytes now: the latest that keeps at least
        ``retention_param`` bytes (SIZE) or milliseconds (TIME) after it;
        None if there is none (or no policy)."""
        c = self.config
        found = None
        for recorded in self.retention_cuts:
            if c.retention is RetentionType.SIZE:
                fits = size - recorded.size >= c.retention_param
            elif c.retention is RetentionType.TIME:
                fits = now_ms - recorded.time_ms >= c.retention_param
            else:
                fits = False
            if fits:
                found = recorded
        return found

    # --- JSON -----------------------------------------------------------------

    def to_json(self) -> bytes:
        c = self.config
        doc: dict[str, Any] = {
            "config": {"min_segments": c.min_segments, "retention": c.retention.value,
                       "retention_param": c.retention_param, "retention_max": c.retention_max,
                       "tags": list(c.tags)},
            "state": self.state.value,
            "epochs": [[e.epoch, e.created_ms, [_range_json(s) for s in e.segments]]
                       for e in self.epochs],
            "next_number": self.next_number,
            "head": [[sid, offset] for sid, offset in sorted(self.head.items())],
            "truncated_ms": self.truncated_ms,
            "sealed_bytes": self.sealed_bytes,
            "retention_cuts": [[r.time_ms, r.size, sorted(r.cut.items())]
                               for r in self.retention_cuts],
        }
        if self.scale is not None:
            doc["scale"] = {"sealed": list(self.scale.sealed), "epoch": self.scale.epoch,
                            "created_ms": self.scale.created_ms,
                            "created": [_range_json(s) for s in self.scale.created]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> StreamRecord:
        doc = json.loads(data)
        c = doc["config"]
        config = StreamConfig(c["min_segments"], RetentionType(c["retention"]),
                              c["retention_param"], c["retention_max"], tuple(c["tags"]))
        scale = None
        if "scale" in doc:
            s = doc["scale"]
            scale = PendingScale(tuple(s["sealed"]),
                                 tuple(_range_of(r) for r in s["created"]),
                                 s["epoch"], s["created_ms"])
        return cls(config, StreamState(doc["state"]),
                   [Epoch(e, t, tuple(_range_of(r) for r in rs)) for e, t, rs in doc["epochs"]],
                   doc["next_number"], scale, {sid: off for sid, off in doc["head"]},
                   doc["truncated_ms"], doc["sealed_bytes"],
                   [RecordedCut(t, size, {sid: off for sid, off in cut})
                    for t, size, cut in doc["retention_cuts"]])


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

    def to_json(self) -> bytes:
        return json.dumps({"id": f"{self.txn_id:032x}", "segments": list(self.segments),
                           "state": self.state.value, "lease_expiry_ms": self.lease_expiry_ms,
                           "completed_ms": self.completed_ms}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TxnRecord:
        doc = json.loads(data)
        return cls(int(doc["id"], 16), tuple(doc["segments"]), TxnState(doc["state"]),
                   doc["lease_expiry_ms"], doc["completed_ms"])


def _range_json(s: SegmentRange) -> list[float | int]:
    return [s.id, s.min_key, s.max_key]


def _range_of(r: list[Any]) -> SegmentRange:
    return SegmentRange(int(r[0]), float(r[1]), float(r[2]))


def _merged(ranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted ranges with touching ones joined."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
