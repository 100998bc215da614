"""Reading a stream's flushed history out of tier-2: :func:`read_stream`,
:class:`StreamDataset`, :func:`read_split`.

Blocking calls for plain Python (a notebook, a Spark task, a script): the
tier-2 reads run on one event loop thread per process, with one open
storage per tier-2 URI, and the next read is on its way while the current
bytes are split into events.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from quire.errors import ProtocolError
from quire.history.catalog import Tier2Catalog
from quire.history.events import EventSplitter, arrow_schema, event_batch, event_times
from quire.history.plan import DEFAULT_SPLIT_BYTES, Bound, HistorySplit, plan_history
from quire.loop_thread import LoopThread
from quire.segmentstore.chunk_sidecars import SidecarCache
from quire.tier2 import ChunkStorage, open_chunk_storage, read_segment

if TYPE_CHECKING:
    import pyarrow as pa

READ_BYTES = 4 << 20
"""Bytes per tier-2 read."""

_lock = threading.Lock()
_state: tuple[int, LoopThread, dict[str, ChunkStorage], dict[str, SidecarCache]] | None = None


def _process() -> tuple[LoopThread, dict[str, ChunkStorage], dict[str, SidecarCache]]:
    """This process's loop thread, open storages and sidecar caches (again after a fork)."""
    global _state
    with _lock:
        if _state is None or _state[0] != os.getpid():
            _state = (os.getpid(), LoopThread("quire-history", "the tier-2 history reader"),
                      {}, {})
        return _state[1], _state[2], _state[3]


async def _storage(uri: str) -> tuple[ChunkStorage, SidecarCache]:
    """The open storage of ``uri`` and its sidecar cache (on the loop)."""
    _loop, storages, caches = _process()
    storage = storages.get(uri)
    if storage is None:
        storage = storages[uri] = await open_chunk_storage(uri)
        caches[uri] = SidecarCache(storage)
    return storage, caches[uri]


def _run(coro: Any) -> Any:
    return _process()[0].run(coro)


