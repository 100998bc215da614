"""quire.pravega_wire: golden bytes of every command (written by hand from the
layout in the package docstring), hypothesis round trips, and a fuzz of the
decoder (any input gives commands or WireCommandError, nothing else)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quire.errors import WireCommandError
from quire.pravega_wire import (
    REPLY_TYPES,
    REQUEST_TYPES,
    AppendBlockEnd,
    AppendSetup,
    AppendTimeLocated,
    AppendTimesRead,
    AuthTokenCheckFailed,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    DataAppended,
    Decoder,
    DeleteSegment,
    DeleteTableSegment,
    ErrorMessage,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateAppendTime,
    MergeSegments,
    MergeTableSegments,
    NoSuchSegment,
    OperationUnsupported,
    ReadAppendTimes,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SealTableSegment,
    SegmentAlreadyExists,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentPolicyUpdated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    StreamSegmentInfo,
    TableEntriesDeltaRead,
    TableEntriesRead,
    TableEntriesUpdated,
    TableKey,
    TableKeyBadVersion,
    TableKeyDoesNotExist,
    TableKeysRead,
    TableKeysRemoved,
    TableRead,
    TableSegmentNotEmpty,
    TableValue,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
    WrongHost,
)

I64_MIN = -(1 << 63)
W = 0x0102030405060708090A0B0C0D0E0F10
# Field pieces, in hex, as the layout says.
HW = "0102030405060708 090a0b0c0d0e0f10"  # u128 W
R7 = "0000000000000007"  # i64 request id 7
SCST = "0005 73632f7374"  # str "sc/st"
T = "0001 74"  # str "t"
EMPTY = "0000"  # str ""
KEY_K = "0000000d 00000001 6b"  # TableKey b"k": payload 4+1+8, data (version follows)

GOLDEN: list[tuple[WireCommand, int, str]] = [
    (Hello(15, 5), -127, "0000000f 00000005"),
    (KeepAlive(), 100, ""),
    # requests
    (SetupAppend(7, W, "sc/st", ""), 1, f"{R7} {HW} {SCST} {EMPTY}"),
    (AppendBlockEnd(W, 10, b"\0\0\0\0\0\0\0\x02hi", 1, 3, 7), 4,
     f"{HW} 0000000a 0000000a 00000000 00000002 6869 00000001 0000000000000003 {R7}"),
    (ReadSegment("sc/st", 16, 1024, "", 7), 9,
     f"{SCST} 0000000000000010 00000400 {EMPTY} {R7}"),
    (GetStreamSegmentInfo(7, "sc/st", ""), 11, f"{R7} {SCST} {EMPTY}"),
    (CreateSegment(7, "sc/st", 0, 0, ""), 20, f"{R7} {SCST} 00000000 00 {EMPTY}"),
    (SealSegment(7, "sc/st", "tok"), 28, f"{R7} {SCST} 0003 746f6b"),
    (DeleteSegment(7, "sc/st", ""), 30, f"{R7} {SCST} {EMPTY}"),
    (UpdateSegmentPolicy(7, "sc/st", 100, 1, ""), 32, f"{R7} {SCST} 00000064 01 {EMPTY}"),
    (GetSegmentAttribute(7, "sc/st", W, ""), 34, f"{R7} {SCST} {HW} {EMPTY}"),
    (UpdateSegmentAttribute(7, "sc/st", W, 5, I64_MIN, ""), 36,
     f"{R7} {SCST} {HW} 0000000000000005 8000000000000000 {EMPTY}"),
    (TruncateSegment(7, "sc/st", 100, ""), 38, f"{R7} {SCST} 0000000000000064 {EMPTY}"),
    (CreateTransientSegment(7, W, "sc/st", ""), 40, f"{R7} {HW} {SCST} {EMPTY}"),
    (MergeSegments(7, "a", "b", ""), 58, f"{R7} 0001 61 0001 62 {EMPTY}"),
    (CreateTableSegment(7, "sc/st", ""), 70, f"{R7} {SCST} {EMPTY}"),
    (DeleteTableSegment(7, "sc/st", True, ""), 71, f"{R7} {SCST} 01 {EMPTY}"),
    (MergeTableSegments(7, "a", "b", ""), 72, f"{R7} 0001 61 0001 62 {EMPTY}"),
    (SealTableSegment(7, "sc/st", ""), 73, f"{R7} {SCST} {EMPTY}"),
    (UpdateTableEntries(7, "t", "", ((TableKey(b"k", -1), TableValue(b"v")),), -1), 74,
     f"{R7} {T} {EMPTY} 00000001 {KEY_K} ffffffffffffffff 00000005 00000001 76 "
     "ffffffffffffffff"),
    (RemoveTableKeys(7, "t", "", (TableKey(b"k", 8),), -1), 76,
     f"{R7} {T} {EMPTY} 00000001 {KEY_K} 0000000000000008 ffffffffffffffff"),
    (ReadTable(7, "t", "", (TableKey(b"k", I64_MIN),)), 78,
     f"{R7} {T} {EMPTY} 00000001 {KEY_K} 8000000000000000"),
    (ReadTableKeys(7, "t", "", 10, b""), 83, f"{R7} {T} {EMPTY} 0000000a 00000000"),
    (ReadTableEntries(7, "t", "", 10, b"\x01"), 85, f"{R7} {T} {EMPTY} 0000000a 00000001 01"),
    (ReadTableEntriesDelta(7, "t", "", 32, 100), 88,
     f"{R7} {T} {EMPTY} 0000000000000020 00000064"),
    (ConditionalBlockEnd(W, 3, 16, b"hi", 7), 89,
     f"{HW} 0000000000000003 0000000000000010 00000002 6869 {R7}"),
    # Quire's own requests
    (ReadAppendTimes(7, "sc/st", 16, 100, ""), 1001,
     f"{R7} {SCST} 0000000000000010 0000000000000064 {EMPTY}"),
    (LocateAppendTime(7, "sc/st", 1000, "tok"), 1003,
     f"{R7} {SCST} 00000000000003e8 0003 746f6b"),
    # replies
    (AppendSetup(7, "sc/st", W, I64_MIN), 2, f"{R7} {SCST} {HW} 8000000000000000"),
    (DataAppended(W, 3, 2, 7, 100), 7,
     f"{HW} 0000000000000003 0000000000000002 {R7} 0000000000000064"),
    (ConditionalCheckFailed(W, 3, 7), 8, f"{HW} 0000000000000003 {R7}"),
    (SegmentRead("sc/st", 16, True, False, b"hi", 7), 10,
     f"{SCST} 0000000000000010 01 00 00000002 6869 {R7}"),
    (StreamSegmentInfo(7, "sc/st", True, False, False, 1000, 100, 10), 12,
     f"{R7} {SCST} 01 00 00 00000000000003e8 0000000000000064 000000000000000a"),
    (SegmentCreated(7, "sc/st"), 21, f"{R7} {SCST}"),
    (SegmentSealed(7, "sc/st"), 29, f"{R7} {SCST}"),
    (SegmentDeleted(7, "sc/st"), 31, f"{R7} {SCST}"),
    (SegmentPolicyUpdated(7, "sc/st"), 33, f"{R7} {SCST}"),
    (SegmentAttribute(7, -1), 35, f"{R7} ffffffffffffffff"),
    (SegmentAttributeUpdated(7, True), 37, f"{R7} 01"),
    (SegmentTruncated(7, "sc/st"), 39, f"{R7} {SCST}"),
    (WrongHost(7, "sc/st", "h:1", ""), 50, f"{R7} {SCST} 0003 683a31 {EMPTY}"),
    (SegmentIsSealed(7, "sc/st", "", 100), 51, f"{R7} {SCST} {EMPTY} 0000000000000064"),
    (SegmentAlreadyExists(7, "sc/st", ""), 52, f"{R7} {SCST} {EMPTY}"),
    (NoSuchSegment(7, "sc/st", "", -1), 53, f"{R7} {SCST} {EMPTY} ffffffffffffffff"),
    (InvalidEventNumber(W, 3, ""), 55, f"{HW} 0000000000000003 {EMPTY}"),
    (SegmentIsTruncated(7, "sc/st", 10, "", 5), 56,
     f"{R7} {SCST} 000000000000000a {EMPTY} 0000000000000005"),
    (OperationUnsupported(7, "x", ""), 57, f"{R7} 0001 78 {EMPTY}"),
    (SegmentsMerged(7, "a", "b", 100), 59, f"{R7} 0001 61 0001 62 0000000000000064"),
    (AuthTokenCheckFailed(7, "", 1), 60, f"{R7} {EMPTY} 00000001"),
    (ErrorMessage(7, "sc/st", "m", -1), 61, f"{R7} {SCST} 0001 6d ffffffff"),
    (TableEntriesUpdated(7, (13, 40)), 75,
     f"{R7} 00000002 000000000000000d 0000000000000028"),
    (TableKeysRemoved(7, "sc/st"), 77, f"{R7} {SCST}"),
    (TableRead(7, "t", ((TableKey(b"k", 0), TableValue(b"")),)), 79,
     f"{R7} {T} 00000001 {KEY_K} 0000000000000000 00000004 00000000"),
    (TableSegmentNotEmpty(7, "t", ""), 80, f"{R7} {T} {EMPTY}"),
    (TableKeyDoesNotExist(7, "t", ""), 81, f"{R7} {T} {EMPTY}"),
    (TableKeyBadVersion(7, "t", ""), 82, f"{R7} {T} {EMPTY}"),
    (TableKeysRead(7, "t", (), b"\x02"), 84, f"{R7} {T} 00000000 00000001 02"),
    (TableEntriesRead(7, "t", (), b""), 86, f"{R7} {T} 00000000 00000000"),
    (TableEntriesDeltaRead(7, "t", ((TableKey(b"k", 5), TableValue(b"v")),), False, True, 14),
     87, f"{R7} {T} 00000001 {KEY_K} 0000000000000005 00000005 00000001 76 00 01 "
     "000000000000000e"),
    # Quire's own replies
    (AppendTimesRead(7, "sc/st", 64, (16, 40), (1000, -1)), 1002,
     f"{R7} {SCST} 0000000000000040 00000002 0000000000000010 0000000000000028 "
     "00000002 00000000000003e8 ffffffffffffffff"),
    (AppendTimeLocated(7, "sc/st", 40), 1004, f"{R7} {SCST} 0000000000000028"),
]


def frame(type_code: int, payload_hex: str) -> bytes:
    payload = bytes.fromhex(payload_hex.replace(" ", ""))
    return type_code.to_bytes(4, "big", signed=True) + len(payload).to_bytes(4, "big") + payload


def test_every_command_has_a_golden_case() -> None:
    covered = {type(c) for c, _, _ in GOLDEN}
    assert covered == set(REQUEST_TYPES.values()) | set(REPLY_TYPES.values())


@pytest.mark.parametrize(("command", "type_code", "payload"), GOLDEN,
                         ids=[type(c).__name__ for c, _, _ in GOLDEN])
def test_golden_bytes(command: WireCommand, type_code: int, payload: str) -> None:
    expected = frame(type_code, payload)
    assert command.encode() == expected
    types = REQUEST_TYPES if type(command) in REQUEST_TYPES.values() else REPLY_TYPES
    decoder = Decoder(types)
    decoder.feed(expected)
    assert list(decoder) == [command]
    assert decoder.buffered_bytes == 0


# --- round trips ------------------------------------------------------------------

_I32 = st.integers(-(1 << 31), (1 << 31) - 1)
_I64 = st.integers(I64_MIN, (1 << 63) - 1)
_KEY = st.builds(TableKey, st.binary(max_size=20), _I64)
_VALUE = st.builds(TableValue, st.binary(max_size=20))
_FIELD = {
    "i": _I32, "q": _I64, "B": st.integers(0, 255), "?": st.booleans(),
    "U": st.integers(0, (1 << 128) - 1), "s": st.text(max_size=20), "b": st.binary(max_size=40),
    "L": st.lists(_I64, max_size=4).map(tuple),
    "K": st.lists(_KEY, max_size=3).map(tuple),
    "E": st.lists(st.tuples(_KEY, _VALUE), max_size=3).map(tuple),
}
ALL_TYPES = sorted({*REQUEST_TYPES.values(), *REPLY_TYPES.values()}, key=lambda c: c.TYPE)


def commands_of(cls: type[WireCommand]) -> st.SearchStrategy[WireCommand]:
    return st.tuples(*(_FIELD[k] for k in cls.LAYOUT)).map(lambda values: cls(*values))


COMMANDS = st.sampled_from(ALL_TYPES).flatmap(commands_of)
SETTINGS = settings(deadline=None, max_examples=200,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(COMMANDS, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_round_trip_in_any_chunks(commands: list[WireCommand], rnd: random.Random) -> None:
    stream = b"".join(c.encode() for c in commands)
    decoder = Decoder({c.TYPE: c for c in ALL_TYPES})
    out: list[WireCommand] = []
    at = 0
    while at < len(stream):
        step = rnd.randint(1, 64)
        decoder.feed(stream[at:at + step])
        at += step
        out += decoder
    assert out == commands
    assert decoder.buffered_bytes == 0


# --- malformed input ----------------------------------------------------------------


def test_oversized_length_refused_from_the_header_alone() -> None:
    decoder = Decoder(REQUEST_TYPES, max_frame_bytes=1000)
    decoder.feed((4).to_bytes(4, "big") + (1001).to_bytes(4, "big"))
    with pytest.raises(WireCommandError, match="payload length 1001"):
        decoder.next()
    with pytest.raises(WireCommandError):
        decoder.feed(b"x")


@pytest.mark.parametrize(("data", "why"), [
    ((4).to_bytes(4, "big") + (-1).to_bytes(4, "big", signed=True), "payload length -1"),
    (frame(12345, ""), "unknown command type 12345"),
    (frame(7, ""), "unknown command type 7"),  # a reply sent to a server
    (frame(-127, "0000000f 00000005 00"), "left over"),
    (frame(-127, "0000000f"), "ends"),
    (frame(71, f"{R7} {SCST} 02 {EMPTY}"), "a bool is 0 or 1"),
    (frame(11, f"{R7} 0002 ff fe {EMPTY}"), "not UTF-8"),
    (frame(76, f"{R7} {T} {EMPTY} 7fffffff"), "does not fit"),
    (frame(4, f"{HW} 00000000 ffffffff"), "ends"),
])
def test_malformed_frames(data: bytes, why: str) -> None:
    decoder = Decoder(REQUEST_TYPES)
    decoder.feed(data)
    with pytest.raises(WireCommandError, match=why):
        decoder.next()


def _decode_all(types: dict[int, type[WireCommand]], data: bytes) -> int:
    decoder = Decoder(types, max_frame_bytes=1 << 16)
    decoder.feed(data)
    count = 0
    try:
        for _ in decoder:
            count += 1
    except WireCommandError:
        pass
    return count


@SETTINGS
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_all(dict(REQUEST_TYPES), data)
    _decode_all(dict(REPLY_TYPES), data)


@SETTINGS
@given(st.lists(COMMANDS, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_fuzz_mutated_frames(commands: list[WireCommand], rnd: random.Random) -> None:
    data = bytearray(b"".join(c.encode() for c in commands))
    for _ in range(rnd.randint(1, 4)):
        what = rnd.randrange(3)
        at = rnd.randrange(len(data))
        if what == 0:
            data[at] = rnd.randrange(256)
        elif what == 1:
            del data[at:at + rnd.randint(1, 8)]
        else:
            data[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        if not data:
            return
    decoded = _decode_all({c.TYPE: c for c in ALL_TYPES}, bytes(data))
    assert decoded <= len(data) // 8
