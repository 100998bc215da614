"""The ``quire`` data source reading *streams* on a real local Spark
(``local[2,2]``) against real processes: 3 bookies, a segment store
flushing to a ``file://`` tier-2, and the controller.

Batch reads between stream cuts of a stream the real Pravega client wrote;
a streaming query restarted from its checkpoint (in a new session) across a
scale, exactly once; ``fail_on_data_loss`` both ways after a truncation;
flushed history read from tier-2 with its unflushed tail from the segment
store, and with the segment store stopped.

One stack serves the module (each test uses its own streams); the
segment-store-stopped test runs last and restarts it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow  # noqa: F401  (a missing dependency fails, never skips)
import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest
from pyspark.sql import DataFrame, SparkSession

from quire.spark import STREAM_SCHEMA, StreamBatchReader, StreamDataLossError, StreamOptions
from quire.spark.stream_read import SegmentRange
from tests.support.cluster import Cluster
from tests.support.spark import forget_last_commit, read_available_now
from tests.support.stream_stack import StreamStack, wait_for

REPO = Path(__file__).resolve().parents[2]
FLUSH_BYTES = 32 * 1024

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(spark_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[StreamStack]:
    """Segment store (2 containers; a segment flushes to tier-2 once 32 KiB
    are unflushed, or when sealed) and controller on the session's bookies."""
    started = StreamStack.start(tmp_path_factory.mktemp("stream-stack"),
                                spark_cluster.metadata_uri,
                                tier2_flush_threshold_bytes=FLUSH_BYTES,
                                tier2_flush_threshold_ms=600_000,
                                tier2_flush_interval_ms=100)
    yield started
    started.close()


Row = tuple[int, int, bytes]


def read(spark: SparkSession, stack: StreamStack, stream: str, **options: str) -> DataFrame:
    frame = (spark.read.format("quire").option("controller", stack.uri)
             .option("stream", stream))
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame.load()


def rows_of(df: DataFrame, stream: str | None = None) -> list[Row]:
    """(segment_id, offset, event) sorted; every row's scope/stream is ``stream``."""
    rows = df.collect()
    if stream is not None:
        assert {f"{r.scope}/{r.stream}" for r in rows} == {stream}
    return sorted((r.segment_id, r.offset, bytes(r.event)) for r in rows)


def by_key(rows: list[Row]) -> dict[str, list[int]]:
    """Events ``key<k>:<n>`` grouped by key, in segment order."""
    found: dict[str, list[int]] = {}
    for _sid, _offset, event in rows:
        key, number = event.decode().split(":")
        found.setdefault(key, []).append(int(number))
    return found


