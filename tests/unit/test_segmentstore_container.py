"""One segment container, and the SegmentStore's routing, on the in-memory
tier-1 log twin (quire.testing.memory_data_log)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest

from quire.errors import ConfigError, QuireError
from quire.log import Position
from quire.metadata import open_store
from quire.segmentstore import (
    AppendResult,
    AttributeUpdate,
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerConfig,
    ContainerFencedError,
    ContainerNotOwnedError,
    CorruptRecordError,
    SegmentContainer,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentStore,
    SegmentStoreConfig,
    SegmentStoreError,
    SegmentTruncatedError,
    SegmentType,
    UpdateType,
    frames,
)
from quire.segmentstore.metadata import ContainerMetadata
from quire.segmentstore.names import base_segment_name, container_of
from quire.segmentstore.operations import AppendOp, SegmentMapOp, decode, encode
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs

S = "sc/st/0.#epoch.0"


@pytest.fixture
def logs() -> MemoryDataLogs:
    return MemoryDataLogs()


@pytest.fixture
async def container(logs: MemoryDataLogs) -> AsyncIterator[SegmentContainer]:
    c = await SegmentContainer.open(0, logs.open("c0"))
    yield c
    await c.close()


async def reopen(logs: MemoryDataLogs, old: SegmentContainer | None = None,
                 **config: int) -> SegmentContainer:
    if old is not None:
        await old.close()
    return await SegmentContainer.open(0, logs.open("c0"), ContainerConfig(**config))


async def test_create_append_read_info(container: SegmentContainer) -> None:
    await container.create_segment(S, SegmentType.STREAM, {7: 70})
    r1 = await container.append(S, b"hello ")
    r2 = await container.append(S, b"world")
    assert (r1.length, r2.length, r2.duplicate, r2.event_number) == (6, 11, False, None)
    read = await container.read(S, 0, 100)
    assert (read.offset, read.data, read.at_tail, read.end_of_segment) == \
        (0, b"hello world", True, False)
    assert (await container.read(S, 3, 4)).data == b"lo w"
    info = await container.get_info(S)
    assert (info.name, info.length, info.start_offset, info.sealed, info.type,
            info.attributes) == (S, 11, 0, False, SegmentType.STREAM, {7: 70})
    with pytest.raises(SegmentExistsError):
        await container.create_segment(S)
    with pytest.raises(SegmentNotFoundError):
        await container.append("nope", b"x")
    with pytest.raises(SegmentNotFoundError):
        await container.read("nope", 0, 1)
    with pytest.raises(BadOffsetError):
        await container.read(S, 12, 1)


async def test_appends_apply_in_call_order_and_share_frames(
        container: SegmentContainer) -> None:
    await container.create_segment(S)
    frames_before = container.operation_log.frames_written
    futures = [container.append(S, bytes([i]) * 3) for i in range(200)]
    results = [await f for f in reversed(futures)][::-1]  # awaited last to first
    assert [r.length for r in results] == [3 * (i + 1) for i in range(200)]
    assert (await container.read(S, 0, 1000)).data == b"".join(bytes([i]) * 3
                                                               for i in range(200))
    assert container.operation_log.frames_written - frames_before < 10


async def test_conditional_append_writes_nothing_on_a_bad_offset(
        container: SegmentContainer) -> None:
    await container.create_segment(S)
    await container.append(S, b"abc", expected_offset=0)
    with pytest.raises(BadOffsetError) as failed:
        await container.append(S, b"zzz", expected_offset=0)
    assert (failed.value.expected_offset, failed.value.actual_offset) == (0, 3)
    # a pipelined pair: the second is checked against the first's outcome
    first = container.append(S, b"d", expected_offset=3)
    second = container.append(S, b"e", expected_offset=4)
    assert (await first).length == 4 and (await second).length == 5
    assert (await container.read(S, 0, 10)).data == b"abcde"


async def test_writer_dedup_survives_a_reopen(logs: MemoryDataLogs) -> None:
    c = await reopen(logs)
    writer = 0x1234_5678_9ABC_DEF0_1122_3344_5566_7788
    await c.create_segment(S)
    r = await c.append(S, b"e1e2", writer=(writer, 2))
    assert (r.event_number, r.previous_event_number, r.duplicate) == (2, None, False)
    dup = await c.append(S, b"e1e2", writer=(writer, 2))
    assert dup.duplicate and dup.previous_event_number == 2 and dup.length == 4
    c = await reopen(logs, c)
    assert await c.get_attributes(S, [writer, 99]) == {writer: 2}
    assert (await c.append(S, b"e2", writer=(writer, 2))).duplicate
    r = await c.append(S, b"e3", writer=(writer, 3))
    assert (r.previous_event_number, r.length, r.duplicate) == (2, 6, False)
    assert (await c.read(S, 0, 100)).data == b"e1e2e3"
    await c.close()


async def test_hot_path_appends_log_what_encode_gives_and_replay_alike(
        logs: MemoryDataLogs) -> None:
    """Plain and writer-only appends skip the operation object and pack their
    bytes in one call: the log must hold exactly the encoding of the
    operation they stand for, and a reopen must see the same state."""
    c = await SegmentContainer.open(0, logs.open("c0"), clock=ManualClock(1234))
    writer = (1 << 127) | 0xABCDEF  # both halves of the 128-bit key
    await c.create_segment(S)
    sid = c.accepted.by_name[S]
    pipelined = [c.append(S, b"xxx"), c.append(S, bytearray(b"yy"), writer=(writer, 9)),
                 c.append(S, b"z", expected_offset=5, writer=(writer, -3)),  # a duplicate
                 c.append(S, b"z", expected_offset=4, writer=(writer, 10)),  # bad offset
                 c.append(S, b"w", expected_offset=5, writer=(writer, 10))]
    outcomes = await asyncio.gather(*pipelined, return_exceptions=True)
    assert outcomes[:3] == [AppendResult(3), AppendResult(5, 9, None),
                            AppendResult(5, -3, 9, duplicate=True)]
    assert isinstance(outcomes[3], BadOffsetError)
    assert outcomes[4] == AppendResult(6, 10, 9)
    logged = [decode(raw) async for _, frame in c._log.read(None)
              for raw in frames.unpack(frame)]
    appends = [op for op in logged if isinstance(op, AppendOp)]
    first = appends[0].sequence
    assert appends == [AppendOp(first, 1234, sid, 0, b"xxx"),
                       AppendOp(first + 1, 1234, sid, 3, b"yy", ((writer, 9),)),
                       AppendOp(first + 2, 1234, sid, 5, b"w", ((writer, 10),))]
    assert c.committed.sequence == c.accepted.sequence == first + 2
    c = await reopen(logs, c)
    info = await c.get_info(S)
    assert (info.length, info.attributes, info.last_modified_ms) == (6, {writer: 10}, 1234)
    assert (await c.read(S, 0, 10)).data == b"xxxyyw"
    await c.close()


async def test_attribute_conditions_are_all_or_nothing(container: SegmentContainer) -> None:
    await container.create_segment(S, attributes={1: 10})
    ok = [AttributeUpdate(1, UpdateType.REPLACE_IF_EQUALS, 11, comparison_value=10),
          AttributeUpdate(2, UpdateType.ACCUMULATE, 5),
          AttributeUpdate(2, UpdateType.ACCUMULATE, 5),
          AttributeUpdate(3, UpdateType.REPLACE_IF_GREATER, 1)]
    await container.append(S, b"x", ok)
    assert await container.get_attributes(S, [1, 2, 3]) == {1: 11, 2: 10, 3: 1}
    for bad in ([AttributeUpdate(4, UpdateType.REPLACE, 4),
                 AttributeUpdate(1, UpdateType.REPLACE_IF_EQUALS, 0, comparison_value=10)],
                [AttributeUpdate(3, UpdateType.REPLACE_IF_GREATER, 1)],
                [AttributeUpdate(2, UpdateType.ACCUMULATE, (1 << 63) - 5)]):
        with pytest.raises(BadAttributeUpdateError):
            await container.append(S, b"y", bad)
        with pytest.raises(BadAttributeUpdateError):
            await container.update_attributes(S, bad)
    assert await container.get_attributes(S, [1, 2, 3, 4]) == {1: 11, 2: 10, 3: 1}
    assert (await container.get_info(S)).length == 1
    await container.update_attributes(S, [AttributeUpdate(4, UpdateType.REPLACE_IF_EQUALS, 1,
                                                          comparison_value=-(1 << 63))])
    assert await container.get_attributes(S, [4]) == {4: 1}
    with pytest.raises(BadAttributeUpdateError):
        AttributeUpdate(1 << 128, UpdateType.REPLACE, 0)


async def test_seal_truncate_delete(container: SegmentContainer) -> None:
    await container.create_segment(S)
    await container.append(S, b"0123456789")
    await container.truncate(S, 4)
    await container.truncate(S, 2)  # below the start: nothing to do
    with pytest.raises(SegmentTruncatedError) as truncated:
        await container.read(S, 3, 5)
    assert truncated.value.start_offset == 4
    assert (await container.read(S, 4, 100)).data == b"456789"
    with pytest.raises(BadOffsetError):
        await container.truncate(S, 11)
    assert await container.seal(S) == 10
    with pytest.raises(SegmentSealedError):
        await container.append(S, b"x")
    with pytest.raises(SegmentSealedError):
        await container.seal(S)
    end = await container.read(S, 10, 5, wait_ms=10_000)  # sealed: no wait
    assert (end.data, end.at_tail, end.end_of_segment) == (b"", True, True)
    assert (await container.read(S, 8, 5)).end_of_segment
    await container.delete(S)
    with pytest.raises(SegmentNotFoundError):
        await container.get_info(S)
    await container.create_segment(S)  # the name is free again, with a new segment
    assert (await container.get_info(S)).length == 0


async def test_a_tail_read_waits_for_data_or_times_out(container: SegmentContainer) -> None:
    await container.create_segment(S)
    empty = await container.read(S, 0, 10, wait_ms=20)
    assert (empty.data, empty.at_tail, empty.end_of_segment) == (b"", True, False)
    waiting = asyncio.ensure_future(container.read(S, 0, 10, wait_ms=60_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    await container.append(S, b"late")
    assert (await waiting).data == b"late"
    waiting = asyncio.ensure_future(container.read(S, 4, 10, wait_ms=60_000))
    await asyncio.sleep(0)
    await container.seal(S)
    assert (await waiting).end_of_segment


async def test_nothing_is_visible_before_its_frame_is_durable(logs: MemoryDataLogs) -> None:
    c = await reopen(logs)
    await c.create_segment(S)
    pending = c.append(S, b"abc")
    # accepted (the next conditional append is checked against it) but not committed
    assert (await c.get_info(S)).length == 0
    assert (await c.read(S, 0, 10)).data == b""
    assert (await pending).length == 3
    assert (await c.get_info(S)).length == 3
    await c.close()


async def test_a_second_owner_fences_the_first(logs: MemoryDataLogs) -> None:
    first = await reopen(logs)
    await first.create_segment(S)
    await first.append(S, b"a")
    second = await SegmentContainer.open(0, logs.open("c0"))
    with pytest.raises(ContainerFencedError):
        await first.append(S, b"b")
    with pytest.raises(ContainerFencedError):
        await first.append(S, b"c")
    with pytest.raises(ContainerFencedError):
        await first.get_info(S)
    await first.close()
    assert (await second.read(S, 0, 10)).data == b"a"
    await second.append(S, b"d")
    assert (await second.read(S, 0, 10)).data == b"ad"
    await second.close()


async def test_a_fenced_owner_never_says_a_merge_source_is_missing(logs: MemoryDataLogs) -> None:
    """Regression (stream simulation seed 35): an owner paused past its lease
    answered a commit's merge "no such segment" for a transaction segment
    the new owner had made, which the controller takes for "merged
    already": the transaction was committed with none of its events.  That
    answer now waits for a probe through tier-1, which the new owner fenced."""
    first = await reopen(logs)
    await first.create_segment(S)
    second = await SegmentContainer.open(0, logs.open("c0"))
    txn = S + "#transaction.1"
    await second.create_segment(txn)
    await second.append(txn, b"t")
    with pytest.raises(ContainerFencedError):
        await first.merge(S, txn)
    assert isinstance(first.failure, ContainerFencedError)
    await first.close()
    with pytest.raises(SegmentNotFoundError):  # the owner's answer, confirmed
        await second.merge(S, S + "#transaction.2")
    assert (await second.merge(S, txn)).target_length == 1
    assert (await second.read(S, 0, 10)).data == b"t"
    await second.close()


async def test_a_create_asked_again_hears_exists_only_once_the_first_is_durable(
        logs: MemoryDataLogs) -> None:
    """Regression (stream simulation seed 104318): a create retried while the
    first attempt was still in flight heard "exists" from the accepted state;
    the first attempt's write then failed, so the segment never existed and
    the client, told it did, never made it. The answer now waits until what
    was accepted is durable, and is the log's failure if that fails."""
    first = await reopen(logs)
    second = await SegmentContainer.open(0, logs.open("c0"))  # fences first
    attempt = first.create_segment(S)
    again = first.create_segment(S)  # the first is accepted, not durable
    with pytest.raises(ContainerFencedError):
        await attempt
    with pytest.raises(ContainerFencedError):  # not SegmentExistsError
        await again
    await first.close()
    await second.create_segment(S)
    with pytest.raises(SegmentExistsError):  # made and durable: exists
        await second.create_segment(S)
    assert (await second.get_info(S)).length == 0
    await second.close()


