"""WireCommand classes, their encoders, and the incremental decoder.

The byte layout is documented in :mod:`quire.pravega_wire`.  Each command is
a frozen slotted dataclass whose ``LAYOUT`` string names its fields' wire
types in declaration order (one character each)::

    i i32   q i64   B u8   ? bool   U u128   s str   b bytes
    L i64 list   K TableKey list   E (TableKey, TableValue) list

From it, :func:`_command` compiles a plan (runs of fixed-width fields become
one :class:`struct.Struct`), used by ``encode()`` and by :class:`Decoder`.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from quire.errors import WireCommandError

WIRE_VERSION = 15
OLDEST_COMPATIBLE_VERSION = 5
MAX_WIRECOMMAND_SIZE = 0x00FF_FFFF
"""The largest payload the Pravega client sends or accepts (16 MiB - 1)."""
I64_MIN = -(1 << 63)
KEY_NO_VERSION = I64_MIN
"""A TableKey's version meaning "whatever the key's current version"."""
KEY_NOT_EXISTS = -1
"""A TableKey's version meaning "the key must not exist"."""
NO_EVENT_NUMBER = I64_MIN
"""AppendSetup's ``last_event_number`` for a writer the segment has not seen."""
EVENT_HEADER = struct.Struct(">ii")
"""An event's header inside a segment: ``i32 type | i32 length`` (its bytes follow)."""
EVENT_TYPE = 0
"""The type field of an event's header (Pravega's EventCommand)."""
NO_APPEND_TIME = -1
"""AppendTimesRead's time of bytes whose append time is not known."""

_HEADER = struct.Struct(">ii")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U64_MASK = (1 << 64) - 1
_FIXED = {"i": "i", "q": "q", "B": "B", "?": "B", "U": "QQ"}


@dataclass(frozen=True, slots=True)
class TableKey:
    """A table key with the version the request expects (or the reply reports)."""

    data: bytes
    key_version: int


@dataclass(frozen=True, slots=True)
class TableValue:
    data: bytes


_TABLE_KEY_HEAD = struct.Struct(">iI")  # payload, data length
_TABLE_VALUE_HEAD = struct.Struct(">iI")


class _Fixed:
    """A run of fixed-width fields read or written with one struct."""

    __slots__ = ("kinds", "packer")

    def __init__(self, kinds: str) -> None:
        self.kinds = kinds
        self.packer = struct.Struct(">" + "".join(_FIXED[k] for k in kinds))


_Step = _Fixed | str


def _compile(layout: str) -> tuple[_Step, ...]:
    steps: list[_Step] = []
    run = ""
    for kind in layout:
        if kind in _FIXED:
            run += kind
            continue
        if kind not in "sbLKE":
            raise ValueError(f"unknown field kind {kind!r}")
        if run:
            steps.append(_Fixed(run))
            run = ""
        steps.append(kind)
    if run:
        steps.append(_Fixed(run))
    return tuple(steps)


class WireCommand:
    """Base of every command: ``TYPE`` is its type code, ``encode()`` its frame."""

    __slots__ = ()
    TYPE: ClassVar[int]
    LAYOUT: ClassVar[str]
    _PLAN: ClassVar[tuple[_Step, ...]]
    _NAMES: ClassVar[tuple[str, ...]]

    def encode(self) -> bytes:
        """The whole frame: type, length, payload."""
        payload = _encode_payload(self._PLAN, [getattr(self, n) for n in self._NAMES])
        return _HEADER.pack(self.TYPE, len(payload)) + payload


C = TypeVar("C", bound=type[WireCommand])


def _command(cls: C) -> C:
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    if len(names) != len(cls.LAYOUT):
        raise TypeError(f"{cls.__name__}: {len(names)} fields, layout {cls.LAYOUT!r}")
    cls._NAMES = names
    cls._PLAN = _compile(cls.LAYOUT)
    return cls


def _put_bytes(out: list[bytes], data: bytes) -> None:
    out.append(_U32.pack(len(data)))
    out.append(data)


