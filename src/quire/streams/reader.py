"""Reading the events of a stream: :class:`StreamReader`.

A reader starts at a stream cut (segment id -> offset): the stream's head
(``getSegments`` at time 0, what the Pravega client does) or its tail (the
open segments at their current lengths).  Each segment of the cut is read
by a task of its own, on a connection of its own; events are parsed out of
the bytes whatever the read boundaries (:class:`~quire.streams.model.EventParser`)
and handed over in segment order, so the events of one routing key come out
in the order they were written.  A segment read to its end (sealed) is
done; a successor (from the controller) is read once *all* its
predecessors are done, so a key's events before a scale come out before
its events after it.

:meth:`StreamReader.events` with ``follow=False`` reads what is there when
each segment is reached: up to the segment's length then, and past it only
through the successors of sealed segments.  With ``follow=True`` it keeps
waiting at the tails (the server answers a read at the tail within its
tail wait) and ends only when the stream is sealed and read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from quire.errors import SegmentTruncatedError
from quire.streams.controller import ControllerClient
from quire.streams.model import EventParser, segment_name
from quire.streams.segments import RemoteSegmentStore


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its segment, the offset of its header there, its payload."""

    segment_id: int
    offset: int
    data: bytes


async def tail_cut(controller: ControllerClient, segments: RemoteSegmentStore, scope: str,
                   stream: str) -> dict[int, int]:
    """Where the stream ends now: each open segment's id -> its length."""
    current = await controller.current_segments(scope, stream)
    infos = await asyncio.gather(*(segments.get_info(s.name) for s in current))
    return {s.id: info.length for s, info in zip(current, infos, strict=True)}


_END = object()


class StreamReader:
    """Reads ``scope/stream`` from its head, its tail or a given cut.

    ``end_cut`` (segment id -> offset, e.g. a :func:`tail_cut` taken
    earlier) bounds the read: each of its segments is read up to its offset
    and no further, and no successor of them is read; segments before it are
    read to their ends and followed as usual.  So two cuts taken one after
    the other split a stream into the events before, between and after them
    (what a batch of a streaming job reads)."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 scope: str, stream: str, from_tail: bool = False,
                 cut: dict[int, int] | None = None,
                 end_cut: dict[int, int] | None = None) -> None:
        self.controller = controller
        self.store = segments
        self.scope = scope
        self.stream = stream
        self.from_tail = from_tail
        self.cut = cut
        self.end_cut = end_cut
        self._done: set[int] = set()
        self._started: set[int] = set()
        self._queue: asyncio.Queue[object] = asyncio.Queue(maxsize=10_000)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start_cut(self) -> dict[int, int]:
        """The cut reading starts from (fixed by the first call)."""
        if self.cut is None:
            if self.from_tail:
                self.cut = await tail_cut(self.controller, self.store, self.scope, self.stream)
            else:
                self.cut = await self.controller.head_cut(self.scope, self.stream)
        return self.cut

    async def events(self, follow: bool = False) -> AsyncIterator[Event]:
        """The stream's events from the start cut (module docstring for
        ``follow``).  Errors of a segment's reads are raised here."""
        cut = await self.start_cut()
        for sid, offset in sorted(cut.items()):
            self._start(sid, offset, follow)
        if not cut:
            return
        ended = 0
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    # a segment's successors are started before its end is queued
                    ended += 1
                    if ended == len(self._started):
                        return
                    continue
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, Event)
                yield item
        finally:
            await self.close()

    def _start(self, sid: int, offset: int, follow: bool) -> None:
        if sid in self._started:
            return
        self._started.add(sid)
        task = asyncio.get_running_loop().create_task(self._read_segment(sid, offset, follow))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_segment(self, sid: int, offset: int, follow: bool) -> None:
        name = segment_name(self.scope, self.stream, sid)
        end = None if self.end_cut is None else self.end_cut.get(sid)
        try:
            if end is not None:
                await self._read_to_length(sid, name, offset, end)
                ended = False  # the end cut is in this segment: what follows is after it
            elif follow:
                ended = await self._follow(sid, name, offset)
            else:
                ended = await self._read_to_length(sid, name, offset)
            self.store.done_reading(name)
            if ended:
                self._done.add(sid)
                for successor, predecessors in await self.controller.successors(
                        self.scope, self.stream, sid):
                    if all(p in self._done for p in predecessors):
                        self._start(successor.id, 0, follow)
        except Exception as e:  # handed to the consumer, which raises it
            await self._queue.put(e)
        finally:
            # the segment's read connection goes however the read ends,
            # cancelled by close() included (it leaked one per closed reader)
            self.store.done_reading(name)
        # not on cancellation: close() cancels, and nobody reads the queue then
        await self._queue.put(_END)

    async def _emit(self, sid: int, parser: EventParser, data: bytes) -> None:
        for offset, payload in parser.feed(data):
            await self._queue.put(Event(sid, offset, payload))

    async def _read_to_length(self, sid: int, name: str, offset: int,
                              end: int | None = None) -> bool:
        """Read up to the segment's length now (or to ``end``, if below it);
        True if it is sealed and was read to its end."""
        info = await self.store.get_info(name)
        offset = max(offset, info.start_offset)
        stop = info.length if end is None else min(end, info.length)
        parser = EventParser(offset)
        while offset < stop:
            r = await self.store.read(name, offset, min(stop - offset,
                                                        self.store.config.read_length_bytes))
            await self._emit(sid, parser, r.data)
            offset += len(r.data)
            if not r.data:
                break
        return info.sealed and offset >= info.length

    async def _follow(self, sid: int, name: str, offset: int) -> bool:
        parser = EventParser(offset)
        while True:
            try:
                r = await self.store.read(name, parser.offset)
            except SegmentTruncatedError as e:
                if parser.partial_bytes:
                    raise
                parser = EventParser(e.start_offset)  # what was before is gone
                continue
            await self._emit(sid, parser, r.data)
            if r.end_of_segment:
                return True

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