@pytest.mark.parametrize("refused", ["seal", "append", "delete", "table_put"])
async def test_a_refusal_read_from_a_change_not_yet_durable_waits_for_it(
        logs: MemoryDataLogs, refused: str) -> None:
    """The create case above, for every refusal read from the accepted
    state: a seal retried while the first is in flight must not hear
    "sealed" (the controller takes that for the seal done) of a seal the
    fenced owner never makes durable; nor an append "sealed", a delete
    "no such segment", a conditional table put "bad version"."""
    first = await reopen(logs)
    await first.create_segment(S)
    await first.create_segment("t", SegmentType.TABLE)
    await first.table_put("t", [(b"k", b"v", None)])
    second = await SegmentContainer.open(0, logs.open("c0"))  # fences first
    if refused == "table_put":
        attempt = first.table_put("t", [(b"k", b"w", None)])
        again = first.table_put("t", [(b"k", b"x", 0)])  # version 0 is gone: BadVersion
    else:
        attempt = first.delete(S) if refused == "delete" else first.seal(S)
        again = {"seal": lambda: first.seal(S), "append": lambda: first.append(S, b"x"),
                 "delete": lambda: first.delete(S)}[refused]()
    with pytest.raises(ContainerFencedError):
        await attempt
    with pytest.raises(ContainerFencedError):  # not the refusal of a change never made
        await again
    await first.close()
    info = await second.get_info(S)
    assert not info.sealed and not info.deleted
    await second.close()