def _encode_payload(plan: tuple[_Step, ...], values: list[Any]) -> bytes:
    out: list[bytes] = []
    it = iter(values)
    for step in plan:
        if isinstance(step, _Fixed):
            flat: list[int] = []
            for kind in step.kinds:
                value = next(it)
                if kind == "U":
                    if not 0 <= value < 1 << 128:
                        raise ValueError(f"u128 out of range: {value}")
                    flat += (value >> 64, value & _U64_MASK)
                else:
                    flat.append(int(value))
            out.append(step.packer.pack(*flat))
            continue
        value = next(it)
        if step == "s":
            raw = value.encode()
            out.append(_U16.pack(len(raw)))
            out.append(raw)
        elif step == "b":
            _put_bytes(out, bytes(value))
        elif step == "L":
            out.append(_U32.pack(len(value)))
            out.extend(_I64.pack(v) for v in value)
        elif step == "K":
            out.append(_U32.pack(len(value)))
            for key in value:
                _put_key(out, key)
        else:  # "E"
            out.append(_U32.pack(len(value)))
            for key, table_value in value:
                _put_key(out, key)
                data = table_value.data
                out.append(_TABLE_VALUE_HEAD.pack(len(data) + 4, len(data)))
                out.append(data)
    return b"".join(out)


def _put_key(out: list[bytes], key: TableKey) -> None:
    out.append(_TABLE_KEY_HEAD.pack(4 + len(key.data) + 8, len(key.data)))
    out.append(key.data)
    out.append(_I64.pack(key.key_version))


