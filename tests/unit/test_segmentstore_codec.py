"""The segment store's sans-IO codecs: operations (golden bytes, round trips,
malformed input) and data frames (packing limits, round trips)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quire.errors import CorruptRecordError
from quire.segmentstore import frames
from quire.segmentstore.operations import (
    AppendOp,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    ProbeOp,
    SealOp,
    SegmentMapOp,
    TruncateOp,
    decode,
    encode,
)
from quire.segmentstore.types import SegmentType

GOLDEN: list[tuple[Operation, str]] = [
    (SegmentMapOp(1, 2, 3, "a/b", SegmentType.TABLE, ((5, -1),)),
     "01" "0000000000000001" "0000000000000002" "0000000000000003" "03" "0003" "612f62"
     "00000001" "00000000000000000000000000000005" "ffffffffffffffff"),
    (AppendOp(4, 5, 6, 7, b"hi", (((1 << 127) | 9, 10),)),
     "02" "0000000000000004" "0000000000000005" "0000000000000006" "0000000000000007"
     "00000001" "80000000000000000000000000000009" "000000000000000a" "00000002" "6869"),
    (SealOp(8, 9, 10), "03" "0000000000000008" "0000000000000009" "000000000000000a"),
    (TruncateOp(11, 12, 13, 14),
     "04" "000000000000000b" "000000000000000c" "000000000000000d" "000000000000000e"),
    (DeleteOp(15, 16, 17), "05" "000000000000000f" "0000000000000010" "0000000000000011"),
    (AttributesOp(18, 19, 20, ((21, 22),)),
     "06" "0000000000000012" "0000000000000013" "0000000000000014"
     "00000001" "00000000000000000000000000000015" "0000000000000016"),
    (CheckpointOp(23, 24, b"{}"), "07" "0000000000000017" "0000000000000018" "00000002" "7b7d"),
    (MergeOp(25, 26, 27, 28, 29, 30),
     "08" "0000000000000019" "000000000000001a" "000000000000001b" "000000000000001c"
     "000000000000001d" "000000000000001e"),
    (ProbeOp(31, 32), "09" "000000000000001f" "0000000000000020"),
]


@pytest.mark.parametrize(("op", "golden"), GOLDEN, ids=lambda v: type(v).__name__)
def test_golden_bytes(op: Operation, golden: str) -> None:
    assert encode(op).hex() == golden
    assert decode(bytes.fromhex(golden)) == op


@pytest.mark.parametrize(("op", "golden"), GOLDEN, ids=lambda v: type(v).__name__)
def test_every_cut_and_extension_is_refused(op: Operation, golden: str) -> None:
    raw = bytes.fromhex(golden)
    for n in range(len(raw)):
        with pytest.raises(CorruptRecordError):
            decode(raw[:n])
    with pytest.raises(CorruptRecordError):
        decode(raw + b"\0")


def test_unknown_kind_and_segment_type_are_refused() -> None:
    with pytest.raises(CorruptRecordError, match="kind"):
        decode(bytes([10]) + bytes(16))
    raw = bytearray(bytes.fromhex(GOLDEN[0][1]))
    raw[25] = 99  # the segment type
    with pytest.raises(CorruptRecordError, match="segment type"):
        decode(bytes(raw))


u64 = st.integers(0, (1 << 64) - 1)
attributes = st.lists(st.tuples(st.integers(0, (1 << 128) - 1),
                                st.integers(-(1 << 63), (1 << 63) - 1)),
                      max_size=4).map(tuple)
operations = st.one_of(
    st.builds(SegmentMapOp, u64, u64, u64, st.text(min_size=1, max_size=40),
              st.sampled_from(SegmentType), attributes),
    st.builds(AppendOp, u64, u64, u64, u64, st.binary(max_size=300), attributes),
    st.builds(SealOp, u64, u64, u64),
    st.builds(TruncateOp, u64, u64, u64, u64),
    st.builds(DeleteOp, u64, u64, u64),
    st.builds(AttributesOp, u64, u64, u64, attributes),
    st.builds(CheckpointOp, u64, u64, st.binary(max_size=100)),
    st.builds(MergeOp, u64, u64, u64, u64, u64, u64),
    st.builds(ProbeOp, u64, u64),
)


@given(operations)
def test_operations_round_trip(op: Operation) -> None:
    assert decode(encode(op)) == op


@given(st.lists(operations, max_size=30), st.integers(64, 2000))
def test_frames_round_trip_in_order_within_the_limit(ops: list[Operation], limit: int) -> None:
    raws = [encode(op) for op in ops]
    built: list[bytes] = []
    builder = frames.FrameBuilder(limit)
    for raw in raws:
        if not builder.add(raw):
            built.append(builder.build())
            assert builder.add(raw)  # an empty builder takes anything
    if len(builder):
        built.append(builder.build())
    for frame in built:
        count = len(frames.unpack(frame))
        assert count >= 1
        assert len(frame) <= limit or count == 1  # only a lone operation may exceed it
    assert [decode(raw) for frame in built for raw in frames.unpack(frame)] == ops


def test_frame_builder_size_and_malformed_frames() -> None:
    builder = frames.FrameBuilder(100)
    assert builder.add(b"x" * 50) and builder.size == 8 + 4 + 50
    assert not builder.add(b"y" * 40)  # 62 + 44 > 100
    assert len(builder) == 1
    frame = builder.build()
    assert frame == b"QSF1\0\0\0\x01\0\0\0\x32" + b"x" * 50
    assert len(builder) == 0 and builder.build() == b"QSF1\0\0\0\0"
    for bad in (b"", b"QSF2\0\0\0\0", frame[:-1], frame + b"z", b"QSF1\0\0\0\x02" + frame[8:]):
        with pytest.raises(CorruptRecordError):
            frames.unpack(bad)
    with pytest.raises(ValueError):
        frames.FrameBuilder(12)
