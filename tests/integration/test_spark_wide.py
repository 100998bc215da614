"""The ``quire`` data source over many streams, on the session's local
Spark (``local[2,2]``) against real processes: 3 bookies, a segment store
flushing to a ``file://`` tier-2 and a controller running retention every
second.

Several streams and a pattern in one query, with a stream created while it
runs, restarted from its checkpoint exactly once; time-bounded reads and
the timestamp column; both metadata tables against the controller's view;
a lagging query holding retention, and its lag; writes that create their
streams and a fan-out sink across three streams exactly once, and a
fan-out write whose driver is killed after its decision; last, with the
stack stopped, a stream's history read from copies of tier-2 (file:// and
the moto S3 server) by ``quire.history``, DuckDB and Spark's ``tier2`` mode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest
from pyspark.sql import DataFrame, SparkSession

import pyspark_quire
from quire.history import StreamDataset, read_stream
from quire.spark import recover_stream_writes
from quire.spark.stream_progress import LAG_GAUGE, lag_of_progress
from quire.streams import ControllerClient, RemoteSegmentStore
from quire.streams.model import segment_name
from quire.tier2 import open_chunk_storage
from tests.support.cluster import Cluster
from tests.support.s3_server import S3Endpoint
from tests.support.spark import forget_last_commit, read_available_now
from tests.support.spark_cluster import SparkStandalone
from tests.support.stream_stack import StreamStack, wait_for

REPO = Path(__file__).resolve().parents[2]
SCOPE = "wd"
EVENT = 24
"""Payload bytes of every event here (32 with its header)."""

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamStack]:
    """A stack on bookies and a metadata store of its own: the session's
    (``spark_cluster``) hold test_spark_streams' container logs, whose
    replay would name chunks of that module's tier-2, not this one's."""
    cluster = Cluster(tmp_path_factory.mktemp("wide-cluster"), 3).start()
    started: StreamStack | None = None
    try:
        started = StreamStack.start(tmp_path_factory.mktemp("wide-stack"),
                                    cluster.metadata_uri,
                                    controller_settings={"retention_interval_ms": 1000},
                                    tier2_flush_threshold_bytes=2048,
                                    tier2_flush_threshold_ms=600_000,
                                    tier2_flush_interval_ms=100)
        started.create(SCOPE, "seed", 1)
        yield started
    finally:
        if started is not None:
            started.close()
        cluster.close()


def events(prefix: str, first: int, count: int) -> list[tuple[str, bytes]]:
    """(routing key, payload): ``<prefix>:<n>`` padded to :data:`EVENT` bytes."""
    return [(f"{prefix}{n % 3}", (b"%s:%06d" % (prefix.encode(), n)).ljust(EVENT, b"."))
            for n in range(first, first + count)]


def payloads(rows: list[tuple[str, bytes]]) -> list[bytes]:
    return [p for _k, p in rows]


Row = tuple[str, int, int, bytes]


def rows_of(df: DataFrame) -> list[Row]:
    """(stream, segment id, offset, event), sorted."""
    return sorted((r.stream, r.segment_id, r.offset, bytes(r.event)) for r in df.collect())


def read(spark: SparkSession, stack: StreamStack, **options: str) -> DataFrame:
    reader = spark.read.format("quire").option("controller", stack.uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def head_cut(stack: StreamStack, stream: str) -> dict[int, int]:
    return stack.run(lambda c, _s: c.head_cut(SCOPE, stream))


# --- many streams ---------------------------------------------------------------------


def test_streams_and_a_pattern_in_one_query_a_stream_joining_while_it_runs_exactly_once(
        spark: SparkSession, stack: StreamStack, tmp_path: Path) -> None:
    for name, segments in (("multi-a", 2), ("multi-b", 1), ("other", 1)):
        stack.create(SCOPE, name, segments)
    stack.write(SCOPE, "multi-a", events("a", 0, 60))
    stack.write(SCOPE, "multi-b", events("b", 0, 40))
    stack.write(SCOPE, "other", events("o", 0, 10))
    checkpoint = tmp_path / "checkpoint"
    seen: dict[int, list[Row]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen[batch_id] = rows_of(batch)

    def start() -> Any:
        return (spark.readStream.format("quire").option("controller", stack.uri)
                .option("stream_pattern", f"{SCOPE}/multi-.*")
                .option("max_rows_per_trigger", "100").load()
                .writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(checkpoint)).start())

    query = start()
    try:
        query.processAllAvailable()
        stack.create(SCOPE, "multi-c", 1)  # a new stream, while the query runs
        stack.write(SCOPE, "multi-c", events("c", 0, 30))
        stack.write(SCOPE, "multi-a", events("a", 60, 20))
        query.processAllAvailable()
    finally:
        query.stop()
    first_run = dict(seen)
    replayed = forget_last_commit(checkpoint)  # as after a crash before Spark's commit
    stack.write(SCOPE, "multi-b", events("b", 40, 10))
    seen.clear()
    assert read_available_now(spark.newSession(), checkpoint, collect, controller=stack.uri,
                              stream_pattern=f"{SCOPE}/multi-.*",
                              max_rows_per_trigger="100") is None
    assert seen[replayed] == first_run[replayed]  # the same batch, exactly
    delivered = [row for rows in {**first_run, **seen}.values() for row in rows]
    by_stream: dict[str, list[bytes]] = {}
    for stream, _sid, _offset, event in delivered:
        by_stream.setdefault(stream, []).append(event)
    assert {k: sorted(v) for k, v in by_stream.items()} == {
        "multi-a": sorted(payloads(events("a", 0, 80))),
        "multi-b": sorted(payloads(events("b", 0, 50))),
        "multi-c": sorted(payloads(events("c", 0, 30)))}  # once each; "other" never
    # a batch read of two named streams
    both = rows_of(read(spark, stack, streams=f"{SCOPE}/multi-b,{SCOPE}/other"))
    assert sorted(e for _s, _i, _o, e in both) == sorted(
        payloads(events("b", 0, 50)) + payloads(events("o", 0, 10)))


# --- time ------------------------------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def tick() -> int:
    """A millisecond no append of before shares: the wall clock past the last one."""
    mark = now_ms()
    wait_for(lambda: now_ms() > mark + 2, "the clock moved on")
    return now_ms()


def test_time_bounded_reads_give_exactly_the_window_and_timestamps_never_go_back(
        spark: SparkSession, stack: StreamStack) -> None:
    stack.create(SCOPE, "timed", 2)
    marks = [tick()]
    for part in range(3):
        stack.write(SCOPE, "timed", events(f"t{part}", 0, 100))
        marks.append(tick())
    window = read(spark, stack, stream=f"{SCOPE}/timed", start_time=str(marks[1]),
                  end_time=str(marks[2]))
    assert sorted(e for *_, e in rows_of(window)) == sorted(payloads(events("t1", 0, 100)))
    iso = read(spark, stack, stream=f"{SCOPE}/timed",
               start_time=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(marks[2] / 1000))
               + f".{marks[2] % 1000:03d}")
    assert sorted(e for *_, e in rows_of(iso)) == sorted(payloads(events("t2", 0, 100)))
    everything = read(spark, stack, stream=f"{SCOPE}/timed").collect()
    assert len(everything) == 300
    stamps = {r.segment_id: [] for r in everything}
    for r in sorted(everything, key=lambda r: (r.segment_id, r.offset)):
        stamp = int(r.timestamp.timestamp() * 1000)
        part = int(bytes(r.event)[1:2])
        assert marks[part] <= stamp <= marks[part + 1]
        stamps[r.segment_id].append(stamp)
    assert all(a <= b for s in stamps.values() for a, b in itertools.pairwise(s))
    # the same times from tier-2's sidecars once flushed (the stream sealed: whole)
    stack.run(lambda c, _s: c.seal_stream(SCOPE, "timed"))
    wait_for(lambda: all((stack.layout(SCOPE, "timed", s) or _Empty()).sealed
                         for s in stamps), "the sealed segments flushed whole")
    from_tier2 = read(spark, stack, stream=f"{SCOPE}/timed", tier2=stack.tier2_uri).collect()
    assert sorted((r.segment_id, r.offset, r.timestamp) for r in from_tier2) == \
        sorted((r.segment_id, r.offset, r.timestamp) for r in everything)


class _Empty:
    sealed = False
    length = 0


# --- metadata tables --------------------------------------------------------------------


def test_metadata_tables_against_the_controller(spark: SparkSession,
                                                stack: StreamStack) -> None:
    stack.run(lambda c, _s: c.create_stream(SCOPE, "described", 2, "time", 3_600_000,
                                            ("blue",)))
    stack.write(SCOPE, "described", events("d", 0, 50))
    successors = stack.scale_first(SCOPE, "described")
    stack.write(SCOPE, "described", events("d", 50, 30))
    rows = {r.stream: r for r in spark.read.format("quire").option("controller", stack.uri)
            .option("metadata_table", "streams").option("scope", SCOPE).load().collect()}

    async def view(controller: ControllerClient, segments: RemoteSegmentStore) -> Any:
        config = await controller.stream_config(SCOPE, "described")
        current = await controller.current_segments(SCOPE, "described")
        head = await controller.head_cut(SCOPE, "described")
        described = await controller.admin("describeStream", {"scope": SCOPE,
                                                              "stream": "described"})
        infos = {}
        for epoch in described["epochs"]:
            for s in epoch["segments"]:
                infos[s["id"]] = await segments.get_info(segment_name(SCOPE, "described",
                                                                      s["id"]))
        return config, current, head, infos, await controller.list_streams(SCOPE)

    config, current, head, infos, streams = stack.run(view)
    assert set(rows) == set(streams)
    row = rows["described"]
    assert (row.min_segments, row.retention, row.retention_min, list(row.tags)) == \
        (config.segments, "time", 3_600_000, ["blue"])
    assert row.segment_count == len(current) == 3
    assert json.loads(row.head_cut) == {str(k): v for k, v in head.items()}
    assert json.loads(row.tail_cut) == {str(s.id): infos[s.id].length for s in current}
    assert row.size_bytes == 80 * (EVENT + 8)
    segments = {r.segment_id: r for r in spark.read.format("quire")
                .option("controller", stack.uri).option("metadata_table", "stream_info")
                .option("stream", f"{SCOPE}/described").load().collect()}
    assert set(segments) == set(infos)
    for sid, info in infos.items():
        r = segments[sid]
        assert (r.length, r.start_offset, r.sealed) == (info.length, info.start_offset,
                                                        info.sealed)
        assert r.current == any(s.id == sid for s in current)
        assert 0 <= r.tier2_length <= r.length
    assert {s for s in segments if segments[s].epoch == 1} == set(successors)
    by_key = {(r.min_key, r.max_key) for r in segments.values() if r.current}
    assert by_key == {(s.min_key, s.max_key) for s in current}


# --- retention and lag ------------------------------------------------------------------


def test_a_lagging_query_holds_retention_and_reports_its_lag(
        spark: SparkSession, stack: StreamStack, tmp_path: Path) -> None:
    for name in ("held", "unheld"):  # keep a byte: retention truncates all it may
        stack.run(lambda c, _s, n=name: c.create_stream(SCOPE, n, 1, "size", 1))
        stack.write(SCOPE, name, events("h", 0, 100))
    checkpoint = tmp_path / "checkpoint"
    seen: dict[int, list[Row]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen[batch_id] = rows_of(batch)

    query = (spark.readStream.format("quire").option("controller", stack.uri)
             .option("stream", f"{SCOPE}/held").option("max_rows_per_trigger", "30").load()
             .writeStream.foreachBatch(collect).trigger(processingTime="1 hour")
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        wait_for(lambda: query.lastProgress is not None and len(seen) == 1,
                 "the first micro-batch")
        behind = pyspark_quire.lag(query)
        assert behind == {f"{SCOPE}/held": 70 * (EVENT + 8)}  # lag while behind
        assert LAG_GAUGE.labels(str(query.id), f"{SCOPE}/held")._value.get() == behind[
            f"{SCOPE}/held"]
        stack.write(SCOPE, "held", events("h", 100, 100))
        stack.write(SCOPE, "unheld", events("h", 100, 100))
        # retention truncates the stream nobody reads; the lagging query's it holds
        wait_for(lambda: sum(head_cut(stack, "unheld").values()) > 0, "retention ran")
        assert sum(head_cut(stack, "held").values()) == 0
    finally:
        query.stop()
    more: dict[int, list[Row]] = {}

    def collect_more(batch: DataFrame, batch_id: int) -> None:
        more[batch_id] = rows_of(batch)

    def start() -> Any:
        return (spark.readStream.format("quire").option("controller", stack.uri)
                .option("stream", f"{SCOPE}/held").option("max_rows_per_trigger", "100").load()
                .writeStream.foreachBatch(collect_more)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    restarted = start()
    restarted.awaitTermination()
    assert restarted.exception() is None  # nothing it had not committed was truncated
    delivered = [e for rows in {**seen, **more}.values() for *_, e in rows]
    assert sorted(delivered) == sorted(payloads(events("h", 0, 200)))
    progress = restarted.recentProgress
    assert lag_of_progress(progress[0])[f"{SCOPE}/held"] > 0
    assert pyspark_quire.lag(restarted) == {f"{SCOPE}/held": 0}  # caught up


# --- writes -----------------------------------------------------------------------------


def test_writes_create_their_streams_and_a_fan_out_sink_commits_exactly_once(
        spark: SparkSession, stack: StreamStack, tmp_path: Path) -> None:
    stack.create(SCOPE, "fan-src", 2)
    source = [(k, p) for k, p in events("f", 0, 150)]
    stack.write(SCOPE, "fan-src", source)
    checkpoint = tmp_path / "checkpoint"

    def run() -> BaseException | None:
        def start() -> Any:
            return (spark.readStream.format("quire").option("controller", stack.uri)
                    .option("stream", f"{SCOPE}/fan-src").option("max_rows_per_trigger", "80")
                    .load()
                    .selectExpr("event", "concat('wd/fan-', cast(substring(cast(event AS "
                                "string), 8, 1) AS int) % 3) AS stream",
                                "substring(cast(event AS string), 1, 8) AS routing_key")
                    .writeStream.format("quire").option("controller", stack.uri)
                    .option("sink_id", "fan-1").option("default_num_segments", "2")
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True).start())
        query = start()
        query.awaitTermination()
        return query.exception()

    assert run() is None
    assert forget_last_commit(checkpoint) >= 1
    assert run() is None  # the last batch again: the sink drops the replay

    def expected(target: int) -> list[bytes]:
        return sorted(p for p in payloads(source) if int(p[7:8]) % 3 == target)

    for target in range(3):
        name = f"fan-{target}"
        got = rows_of(read(spark, stack, stream=f"{SCOPE}/{name}"))
        assert sorted(e for *_, e in got) == expected(target)  # exactly once
        config = stack.run(lambda c, _s, n=name: c.stream_config(SCOPE, n))
        assert config.segments == 2  # created by the write, with its policy


@pytest.mark.timeout(900)  # a driver JVM and two executors start (minutes on a loaded host)
def test_a_fan_out_write_killed_after_its_decision_lands_everywhere_once_recovered(
        stack: StreamStack, spark_standalone: SparkStandalone) -> None:
    """On the standalone cluster: the executors (JVMs of their own) write
    the three streams' transactions, the driver is killed after the commit
    record; recovery rolls the batch forward in all three, once."""
    rows = [[p.decode(), k, f"{SCOPE}/kill-{n % 3}"]
            for n, (k, p) in enumerate(events("k", 0, 90))]
    spec = [{"routed": True, "rows": rows, "partitions": 2}]
    done = spark_standalone.run_driver(
        REPO / "tests" / "support" / "spark_stream_driver.py", stack.uri, json.dumps(spec),
        check=False, timeout_s=800,
        env={"QUIRE_CRASH_AFTER_FANOUT_DECISION": "1",
             "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "support" / "spark_faults"),
                                            spark_standalone.env["PYTHONPATH"]])})
    out, err = done.stdout, done.stderr
    assert done.returncode == -9, err[-3000:]  # the driver's group was killed (SIGKILL)
    assert "written" not in out

    def stored(name: str) -> int:
        return sum(stack.lengths(SCOPE, name, list(stack.run(
            lambda c, _s: c.head_cut(SCOPE, name)))).values())

    # decided, nothing committed yet: no stream holds any of it
    assert [stored(f"kill-{n}") for n in range(3)] == [0, 0, 0]
    report = recover_stream_writes(stack.uri, SCOPE)
    assert len(report.rolled_forward) == 1
    for n in range(3):
        assert stored(f"kill-{n}") == 30 * (EVENT + 8)  # the whole batch, once
    again = recover_stream_writes(stack.uri, SCOPE)
    assert again.rolled_forward == [] and again.committed_txns == 0


# --- history from tier-2, with the stack stopped (last) -------------------------------------


def test_history_from_copies_of_tier2_with_the_stack_stopped(
        spark: SparkSession, stack: StreamStack, s3_endpoint: S3Endpoint,
        tmp_path: Path) -> None:
    stack.create(SCOPE, "history", 2)
    for first in (0, 200):  # each round flushed (its tail perhaps not): several chunks
        stack.write(SCOPE, "history", [(f"y{n % 16}", p) for n, (_k, p) in
                                       enumerate(events("y", first, 200), first)])
        flushed(stack, "history", [0, 1], below=2048)  # the flush threshold
    successors = stack.scale_first(SCOPE, "history")
    stack.write(SCOPE, "history", events("y", 400, 90))
    through_store = rows_of(read(spark, stack, stream=f"{SCOPE}/history"))
    stack.run(lambda c, _s: c.seal_stream(SCOPE, "history"))
    segments = sorted({0, 1, *successors})  # every segment, some perhaps empty
    assert set(successors) & {sid for _s, sid, _o, _e in through_store}  # epoch 1 read too
    flushed(stack, "history", segments)
    wait_for(lambda: _tier2_knows_sealed(stack), "the stream's record flushed")
    stack.close()  # no segment store, no controller from here on
    copy = tmp_path / "tier2-copy"
    shutil.copytree(Path(stack.tier2_uri.removeprefix("file://")), copy)
    s3_uri = s3_endpoint.uri("history-copy")
    asyncio.run(_upload(copy.as_uri(), s3_uri))
    expected = [(s, sid, o, e) for s, sid, o, e in through_store]
    for uri in (copy.as_uri(), s3_uri):
        batches = list(read_stream(uri, SCOPE, "history"))
        got = sorted((r["stream"], r["segment_id"], r["offset"], r["event"])
                     for b in batches for r in b.to_pylist())
        assert got == expected
        assert all(b.column("timestamp").null_count == 0 for b in batches)
    history = StreamDataset(copy.as_uri(), SCOPE, "history", split_bytes=1024)  # noqa: F841
    # (DuckDB finds the dataset by its variable's name, through its Arrow stream)
    [(count, streams)] = duckdb.sql("SELECT count(*), count(DISTINCT stream) "
                                    "FROM history").fetchall()
    assert (count, streams) == (490, 1)
    tier2_mode = read(spark, stack, stream=f"{SCOPE}/history", tier2=copy.as_uri(),
                      read_mode="tier2", split_bytes="1024")
    assert rows_of(tier2_mode) == expected
    assert tier2_mode.rdd.getNumPartitions() > len(segments)  # split within segments


def flushed(stack: StreamStack, stream: str, segments: list[int], below: int = 0) -> None:
    """Until tier-2 holds each of the segments whole, or (``below``: the
    flush threshold) all but fewer bytes than that."""
    lengths = stack.lengths(SCOPE, stream, segments)
    wait_for(lambda: all((stack.layout(SCOPE, stream, s) or _Empty()).length
                         > lengths[s] - max(below, 1) for s in segments),
             "the segments flushed")


def _tier2_knows_sealed(stack: StreamStack) -> bool:
    from quire.history.catalog import Tier2Catalog

    async def sealed() -> bool:
        storage = await open_chunk_storage(stack.tier2_uri)
        try:
            record = await (await Tier2Catalog.load(storage)).stream(SCOPE, "history")
            return record.state.value == "sealed"
        finally:
            await storage.close()
    return asyncio.run(sealed())


async def _upload(source: str, target: str) -> None:
    src, dst = await open_chunk_storage(source), await open_chunk_storage(target)
    try:
        for info in await src.list_chunks(""):
            await dst.write_chunk(info.name, await src.read(info.name, 0, info.length))
    finally:
        await src.close()
        await dst.close()