class _Reader:
    """A cursor over one payload; every read checks the bytes are there."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise WireCommandError(f"payload ends {end - len(self.data)} bytes early")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, packer: struct.Struct) -> tuple[Any, ...]:
        if self.pos + packer.size > len(self.data):
            raise WireCommandError("payload ends early")
        values = packer.unpack_from(self.data, self.pos)
        self.pos += packer.size
        return values

    def count(self, item_min_bytes: int) -> int:
        """A u32 count, refused when its items cannot fit in what is left."""
        (n,) = self.unpack(_U32)
        if n * item_min_bytes > len(self.data) - self.pos:
            raise WireCommandError(f"a count of {n} does not fit in the payload")
        return int(n)

    def key(self) -> TableKey:
        _payload, length = self.unpack(_TABLE_KEY_HEAD)
        data = self.take(length)
        (version,) = self.unpack(_I64)
        return TableKey(data, version)


def _decode_payload(plan: tuple[_Step, ...], data: bytes) -> list[Any]:
    reader = _Reader(data)
    values: list[Any] = []
    for step in plan:
        if isinstance(step, _Fixed):
            raw = reader.unpack(step.packer)
            i = 0
            for kind in step.kinds:
                if kind == "U":
                    values.append((raw[i] << 64) | raw[i + 1])
                    i += 2
                    continue
                value = raw[i]
                i += 1
                if kind == "?":
                    if value > 1:
                        raise WireCommandError(f"a bool is 0 or 1, got {value}")
                    value = bool(value)
                values.append(value)
        elif step == "s":
            (n,) = reader.unpack(_U16)
            try:
                values.append(reader.take(n).decode())
            except UnicodeDecodeError as e:
                raise WireCommandError(f"a string is not UTF-8: {e}") from None
        elif step == "b":
            (n,) = reader.unpack(_U32)
            values.append(reader.take(n))
        elif step == "L":
            n = reader.count(8)
            values.append(tuple(reader.unpack(_I64)[0] for _ in range(n)))
        elif step == "K":
            n = reader.count(16)
            values.append(tuple(reader.key() for _ in range(n)))
        else:  # "E"
            n = reader.count(24)
            entries = []
            for _ in range(n):
                key = reader.key()
                _payload, length = reader.unpack(_TABLE_VALUE_HEAD)
                entries.append((key, TableValue(reader.take(length))))
            values.append(tuple(entries))
    if reader.pos != len(data):
        raise WireCommandError(f"{len(data) - reader.pos} bytes left over in the payload")
    return values


# --- both directions ---------------------------------------------------------------


@_command
@dataclass(frozen=True, slots=True)
class Hello(WireCommand):
    TYPE: ClassVar[int] = -127
    LAYOUT: ClassVar[str] = "ii"
    high_version: int
    low_version: int


@_command
@dataclass(frozen=True, slots=True)
class KeepAlive(WireCommand):
    TYPE: ClassVar[int] = 100
    LAYOUT: ClassVar[str] = ""


# --- requests --------------------------------------------------------------------


@_command
@dataclass(frozen=True, slots=True)
class SetupAppend(WireCommand):
    TYPE: ClassVar[int] = 1
    LAYOUT: ClassVar[str] = "qUss"
    request_id: int
    writer_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class AppendBlockEnd(WireCommand):
    """A block of whole events (each ``i32 0 | i32 length | bytes``) from one
    writer; ``last_event_number`` is the block's last event's number."""

    TYPE: ClassVar[int] = 4
    LAYOUT: ClassVar[str] = "Uibiqq"
    writer_id: int
    size_of_whole_events: int
    data: bytes
    num_event: int
    last_event_number: int
    request_id: int


@_command
@dataclass(frozen=True, slots=True)
class ReadSegment(WireCommand):
    TYPE: ClassVar[int] = 9
    LAYOUT: ClassVar[str] = "sqisq"
    segment: str
    offset: int
    suggested_length: int
    delegation_token: str
    request_id: int


@_command
@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo(WireCommand):
    TYPE: ClassVar[int] = 11
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment_name: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class CreateSegment(WireCommand):
    TYPE: ClassVar[int] = 20
    LAYOUT: ClassVar[str] = "qsiBs"
    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class SealSegment(WireCommand):
    TYPE: ClassVar[int] = 28
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class DeleteSegment(WireCommand):
    TYPE: ClassVar[int] = 30
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class UpdateSegmentPolicy(WireCommand):
    TYPE: ClassVar[int] = 32
    LAYOUT: ClassVar[str] = "qsiBs"
    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class GetSegmentAttribute(WireCommand):
    TYPE: ClassVar[int] = 34
    LAYOUT: ClassVar[str] = "qsUs"
    request_id: int
    segment_name: str
    attribute_id: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class UpdateSegmentAttribute(WireCommand):
    TYPE: ClassVar[int] = 36
    LAYOUT: ClassVar[str] = "qsUqqs"
    request_id: int
    segment_name: str
    attribute_id: int
    new_value: int
    expected_value: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class TruncateSegment(WireCommand):
    TYPE: ClassVar[int] = 38
    LAYOUT: ClassVar[str] = "qsqs"
    request_id: int
    segment: str
    truncation_offset: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class CreateTransientSegment(WireCommand):
    """Create a server-named segment of ``segment``'s (answered SegmentCreated
    with the new name)."""

    TYPE: ClassVar[int] = 40
    LAYOUT: ClassVar[str] = "qUss"
    request_id: int
    writer_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class MergeSegments(WireCommand):
    TYPE: ClassVar[int] = 58
    LAYOUT: ClassVar[str] = "qsss"
    request_id: int
    target: str
    source: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class CreateTableSegment(WireCommand):
    TYPE: ClassVar[int] = 70
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class DeleteTableSegment(WireCommand):
    TYPE: ClassVar[int] = 71
    LAYOUT: ClassVar[str] = "qs?s"
    request_id: int
    segment: str
    must_be_empty: bool
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class MergeTableSegments(WireCommand):
    TYPE: ClassVar[int] = 72
    LAYOUT: ClassVar[str] = "qsss"
    request_id: int
    target: str
    source: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class SealTableSegment(WireCommand):
    TYPE: ClassVar[int] = 73
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class UpdateTableEntries(WireCommand):
    TYPE: ClassVar[int] = 74
    LAYOUT: ClassVar[str] = "qssEq"
    request_id: int
    segment: str
    delegation_token: str
    table_entries: tuple[tuple[TableKey, TableValue], ...]
    table_segment_offset: int


@_command
@dataclass(frozen=True, slots=True)
class RemoveTableKeys(WireCommand):
    TYPE: ClassVar[int] = 76
    LAYOUT: ClassVar[str] = "qssKq"
    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]
    table_segment_offset: int


@_command
@dataclass(frozen=True, slots=True)
class ReadTable(WireCommand):
    TYPE: ClassVar[int] = 78
    LAYOUT: ClassVar[str] = "qssK"
    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]


@_command
@dataclass(frozen=True, slots=True)
class ReadTableKeys(WireCommand):
    TYPE: ClassVar[int] = 83
    LAYOUT: ClassVar[str] = "qssib"
    request_id: int
    segment: str
    delegation_token: str
    suggested_key_count: int
    continuation_token: bytes


@_command
@dataclass(frozen=True, slots=True)
class ReadTableEntries(WireCommand):
    TYPE: ClassVar[int] = 85
    LAYOUT: ClassVar[str] = "qssib"
    request_id: int
    segment: str
    delegation_token: str
    suggested_entry_count: int
    continuation_token: bytes


@_command
@dataclass(frozen=True, slots=True)
class ReadTableEntriesDelta(WireCommand):
    TYPE: ClassVar[int] = 88
    LAYOUT: ClassVar[str] = "qssqi"
    request_id: int
    segment: str
    delegation_token: str
    from_position: int
    suggested_entry_count: int


@_command
@dataclass(frozen=True, slots=True)
class ConditionalBlockEnd(WireCommand):
    """Raw bytes appended only if the segment's length is ``expected_offset``."""

    TYPE: ClassVar[int] = 89
    LAYOUT: ClassVar[str] = "Uqqbq"
    writer_id: int
    event_number: int
    expected_offset: int
    data: bytes
    request_id: int