async def test_confirming_ownership_logs_a_probe_that_changes_nothing(
        logs: MemoryDataLogs) -> None:
    first = await reopen(logs)
    await first.create_segment(S)
    await first.append(S, b"a")
    info = await first.get_info(S)
    frames_before, ops_before = (first.operation_log.frames_written,
                                 first.operation_log.operations_written)
    await asyncio.gather(first.confirm_ownership(), first.confirm_ownership())
    assert first.operation_log.frames_written == frames_before + 1  # one frame for both
    assert first.operation_log.operations_written == ops_before + 2
    assert await first.get_info(S) == info
    second = await SegmentContainer.open(0, logs.open("c0"))  # replays them, fences first
    assert await second.get_info(S) == info
    assert second.committed.sequence == first.committed.sequence + 1  # (its checkpoint)
    # nothing first did touched tier-1 since: it still answers from its state...
    assert (await first.get_info(S)).length == 1
    # ...until it confirms its ownership, which fails it for good
    with pytest.raises(ContainerFencedError):
        await first.confirm_ownership()
    assert isinstance(first.failure, ContainerFencedError)
    with pytest.raises(ContainerFencedError):
        await first.read(S, 0, 10)
    await first.close()
    await second.close()


async def test_replay_restores_from_checkpoints_and_reads_evicted_data_from_tier1(
        logs: MemoryDataLogs) -> None:
    c = await reopen(logs, checkpoint_every_bytes=2000, read_index_budget_bytes=500)
    await c.create_segment(S)
    await c.create_segment("other", SegmentType.SYSTEM)
    chunks = [bytes([65 + i % 26]) * (i % 50 + 1) for i in range(120)]
    for chunk in chunks:
        c.append(S, chunk)
    await c.append("other", b"o")
    await c.truncate("other", 1)
    assert c.read_index.cached_bytes <= 500
    assert (await c.read(S, 0, 1 << 20)).data == b"".join(chunks)
    before = ContainerMetadata.restore(c.committed.checkpoint())
    c = await reopen(logs, c, read_index_budget_bytes=500)
    after = c.committed
    assert {i: s.info() for i, s in after.segments.items()} == \
        {i: s.info() for i, s in before.segments.items()}
    assert (await c.read(S, 100, 1 << 20)).data == b"".join(chunks)[100:]
    assert (await c.get_info("other")).start_offset == 1
    await c.close()