def plan(tier2_uri: str, scope: str, stream: str, start: Bound = None, end: Bound = None,
         split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[HistorySplit]:
    """The splits of stream ``scope/stream``'s flushed history from
    ``start`` to ``end`` (:mod:`quire.history.plan`)."""
    async def go() -> list[HistorySplit]:
        storage, _cache = await _storage(tier2_uri)
        catalog = await Tier2Catalog.load(storage)
        return await plan_history(catalog, tier2_uri, scope, stream, start, end, split_bytes)

    splits: list[HistorySplit] = _run(go())
    return splits


def list_streams(tier2_uri: str, scope: str) -> list[str]:
    """The streams of ``scope`` tier-2 records (as last flushed)."""
    async def go() -> list[str]:
        storage, _cache = await _storage(tier2_uri)
        return list(await (await Tier2Catalog.load(storage)).streams(scope))

    found: list[str] = _run(go())
    return found


class _SplitBytes:
    """A split's bytes in order, one tier-2 read at a time (on the loop)."""

    def __init__(self, split: HistorySplit, read_bytes: int) -> None:
        self.split = split
        self.layout = split.layout()
        self.pos = split.first
        self.read_bytes = read_bytes

    async def next(self) -> bytes | None:
        if self.pos >= self.split.last:
            return None
        storage, _cache = await _storage(self.split.uri)
        data = await read_segment(storage, self.layout, self.pos,
                                  min(self.read_bytes, self.split.last - self.pos))
        if not data:
            raise ProtocolError(f"{self.split.segment}: no bytes at {self.pos} in tier-2")
        self.pos += len(data)
        return data

    async def times(self) -> list[tuple[int, int]]:
        _opened, cache = await _storage(self.split.uri)
        return await cache.times(self.layout, self.split.first, self.split.last)


def read_split(split: HistorySplit, schema: pa.Schema | None = None, batch_rows: int = 8192,
               read_bytes: int = READ_BYTES) -> Iterator[pa.RecordBatch]:
    """The split's events as record batches of ``schema`` (default
    :func:`~quire.history.events.arrow_schema`), up to ``batch_rows`` each,
    in segment order."""
    import pyarrow as pa

    schema = schema if schema is not None else arrow_schema()
    loop = _process()[0]
    source = _SplitBytes(split, read_bytes)
    entries = loop.run(source.times())
    splitter = EventSplitter(split.first)
    scope = pa.scalar(split.scope, pa.string())
    stream = pa.scalar(split.stream, pa.string())
    pending: concurrent.futures.Future[bytes | None] = loop.submit(source.next())
    try:
        while (data := pending.result()) is not None:
            pending = loop.submit(source.next())
            offsets, payloads = splitter.feed(data)
            times = event_times(offsets, entries)
            for low in range(0, len(offsets), batch_rows):
                high = min(len(offsets), low + batch_rows)
                yield event_batch(schema, payloads.slice(low, high - low), scope, stream,
                                  split.segment_id, offsets[low:high], times[low:high])
    finally:
        pending.cancel()
    if splitter.partial_bytes:
        raise ProtocolError(f"{split.segment}: {splitter.partial_bytes} bytes of an event "
                            f"cross the end of the split at {split.last}")


def read_stream(tier2_uri: str, scope: str, stream: str, start: Bound = None,
                end: Bound = None, *, batch_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Stream ``scope/stream``'s flushed history, one row per event
    (:func:`~quire.history.events.arrow_schema`: ``event, scope, stream,
    segment_id, offset, timestamp``), read from tier-2 alone with no Quire
    process running.

    ``start`` and ``end`` are stream cuts (segment id -> offset), times (ms
    since the epoch, or datetimes: the events appended in ``[start, end)``),
    or None (the stream's head; everything flushed).  Segments come in
    reading order (a segment's successors after it), each in offset order.
    What it sees lags the cluster by one flush (:mod:`quire.history.catalog`)."""
    for split in plan(tier2_uri, scope, stream, start, end):
        yield from read_split(split, batch_rows=batch_rows)


class HistoryFragment:
    """One split of a :class:`StreamDataset`, readable on its own (and
    picklable: ship it to a worker)."""

    def __init__(self, split: HistorySplit, batch_rows: int = 8192) -> None:
        self.split = split
        self.batch_rows = batch_rows

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return read_split(self.split, batch_rows=self.batch_rows)

    def to_table(self) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.to_batches()), schema=arrow_schema())


class StreamDataset:
    """A stream's flushed history in tier-2 as a dataset, in the manner of
    ``pyarrow.dataset``: :attr:`schema`, :meth:`get_fragments` (one per
    split, each readable alone), :meth:`to_batches`, :meth:`to_table`,
    :meth:`to_reader`, :meth:`count_rows`, :meth:`head`; and the Arrow
    PyCapsule stream (``__arrow_c_stream__``), so DuckDB, Polars and pandas
    read it directly::

        ds = StreamDataset("s3://bucket/tier2", "shop", "orders")
        duckdb.sql("SELECT count(*) FROM ds")   # or duckdb.arrow(ds.to_reader())
        polars.from_arrow(ds.to_table())

    Planned once, when made (the splits as tier-2 held them then)."""

    def __init__(self, tier2_uri: str, scope: str, stream: str, start: Bound = None,
                 end: Bound = None, *, split_bytes: int = DEFAULT_SPLIT_BYTES,
                 batch_rows: int = 8192) -> None:
        self.splits = plan(tier2_uri, scope, stream, start, end, split_bytes)
        self.batch_rows = batch_rows

    @property
    def schema(self) -> pa.Schema:
        return arrow_schema()

    def get_fragments(self) -> list[HistoryFragment]:
        return [HistoryFragment(s, self.batch_rows) for s in self.splits]

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        for fragment in self.get_fragments():
            yield from fragment.to_batches()

    def to_reader(self) -> pa.RecordBatchReader:
        import pyarrow as pa

        return pa.RecordBatchReader.from_batches(self.schema, self.to_batches())

    def to_table(self) -> pa.Table:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.to_batches()), schema=self.schema)

    def count_rows(self) -> int:
        return sum(batch.num_rows for batch in self.to_batches())

    def head(self, rows: int) -> pa.Table:
        import pyarrow as pa

        taken: list[pa.RecordBatch] = []
        left = rows
        for batch in self.to_batches():
            if left <= 0:
                break
            taken.append(batch.slice(0, left))
            left -= min(left, batch.num_rows)
        return pa.Table.from_batches(taken, schema=self.schema)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)
