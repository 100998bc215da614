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
    assert len(index._age_ids) == 0


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