def pravega_write(uri: str, scope: str, stream: str, keys: int, per_key: int) -> None:
    """The real Pravega client writes ``key<k>:<n>`` (in a process of its own:
    its blocking calls hold the GIL)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.pravega_writer", uri, scope, stream, str(keys),
         str(per_key)], cwd=REPO, capture_output=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    last = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert last == {"done": keys * per_key}, proc.stderr.decode()[-2000:]


def test_batch_read_between_stream_cuts_of_a_pravega_written_stream(
        spark: SparkSession, stack: StreamStack) -> None:
    import pravega_client

    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("pv")
    assert manager.create_stream("pv", "orders", 3)
    pravega_write(stack.uri, "pv", "orders", keys=6, per_key=40)

    rows = rows_of(read(spark, stack, "pv/orders"), "pv/orders")
    assert by_key(rows) == {f"key{k}": list(range(40)) for k in range(6)}
    assert len({sid for sid, _, _ in rows}) == 3
    # offsets are the events' header offsets: consecutive events are contiguous
    for sid in {sid for sid, _, _ in rows}:
        mine = [(o, e) for s, o, e in rows if s == sid]
        assert mine[0][0] == 0
        assert all(o2 == o1 + 8 + len(e1) for (o1, e1), (o2, _) in itertools.pairwise(mine))

    # an explicit cut: each segment at its 10th event
    middle = {}
    for sid in {sid for sid, _, _ in rows}:
        middle[str(sid)] = [o for s, o, _ in rows if s == sid][10]
    cut = json.dumps(middle)
    before = rows_of(read(spark, stack, "pv/orders", end_stream_cut=cut))
    after = rows_of(read(spark, stack, "pv/orders", start_stream_cut=cut,
                         end_stream_cut="latest"))
    assert len(before) == 30 and sorted(before + after) == rows
    assert all(o < middle[str(s)] for s, o, _ in before)
    assert all(o >= middle[str(s)] for s, o, _ in after)
    assert read(spark, stack, "pv/orders", start_stream_cut="latest").count() == 0
    with pytest.raises(Exception, match="start_stream_cut"):
        read(spark, stack, "pv/orders", start_stream_cut="{not json").count()


# --- streaming -------------------------------------------------------------------------------




def run_query(spark: SparkSession, stack: StreamStack, stream: str, checkpoint: Path,
              collect: Any, **options: str) -> BaseException | None:
    """One ``Trigger.AvailableNow`` run of a query into ``collect``; its error
    (restarted only when Spark's Python worker failed to connect back)."""
    return read_available_now(spark, checkpoint, collect, controller=stack.uri, stream=stream,
                              **options)


def test_streaming_query_restarts_from_its_checkpoint_across_a_scale_exactly_once(
        spark: SparkSession, stack: StreamStack, tmp_path: Path) -> None:
    stack.create("st", "clicks", 2)
    first = [(f"key{k}", b"key%d:%d" % (k, n)) for n in range(50) for k in range(4)]
    stack.write("st", "clicks", first)
    checkpoint = tmp_path / "checkpoint"
    seen: dict[int, list[Row]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen[batch_id] = rows_of(batch)

    assert run_query(spark, stack, "st/clicks", checkpoint, collect,
                     max_rows_per_trigger="150") is None
    first_run = dict(seen)
    assert sorted(len(rows) for rows in first_run.values()) == [50, 150]
    replayed = forget_last_commit(checkpoint)  # the driver "crashed" before committing it
    new_segments = stack.scale_first("st", "clicks")  # seals a segment the query was reading
    assert len(new_segments) == 2
    second = [(f"key{k}", b"key%d:%d" % (k, n)) for n in range(50, 100) for k in range(4)]
    stack.write("st", "clicks", second)
    seen.clear()
    restarted = spark.newSession()  # a new session and query on the same checkpoint
    assert run_query(restarted, stack, "st/clicks", checkpoint, collect,
                     max_rows_per_trigger="150") is None
    second_run = dict(seen)
    assert second_run[replayed] == first_run[replayed]  # the same batch, exactly
    batches = {**first_run, **second_run}
    delivered = [row for batch_id in sorted(batches) for row in batches[batch_id]]
    assert len(delivered) == 400  # nothing lost, nothing twice
    assert by_key(delivered) == {f"key{k}": list(range(100)) for k in range(4)}
    assert {sid for sid, _, _ in delivered} & set(new_segments)  # successors were followed


def test_fail_on_data_loss_both_ways(spark: SparkSession, stack: StreamStack,
                                     tmp_path: Path) -> None:
    stack.create("dl", "events", 1)
    stack.write("dl", "events", [("k", b"e-%04d" % i) for i in range(50)])
    checkpoint = tmp_path / "checkpoint"
    got: list[bytes] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        got.extend(e for _, _, e in rows_of(batch))

    assert run_query(spark, stack, "dl/events", checkpoint, collect) is None
    assert got == [b"e-%04d" % i for i in range(50)]
    stack.write("dl", "events", [("k", b"e-%04d" % i) for i in range(50, 100)])
    # events are 8 + 6 bytes: the unread e-0050..e-0074 are truncated away
    stack.run(lambda controller, _s: controller.truncate_stream("dl", "events", {0: 14 * 75}))
    got.clear()
    error = run_query(spark, stack, "dl/events", checkpoint, collect)
    assert error is not None and "truncated" in str(error) and got == []
    assert run_query(spark, stack, "dl/events", checkpoint, collect,
                     fail_on_data_loss="false") is None
    assert got == [b"e-%04d" % i for i in range(75, 100)]


# --- history from tier-2 -----------------------------------------------------------------------


EVENT = 100
"""Payload bytes of the tier-2 tests' events (108 bytes with the header)."""


def numbered(first: int, count: int) -> list[tuple[str, bytes]]:
    return [("k", b"%08d" % i + b"." * (EVENT - 8)) for i in range(first, first + count)]


def planned(stack: StreamStack, stream: str, **options: str) -> list[SegmentRange]:
    """The input partitions the batch reader plans (on this process, as the driver does)."""
    reader = StreamBatchReader(StreamOptions.parse(
        {"controller": stack.uri, "stream": stream, "tier2": stack.tier2_uri, **options}),
        STREAM_SCHEMA)
    return [p for p in reader.partitions() if isinstance(p, SegmentRange)]


def read_here(part: SegmentRange) -> list[bytes]:
    """A partition's events read by this process (the executors' code)."""
    reader = StreamBatchReader(StreamOptions.parse(
        {"controller": part.controller, "stream": f"{part.scope}/{part.stream}"}), STREAM_SCHEMA)
    return [bytes(e) for batch in reader.read(part) for e in batch.column(0).to_pylist()]


def test_flushed_history_is_read_from_tier2_and_the_tail_from_the_segment_store(
        spark: SparkSession, stack: StreamStack) -> None:
    stack.create("t2", "hist", 1)
    stack.write("t2", "hist", numbered(0, 2000))  # 216 kB, past the 32 KiB threshold
    count = 2000

    def unflushed() -> int:
        """Bytes not in tier-2.  While a flush runs, the layout still has its
        old length, so this stays at least a threshold until it is done."""
        layout = stack.layout("t2", "hist", 0)
        return stack.lengths("t2", "hist", [0])[0] - (0 if layout is None else layout.length)

    wait_for(lambda: unflushed() < FLUSH_BYTES, "the history flushed (all but a tail)")
    if unflushed() == 0:
        stack.write("t2", "hist", numbered(count, 20))  # a tail under the flush threshold
        count += 20
    # that tail stays where it is: time-based flushes are 10 minutes away
    assert 0 < unflushed() < FLUSH_BYTES
    [part] = planned(stack, "t2/hist")
    assert part.tier2 is not None and 0 < part.tier2.length < part.last  # both sources
    rows = rows_of(read(spark, stack, "t2/hist", tier2=stack.tier2_uri))
    assert [e for _, _, e in rows] == [e for _, e in numbered(0, count)]
    assert [o for _, o, _ in rows] == [i * (EVENT + 8) for i in range(count)]


def test_flushed_history_reads_with_the_segment_store_stopped_and_vanished_chunks(
        spark: SparkSession, stack: StreamStack) -> None:
    """Runs after the test above (same stream): a scale seals segment 0,
    which flushes it whole; its history is read with the segment store down."""
    length = stack.lengths("t2", "hist", [0])[0]
    count = length // (EVENT + 8)
    successors = stack.scale_first("t2", "hist")
    wait_for(lambda: (stack.layout("t2", "hist", 0) or SimpleNamespace(length=0)).length
             == length, "segment 0 flushed whole")
    history = json.dumps({str(s): 0 for s in successors})  # the end of segment 0
    df = read(spark, stack, "t2/hist", tier2=stack.tier2_uri, end_stream_cut=history)
    rdd = df.rdd  # plans the input partitions now (the driver needs the controller)
    failing = planned(stack, "t2/hist", end_stream_cut=history)
    skipping = planned(stack, "t2/hist", end_stream_cut=history, fail_on_data_loss="false")
    assert [(p.segment_id, p.first, p.last) for p in failing] == [(0, 0, length)]
    stack.store.stop()
    try:
        assert not stack.store.running
        events = [bytes(r.event) for r in rdd.collect()]
        assert events == [e for _, e in numbered(0, count)]
    finally:
        stack.restart_store()
    # a truncation past segment 0 deletes it and its chunks after planning
    stack.run(lambda controller, _s: controller.truncate_stream("t2", "hist", {
        s: 0 for s in successors}))
    chunks = [Path(stack.tier2_uri.removeprefix("file://")) / name
              for name, _, _ in failing[0].tier2.chunks]  # type: ignore[union-attr]
    wait_for(lambda: not any(c.exists() for c in chunks), "the deleted segment's chunks gone")
    with pytest.raises(StreamDataLossError, match="vanished"):
        read_here(failing[0])
    assert read_here(skipping[0]) == []  # skipped, with a warning