@_command
@dataclass(frozen=True, slots=True)
class ReadAppendTimes(WireCommand):
    """Quire only: when the bytes ``start .. end`` of a segment were appended."""

    TYPE: ClassVar[int] = 1001
    LAYOUT: ClassVar[str] = "qsqqs"
    request_id: int
    segment: str
    start: int
    end: int
    delegation_token: str


@_command
@dataclass(frozen=True, slots=True)
class LocateAppendTime(WireCommand):
    """Quire only: where a segment's first bytes appended at or after ``time_ms`` are."""

    TYPE: ClassVar[int] = 1003
    LAYOUT: ClassVar[str] = "qsqs"
    request_id: int
    segment: str
    time_ms: int
    delegation_token: str


# --- replies --------------------------------------------------------------------


@_command
@dataclass(frozen=True, slots=True)
class AppendSetup(WireCommand):
    TYPE: ClassVar[int] = 2
    LAYOUT: ClassVar[str] = "qsUq"
    request_id: int
    segment: str
    writer_id: int
    last_event_number: int


@_command
@dataclass(frozen=True, slots=True)
class DataAppended(WireCommand):
    TYPE: ClassVar[int] = 7
    LAYOUT: ClassVar[str] = "Uqqqq"
    writer_id: int
    event_number: int
    previous_event_number: int
    request_id: int
    current_segment_write_offset: int


@_command
@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed(WireCommand):
    TYPE: ClassVar[int] = 8
    LAYOUT: ClassVar[str] = "Uqq"
    writer_id: int
    event_number: int
    request_id: int


@_command
@dataclass(frozen=True, slots=True)
class SegmentRead(WireCommand):
    TYPE: ClassVar[int] = 10
    LAYOUT: ClassVar[str] = "sq??bq"
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int


@_command
@dataclass(frozen=True, slots=True)
class StreamSegmentInfo(WireCommand):
    TYPE: ClassVar[int] = 12
    LAYOUT: ClassVar[str] = "qs???qqq"
    request_id: int
    segment_name: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int


@_command
@dataclass(frozen=True, slots=True)
class SegmentCreated(WireCommand):
    TYPE: ClassVar[int] = 21
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentSealed(WireCommand):
    TYPE: ClassVar[int] = 29
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentDeleted(WireCommand):
    TYPE: ClassVar[int] = 31
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentPolicyUpdated(WireCommand):
    TYPE: ClassVar[int] = 33
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentAttribute(WireCommand):
    TYPE: ClassVar[int] = 35
    LAYOUT: ClassVar[str] = "qq"
    request_id: int
    value: int


@_command
@dataclass(frozen=True, slots=True)
class SegmentAttributeUpdated(WireCommand):
    TYPE: ClassVar[int] = 37
    LAYOUT: ClassVar[str] = "q?"
    request_id: int
    success: bool


@_command
@dataclass(frozen=True, slots=True)
class SegmentTruncated(WireCommand):
    TYPE: ClassVar[int] = 39
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class WrongHost(WireCommand):
    TYPE: ClassVar[int] = 50
    LAYOUT: ClassVar[str] = "qsss"
    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentIsSealed(WireCommand):
    TYPE: ClassVar[int] = 51
    LAYOUT: ClassVar[str] = "qssq"
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@_command
@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists(WireCommand):
    TYPE: ClassVar[int] = 52
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class NoSuchSegment(WireCommand):
    TYPE: ClassVar[int] = 53
    LAYOUT: ClassVar[str] = "qssq"
    request_id: int
    segment: str
    server_stack_trace: str
    offset: int


