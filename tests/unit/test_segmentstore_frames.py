"""Part frames: an operation too large for one frame, split and reassembled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quire.errors import CorruptRecordError
from quire.segmentstore import frames


def test_a_part_frame_has_its_documented_layout() -> None:
    parts = frames.split(b"abcdefghij", max_frame_bytes=frames.PART_OVERHEAD + 4)
    assert parts == [
        b"QSP1" + b"\x00\x00\x00\x0a" + b"\x00\x00\x00\x00" + b"abcd",
        b"QSP1" + b"\x00\x00\x00\x0a" + b"\x00\x00\x00\x04" + b"efgh",
        b"QSP1" + b"\x00\x00\x00\x0a" + b"\x00\x00\x00\x08" + b"ij",
    ]
    assert all(frames.is_part(p) for p in parts)
    assert not frames.is_part(frames.join(0, []))


@given(data=st.binary(min_size=1, max_size=3000), room=st.integers(1, 700))
def test_parts_reassemble_to_the_operation_with_the_first_tag(data: bytes, room: int) -> None:
    parts = frames.split(data, frames.PART_OVERHEAD + room)
    assert all(len(p) <= frames.PART_OVERHEAD + room for p in parts)
    assembler: frames.PartAssembler[int] = frames.PartAssembler()
    results = [assembler.add(p, tag) for tag, p in enumerate(parts, start=7)]
    assert results[:-1] == [None] * (len(parts) - 1)
    assert results[-1] == (data, 7)
    assert not assembler.pending


def test_parts_cut_short_are_dropped_when_another_operation_starts() -> None:
    first = frames.split(b"x" * 30, frames.PART_OVERHEAD + 10)
    second = frames.split(b"y" * 15, frames.PART_OVERHEAD + 10)
    assembler: frames.PartAssembler[str] = frames.PartAssembler()
    assert assembler.add(first[0], "a") is None
    assert assembler.add(first[1], "b") is None  # the third part never came
    assert assembler.add(second[0], "c") is None
    assert assembler.add(first[2], "d") is None  # a stray part is not a continuation
    assert not assembler.pending
    assert assembler.add(second[0], "e") is None
    assert assembler.add(second[1], "f") == (b"y" * 15, "e")


def test_a_part_overrunning_its_operation_is_refused() -> None:
    part = frames.split(b"z" * 8, frames.PART_OVERHEAD + 8)[0]
    forged = part[:4] + b"\x00\x00\x00\x04" + part[8:]
    with pytest.raises(CorruptRecordError, match="overruns"):
        frames.PartAssembler[int]().add(forged, 0)
