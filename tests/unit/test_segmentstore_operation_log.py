"""The operation log's frame cutting: a burst of operations goes out as
several frames that are in flight together (pipelined), each acknowledged
only when its frame is, in the order the operations were added."""

from __future__ import annotations

import asyncio

from quire.log import Position
from quire.segmentstore import frames
from quire.segmentstore.operation_log import OPERATION_WEIGHT, OperationLog, Pending
from quire.segmentstore.operations import (
    AppendOp,
    CheckpointOp,
    Operation,
    SealOp,
    decode,
    encode,
)


class HeldLog:
    """A tier-1 log whose appends complete only when the test says so."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.pending: list[asyncio.Future[Position]] = []
        self.epoch = 1

    def append(self, data: bytes) -> asyncio.Future[Position]:
        self.frames.append(data)
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def release(self, index: int) -> None:
        self.pending[index].set_result(Position(0, index))

    async def close(self) -> None:
        pass


def op(sequence: int, size: int = 10) -> AppendOp:
    return AppendOp(sequence, 0, 1, (sequence - 1) * size, b"x" * size)


async def test_a_burst_is_cut_into_pipelined_frames_acknowledged_in_order() -> None:
    log = HeldLog()
    committed: list[tuple[int, Position]] = []

    def commit(o: Operation, at: Position) -> None:
        committed.append((o.sequence, at))

    oplog = OperationLog(log, commit, max_frames_in_flight=3, cut_ops=8)  # type: ignore[arg-type]
    futures = [oplog.add(op(i), i) for i in range(1, 41)]
    # cut while being added: 3 frames of 8 in flight, the rest queued
    assert [len(frames.unpack(f)) for f in log.frames] == [8, 8, 8]
    await asyncio.sleep(0)  # the loop's turn does not cut past the limit
    assert len(log.frames) == 3
    log.release(1)  # a later frame first: nothing is acknowledged before frame 0
    await asyncio.sleep(0)
    assert committed == [] and not any(f.done() for f in futures)
    log.release(0)
    await asyncio.sleep(0)
    assert [s for s, _ in committed] == list(range(1, 17))
    assert all(f.done() for f in futures[:16]) and not any(f.done() for f in futures[16:])
    await asyncio.sleep(0)
    # the loop's turn cuts what queued meanwhile as one frame (frames grow under load)
    assert [len(frames.unpack(f)) for f in log.frames] == [8, 8, 8, 16]
    for i in range(2, 4):
        log.release(i)
    assert await asyncio.gather(*futures) == list(range(1, 41))
    assert [s for s, _ in committed] == list(range(1, 41))
    assert [decode(raw) for f in log.frames for raw in frames.unpack(f)] == \
        [op(i) for i in range(1, 41)]
    assert oplog.frames_written == 4 and oplog.operations_written == 40


async def test_a_frame_committer_gets_each_durable_frame_once_before_its_futures() -> None:
    log = HeldLog()
    calls: list[tuple[list[int], Position, list[bool]]] = []

    def commit_frame(batch: list[Pending], at: Position) -> None:
        calls.append(([p[0].sequence for p in batch], at, [p[2].done() for p in batch]))

    def commit(o: Operation, at: Position) -> None:
        raise AssertionError("on_committed is not called when on_frame_committed is given")

    oplog = OperationLog(log, commit, max_frames_in_flight=4, cut_ops=4,  # type: ignore[arg-type]
                         on_frame_committed=commit_frame)
    futures = [oplog.add(op(i), i) for i in range(1, 11)]
    await asyncio.sleep(0)
    assert [len(frames.unpack(f)) for f in log.frames] == [4, 4, 2]
    log.release(1)
    await asyncio.sleep(0)
    assert calls == []  # frame 1 waits for frame 0
    log.release(0)
    await asyncio.sleep(0)
    assert calls == [([1, 2, 3, 4], Position(0, 0), [False] * 4),
                     ([5, 6, 7, 8], Position(0, 1), [False] * 4)]
    assert all(f.done() for f in futures[:8]) and not any(f.done() for f in futures[8:])
    log.release(2)
    assert await asyncio.gather(*futures) == list(range(1, 11))
    assert [c[0] for c in calls] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


async def test_frames_are_also_cut_by_bytes_and_alone_an_operation_waits_for_the_loop() -> None:
    log = HeldLog()
    size = len(frames.framed(encode(op(1, 1000))))
    oplog = OperationLog(log, lambda o, at: None, cut_ops=1000,  # type: ignore[arg-type]
                         cut_bytes=3 * size)
    lone = oplog.add(op(1, 1000))
    assert log.frames == []  # below both limits: cut when the loop comes back
    await asyncio.sleep(0)
    assert len(log.frames) == 1
    more = [oplog.add(op(i, 1000)) for i in range(2, 8)]
    assert [len(frames.unpack(f)) for f in log.frames] == [1, 3, 3]
    for i in range(3):
        log.release(i)
    await asyncio.gather(lone, *more)


async def test_an_operation_larger_than_a_frame_goes_as_part_frames_acked_after_the_last(
        ) -> None:
    log = HeldLog()
    committed: list[tuple[int, Position]] = []
    oplog = OperationLog(log, lambda o, at: committed.append((o.sequence, at)),  # type: ignore[arg-type]
                         max_frame_bytes=1000, max_frames_in_flight=2, cut_ops=1)
    small = oplog.add(op(1), "small")
    big = oplog.add(AppendOp(2, 0, 1, 10, b"B" * 2500), "big")
    after = oplog.add(op(3, size=10), "after")
    # the small one's frame, then the big one's parts back to back (past the
    # in-flight limit: nothing may come between them); the next one waits
    assert ["part" if frames.is_part(f) else "data" for f in log.frames] == \
        ["data", "part", "part", "part"]
    assert all(len(f) <= 1000 for f in log.frames)
    assembler: frames.PartAssembler[int] = frames.PartAssembler()
    whole = [assembler.add(f, i) for i, f in enumerate(log.frames[1:4], start=1)]
    assert whole[:2] == [None, None] and whole[2] is not None
    assert whole[2][1] == 1 and decode(whole[2][0]) == AppendOp(2, 0, 1, 10, b"B" * 2500)
    for i in range(3):
        log.release(i)
    await asyncio.sleep(0)
    assert small.done() and not big.done()  # its last part is not durable yet
    log.release(3)
    await asyncio.sleep(0)
    assert big.result() == "big"
    # committed with the address of its first part, where it is read back from
    assert committed == [(1, Position(0, 0)), (2, Position(0, 1))]
    await asyncio.sleep(0)
    assert len(log.frames) == 5 and not frames.is_part(log.frames[4])
    log.release(4)
    assert await after == "after"
    assert [s for s, _ in committed] == [1, 2, 3]


async def test_a_queue_longer_than_a_frame_is_cut_at_the_frame_limit_in_order() -> None:
    # the queue holds more than one frame (frames in flight at their limit):
    # frames of at most max_frame_bytes, in order; the last one, when all that
    # is left fits, is the whole queue at once
    log = HeldLog()
    size = len(frames.framed(encode(op(1, 100))))
    oplog = OperationLog(log, lambda o, at: None,  # type: ignore[arg-type]
                         max_frame_bytes=frames.FRAME_OVERHEAD + 3 * size,
                         max_frames_in_flight=1, cut_ops=1000)
    futures = [oplog.add(op(i, 100), i) for i in range(1, 9)]
    await asyncio.sleep(0)
    assert [len(frames.unpack(f)) for f in log.frames] == [3]
    for released in range(2):
        log.release(released)
        await asyncio.sleep(0)  # committed; the next cut is the loop's next turn
        await asyncio.sleep(0)
    assert [len(frames.unpack(f)) for f in log.frames] == [3, 3, 2]
    assert all(len(f) <= frames.FRAME_OVERHEAD + 3 * size for f in log.frames)
    log.release(2)
    assert await asyncio.gather(*futures) == list(range(1, 9))
    assert [decode(raw) for f in log.frames for raw in frames.unpack(f)] == \
        [op(i, 100) for i in range(1, 9)]
    assert oplog.frames_written == 3 and oplog.operations_written == 8


async def test_a_checkpoint_is_due_once_the_operations_since_the_last_weigh_enough() -> None:
    """Each operation weighs its data plus OPERATION_WEIGHT; the one that
    brings the weight since the last checkpoint to checkpoint_every_bytes
    calls on_checkpoint_due, again after every later one until a checkpoint
    is added, which starts the count again."""
    log = HeldLog()
    events: list[object] = []
    add_checkpoint = True

    def due() -> None:
        events.append("due")
        if add_checkpoint:
            oplog.add(CheckpointOp(0, 0, b"{}"))

    oplog = OperationLog(log, lambda _o, _a: None,  # type: ignore[arg-type]
                         checkpoint_every_bytes=2 * (10 + OPERATION_WEIGHT) + 1,
                         on_checkpoint_due=due)
    for i in range(1, 7):
        oplog.add(op(i))
        events.append(i)
    assert events == [1, 2, "due", 3, 4, 5, "due", 6]
    events.clear()
    oplog.add(CheckpointOp(0, 0, b"{}"))
    for segment_id in range(3):  # no data: 64 each
        oplog.add(SealOp(0, 0, segment_id))
        events.append("seal")
    assert events == ["seal", "seal", "due", "seal"]
    events.clear()
    add_checkpoint = False
    for i in range(7, 11):
        oplog.add(op(i))
        events.append(i)
    assert events == [7, 8, "due", 9, "due", 10]
