"""Segment layouts in tier-2: the value, its changes, its codec (golden bytes,
every cut refused, round trips) and reading a segment across its chunks,
where a vanished chunk reads as truncation, never as wrong bytes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quire.errors import (
    InvalidChunkNameError,
    InvalidLayoutError,
    SegmentTruncatedError,
)
from quire.tier2 import (
    ChunkNamer,
    ChunkRef,
    SegmentLayout,
    decode_layout,
    encode_layout,
    open_chunk_storage,
    parse_chunk_name,
    read_segment,
)

SEGMENT = "scope/stream/0.#epoch.0"


def grown(sizes: list[int], namer: ChunkNamer | None = None,
          segment: str = SEGMENT) -> SegmentLayout:
    namer = namer or ChunkNamer(epoch=1)
    layout = SegmentLayout(segment)
    for size in sizes:
        layout = layout.with_chunk(namer.next_name(segment), size)
    return layout


# --- the value and its changes --------------------------------------------------


def test_chunks_grow_the_segment_one_after_another() -> None:
    layout = grown([3, 5, 2])
    assert layout.chunks == (ChunkRef(f"{SEGMENT}.E1.0", 0, 3), ChunkRef(f"{SEGMENT}.E1.1", 3, 5),
                             ChunkRef(f"{SEGMENT}.E1.2", 8, 2))
    assert (layout.start_offset, layout.length) == (0, 10)
    assert list(layout.pieces(2, 7)) == [(layout.chunks[0], 2, 1), (layout.chunks[1], 0, 5),
                                         (layout.chunks[2], 0, 1)]
    assert list(layout.pieces(9, 100)) == [(layout.chunks[2], 1, 1)]
    assert list(layout.pieces(10, 5)) == []


def test_truncate_drops_only_chunks_wholly_below_the_start() -> None:
    layout = grown([3, 5, 2])
    kept, dropped = layout.truncated(3)
    assert dropped == [f"{SEGMENT}.E1.0"] and kept.start_offset == 3
    assert [c.name for c in kept.chunks] == [f"{SEGMENT}.E1.1", f"{SEGMENT}.E1.2"]
    kept, dropped = kept.truncated(7)
    assert dropped == [] and kept.chunks[0].offset == 3
    kept, dropped = kept.truncated(10)
    assert (kept.chunks, kept.start_offset, kept.length) == ((), 10, 10)
    assert dropped == [f"{SEGMENT}.E1.1", f"{SEGMENT}.E1.2"]
    again = kept.with_chunk(f"{SEGMENT}.E2.0", 4)  # growing a segment truncated to its end
    assert again.chunks == (ChunkRef(f"{SEGMENT}.E2.0", 10, 4),)
    for bad in (9, 15, -1):
        with pytest.raises(InvalidLayoutError):
            kept.truncated(bad)


def test_seal_delete_merge_and_concat() -> None:
    target = grown([4])
    source = grown([2, 3], ChunkNamer(epoch=7), "scope/stream/0.#epoch.0#transaction.ab")
    with pytest.raises(InvalidLayoutError, match="sealed"):
        target.merged(source)
    merged, gone = target.merged(source.with_sealed())
    assert merged.length == 9
    assert [(c.name.rsplit("/", 1)[-1], c.offset) for c in merged.chunks] == [
        ("0.#epoch.0.E1.0", 0), ("0.#epoch.0#transaction.ab.E7.0", 4),
        ("0.#epoch.0#transaction.ab.E7.1", 6)]
    assert gone.deleted and gone.chunks == ()
    joined, replaced = merged.concatenated(1, 2, f"{SEGMENT}.E2.0")
    assert joined.chunks[1:] == (ChunkRef(f"{SEGMENT}.E2.0", 4, 5),)
    assert replaced == [c.name for c in merged.chunks[1:]]
    with pytest.raises(InvalidLayoutError):
        merged.concatenated(2, 2, f"{SEGMENT}.E2.1")
    sealed = joined.with_sealed()
    with pytest.raises(InvalidLayoutError, match="sealed"):
        sealed.with_chunk(f"{SEGMENT}.E2.1", 1)
    deleted, to_delete = sealed.with_deleted()
    assert deleted.deleted and deleted.chunks == () and to_delete == [
        c.name for c in joined.chunks]
    with pytest.raises(InvalidLayoutError, match="deleted"):
        deleted.with_chunk(f"{SEGMENT}.E2.1", 1)


@pytest.mark.parametrize("broken", [
    dict(chunks=(ChunkRef("a.E1.0", 0, 3),), length=4),  # chunks end short of the length
    dict(chunks=(ChunkRef("a.E1.0", 0, 3), ChunkRef("a.E1.1", 4, 1)), length=5),  # a gap
    dict(chunks=(ChunkRef("a.E1.0", 0, 3), ChunkRef("a.E1.0", 3, 1)), length=4),  # name twice
    dict(chunks=(ChunkRef("a.E1.0", 0, 3),), length=3, start_offset=3),  # start past chunk
    dict(chunks=(ChunkRef("a.E1.0", 2, 3),), length=5, start_offset=1),  # start before chunk
    dict(chunks=(ChunkRef("a.E1.0", 0, 0),), length=0),  # an empty chunk
    dict(chunks=(), length=5, start_offset=2),  # bytes without chunks
    dict(chunks=(), length=2, start_offset=3),  # start past the end
])
def test_broken_invariants_are_refused(broken: dict[str, object]) -> None:
    with pytest.raises(InvalidLayoutError):
        SegmentLayout("a", **broken)  # type: ignore[arg-type]


def test_chunk_names_carry_the_epoch_and_are_never_given_twice() -> None:
    first_owner, second_owner = ChunkNamer(epoch=3), ChunkNamer(epoch=4)
    names = [namer.next_name(segment) for namer in (first_owner, second_owner)
             for segment in ("s/a", "s/b", "s/a") for _ in range(3)]
    assert len(set(names)) == len(names)
    assert parse_chunk_name(names[0]) == ("s/a", 3, 0)
    assert parse_chunk_name(names[-1]) == ("s/a", 4, 8)
    assert parse_chunk_name("s/a.E12.3.E4.5") == ("s/a.E12.3", 4, 5)
    for bad in ("s/a", "s/a.E1", "s/a.E.1", "s/a.1.2"):
        with pytest.raises(InvalidChunkNameError):
            parse_chunk_name(bad)
    # a name no chunk can hold as it is gets an escaped path (test_naming_rule.py)
    escaped = ChunkNamer(epoch=1).next_name("bad name/.x")
    assert escaped.startswith("~bad-name@") and "/~.x.E1.0" in escaped


# --- codec ------------------------------------------------------------------------


def test_golden_bytes() -> None:
    layout = SegmentLayout("s/t/0").with_chunk("s/t/0.E1.0", 3).with_sealed()
    assert encode_layout(layout) == bytes.fromhex(
        "01" "01"                          # version 1, flags: sealed
        "0000000000000000"                 # start offset 0
        "0000000000000003"                 # length 3
        "0005" + b"s/t/0".hex() +          # segment name
        "00000001"                         # one chunk:
        "0000000000000000"                 # at offset 0
        "0000000000000003"                 # 3 bytes
        "000a" + b"s/t/0.E1.0".hex())      # its name
    assert decode_layout(encode_layout(layout)) == layout
    deleted, _ = layout.with_deleted()
    assert encode_layout(deleted)[:2] == bytes.fromhex("0103")


layouts = st.builds(
    lambda sizes, cut, sealed, deleted, segment: _shaped(sizes, cut, sealed, deleted, segment),
    st.lists(st.integers(1, 1 << 40), max_size=6), st.floats(0, 1), st.booleans(),
    st.booleans(), st.sampled_from([SEGMENT, "x", "_system/containers/metadata_3$attributes"]))


def _shaped(sizes: list[int], cut: float, sealed: bool, deleted: bool,
            segment: str) -> SegmentLayout:
    layout = grown(sizes, segment=segment)
    layout, _ = layout.truncated(int(layout.length * cut))
    if sealed:
        layout = layout.with_sealed()
    return layout.with_deleted()[0] if deleted else layout


@given(layouts)
def test_round_trip_and_every_cut_refused(layout: SegmentLayout) -> None:
    encoded = encode_layout(layout)
    assert decode_layout(encoded) == layout
    for cut in range(len(encoded)):
        with pytest.raises(InvalidLayoutError):
            decode_layout(encoded[:cut])
    with pytest.raises(InvalidLayoutError):
        decode_layout(encoded + b"\0")


def test_unknown_versions_and_flags_and_broken_values_are_refused() -> None:
    encoded = bytearray(encode_layout(grown([2, 2])))
    for index, value in ((0, 2), (1, 4)):
        bad = bytearray(encoded)
        bad[index] = value
        with pytest.raises(InvalidLayoutError):
            decode_layout(bytes(bad))
    bad = bytearray(encoded)
    bad[17] = 5  # length 5, chunks end at 4
    with pytest.raises(InvalidLayoutError, match="end at 4"):
        decode_layout(bytes(bad))


# --- reading across chunks ------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8), cut=st.floats(0, 1),
       reads=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 120)), max_size=8))
def test_read_segment_returns_the_bytes_the_chunks_hold(
        sizes: list[int], cut: float, reads: list[tuple[float, int]]) -> None:
    async def scenario() -> None:
        storage = await open_chunk_storage("memory://")
        namer, layout, content = ChunkNamer(epoch=2), SegmentLayout(SEGMENT), b""
        for size in sizes:
            data = bytes((len(content) + i) % 251 for i in range(size))
            name = namer.next_name(SEGMENT)
            await storage.write_chunk(name, data)
            layout, content = layout.with_chunk(name, size), content + data
        layout, dropped = layout.truncated(int(layout.length * cut))
        for name in dropped:
            await storage.delete(name)
        for position, length in reads:
            offset = layout.start_offset + int((layout.length - layout.start_offset) * position)
            assert await read_segment(storage, layout, offset, length) == \
                content[offset:offset + length]
        if layout.start_offset:
            with pytest.raises(SegmentTruncatedError) as below:
                await read_segment(storage, layout, layout.start_offset - 1, 1)
            assert below.value.start_offset == layout.start_offset

    asyncio.run(scenario())


async def test_a_vanished_chunk_reads_as_truncation_and_a_short_one_as_invalid() -> None:
    storage = await open_chunk_storage("memory://")
    layout = SegmentLayout(SEGMENT)
    for i, data in enumerate([b"aaa", b"bbbb", b"cc"]):
        await storage.write_chunk(f"{SEGMENT}.E1.{i}", data)
        layout = layout.with_chunk(f"{SEGMENT}.E1.{i}", len(data))
    assert await read_segment(storage, layout, 1, 100) == b"aabbbbcc"
    # a later truncate deleted the first two chunks; this layout is stale
    await storage.delete(f"{SEGMENT}.E1.0")
    await storage.delete(f"{SEGMENT}.E1.1")
    with pytest.raises(SegmentTruncatedError) as stale:
        await read_segment(storage, layout, 1, 100)
    assert stale.value.start_offset == 3  # the end of the first vanished chunk it met
    assert await read_segment(storage, layout, 7, 100) == b"cc"
    # a chunk with fewer bytes than recorded is never read as the segment's bytes
    lying = SegmentLayout(SEGMENT, (ChunkRef(f"{SEGMENT}.E1.2", 0, 5),), 0, 5)
    with pytest.raises(InvalidLayoutError, match="holds 2 bytes"):
        await read_segment(storage, lying, 0, 5)
    with pytest.raises(InvalidLayoutError):
        await read_segment(storage, layout, 10, 1)
    assert await read_segment(storage, layout, 9, 1) == b""
