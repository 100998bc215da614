"""Table segments on one container (in-memory tier-1 log): the entry codec,
conditional puts and removals (all or nothing), reads, pages, deltas, and
the index rebuilt on reopen."""

from __future__ import annotations

import pytest

from quire.errors import (
    CorruptRecordError,
    SegmentStoreError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.segmentstore import NOT_EXISTS, ContainerConfig, SegmentContainer, SegmentType
from quire.segmentstore.tables import TableEntry, decode_entries, encode_batch
from quire.testing.memory_data_log import MemoryDataLogs

T = "_system/_tables/streams"


def test_entry_golden_bytes() -> None:
    data, offsets = encode_batch([(b"k", b"vv"), (b"gone", None)])
    assert data.hex() == ("00000001" "00000002" "6b" "7676"
                          "00000004" "ffffffff" "676f6e65")
    assert offsets == [0, 11]
    assert list(decode_entries(data, 100)) == [(100, b"k", b"vv", 111),
                                               (111, b"gone", None, 123)]
    assert list(decode_entries(data[:-1], 0)) == [(0, b"k", b"vv", 11)]  # partial: stops
    with pytest.raises(CorruptRecordError):
        list(decode_entries(b"\xff" * 8, 0))


async def open_container(logs: MemoryDataLogs) -> SegmentContainer:
    return await SegmentContainer.open(0, logs.open("c"), ContainerConfig(
        read_index_budget_bytes=64))


async def test_conditional_puts_and_removes_are_all_or_nothing() -> None:
    logs = MemoryDataLogs()
    c = await open_container(logs)
    await c.create_segment(T, SegmentType.TABLE)
    v1, v2 = await c.tables.put(T, [(b"a", b"1", NOT_EXISTS), (b"b", b"2", None)])
    assert 0 == v1 < v2
    with pytest.raises(TableKeyBadVersionError):
        await c.tables.put(T, [(b"c", b"3", None), (b"a", b"x", NOT_EXISTS)])
    with pytest.raises(TableKeyBadVersionError):
        await c.tables.put(T, [(b"a", b"x", v2)])
    with pytest.raises(TableKeyNotFoundError):
        await c.tables.put(T, [(b"z", b"x", 5)])
    # a key twice: each condition against the table before the batch
    with pytest.raises(TableKeyBadVersionError):
        await c.tables.put(T, [(b"a", b"x", v1), (b"a", b"y", NOT_EXISTS)])
    assert await c.tables.get(T, [b"a", b"b", b"c"]) == [
        TableEntry(b"a", b"1", v1), TableEntry(b"b", b"2", v2), None]
    dead, v3 = await c.tables.put(T, [(b"a", b"10", v1), (b"a", b"11", v1)])
    assert v2 < dead < v3  # the last entry of a key wins
    with pytest.raises(TableKeyBadVersionError):
        await c.tables.remove(T, [(b"b", v2), (b"a", v1)])
    await c.tables.remove(T, [(b"b", v2), (b"nope", None)])
    assert await c.tables.get(T, [b"a", b"b"]) == [TableEntry(b"a", b"11", v3), None]
    with pytest.raises(SegmentStoreError):
        await c.append(T, b"raw bytes would break the table")
    await c.create_segment("plain")
    with pytest.raises(SegmentStoreError):
        await c.tables.put("plain", [(b"k", b"v", None)])
    await c.close()


async def test_pages_deltas_and_reopen() -> None:
    logs = MemoryDataLogs()
    c = await open_container(logs)
    await c.create_segment(T, SegmentType.TABLE)
    for i in range(10):
        await c.tables.put(T, [(b"k%02d" % i, b"v%d" % i, None)])
    await c.tables.remove(T, [(b"k03", None)])
    await c.tables.put(T, [(b"k05", b"new", None)])
    await c.close()
    c = await open_container(logs)  # the index is rebuilt from the table's data
    keys = []
    token = None
    while True:
        page = await c.tables.iterate(T, keys_only=True, token=token, max_entries=4)
        keys += [e.key for e in page.entries]
        assert all(e.value is None for e in page.entries)
        token = page.token
        if token is None:
            break
    assert keys == [b"k%02d" % i for i in range(10) if i != 3]
    seen: dict[bytes, bytes] = {}
    position, polls = 0, 0
    while True:
        delta = await c.tables.read_delta(T, position, 3)
        assert not delta.should_clear
        for e in delta.entries:
            assert e.version >= position
            seen[e.key] = e.value or b""
        if delta.last_position == position:
            break
        position = delta.last_position
        polls += 1
    assert seen == {b"k%02d" % i: (b"new" if i == 5 else b"v%d" % i)
                    for i in range(10) if i != 3}
    assert position == (await c.get_info(T)).length
    assert (await c.tables.read_delta(T, position, 3)).entries == []
    (v,) = await c.tables.put(T, [(b"k00", b"again", None)])
    assert [e.key for e in (await c.tables.read_delta(T, position, 3)).entries] == [b"k00"]
    assert (await c.tables.get(T, [b"k00"]))[0] == TableEntry(b"k00", b"again", v)
    await c.close()
