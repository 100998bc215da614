"""The read index's eviction order across truncation and merges: the
oldest cached chunks go first, whichever lists they sit in by then."""

from __future__ import annotations

import pytest

from quire.log import Position
from quire.segmentstore.read_index import ReadIndex


async def _no_fetch(segment_id: int, offset: int, length: int, address: Position) -> bytes:
    raise AssertionError("this test reads cached chunks only")


def cached(index: ReadIndex, segment_id: int) -> list[bool]:
    """Which of the segment's chunks still hold their bytes."""
    segment = index._segments[segment_id]
    return [segment.cached(i) is not None for i in range(len(segment.data))]


@pytest.mark.parametrize("truncate_first", [False, True])
async def test_eviction_takes_the_oldest_chunks_across_truncation_and_merge(
        truncate_first: bool) -> None:
    index = ReadIndex(_no_fetch, budget_bytes=10 * 100)
    for n in range(6):  # segment 1: six chunks of 100 B, each in its own frame
        index.append(1, n * 100, b"a" * 100, Position(1, n))
    for n in range(3):  # segment 2: three, then merged into segment 1 below
        index.append(2, n * 100, b"b" * 100, Position(1, 10 + n))
    if truncate_first:
        index.truncate(1, 250)  # drops chunks 0 and 1 (bytes 0-199) from the lists
    index.merge(1, 2, 600, 300)  # segment 2's chunks move behind segment 1's
    kept = cached(index, 1)
    assert all(kept)
    assert index.cached_bytes == (700 if truncate_first else 900)
    for n in range(3):  # 300 more bytes for segment 1: over the 1,000 B budget
        index.append(1, 900 + n * 100, b"c" * 100, Position(1, 20 + n))
    # what was committed first went first: segment 1's own oldest chunks
    # (after the truncation, its third chunk is the oldest one left)
    after = cached(index, 1)
    assert index.cached_bytes == 1000
    if truncate_first:
        assert after == [True] * 10  # 700 + 300: nothing over the budget
    else:
        assert after == [False, False] + [True] * 10
    for n in range(2):
        index.append(1, 1200 + n * 100, b"d" * 100, Position(1, 30 + n))
    after = cached(index, 1)
    evicted = after.index(True)
    assert not any(after[:evicted]) and all(after[evicted:])
    assert index.cached_bytes == 1000
    assert (await index.read(1, 1300, 100)) == b"d" * 100
    # a budget of nothing: every entry of the eviction order is used up, the
    # newest ones included, and each finds its own chunk
    index.budget_bytes = 0
    index.append(1, 1400, b"e" * 100, Position(1, 40))
    assert index.cached_bytes == 0 and not any(cached(index, 1))
    assert len(index._age) == 0


async def test_after_a_truncation_the_next_eviction_is_still_the_oldest_chunk() -> None:
    """Chunks of two segments committed in turn; the first segment is
    truncated past its two oldest chunks.  Going over the budget by one
    chunk evicts the oldest chunk left, the other segment's first one, not a
    younger chunk of the truncated segment."""
    index = ReadIndex(_no_fetch, budget_bytes=10_000)
    for n in range(4):
        index.append(1, n * 100, b"a" * 100, Position(1, 2 * n))
        index.append(2, n * 100, b"b" * 100, Position(1, 2 * n + 1))
    index.truncate(1, 200)  # segment 1 keeps its chunks at 200 and 300
    assert cached(index, 1) == [True, True] and cached(index, 2) == [True] * 4
    index.budget_bytes = index.cached_bytes - 100  # one chunk too many
    index.append(2, 400, b"b" * 100, Position(1, 9))  # and one more: two to evict
    assert cached(index, 2) == [False, False, True, True, True]
    assert cached(index, 1) == [True, True]
    index.budget_bytes -= 100
    index.append(2, 500, b"b" * 100, Position(1, 10))
    assert cached(index, 1) == [False, True]  # (segment 1's chunk at 200 came next)
    assert cached(index, 2) == [False, False, False, True, True, True]


def _chunk(n: int) -> bytes:
    return bytes([n % 251]) * 100


async def test_evicted_chunks_that_tier2_holds_leave_the_index() -> None:
    """Without this, every append a container ever took kept a place in
    its segment's lists.  Evicted chunks below the flushed length go (in
    batches); their bytes are then read from tier-2, evicted ones above it
    from their tier-1 frame, and eviction goes on in commit order."""
    tier1_reads: list[int] = []
    tier2_reads: list[int] = []

    async def from_tier1(segment_id: int, offset: int, length: int, address: Position) -> bytes:
        tier1_reads.append(offset)
        assert address == Position(1, offset // 100)  # the chunk's own frame
        return _chunk(offset // 100)[:length]

    async def from_tier2(segment_id: int, offset: int, length: int) -> bytes:
        tier2_reads.append(offset)
        flushed = 250 * 100 + 50
        held = b"".join(_chunk(n) for n in range(offset // 100, 251))[offset % 100:]
        return held[:max(0, min(length, flushed - offset))]

    index = ReadIndex(from_tier1, budget_bytes=100 * 100, fetch_tier2=from_tier2)
    for n in range(400):
        index.append(1, n * 100, _chunk(n), Position(1, n))
    assert index.chunk_count(1) == 400 and index.cached_bytes == 100 * 100
    index.flushed(1, 250 * 100 + 50)  # chunk 250 only in part: it stays
    assert index.chunk_count(1) == 150
    index.flushed(1, 200 * 100)  # a smaller length changes nothing
    assert index.chunk_count(1) == 150
    # a read across the dropped chunks and the evicted one still listed
    expected = (_chunk(249) + _chunk(250) + _chunk(251))[10:210]
    assert await index.read(1, 249 * 100 + 10, 200) == expected
    assert tier2_reads[0] == 249 * 100 + 10  # below the first chunk listed
    assert tier1_reads == [250 * 100, 251 * 100]  # tier-2 holds only half of 250
    assert await index.read(1, 399 * 100, 100) == _chunk(399)  # still cached
    # eviction goes on with the oldest cached chunk (300), then 301
    index.append(1, 400 * 100, _chunk(400), Position(1, 400))
    index.append(1, 401 * 100, _chunk(401), Position(1, 401))
    assert cached(index, 1)[:50] == [False] * 50
    assert cached(index, 1)[50:52] == [False, False] and cached(index, 1)[52]
    assert index.cached_bytes == 100 * 100


async def test_a_segment_flushed_as_it_goes_keeps_a_bounded_index() -> None:
    async def unused(*_args: object) -> bytes:
        raise AssertionError("not read")

    index = ReadIndex(unused, budget_bytes=50 * 100, fetch_tier2=unused)
    most = 0
    for n in range(5_000):
        index.append(7, n * 100, _chunk(n), Position(1, n))
        if n % 10 == 0:
            index.flushed(7, n * 100)  # tier-2 a little behind the tail
        most = max(most, index.chunk_count(7))
    assert index.cached_bytes == 50 * 100
    assert most < 4 * 50 + 64 * 2  # cached ones, and dropped batches' worth
    # truncating past the remaining chunks, then deleting, leaves nothing
    index.truncate(7, 4_990 * 100)
    assert index.cached_bytes == 10 * 100
    index.delete(7)
    assert index.cached_bytes == 0