@_command
@dataclass(frozen=True, slots=True)
class InvalidEventNumber(WireCommand):
    TYPE: ClassVar[int] = 55
    LAYOUT: ClassVar[str] = "Uqs"
    writer_id: int
    event_number: int
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentIsTruncated(WireCommand):
    TYPE: ClassVar[int] = 56
    LAYOUT: ClassVar[str] = "qsqsq"
    request_id: int
    segment: str
    start_offset: int
    server_stack_trace: str
    offset: int


@_command
@dataclass(frozen=True, slots=True)
class OperationUnsupported(WireCommand):
    TYPE: ClassVar[int] = 57
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    operation_name: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class SegmentsMerged(WireCommand):
    TYPE: ClassVar[int] = 59
    LAYOUT: ClassVar[str] = "qssq"
    request_id: int
    target: str
    source: str
    new_target_write_offset: int


@_command
@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed(WireCommand):
    TYPE: ClassVar[int] = 60
    LAYOUT: ClassVar[str] = "qsi"
    request_id: int
    server_stack_trace: str
    error_code: int


@_command
@dataclass(frozen=True, slots=True)
class ErrorMessage(WireCommand):
    TYPE: ClassVar[int] = 61
    LAYOUT: ClassVar[str] = "qssi"
    request_id: int
    segment: str
    message: str
    error_code: int


@_command
@dataclass(frozen=True, slots=True)
class TableEntriesUpdated(WireCommand):
    TYPE: ClassVar[int] = 75
    LAYOUT: ClassVar[str] = "qL"
    request_id: int
    updated_versions: tuple[int, ...]


@_command
@dataclass(frozen=True, slots=True)
class TableKeysRemoved(WireCommand):
    TYPE: ClassVar[int] = 77
    LAYOUT: ClassVar[str] = "qs"
    request_id: int
    segment: str


@_command
@dataclass(frozen=True, slots=True)
class TableRead(WireCommand):
    TYPE: ClassVar[int] = 79
    LAYOUT: ClassVar[str] = "qsE"
    request_id: int
    segment: str
    entries: tuple[tuple[TableKey, TableValue], ...]


@_command
@dataclass(frozen=True, slots=True)
class TableSegmentNotEmpty(WireCommand):
    TYPE: ClassVar[int] = 80
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class TableKeyDoesNotExist(WireCommand):
    TYPE: ClassVar[int] = 81
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class TableKeyBadVersion(WireCommand):
    TYPE: ClassVar[int] = 82
    LAYOUT: ClassVar[str] = "qss"
    request_id: int
    segment: str
    server_stack_trace: str


@_command
@dataclass(frozen=True, slots=True)
class TableKeysRead(WireCommand):
    TYPE: ClassVar[int] = 84
    LAYOUT: ClassVar[str] = "qsKb"
    request_id: int
    segment: str
    keys: tuple[TableKey, ...]
    continuation_token: bytes


@_command
@dataclass(frozen=True, slots=True)
class TableEntriesRead(WireCommand):
    TYPE: ClassVar[int] = 86
    LAYOUT: ClassVar[str] = "qsEb"
    request_id: int
    segment: str
    entries: tuple[tuple[TableKey, TableValue], ...]
    continuation_token: bytes


@_command
@dataclass(frozen=True, slots=True)
class TableEntriesDeltaRead(WireCommand):
    TYPE: ClassVar[int] = 87
    LAYOUT: ClassVar[str] = "qsE??q"
    request_id: int
    segment: str
    entries: tuple[tuple[TableKey, TableValue], ...]
    should_clear: bool
    reached_end: bool
    last_position: int


@_command
@dataclass(frozen=True, slots=True)
class AppendTimesRead(WireCommand):
    """Quire only: the answer to ReadAppendTimes: bytes from ``offsets[i]``
    (up to the next) were appended at ``times[i]`` (ms; :data:`NO_APPEND_TIME`:
    not known); and how much of the segment tier-2 holds."""

    TYPE: ClassVar[int] = 1002
    LAYOUT: ClassVar[str] = "qsqLL"
    request_id: int
    segment: str
    storage_length: int
    offsets: tuple[int, ...]
    times: tuple[int, ...]


@_command
@dataclass(frozen=True, slots=True)
class AppendTimeLocated(WireCommand):
    """Quire only: the answer to LocateAppendTime: the offset (an append's
    start, so an event boundary), or the segment's length if nothing was
    appended at or after the time."""

    TYPE: ClassVar[int] = 1004
    LAYOUT: ClassVar[str] = "qsq"
    request_id: int
    segment: str
    offset: int