async def test_a_frame_is_one_chunk_per_segment_and_appends_leave_no_tracked_objects(
        logs: MemoryDataLogs) -> None:
    """Appends to many segments interleaved in one frame: each segment's make
    one read-index chunk (the frame's appends share its address object), and
    a chunk leaves no object for the garbage collector (the eviction order is
    kept as ints, not a pair per chunk: with 1,000 segments every append is a
    chunk, and those pairs made the collections that set the appends' p99)."""
    c = await reopen(logs, frame_cut_ops=100_000)
    names = [f"sc/st/{i}" for i in range(300)]
    await asyncio.gather(*(c.create_segment(n) for n in names))
    ids = [c.committed.by_name[n] for n in names]
    await asyncio.gather(*(c.append(n, b"a") for _ in range(3) for n in names))
    assert [c.read_index.chunk_count(i) for i in ids] == [1] * len(names)
    gc.disable()
    try:
        made = []
        for _ in range(2):
            for _ in range(3):
                await asyncio.sleep(0)  # what the last frame's completions made is gone
            gc.collect()
            before = len(gc.get_objects())
            await asyncio.gather(*(c.append(n, b"b") for n in names))
            for _ in range(3):
                await asyncio.sleep(0)
            made.append(len(gc.get_objects()) - before)
    finally:
        gc.enable()
    assert [c.read_index.chunk_count(i) for i in ids] == [3] * len(names)
    assert max(made) < len(names) // 4
    for n in names:
        assert (await c.read(n, 0, 10)).data == b"aaabb"
    await c.close()


