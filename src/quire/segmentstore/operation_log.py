"""A container's operation log: operations in, data frames out, acks back.

:class:`OperationLog` takes operations in the order the container accepted
them, packs the ones queued meanwhile into data frames
(:mod:`~quire.segmentstore.frames`) and appends the frames to the
container's :class:`~quire.log.DurableDataLog`.  When a frame is durable,
each of its operations is handed to ``on_committed`` (which applies it to
the committed state) and only then is its future completed: an operation is
acknowledged only after its frame is durable in tier-1, and operations are
committed in the order they were added.

Batching is adaptive: a frame is cut when the loop comes back to the log
(every operation added in one loop iteration shares a frame), or as soon as
``cut_ops`` operations or ``cut_bytes`` bytes have queued (so a burst of
hundreds of appends goes out as several frames that pipeline: the first is
on the wire while the rest are still being added, and their completions
come back spread out instead of in one burst); at most
``max_frames_in_flight`` frames are outstanding, so under heavier load
operations queue up and frames grow (to ``max_frame_bytes``), and when
idle an operation waits for nothing.

The log also keeps a container's checkpoint policy: once the operations
added since the last :class:`~quire.segmentstore.operations.CheckpointOp`
weigh ``checkpoint_every_bytes`` (an operation weighs the bytes of data it
carries plus :data:`OPERATION_WEIGHT`), it calls ``on_checkpoint_due``,
which adds a checkpoint.

A frame that fails fails the log: its outcome is unknown, so is the state
of every operation after it, and the container cannot go on (it reopens and
replays, as Pravega's does).  Every pending and later operation then fails
with :class:`~quire.errors.ContainerFencedError` (the log was taken by a new
owner) or :class:`~quire.errors.ContainerClosedError`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from quire.errors import (
    ContainerClosedError,
    ContainerFencedError,
    CorruptRecordError,
    QueueFullError,
    fresh_copy,
)
from quire.log import DurableDataLog, LogFencedError, Position
from quire.segmentstore import frames
from quire.segmentstore.operations import (
    AppendOp,
    CheckpointOp,
    Operation,
    Queued,
    as_operation,
    decode,
    encode,
)

Pending = tuple[Queued, bytes, "asyncio.Future[Any]", object]
"""An operation (or an append packed as a tuple, see
:data:`~quire.segmentstore.operations.PackedAppend`), its bytes as they sit
in a frame (length first), its future and the value the future gets."""
_Pending = Pending
_InFlight = tuple["asyncio.Future[Position]", list[_Pending], "asyncio.Future[Position] | None",
                  int]
"""A frame's append, the operations it completes, for the last part
frame of an operation written in parts the append of its first part (the
operation's address), and the frame's bytes."""
T = TypeVar("T")
OPERATION_WEIGHT = 64
"""What an operation weighs towards the next checkpoint besides its data."""
_NEVER = 1 << 62


class OperationLog:
    """See the module docstring."""

    def __init__(self, log: DurableDataLog, on_committed: Callable[[Operation, Position], None],
                 *, max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
                 max_frames_in_flight: int = 8, cut_ops: int = 64,
                 cut_bytes: int = 256 << 10,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_frame_committed: Callable[[list[Pending], Position], None] | None = None,
                 checkpoint_every_bytes: int = _NEVER,
                 on_checkpoint_due: Callable[[], None] | None = None,
                 on_bytes_committed: Callable[[int], None] | None = None,
                 ) -> None:
        """``on_committed(op, address)`` applies one committed operation;
        ``on_frame_committed(batch, address)``, if given, is called instead
        with a durable frame's operations (:data:`Pending`, in log order;
        it only reads them) and must apply each of them in order, as
        ``on_committed`` would: one call per frame, not one per operation.
        Futures are completed after either.  ``on_checkpoint_due()`` is
        called right after the operation that brings the weight since the
        last checkpoint to ``checkpoint_every_bytes`` is added (see the
        module docstring); it must add a checkpoint, or it is called again
        after the next operation.  ``on_bytes_committed(n)`` is told each
        durable frame's size (after its operations are committed)."""
        if cut_ops < 1 or cut_bytes < 1:
            raise ValueError("cut_ops and cut_bytes are at least 1")
        self._log = log
        self._cut_ops = cut_ops
        self._cut_bytes = cut_bytes
        self._queued_bytes = 0
        self._on_committed = on_committed
        self._on_frame_committed = on_frame_committed
        self._on_failure = on_failure
        self._on_checkpoint_due = on_checkpoint_due or _nothing
        self._on_bytes_committed = on_bytes_committed
        self._checkpoint_every_bytes = checkpoint_every_bytes if on_checkpoint_due else _NEVER
        self._weight_since_checkpoint = 0
        self._max_frame_bytes = max_frame_bytes
        self._max_in_flight = max_frames_in_flight
        self._queue: collections.deque[_Pending] = collections.deque()
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the log runs on, taken at the first :meth:`add_encoded`
        (``asyncio.get_running_loop()`` costs a ``getpid`` system call on
        Python 3.11: one per append showed in profiles)."""
        self._last: asyncio.Future[Any] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self.frames_written = 0
        self.operations_written = 0

    @property
    def queued_bytes(self) -> int:
        """Bytes of operations queued, not yet in a frame written to tier-1
        (the tier-1 backlog, on ``/metrics``)."""
        return self._queued_bytes

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the log, if one did."""
        return self._failure

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def check(self) -> None:
        """Raise the log's failure, or ContainerClosedError once closed."""
        if self._failure is not None:
            raise fresh_copy(self._failure)
        if self._closed:
            raise ContainerClosedError("the container is closed")

    def add(self, op: Operation, result: object = None,
            raw: bytes | None = None) -> asyncio.Future[Any]:
        """Queue ``op``; the future gets ``result`` once ``op`` is committed.
        ``raw``: the operation's encoding with its length in front
        (:func:`frames.framed`), if the caller has it."""
        if self._failure is not None or self._closed:
            self.check()
        if raw is None:
            raw = frames.framed(encode(op))
        data_bytes = len(op.data) if type(op) is AppendOp \
            else None if type(op) is CheckpointOp else 0
        return self.add_encoded(op, raw, result, data_bytes)

    def add_encoded(self, op: Queued, raw: bytes, result: object,
                    data_bytes: int | None) -> asyncio.Future[Any]:
        """:meth:`add` for a caller that has ``op``'s encoding with its length
        in front (``raw``) and has just checked that the log is usable
        (:meth:`check`): the appends' hot path.  ``op`` may be an append
        packed as a tuple (:data:`~quire.segmentstore.operations.PackedAppend`):
        ``on_frame_committed`` gets it as it is, ``on_committed`` as an
        operation.  ``data_bytes``: the bytes of data ``op`` carries (its
        weight towards the next checkpoint), None for a checkpoint (the
        weight starts again from nothing)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        queue = self._queue
        queue.append((op, raw, future, result))
        self._last = future
        self._queued_bytes += len(raw)
        if len(queue) >= self._cut_ops or self._queued_bytes >= self._cut_bytes:
            self._flush(full_only=True)
        if queue and not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if data_bytes is None:
            self._weight_since_checkpoint = 0
        else:
            self._weight_since_checkpoint += data_bytes + OPERATION_WEIGHT
            if self._weight_since_checkpoint >= self._checkpoint_every_bytes:
                self._on_checkpoint_due()
        return future

    def barrier(self, result: object = None) -> asyncio.Future[Any]:
        """A future that gets ``result`` once every operation added so far is
        committed (or the failure, if one of them fails)."""
        self.check()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        last = self._last
        if last is None or (last.done() and not last.cancelled() and last.exception() is None):
            future.set_result(result)
            return future

        def follow(done: asyncio.Future[Any]) -> None:
            if future.done():
                return
            if done.cancelled() or done.exception() is None:
                future.set_result(result)
            else:
                future.set_exception(done.exception())  # type: ignore[arg-type]

        last.add_done_callback(follow)
        return future

    def _flush(self, full_only: bool = False) -> None:
        """Cut frames of what is queued while fewer than the most are in
        flight; ``full_only``: only frames of ``cut_ops`` operations or
        ``cut_bytes`` bytes (the rest waits for the loop's turn)."""
        if not full_only:
            self._flush_scheduled = False
        queue = self._queue
        room = self._max_frame_bytes - frames.FRAME_OVERHEAD
        while queue and len(self._in_flight) < self._max_in_flight \
                and self._failure is None:
            if full_only and len(queue) < self._cut_ops \
                    and self._queued_bytes < self._cut_bytes:
                return
            if len(queue[0][1]) > room:  # too large for a frame: part frames of its own
                self._append_parts(queue.popleft())
                continue
            if self._queued_bytes <= room:  # all of it fits one frame (the usual case)
                batch = list(queue)
                queue.clear()
                parts = [pending[1] for pending in batch]
                frame_bytes = self._queued_bytes
            else:
                batch = []
                parts = []
                frame_bytes = 0
                while queue:
                    pending = queue[0]
                    size = len(pending[1])
                    if frame_bytes + size > room:
                        break
                    frame_bytes += size
                    parts.append(pending[1])
                    batch.append(queue.popleft())
            frame = frames.join(len(batch), parts)
            self._queued_bytes -= frame_bytes
            try:
                appended = self._log.append(frame)
            except QueueFullError:
                queue.extendleft(reversed(batch))  # retried when a frame completes
                self._queued_bytes += frame_bytes
                return
            except BaseException as e:
                queue.extendleft(reversed(batch))
                self._queued_bytes += frame_bytes
                self._fail(e)
                return
            self._in_flight.append((appended, batch, None, len(frame)))
            appended.add_done_callback(self._frame_done)

    def _append_parts(self, pending: _Pending) -> None:
        """Append one operation as part frames, back to back (nothing can come
        between them: the log takes appends in call order)."""
        raw = pending[1]
        self._queued_bytes -= len(raw)
        parts = frames.split(memoryview(raw)[frames.OPERATION_OVERHEAD:], self._max_frame_bytes)
        first: asyncio.Future[Position] | None = None
        for i, part in enumerate(parts):
            try:
                appended = self._log.append(part)
            except QueueFullError:
                if first is None:
                    self._queue.appendleft(pending)  # retried when a frame completes
                    self._queued_bytes += len(raw)
                    return
                self._fail(ContainerClosedError("tier-1 refused the rest of a large operation"))
                self._reject([pending])
                return
            except BaseException as e:
                self._fail(e)
                self._reject([pending])
                return
            last = i == len(parts) - 1
            self._in_flight.append((appended, [pending] if last else [],
                                    first if last else None, len(part)))
            if first is None:
                first = appended
            appended.add_done_callback(self._frame_done)

    def _frame_done(self, _: asyncio.Future[Position]) -> None:
        while self._in_flight and self._in_flight[0][0].done():
            appended, batch, first, size = self._in_flight.popleft()
            if self._failure is not None:
                self._reject(batch)
                continue
            error = appended.exception() if not appended.cancelled() else \
                ContainerClosedError("a tier-1 append was cancelled")
            if error is not None:
                self._fail(error)  # rejects what is in flight behind it and queued
                self._reject(batch)
                continue
            address = (first or appended).result()
            if self._on_frame_committed is not None:
                self._on_frame_committed(batch, address)
                for _op, _raw, future, result in batch:
                    if not future.done():
                        future.set_result(result)
            else:
                commit = self._on_committed
                for op, _raw, future, result in batch:
                    commit(as_operation(op), address)
                    if not future.done():
                        future.set_result(result)
            self.frames_written += 1
            self.operations_written += len(batch)
            if self._on_bytes_committed is not None:
                self._on_bytes_committed(size)
        if self._queue and not self._flush_scheduled and self._failure is None:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _fail(self, error: BaseException) -> None:
        if self._failure is not None:
            return
        if isinstance(error, LogFencedError):
            failure: BaseException = ContainerFencedError(
                f"another owner took the container's tier-1 log: {error}")
        elif isinstance(error, ContainerClosedError | ContainerFencedError):
            failure = error
        else:
            failure = ContainerClosedError(f"a tier-1 append failed (outcome unknown): {error!r}")
        failure.__cause__ = error
        self._failure = failure
        for _appended, batch, _first, _size in self._in_flight:
            self._reject(batch)
        self._reject(list(self._queue))
        self._queue.clear()
        self._queued_bytes = 0
        if self._on_failure is not None:
            self._on_failure(failure)

    def _reject(self, batch: list[_Pending]) -> None:
        error = self._failure or ContainerClosedError("a tier-1 append failed")
        for _op, _raw, future, _result in batch:
            if not future.done():
                future.set_exception(fresh_copy(error))

    async def drain(self) -> None:
        """Wait until every operation added so far is committed or failed."""
        if self._failure is None and not self._closed and self._last is not None:
            barrier = self.barrier()
            await asyncio.wait([barrier])
            if not barrier.cancelled():
                barrier.exception()  # retrieved: the operations' owners see it

    async def close(self) -> None:
        """Wait for the pending operations, then give up the log (idempotent)."""
        if self._closed:
            return
        await self.drain()
        self._closed = True
        await self._log.close()


def _nothing() -> None:
    pass


async def read_operations(log: DurableDataLog, from_address: Position | None = None,
                          counted: Callable[[int], None] | None = None,
                          ) -> AsyncGenerator[tuple[Position, list[Operation]], None]:
    """The log's operations from ``from_address`` on, in log order: each data
    frame's with its address, and each operation written as part frames with
    the address of its first part (one whose parts stop short is skipped: it
    was never acknowledged).  CorruptRecordError for a record that does not
    decode.  ``counted(n)`` is told each record's size as it is read."""
    records = log.read(from_address)
    try:
        async for found in operations_of(records, counted):
            yield found
    finally:
        aclose = getattr(records, "aclose", None)
        if aclose is not None:
            await aclose()


async def operations_of(records: AsyncIterator[tuple[T, bytes]],
                        counted: Callable[[int], None] | None = None,
                        ) -> AsyncGenerator[tuple[T, list[Operation]], None]:
    """The operations of tier-1 records ``(address, frame)`` in log order (see
    :func:`read_operations`; the records may be a log's, or its ledgers' read
    one after another)."""
    assembler: frames.PartAssembler[T] = frames.PartAssembler()
    async for address, frame in records:
        if counted is not None:
            counted(len(frame))
        if frames.is_part(frame):
            whole = assembler.add(frame, address)
            if whole is not None:
                yield whole[1], [decode(whole[0])]
        else:
            assembler.abandon()  # parts cut short were never acknowledged
            yield address, [decode(raw) for raw in frames.unpack(frame)]


async def read_frame(log: DurableDataLog, address: Position) -> list[Operation]:
    """The operations of the frame at ``address``: a data frame's, or the one
    operation whose first part frame is there (CorruptRecordError if it is gone)."""
    operations = read_operations(log, address)
    try:
        async for at, ops in operations:
            if at == address:
                return ops
            break
    finally:
        await operations.aclose()
    raise CorruptRecordError(f"no data frame at {address} in the tier-1 log")