def _by_type(*classes: type[WireCommand]) -> Mapping[int, type[WireCommand]]:
    table = {c.TYPE: c for c in classes}
    if len(table) != len(classes):
        raise TypeError("two commands share a type code")
    return table


REQUEST_TYPES: Mapping[int, type[WireCommand]] = _by_type(
    Hello, KeepAlive, SetupAppend, AppendBlockEnd, ReadSegment, GetStreamSegmentInfo,
    CreateSegment, SealSegment, DeleteSegment, UpdateSegmentPolicy, GetSegmentAttribute,
    UpdateSegmentAttribute, TruncateSegment, CreateTransientSegment, MergeSegments,
    CreateTableSegment, DeleteTableSegment, MergeTableSegments, SealTableSegment,
    UpdateTableEntries, RemoveTableKeys, ReadTable, ReadTableKeys, ReadTableEntries,
    ReadTableEntriesDelta, ConditionalBlockEnd, ReadAppendTimes, LocateAppendTime)
"""What a server decodes (``Decoder(REQUEST_TYPES)``)."""

REPLY_TYPES: Mapping[int, type[WireCommand]] = _by_type(
    Hello, KeepAlive, AppendSetup, DataAppended, ConditionalCheckFailed, SegmentRead,
    StreamSegmentInfo, SegmentCreated, SegmentSealed, SegmentDeleted, SegmentPolicyUpdated,
    SegmentAttribute, SegmentAttributeUpdated, SegmentTruncated, WrongHost, SegmentIsSealed,
    SegmentAlreadyExists, NoSuchSegment, InvalidEventNumber, SegmentIsTruncated,
    OperationUnsupported, SegmentsMerged, AuthTokenCheckFailed, ErrorMessage,
    TableEntriesUpdated, TableKeysRemoved, TableRead, TableSegmentNotEmpty,
    TableKeyDoesNotExist, TableKeyBadVersion, TableKeysRead, TableEntriesRead,
    TableEntriesDeltaRead, AppendTimesRead, AppendTimeLocated)
"""What a client decodes (``Decoder(REPLY_TYPES)``)."""


def decode_payload(cls: type[WireCommand], payload: bytes) -> WireCommand:
    """One command of type ``cls`` from its whole payload (WireCommandError if
    it does not parse exactly)."""
    try:
        values = _decode_payload(cls._PLAN, payload)
    except struct.error as e:  # a defect of the plan, reported as the input's
        raise WireCommandError(f"{cls.__name__}: {e}") from None
    return cls(*values)


class Decoder:
    """Incremental decoder of one direction of one connection.

    ``Decoder(REQUEST_TYPES)`` is a server's side, ``Decoder(REPLY_TYPES)`` a
    client's.  Feed bytes as they arrive, then take whole commands::

        decoder.feed(data)
        for command in decoder:
            ...

    A frame's length is checked when its header is complete, before its
    payload is waited for.  Malformed input raises
    :class:`~quire.errors.WireCommandError`; the decoder then refuses further
    use (the stream position is lost: close the connection).
    """

    __slots__ = ("_broken", "_buf", "_pos", "max_frame_bytes", "types")

    def __init__(self, types: Mapping[int, type[WireCommand]] = REQUEST_TYPES,
                 max_frame_bytes: int = MAX_WIRECOMMAND_SIZE) -> None:
        self.types = types
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._broken = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._broken:
            raise WireCommandError("decoder already failed; close the connection")
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[WireCommand]:
        while (command := self.next()) is not None:
            yield command

    def next(self) -> WireCommand | None:
        """The next whole command, or None until more bytes arrive."""
        if self._broken:
            raise WireCommandError("decoder already failed; close the connection")
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < _HEADER.size:
            return None
        type_code, length = _HEADER.unpack_from(buf, pos)
        try:
            cls = self.types.get(type_code)
            if cls is None:
                raise WireCommandError(f"unknown command type {type_code}")
            if not 0 <= length <= self.max_frame_bytes:
                raise WireCommandError(f"{cls.__name__}: payload length {length} is not in "
                                       f"0..{self.max_frame_bytes}")
            end = pos + _HEADER.size + length
            if len(buf) < end:
                return None
            command = decode_payload(cls, bytes(buf[pos + _HEADER.size:end]))
        except WireCommandError:
            self._broken = True
            raise
        self._pos = end
        return command