async def test_an_append_larger_than_a_frame_is_whole_after_reopen_and_eviction(
        logs: MemoryDataLogs) -> None:
    big = bytes(range(256)) * (9 * 4096)  # 9 MiB: a Pravega client's block, and then some
    c = await reopen(logs, max_frame_bytes=1 << 20, read_index_budget_bytes=1 << 20)
    await c.create_segment(S)
    await c.append(S, b"<")
    assert (await c.append(S, big)).length == 1 + len(big)
    await c.append(S, b">")
    assert (await c.read(S, 0, 1 << 25)).data == b"<" + big + b">"  # evicted: from tier-1 parts
    c = await reopen(logs, c, max_frame_bytes=1 << 20, read_index_budget_bytes=1 << 20)
    assert (await c.get_info(S)).length == len(big) + 2
    assert (await c.read(S, 1, 1 << 25)).data == big + b">"
    await c.close()


async def test_an_operation_whose_parts_stop_short_was_never_acknowledged(
        logs: MemoryDataLogs) -> None:
    c = await reopen(logs)
    await c.create_segment(S)
    await c.append(S, b"kept")
    info = await c.get_info(S)
    sequence = c.committed.sequence
    await c.close()
    # a crash after the first part of a large append was written, before the rest
    raw = encode(AppendOp(sequence + 1, 0, c.committed.by_name[S], info.length, b"L" * 5000))
    log = logs.open("c0")
    await log.initialize()
    await log.append(frames.split(raw, 2048)[0])
    await log.close()
    c = await reopen(logs)
    assert (await c.get_info(S)).length == 4
    assert (await c.read(S, 0, 100)).data == b"kept"
    await c.append(S, b"+more")  # and the container goes on after it
    c = await reopen(logs, c)
    assert (await c.read(S, 0, 100)).data == b"kept+more"
    await c.close()


