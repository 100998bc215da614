"""Writing events to a stream: :class:`StreamWriter`.

An event goes to the open segment whose key range holds its routing key's
point (:func:`~quire.streams.model.key_hash`; no key: a random point), so
the events of one key are in one segment, in write order.  Per segment the
writer keeps one connection to the segment's owner, set up with
``SetupAppend`` under the writer's 128-bit id, and sends what was written
in one loop iteration as one ``AppendBlockEnd`` (up to
``max_block_events`` / ``max_block_bytes``), without waiting for earlier
blocks: blocks pipeline, and are acknowledged in order.

Exactly once: each block carries the number of its last event (numbers
count up per writer and segment, from the number the segment last stored
for this writer id).  When a connection breaks, or its owner answers
WrongHost, the writer resolves the owner again, sets up again (the answer
says the last number the segment stored) and resends the unacknowledged
blocks, unchanged: those the segment already has are acknowledged as
duplicates without being written again.

A sealed segment (the stream was scaled) answers SegmentIsSealed: its
unacknowledged events are routed again, first and in order, over the
segment's successors, which the controller names; new writes wait until
then.  No successors means the stream is sealed: the events fail with
StreamSealedError.

A segment that answers NoSuchSegment was sealed by a scale and then
deleted by a truncation before the writer learnt of the seal (or its
stream was deleted): its events are routed over its successors the same
way (Pravega's writer does so too), with one exception: events sent
before a connection broke, whose answer never came, may have landed
before the seal and gone with the truncation; resent, they could be
stored twice, so they fail with SegmentStoreConnectionError (outcome
unknown).  No successors: the events fail with SegmentNotFoundError.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections import deque
from dataclasses import dataclass, field

from quire.errors import (
    ConfigError,
    ContainerNotOwnedError,
    QuireError,
    SegmentNotFoundError,
    SegmentStoreConnectionError,
    StreamSealedError,
)
from quire.pravega_wire import (
    MAX_WIRECOMMAND_SIZE,
    NO_EVENT_NUMBER,
    AppendBlockEnd,
    AppendSetup,
    DataAppended,
    SegmentIsSealed,
    SetupAppend,
    WireCommand,
    WrongHost,
)
from quire.streams.connection import SegmentConnection, next_request_id
from quire.streams.controller import ControllerClient
from quire.streams.model import Segment, frame_event, key_hash, segment_for
from quire.streams.refusals import error_of
from quire.streams.segments import NotSent, RemoteSegmentStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterConfig:
    max_block_events: int = 500
    """Events in one AppendBlockEnd at most (the Pravega client's figure)."""
    max_block_bytes: int = 1024 * 1024
    """Bytes of framed events in one AppendBlockEnd at most; also the
    largest event taken (its 8-byte header included)."""
    max_breaks_without_progress: int = 10
    """Connection breaks in a row, with no block acknowledged in between,
    after which a segment's events fail (SegmentStoreConnectionError, their
    outcome unknown) instead of being resent again: a block the server
    keeps refusing by closing the connection must not be resent forever."""

    def __post_init__(self) -> None:
        if self.max_block_events < 1:
            raise ConfigError("max_block_events must be positive")
        if self.max_breaks_without_progress < 1:
            raise ConfigError("max_breaks_without_progress must be positive")
        if not 8 < self.max_block_bytes <= MAX_WIRECOMMAND_SIZE - 64:
            raise ConfigError("max_block_bytes must fit in one wire command")


@dataclass(slots=True)
class _Event:
    point: float
    data: bytes
    """Framed (header and payload)."""
    future: asyncio.Future[None]


@dataclass(slots=True)
class _Block:
    last_event_number: int
    events: list[_Event]
    request_id: int = 0


@dataclass
class SegmentWriterState:
    """A writer's state for one segment: its connection, what is queued
    and what is in flight."""

    segment: Segment
    name: str
    """The segment written: the stream segment's name, or a transaction's
    segment of it."""
    connection: SegmentConnection | None = None
    ready: bool = False
    """Set up on ``connection``: blocks may be sent."""
    next_event_number: int | None = None
    """The next event's number (None before the first setup)."""
    queued: list[_Event] = field(default_factory=list)
    unacked: deque[_Block] = field(default_factory=deque)
    retired: bool = False
    """Given up (its segment sealed, or its events failed): no more setups;
    a later event for the segment gets a new writer."""
    connecting: asyncio.Task[None] | None = None
    breaks: int = 0
    """Connection breaks since the last acknowledgement."""


class StreamWriter:
    """Writes events to ``scope/stream``; :meth:`start` it, :meth:`close` it.

    ``writer_id`` (128-bit) identifies the writer to the segments for
    deduplication; give the same one to a writer that takes over from a
    crashed one so its resends are deduplicated too (default: a new UUID).
    """

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 scope: str, stream: str, writer_id: int | None = None,
                 config: WriterConfig | None = None) -> None:
        self.controller = controller
        self.store = segments
        self.scope = scope
        self.stream = stream
        self.writer_id = uuid.uuid4().int if writer_id is None else writer_id
        self.config = config or WriterConfig()
        self._routes: list[Segment] = []
        self._writers: dict[int, SegmentWriterState] = {}
        self._held: list[_Event] | None = None
        """Events written while a sealed segment's successors are looked up."""
        self._following = 0
        """Sealed segments whose successors are being looked up."""
        self._outstanding: set[asyncio.Future[None]] = set()
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.reconnects = 0
        """Segment connections set up again after a break or WrongHost."""

    async def start(self) -> None:
        self._routes = await self.controller.current_segments(self.scope, self.stream)
        if not self._routes:
            raise StreamSealedError(f"stream {self.scope}/{self.stream} is sealed")

    def name_of(self, segment: Segment) -> str:
        """The name of the segment written for ``segment``."""
        return segment.name

    @property
    def segments(self) -> list[Segment]:
        """The segments written to now, in key order."""
        return list(self._routes)

    # --- writing --------------------------------------------------------------------

    def write_event(self, data: bytes, routing_key: str | None = None) -> asyncio.Future[None]:
        """Queue one event; the future completes once it is durable in its
        segment (exactly once), or fails with its error."""
        if self._closed:
            raise QuireError("the stream writer is closed")
        if len(data) + 8 > self.config.max_block_bytes:
            raise ValueError(f"an event is at most {self.config.max_block_bytes - 8} bytes, "
                             f"got {len(data)}")
        point = key_hash(routing_key) if routing_key is not None else random.random()
        event = _Event(point, frame_event(data), self._loop.create_future())
        self._outstanding.add(event.future)
        event.future.add_done_callback(self._outstanding.discard)
        self._route(event)
        return event.future

    def _route(self, event: _Event) -> None:
        if self._held is not None:
            self._held.append(event)
            return
        if not self._routes:
            event.future.set_exception(
                StreamSealedError(f"stream {self.scope}/{self.stream} is sealed"))
            return
        segment = segment_for(self._routes, event.point)
        writer = self._writers.get(segment.id)
        if writer is None:
            writer = self._writers[segment.id] = SegmentWriterState(segment, self.name_of(segment))
        writer.queued.append(event)
        if not writer.ready:
            self._connect(writer)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def flush(self) -> None:
        """Wait until every event written so far is acknowledged (the first
        failure is raised)."""
        if self._outstanding:
            await asyncio.gather(*list(self._outstanding))

    def _flush(self) -> None:
        self._flush_scheduled = False
        for writer in list(self._writers.values()):
            if writer.ready and writer.queued:
                self._send_queued(writer)

    def _send_queued(self, writer: SegmentWriterState) -> None:
        assert writer.connection is not None and writer.next_event_number is not None
        blocks: list[_Block] = []
        block: list[_Event] = []
        size = 0
        for event in writer.queued:
            if block and (len(block) >= self.config.max_block_events
                          or size + len(event.data) > self.config.max_block_bytes):
                blocks.append(self._number(writer, block))
                block, size = [], 0
            block.append(event)
            size += len(event.data)
        if block:
            blocks.append(self._number(writer, block))
        writer.queued = []
        self._send_blocks(writer, blocks)

    @staticmethod
    def _number(writer: SegmentWriterState, events: list[_Event]) -> _Block:
        assert writer.next_event_number is not None
        last = writer.next_event_number + len(events) - 1
        writer.next_event_number = last + 1
        return _Block(last, events)

    def _send_blocks(self, writer: SegmentWriterState, blocks: list[_Block]) -> None:
        connection = writer.connection
        assert connection is not None
        commands: list[tuple[WireCommand, int]] = []
        for block in blocks:
            block.request_id = next_request_id()
            data = b"".join(e.data for e in block.events)
            commands.append((AppendBlockEnd(self.writer_id, len(data), data, len(block.events),
                                            block.last_event_number, block.request_id),
                             block.request_id))
            writer.unacked.append(block)
        try:
            futures = connection.send(commands)
        except SegmentStoreConnectionError:
            self._lost(writer, connection)
            return
        for block, future in zip(blocks, futures, strict=True):
            future.add_done_callback(functools.partial(self._answered, writer, connection,
                                                       block))

    # --- answers --------------------------------------------------------------------

    def _answered(self, writer: SegmentWriterState, connection: SegmentConnection, block: _Block,
                  future: asyncio.Future[WireCommand]) -> None:
        # retrieved before anything else: a failure on a connection given up
        # (the writer moved on, or was closed with blocks in flight) is
        # answered here, not left to be logged when the future is collected
        error = None if future.cancelled() else future.exception()
        if writer.connection is not connection or writer.retired:
            return  # an answer on a connection given up: the blocks went elsewhere
        if error is not None or future.cancelled():
            self._lost(writer, connection)
            return
        reply = future.result()
        if isinstance(reply, DataAppended):
            writer.breaks = 0
            while writer.unacked and writer.unacked[0].last_event_number <= \
                    reply.event_number:
                for event in writer.unacked.popleft().events:
                    if not event.future.done():
                        event.future.set_result(None)
            return
        if isinstance(reply, WrongHost):
            self.store.refute(writer.name, connection.address)
            self._lost(writer, connection)
            return
        if isinstance(reply, SegmentIsSealed):
            self._sealed(writer)
            return
        error = error_of(reply, writer.name)
        if isinstance(error, SegmentNotFoundError):
            # the blocks sent after this one on this connection were not
            # stored either; those before it, still unanswered, may have been
            self._gone(writer, error, next((i for i, b in enumerate(writer.unacked)
                                            if b is block), len(writer.unacked)))
            return
        self._fail(writer, error)

    def _lost(self, writer: SegmentWriterState, connection: SegmentConnection) -> None:
        """The connection broke: set up again and resend what is unacknowledged."""
        if writer.connection is not connection:
            return
        connection.abort()
        writer.connection = None
        writer.ready = False
        writer.breaks += 1
        if writer.breaks > self.config.max_breaks_without_progress:
            self._fail(writer, SegmentStoreConnectionError(
                f"writer {self.writer_id:x}: the connection to {connection.address} for "
                f"{writer.name} broke {writer.breaks} times in a row with no block "
                "acknowledged; giving up (the outcome of the unacknowledged events is unknown)"))
            return
        self.reconnects += 1
        self._connect(writer)

    def _connect(self, writer: SegmentWriterState) -> None:
        if writer.connecting is not None or writer.retired or self._closed:
            return
        writer.connecting = self._spawn(self._set_up(writer))

    def _spawn(self, coroutine: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._loop.create_task(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _set_up(self, writer: SegmentWriterState) -> None:
        name = writer.name

        async def attempt(address: str) -> tuple[SegmentConnection, WireCommand]:
            # a setup that failed is harmless to send again (to the owner
            # resolved again): an owner that refuses connections now (it
            # crashed; its containers are being taken over) is retried until
            # the store's retry deadline, not given up at once
            try:
                connection = await self.store.open_connection(address)
            except SegmentStoreConnectionError as e:
                raise NotSent(e) from e

            async def set_up(token: str) -> WireCommand:
                request_id = next_request_id()
                return await connection.request(SetupAppend(request_id, self.writer_id, name,
                                                            token), request_id)
            try:
                reply = await self.store.authorized(name, set_up)
            except SegmentStoreConnectionError as e:
                connection.abort()
                raise NotSent(e) from e
            except BaseException:  # no setup: nothing will use this connection
                connection.abort()
                raise
            if isinstance(reply, WrongHost):
                connection.abort()
                raise ContainerNotOwnedError(f"{address} does not serve {name!r} now")
            return connection, reply

        try:
            connection, reply = await self.store.retrying(name, attempt)
        except QuireError as e:
            writer.connecting = None
            self._fail(writer, e)
            return
        writer.connecting = None
        if isinstance(reply, SegmentIsSealed):
            connection.abort()
            self._sealed(writer)
            return
        if not isinstance(reply, AppendSetup):
            connection.abort()
            error = error_of(reply, name)
            if isinstance(error, SegmentNotFoundError):
                # what is unacknowledged was sent on a connection that broke
                self._gone(writer, error, len(writer.unacked))
            else:
                self._fail(writer, error)
            return
        stored = None if reply.last_event_number == NO_EVENT_NUMBER else reply.last_event_number
        while writer.unacked and stored is not None and \
                writer.unacked[0].last_event_number <= stored:
            writer.breaks = 0
            for event in writer.unacked.popleft().events:  # the segment has them
                if not event.future.done():
                    event.future.set_result(None)
        if writer.next_event_number is None:
            writer.next_event_number = (stored or 0) + 1
        writer.connection = connection
        writer.ready = True
        resend = list(writer.unacked)
        writer.unacked.clear()
        if resend:
            self._send_blocks(writer, resend)
        if writer.queued and writer.connection is connection:
            self._send_queued(writer)

    def _fail(self, writer: SegmentWriterState, error: BaseException) -> None:
        """Fail every event of ``writer`` (a definite refusal, or retries
        that ran out: then the outcome of those sent is unknown)."""
        if isinstance(error, SegmentNotFoundError):
            error = SegmentNotFoundError(f"{error} (was the stream deleted?)")
        writer.retired = True
        writer.ready = False
        for event in self._take_events(writer):
            if not event.future.done():
                event.future.set_exception(error)
        if writer.connection is not None:
            writer.connection.abort()
            writer.connection = None
        if self._writers.get(writer.segment.id) is writer:
            del self._writers[writer.segment.id]

    @staticmethod
    def _take_events(writer: SegmentWriterState) -> list[_Event]:
        events = [e for block in writer.unacked for e in block.events] + writer.queued
        writer.unacked.clear()
        writer.queued = []
        return events

    # --- scaling --------------------------------------------------------------------

    def _sealed(self, writer: SegmentWriterState) -> None:
        """``writer``'s segment is sealed: what it did not store goes to the
        successors, before anything written since."""
        self._reroute(writer, None)

    def _gone(self, writer: SegmentWriterState, error: SegmentNotFoundError,
              in_doubt: int) -> None:
        """``writer``'s segment does not exist (module docstring): the first
        ``in_doubt`` unacknowledged blocks may have landed in it before it
        went, and fail as unknown; the others go to the successors."""
        doubtful = [writer.unacked.popleft() for _ in range(in_doubt)]
        unknown = SegmentStoreConnectionError(
            f"writer {self.writer_id:x}: {writer.name} was deleted (truncated away after a "
            "scale sealed it) while events sent to it were unacknowledged: whether they "
            "landed in it is unknown (they are not resent to its successors)")
        for block in doubtful:
            for event in block.events:
                if not event.future.done():
                    event.future.set_exception(unknown)
        self._reroute(writer, error)

    def _reroute(self, writer: SegmentWriterState, gone: SegmentNotFoundError | None) -> None:
        """Route what ``writer`` holds over its segment's successors (its
        segment sealed; ``gone``: deleted too)."""
        writer.retired = True
        writer.ready = False
        if writer.connection is not None:
            writer.connection.abort()
            writer.connection = None
        if self._writers.get(writer.segment.id) is writer:
            del self._writers[writer.segment.id]
        self._held = self._take_events(writer) + (self._held or [])
        self._following += 1
        self._spawn(self._follow(writer.segment, gone))

    async def _follow(self, sealed: Segment, gone: SegmentNotFoundError | None) -> None:
        error: QuireError | None = None
        try:
            successors = await self.controller.successors(self.scope, self.stream, sealed.id)
        except QuireError as e:
            error = e
        else:
            if all(s.id != sealed.id for s in self._routes):
                # a follow of a neighbour already put a newer segment over its
                # range: its successors are older than that one (following them
                # left part of the key space with no segment: seed 115030)
                pass
            elif successors:
                self._routes = [s for s in self._routes if s.id != sealed.id]
                for successor, _predecessors in successors:
                    self._routes = [s for s in self._routes if s.max_key <= successor.min_key
                                    or s.min_key >= successor.max_key]
                    self._routes.append(successor)
                self._routes.sort(key=lambda s: s.min_key)
                log.debug("writer %x: %s sealed, now writing to %s", self.writer_id,
                          sealed.name, [s.name for s in self._routes])
            elif gone is not None:  # never scaled away: the stream was deleted
                error = SegmentNotFoundError(f"{gone} (was the stream deleted?)")
            else:  # no successor: the stream is sealed
                self._routes = []
        self._following -= 1
        if error is not None:
            held, self._held = self._held or [], None
            for event in held:
                if not event.future.done():
                    event.future.set_exception(error)
        if self._following == 0:
            held, self._held = self._held or [], None
            for event in held:
                self._route(event)

    # --- lifetime -------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for what was written, then drop the connections."""
        try:
            await self.flush()
        finally:
            self._closed = True
            for task in list(self._tasks):
                task.cancel()
            for writer in self._writers.values():
                if writer.connection is not None:
                    writer.connection.abort()
            self._writers.clear()
