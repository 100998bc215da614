"""Unit tests of the stream source's sans-Spark parts: option parsing, the
event splitter, and the cut planner over an in-memory stream (fakes of the
controller and segment store seams, one layer only)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow  # noqa: F401  (a missing dependency fails, never skips)
import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest

from quire.errors import ProtocolError, SegmentNotFoundError
from quire.segmentstore import ReadResult, SegmentInfo, SegmentType
from quire.spark.stream_options import StreamOptions, parse_cut
from quire.spark.stream_plan import Budget, CutPlanner, StreamDataLossError
from quire.spark.stream_read import EventSplitter
from quire.streams.model import Segment, frame_event, segment_name

# --- options --------------------------------------------------------------------------------


def test_options_parse_cuts_and_check_values() -> None:
    opts = StreamOptions.parse({"stream": "sc/st", "controller": "tcp://h:1",
                                "start_stream_cut": '{"0": 14, "4294967297": 0}',
                                "end_stream_cut": "UNBOUNDED", "tier2": "file:///x",
                                "max_rows_per_trigger": "5", "fail_on_data_loss": "false"})
    assert (opts.scope, opts.stream, opts.controller) == ("sc", "st", "tcp://h:1")
    assert opts.start == {0: 14, (1 << 32) | 1: 0} and opts.end == "latest"
    assert opts.tier2 == "file:///x" and opts.max_rows_per_trigger == 5
    assert not opts.fail_on_data_loss
    assert StreamOptions.parse({"stream": "a/b"}).start == "earliest"
    for bad in ({"stream": "nope"}, {"stream": "a/b/c"}, {"stream": "a/b", "controller": "x"},
                {"stream": "a/b", "start_stream_cut": "[1]"},
                {"stream": "a/b", "start_stream_cut": '{"x": 1}'},
                {"stream": "a/b", "end_stream_cut": '{"1": -4}'},
                {"stream": "a/b", "tier2": "ftp://x"},
                {"stream": "a/b", "max_bytes_per_trigger": "0"},
                {"stream": "a/b", "fail_on_data_loss": "maybe"}):
        with pytest.raises(ValueError):
            StreamOptions.parse(bad)
    assert parse_cut('{"7": 0}', "x") == {7: 0}


# --- event splitting ------------------------------------------------------------------------


def test_splitter_finds_every_event_whatever_the_pieces() -> None:
    rng = random.Random(7)
    sizes = [rng.choice([0, 3, 100, 100, 100, 5000]) for _ in range(400)] + [100] * 300
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    data = b"".join(frame_event(p) for p in payloads)
    base = 1000
    splitter = EventSplitter(base)
    offsets: list[int] = []
    got: list[bytes] = []
    at = 0
    while at < len(data):
        step = rng.choice([1, 7, 8, 9, 500, 4096, 70_000])
        found, events = splitter.feed(data[at:at + step])
        offsets += [int(o) for o in found]
        got += events.to_pylist()
        at += step
    assert got == payloads and splitter.partial_bytes == 0
    expected, pos = [], base
    for p in payloads:
        expected.append(pos)
        pos += 8 + len(p)
    assert offsets == expected
    with pytest.raises(ProtocolError):
        EventSplitter(0).feed(b"\x00\x00\x00\x01\x00\x00\x00\x00")


def test_splitter_runs_of_equal_sizes_end_where_the_size_changes() -> None:
    # runs longer and shorter than a checking window, broken by one odd event
    sizes = [100] * 40 + [99] + [100] * 1000 + [7] * 17 + [100] + [0] * 300 + [5] * 15
    payloads = [i.to_bytes(4, "big") * (size // 4) + b"z" * (size % 4)
                for i, size in enumerate(sizes)]
    data = b"".join(frame_event(p) for p in payloads)
    offsets, events = EventSplitter(0).feed(data)
    assert events.to_pylist() == payloads
    assert [int(o) for o in offsets][-1] == len(data) - 8 - 5


def test_splitter_names_a_bad_header_inside_a_run() -> None:
    data = bytearray(b"".join(frame_event(b"e" * 100) for _ in range(500)))
    bad = 300 * 108
    data[bad:bad + 4] = b"\x00\x00\x00\x09"  # not an event's type
    with pytest.raises(ProtocolError, match=f"offset {bad + 64} "):
        EventSplitter(64).feed(bytes(data))


# --- planning over an in-memory stream ------------------------------------------------------


@dataclass
class FakeSegment:
    data: bytes = b""
    sealed: bool = False
    start: int = 0
    deleted: bool = False
    successors: list[tuple[int, list[int]]] = field(default_factory=list)


class FakeStream:
    """Controller and segment store seams of one stream ``sc/st``."""

    def __init__(self) -> None:
        self.segments: dict[int, FakeSegment] = {}

    def add(self, sid: int, events: list[bytes], sealed: bool = False) -> None:
        self.segments[sid] = FakeSegment(b"".join(frame_event(e) for e in events), sealed)

    def _sid(self, name: str) -> int:
        for sid in self.segments:
            if segment_name("sc", "st", sid) == name:
                return sid
        raise SegmentNotFoundError(name)

    # controller
    async def head_cut(self, scope: str, stream: str) -> dict[int, int]:
        return {0: 0}

    async def successors(self, scope: str, stream: str, sid: int
                         ) -> list[tuple[Segment, list[int]]]:
        return [(Segment("sc", "st", s, 0.0, 1.0), preds)
                for s, preds in self.segments[sid].successors]

    # segment store
    async def get_info(self, name: str) -> SegmentInfo:
        seg = self.segments[self._sid(name)]
        if seg.deleted:
            raise SegmentNotFoundError(name)
        return SegmentInfo(name, len(seg.data), seg.start, 0, seg.sealed, False,
                           SegmentType.STREAM)

    async def read(self, name: str, offset: int, max_length: int | None = None) -> ReadResult:
        seg = self.segments[self._sid(name)]
        data = seg.data[offset:offset + (max_length or 1 << 20)]
        return ReadResult(offset, data, False, False)

    def done_reading(self, name: str) -> None:
        pass


def plan(stream: FakeStream, start: dict[int, int], end: dict[int, int],
         budget: Budget | None = None, fail: bool = True, read_bytes: int = 1 << 20
         ) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    fake: Any = stream
    planner = CutPlanner(fake, fake, "sc", "st", fail_on_data_loss=fail, read_bytes=read_bytes)
    spans, cut = asyncio.run(planner.plan_between(start, end, budget))
    return [(s.segment_id, s.first, s.last) for s in spans], cut


def scaled() -> FakeStream:
    """0 and 1 sealed; 2 follows 0 alone; 3 follows 1 and 2 (a merge)."""
    stream = FakeStream()
    stream.add(0, [b"a" * 10] * 3, sealed=True)  # 18 bytes each
    stream.add(1, [b"b" * 10] * 2, sealed=True)
    stream.add(2, [b"c" * 10] * 4, sealed=True)
    stream.add(3, [b"d" * 10] * 5)
    stream.segments[0].successors = [(2, [0])]
    stream.segments[1].successors = [(3, [1, 2])]
    stream.segments[2].successors = [(3, [1, 2])]
    return stream


def test_plan_follows_successors_once_all_predecessors_ended() -> None:
    stream = scaled()
    spans, cut = plan(stream, {0: 0, 1: 0}, {3: 90})
    assert spans == [(0, 0, 54), (1, 0, 36), (2, 0, 72), (3, 0, 90)]
    assert cut == {3: 90}
    # an end cut inside: 2 bounded, so 3 (which waits for 2) is not read
    spans, cut = plan(stream, {0: 0, 1: 0}, {1: 36, 2: 18})
    assert spans == [(0, 0, 54), (1, 0, 36), (2, 0, 18)]
    assert cut == {1: 36, 2: 18}
    # from that cut on, the rest; nothing is read twice
    spans, cut = plan(stream, cut, {3: 90})
    assert spans == [(2, 18, 72), (3, 0, 90)] and cut == {3: 90}


def test_plan_within_a_budget_stops_at_event_boundaries() -> None:
    stream = scaled()
    spans, cut = plan(stream, {0: 0, 1: 0}, {3: 90}, Budget(rows=3), read_bytes=7)
    assert sum((last - first) // 18 for _, first, last in spans) == 3
    assert all(offset % 18 == 0 for offset in cut.values())
    seen = 3
    while cut != {3: 90}:
        spans, cut = plan(stream, cut, {3: 90}, Budget(bytes=40))
        taken = sum((last - first) // 18 for _, first, last in spans)
        assert 1 <= taken <= 2
        seen += taken
    assert seen == 14  # every event once
    # a budget below one event still moves on by one
    spans, _ = plan(stream, {0: 0, 1: 0}, {3: 90}, Budget(bytes=5))
    assert [(last - first) for _, first, last in spans] == [18]


def test_plan_reports_truncated_offsets_as_data_loss() -> None:
    stream = scaled()
    stream.segments[0].start = 36
    with pytest.raises(StreamDataLossError, match="truncated"):
        plan(stream, {0: 0, 1: 0}, {3: 90})
    spans, _ = plan(stream, {0: 0, 1: 0}, {3: 90}, fail=False)
    assert spans[0] == (0, 36, 54)
    stream.segments[1].deleted = True  # the controller still knows its successors
    with pytest.raises(StreamDataLossError, match="deleted"):
        plan(stream, {0: 54, 1: 0}, {3: 90})
    spans, cut = plan(stream, {0: 54, 1: 0}, {3: 90}, fail=False)
    assert spans == [(2, 0, 72), (3, 0, 90)] and cut == {3: 90}
