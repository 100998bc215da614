"""The segment store's public value types: segment kinds, attribute updates
and the results of operations.  Plain data, no behaviour beyond checks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from quire.errors import BadAttributeUpdateError

ATTRIBUTE_KEY_LIMIT = 1 << 128
"""Attribute keys are 128-bit unsigned ints (a Pravega writer id is a UUID)."""
VALUE_MIN = -(1 << 63)
VALUE_MAX = (1 << 63) - 1
NULL_ATTRIBUTE_VALUE = VALUE_MIN
QUARANTINED_ATTRIBUTE = (0x8000_0000_0000_0000 << 64) | 0x5155_4152_414E_5449
"""A core attribute (Pravega's core attributes have the top bit of the high
half set): set, to the wall-clock ms it happened, on a segment its storage
writer quarantined (:mod:`~quire.segmentstore.quarantine`)."""
"""Pravega's "no value": an absent attribute compares equal to it."""
MAX_APPEND_BYTES = 16 << 20
"""The largest append (and table update): room for the Pravega client's
blocks of up to 8 MiB of events with their headers.  One larger than a
frame is written as part frames (:func:`~quire.segmentstore.frames.split`)."""


class SegmentType(enum.IntEnum):
    """What a segment is for (PDP-40's kinds).  Stored in the log as one byte."""

    STREAM = 1
    """A user segment (``scope/stream/...``)."""
    SYSTEM = 2
    """A segment of the ``_system`` scope."""
    TABLE = 3
    """A key-value table segment."""
    TRANSIENT = 4
    """A server-named segment of a parent, gone when merged or deleted."""


class UpdateType(enum.IntEnum):
    """How an :class:`AttributeUpdate` changes its attribute."""

    REPLACE = 1
    """Set the value."""
    REPLACE_IF_EQUALS = 2
    """Set the value if the current one is ``comparison_value`` (absent:
    :data:`NULL_ATTRIBUTE_VALUE`); otherwise the whole operation fails."""
    REPLACE_IF_GREATER = 3
    """Set the value if it is greater than the current one (or there is
    none); otherwise the whole operation fails."""
    ACCUMULATE = 4
    """Add the value to the current one (absent: 0)."""


@dataclass(frozen=True, slots=True)
class AttributeUpdate:
    """One change to one attribute: 128-bit key, signed 64-bit value."""

    key: int
    update_type: UpdateType
    value: int
    comparison_value: int | None = None

    def __post_init__(self) -> None:
        check_key(self.key)
        check_value(self.value)
        if self.update_type is UpdateType.REPLACE_IF_EQUALS:
            if self.comparison_value is None:
                raise BadAttributeUpdateError("REPLACE_IF_EQUALS needs a comparison_value")
            check_value(self.comparison_value)


def check_key(key: int) -> None:
    if type(key) is not int or not 0 <= key < ATTRIBUTE_KEY_LIMIT:
        raise BadAttributeUpdateError(f"an attribute key is a 128-bit unsigned int, got {key!r}")


def check_value(value: int) -> None:
    if type(value) is not int or not VALUE_MIN <= value <= VALUE_MAX:
        raise BadAttributeUpdateError(f"an attribute value is a signed 64-bit int, got {value!r}")


@dataclass(slots=True, unsafe_hash=True)  # not frozen only for speed: one per append
class AppendResult:
    """An acknowledged append.  ``length`` is the segment's length after it
    (for a duplicate: the length when the duplicate was recognised);
    ``event_number`` the writer's event number it carried (None without a
    writer); ``previous_event_number`` the writer's number before it (None
    if the writer had none); ``duplicate`` True if nothing was written
    because the writer's stored number was not below ``event_number``."""

    length: int
    event_number: int | None = None
    previous_event_number: int | None = None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Bytes read from ``offset`` (possibly none).  ``at_tail``: the read ends
    at the segment's length; ``end_of_segment``: and the segment is sealed."""

    offset: int
    data: bytes
    at_tail: bool
    end_of_segment: bool


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment's state as acknowledged operations left it."""

    name: str
    length: int
    start_offset: int
    storage_length: int
    sealed: bool
    deleted: bool
    type: SegmentType
    attributes: dict[int, int] = field(default_factory=dict)
    last_modified_ms: int = 0


@dataclass(frozen=True, slots=True)
class MergeResult:
    """A merge's outcome: the target's length after it."""

    target_length: int