async def test_merge_and_transient_segments(logs: MemoryDataLogs) -> None:
    c = await reopen(logs, read_index_budget_bytes=10)
    await c.create_segment(S)
    await c.append(S, b"head-")
    t1 = await c.create_transient_segment(S, 0xABC)
    t2 = await c.create_transient_segment(S, 0xABC)
    assert t1 != t2 and base_segment_name(t1) == S
    assert (await c.get_info(t1)).type is SegmentType.TRANSIENT
    await c.append(t1, b"one-")
    await c.append(t1, b"two-")
    await c.append(t2, b"three")
    assert (await c.merge(S, t1)).target_length == 13  # t1 sealed by the merge
    await c.seal(t2)
    assert (await c.merge(S, t2)).target_length == 18
    with pytest.raises(SegmentNotFoundError):
        await c.get_info(t1)
    with pytest.raises(SegmentNotFoundError):
        await c.merge(S, t1)
    assert (await c.read(S, 0, 100)).data == b"head-one-two-three"  # evicted: from tier-1
    c = await reopen(logs, c, read_index_budget_bytes=10)
    assert (await c.read(S, 2, 100)).data == b"ad-one-two-three"
    await c.truncate(S, 7)
    assert (await c.read(S, 7, 100)).data == b"e-two-three"
    other = await c.create_transient_segment(S, 1)
    await c.append(other, b"xyz")
    await c.truncate(other, 1)
    with pytest.raises(SegmentTruncatedError):
        await c.merge(S, other)
    with pytest.raises(SegmentStoreError):
        await c.merge(S, S)
    await c.seal(S)
    with pytest.raises(SegmentSealedError):
        await c.merge(S, other)
    assert (await c.get_info(other)).length == 3  # refused: nothing applied, not sealed
    assert not (await c.get_info(other)).sealed
    await c.close()


async def test_a_failed_tier1_append_fails_the_container(logs: MemoryDataLogs) -> None:
    c = await reopen(logs)
    await c.create_segment(S)

    def broken(data: bytes) -> asyncio.Future[Position]:
        raise OSError("disk on fire")

    c._log.append = broken  # type: ignore[method-assign]
    with pytest.raises(Exception, match="outcome unknown"):
        await c.append(S, b"x")
    with pytest.raises(Exception, match="outcome unknown"):
        await c.append(S, b"y")
    await c.close()
    c = await reopen(logs)
    assert (await c.get_info(S)).length == 0
    await c.close()


async def test_metadata_apply_refuses_what_does_not_fit() -> None:
    m = ContainerMetadata(3)
    m.apply(SegmentMapOp(1, 0, 1, "s", SegmentType.STREAM))
    with pytest.raises(CorruptRecordError, match="operation 3 after 1"):
        m.apply(AppendOp(3, 0, 1, 0, b"x"))  # a gap in sequence numbers
    with pytest.raises(CorruptRecordError, match="append at 5, length 0"):
        m.apply(AppendOp(2, 0, 1, 5, b"x"))  # not at the segment's length
    with pytest.raises(CorruptRecordError, match="malformed container checkpoint"):
        ContainerMetadata.restore(b"{}")


@pytest.mark.parametrize(("record", "why"), [
    (b"junk" + bytes(8), "not a data frame"),
    (b"QSF1\0\0\0\x01\0\0\0\x11" + bytes([99]) + bytes(16), "unknown operation kind 99"),
], ids=["not-a-frame", "unknown-operation"])
async def test_a_corrupt_record_in_the_log_fails_the_open_with_a_quire_error(
        logs: MemoryDataLogs, record: bytes, why: str) -> None:
    """A tier-1 record that is no frame, or holds an operation that does not
    decode, stops the replay with CorruptRecordError (a QuireError) saying
    what is wrong."""
    c = await reopen(logs)
    await c.create_segment(S)
    await c.append(S, b"kept")
    await c.close()
    writer = logs.open("c0")
    await writer.initialize()
    await writer.append(record)
    await writer.close()
    with pytest.raises(CorruptRecordError, match=why) as raised:
        await reopen(logs)
    assert isinstance(raised.value, QuireError)


async def test_a_checkpoint_follows_every_checkpoint_every_bytes_of_operations(
        logs: MemoryDataLogs) -> None:
    """Every operation weighs its data plus 64 bytes, whichever way it is
    logged (the appends' hot path, plain or with a writer's number, an append
    with attribute updates, a table update, any other operation): the one
    that brings the weight since the last checkpoint to
    ``checkpoint_every_bytes`` is followed by a checkpoint."""
    c = await reopen(logs, checkpoint_every_bytes=1000)
    assert len(c.committed_side.checkpoints) == 1  # the one opening writes; the weight starts at 0
    await c.create_segment(S)  # 64
    await c.create_segment("tbl", SegmentType.TABLE)  # 128
    await c.append(S, b"a" * 100)  # 292
    await c.append(S, b"b" * 100, writer=(7, 1))  # 456
    await c.append(S, b"c" * 100, [AttributeUpdate(9, UpdateType.REPLACE, 1)])  # 620
    await c.tables.put("tbl", [(b"k", b"v" * 91, None)])  # an entry of 100 bytes: 784
    await c.update_attributes(S, [AttributeUpdate(9, UpdateType.REPLACE, 2)])  # 848
    await c.append(S, b"d" * 87)  # 999
    await c.barrier()
    assert len(c.committed_side.checkpoints) == 1
    await c.update_attributes(S, [AttributeUpdate(9, UpdateType.REPLACE, 3)])  # 1063
    await c.barrier()
    assert len(c.committed_side.checkpoints) == 2
    await c.append(S, b"e" * 800)  # 864 since that checkpoint
    await c.barrier()
    assert len(c.committed_side.checkpoints) == 2
    await c.close()


