"""The steady mixed load of ``benchmarks/soak_month.py``, whose live data is bounded.

:class:`SoakLoad` drives a running system through Quire's own clients (the
controller's gRPC API and the segment stores' wire protocol), all at once
and at a steady pace, for as long as it runs:

* **streams** of 2 segments, each with a size retention (so the
  controller truncates them), written by a :class:`~quire.streams.StreamWriter`
  each at a fixed event rate; every ``rotate_s`` a new stream is created
  and the oldest sealed and deleted, so a few live at a time; each is
  scaled once (its first segment split) half way through its life;
* a **table** of 100 keys updated at a fixed rate (and a key removed now
  and then);
* **reader groups** coming and going: a group is a state table of its own
  (``<scope>/<group>_kvtable/0.#epoch.0``, as the Pravega client keeps
  one) and a :class:`~quire.streams.StreamReader` following the newest
  stream, writing its position to the table; a new one every
  ``group_s``, each deleted (reader and table) two periods later;
* **transactions** on the newest stream every ``txn_s``, a few events
  each, committed (every third aborted).

Failures are counted, not raised: a soak keeps going and reports them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from dataclasses import dataclass, field

from quire.errors import QuireError
from quire.segmentstore import SegmentType
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    StreamReader,
    StreamTransaction,
    StreamWriter,
)

SCOPE = "soak"
TABLE = f"{SCOPE}/kv/0.#epoch.0"


@dataclass(frozen=True)
class LoadShape:
    """How hard and how often (units in the names)."""

    events_per_s: int = 100
    """Per live stream."""
    event_bytes: int = 512
    streams: int = 3
    """Streams live at a time."""
    rotate_s: float = 15.0
    retention_bytes: int = 1 << 20
    table_updates_per_s: int = 50
    group_s: float = 10.0
    txn_s: float = 3.0


@dataclass
class LoadCounts:
    events: int = 0
    streams_created: int = 0
    streams_deleted: int = 0
    scales: int = 0
    table_updates: int = 0
    groups_created: int = 0
    groups_deleted: int = 0
    txns_committed: int = 0
    txns_aborted: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


class SoakLoad:
    """See the module docstring: :meth:`run` until :meth:`stop`."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore,
                 shape: LoadShape) -> None:
        self.controller = controller
        self.segments = segments
        self.shape = shape
        self.counts = LoadCounts()
        self._stopping = asyncio.Event()
        self._streams: collections.deque[tuple[str, StreamWriter, asyncio.Task[None]]] = \
            collections.deque()
        self._generation = 0
        self._random = random.Random(42)

    def stop(self) -> None:
        self._stopping.set()

    async def _every(self, period_s: float) -> bool:
        """Wait a period (the load's pace); False once stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), period_s)
        return not self._stopping.is_set()

    def _failed(self, what: str, error: BaseException) -> None:
        self.counts.errors[f"{what}: {type(error).__name__}"] += 1

    async def run(self) -> None:
        await self.controller.create_scope(SCOPE)
        await self.segments.create_segment(TABLE, SegmentType.TABLE)
        for _ in range(self.shape.streams):
            await self._new_stream()
        tasks = [asyncio.ensure_future(t) for t in (self._rotate(), self._table(),
                                                    self._groups(), self._transactions())]
        try:
            await self._stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            while self._streams:
                await self._retire()

    # --- streams ------------------------------------------------------------------

    async def _new_stream(self) -> None:
        self._generation += 1
        name = f"s{self._generation}"
        await self.controller.create_stream(SCOPE, name, 2, retention="size",
                                            retention_param=self.shape.retention_bytes)
        writer = StreamWriter(self.controller, self.segments, SCOPE, name)
        await writer.start()
        task = asyncio.ensure_future(self._write(name, writer))
        self._streams.append((name, writer, task))
        self.counts.streams_created += 1

    async def _write(self, name: str, writer: StreamWriter) -> None:
        payload = b"e" * self.shape.event_bytes
        batch = max(1, self.shape.events_per_s // 20)
        while await self._every(batch / self.shape.events_per_s):
            try:
                await asyncio.gather(*(writer.write_event(payload, routing_key=f"k{i}")
                                       for i in range(batch)))
                self.counts.events += batch
            except QuireError as e:
                self._failed("write", e)

    async def _retire(self) -> None:
        name, writer, task = self._streams.popleft()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            await writer.close()
            await self.controller.seal_stream(SCOPE, name)
            await self.controller.delete_stream(SCOPE, name)
            self.counts.streams_deleted += 1
        except QuireError as e:
            self._failed("delete stream", e)

    async def _rotate(self) -> None:
        half = self.shape.rotate_s * self.shape.streams / 2
        scaled: set[str] = set()
        ages: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while await self._every(self.shape.rotate_s / 2):
            now = loop.time()
            for name, _writer, _task in list(self._streams):
                ages.setdefault(name, now)
                if name not in scaled and now - ages[name] >= half:
                    scaled.add(name)
                    await self._scale(name)
            if now - ages.get(self._streams[-1][0], now) >= self.shape.rotate_s:
                try:
                    await self._new_stream()
                    await self._retire()
                except QuireError as e:
                    self._failed("rotate", e)

    async def _scale(self, name: str) -> None:
        try:
            first = (await self.controller.current_segments(SCOPE, name))[0]
            middle = (first.min_key + first.max_key) / 2
            await self.controller.scale(SCOPE, name, [first.id],
                                        [(first.min_key, middle), (middle, first.max_key)])
            self.counts.scales += 1
        except QuireError as e:
            self._failed("scale", e)

    # --- a table, reader groups, transactions -----------------------------------------

    async def _table(self) -> None:
        value = b"v" * 100
        while await self._every(1 / self.shape.table_updates_per_s):
            key = b"key-%03d" % self._random.randrange(100)
            try:
                if self._random.random() < 0.02:
                    await self.segments.table_remove(TABLE, [(key, None)])
                else:
                    await self.segments.table_put(TABLE, [(key, value, None)])
                self.counts.table_updates += 1
            except QuireError as e:
                self._failed("table", e)

    async def _groups(self) -> None:
        live: collections.deque[tuple[str, asyncio.Task[None]]] = collections.deque()
        number = 0
        try:
            while await self._every(self.shape.group_s):
                number += 1
                table = f"{SCOPE}/g{number}_kvtable/0.#epoch.0"
                try:
                    await self.segments.create_segment(table, SegmentType.TABLE)
                    stream = self._streams[-1][0]
                    live.append((table, asyncio.ensure_future(self._read(table, stream))))
                    self.counts.groups_created += 1
                except QuireError as e:
                    self._failed("group", e)
                while len(live) > 2:
                    await self._end_group(*live.popleft())
        finally:
            while live:
                await self._end_group(*live.popleft())

    async def _read(self, table: str, stream: str) -> None:
        reader = StreamReader(self.controller, self.segments, SCOPE, stream)
        read = 0
        try:
            async for event in reader.events(follow=True):
                read += 1
                if read % 100 == 0:
                    await self.segments.table_put(table, [(b"position", b"%d:%d" % (
                        event.segment_id, event.offset), None)])
        except QuireError as e:
            self._failed("read", e)
        finally:
            await reader.close()

    async def _end_group(self, table: str, reading: asyncio.Task[None]) -> None:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        try:
            await self.segments.delete(table)
            self.counts.groups_deleted += 1
        except QuireError as e:
            self._failed("group delete", e)

    async def _transactions(self) -> None:
        number = 0
        while await self._every(self.shape.txn_s):
            number += 1
            try:
                txn = await StreamTransaction.begin(self.controller, self.segments, SCOPE,
                                                    self._streams[-1][0])
                await asyncio.gather(*(txn.write_event(b"t" * 200, routing_key=f"t{i}")
                                       for i in range(10)))
                if number % 3:
                    await txn.commit()
                    self.counts.txns_committed += 1
                else:
                    await txn.abort()
                    self.counts.txns_aborted += 1
            except QuireError as e:
                self._failed("transaction", e)