def test_names_map_related_segments_to_one_container() -> None:
    for related in (S + "$attributes", S + "#transaction.00ff", S + "#transient.1",
                    S + "#transaction.00ff$attributes", S + "$index"):
        assert base_segment_name(related) == S
        assert container_of(related, 16) == container_of(S, 16)
    spread = {container_of(f"sc/st/{i}.#epoch.0", 8) for i in range(64)}
    assert spread == set(range(8))
    assert container_of("_system/containers/metadata", 4) == \
        container_of("_system/containers/metadata", 4)  # stable, no salted hash


async def test_store_routes_by_name_and_keeps_container_count(logs: MemoryDataLogs) -> None:
    metadata = await open_store("memory://segstore-routing")
    try:
        store = await SegmentStore.open(None, [0, 1], metadata_store=metadata,
                                        open_log=lambda c: logs.open(f"c{c}"),
                                        config=SegmentStoreConfig(container_count=2))
        names = [f"sc/st/{i}.#epoch.0" for i in range(6)]
        for name in names:
            await store.create_segment(name)
            await store.append(name, name.encode())
        for name in names:
            assert (await store.read(name, 0, 100)).data == name.encode()
            assert store.owns(name)
        assert {store.container_for(n) for n in names} == {0, 1}
        await store.stop_container(1)
        lost = next(n for n in names if store.container_for(n) == 1)
        assert not store.owns(lost)
        with pytest.raises(ContainerNotOwnedError):
            await store.append(lost, b"x")
        with pytest.raises(ContainerNotOwnedError):
            await store.get_info(lost)
        # a stop called while the container starts waits for the start, then stops it
        starting = asyncio.ensure_future(store.start_container(1))
        stopping = asyncio.ensure_future(store.stop_container(1))
        await asyncio.sleep(0)  # both begun (one turn of the loop)
        assert store.transitions == {"starting": [1], "stopping": {1: "its start"}}
        await asyncio.gather(starting, stopping)
        assert not store.owns(lost)
        assert store.transitions == {"starting": [], "stopping": {}}
        await store.start_container(1)
        assert (await store.get_info(lost)).length == len(lost)
        await store.close()
        with pytest.raises(ConfigError, match="fixed"):
            await SegmentStore.open(None, metadata_store=metadata, open_log=logs.open,
                                    config=SegmentStoreConfig(container_count=3))
        again = await SegmentStore.open(None, metadata_store=metadata, open_log=logs.open)
        assert again.container_count == 2
        await again.close()
    finally:
        await metadata.close()


async def test_a_stores_containers_run_on_its_clock(logs: MemoryDataLogs) -> None:
    """The clock given to a store is its containers': their operations'
    timestamps are its time."""
    metadata = await open_store("memory://segstore-clock")
    clock = ManualClock(5000)
    try:
        store = await SegmentStore.open(None, [0, 1], metadata_store=metadata,
                                        open_log=lambda c: logs.open(f"c{c}"), clock=clock,
                                        config=SegmentStoreConfig(container_count=2))
        await store.create_segment(S)
        clock.advance(250)
        await store.append(S, b"x")
        assert (await store.get_info(S)).last_modified_ms == 5250
        await store.close()
    finally:
        await metadata.close()


async def test_tail_reads_that_time_out_leave_no_waiter_behind(
        container: SegmentContainer) -> None:
    await container.create_segment(S)
    for _ in range(50):  # an idle segment polled at its tail
        read = await container.read(S, 0, 10, wait_ms=1)
        assert read.data == b"" and read.at_tail
    segment_id = container.committed.by_name[S]
    assert len(container.read_index._segments[segment_id].waiters) <= 1
