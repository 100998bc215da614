"""Spark writes to streams (``format("quire")`` with ``option("stream", ...)``)
against real processes: 3 bookies, a segment store and the controller
(``quire segmentstore start`` / ``quire controller start``), read back with
the real Pravega client (``pravega_client``).

Most tests run on the session's ``local[2,2]`` Spark; the driver-crash test
runs its driver as a child process on the standalone cluster (a master and
two worker JVMs), which also shows a plain write there.  Every test uses its
own stream names.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pyarrow  # noqa: F401  (a missing dependency fails, never skips)
import pyarrow as pa
import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession

from quire.client import Client
from quire.log import LogStore
from quire.sandbox import ControllerProcess, SegmentStoreProcess, free_port
from quire.spark import recover_stream_writes
from quire.spark.stream_commits import StreamCommits, writes_table
from quire.spark.stream_sink import StreamSinkOptions, _write_task
from quire.streams import ControllerClient, RemoteSegmentStore, TxnState, tail_cut
from tests.support.cluster import Cluster
from tests.support.pravega_reading import by_routing_key, read_slices
from tests.support.spark import forget_last_commit, run_available_now
from tests.support.spark_cluster import SparkStandalone
from tests.support.stream_stack import wait_for, with_stream_clients

REPO = Path(__file__).resolve().parents[2]
SCOPE = "sink"

# UDFs defined here run in Spark's Python workers: ship this module by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(600)  # Spark JVMs and Python workers start in the first tests


# --- the stream system ------------------------------------------------------------------


class Streams:
    """Bookies, a segment store and the controller, as processes."""

    def __init__(self, root: Path) -> None:
        self.bookies = Cluster(root / "bookies", 3)
        self.store = SegmentStoreProcess(root / "stack", self.bookies.metadata_uri, "ss-1",
                                         port=free_port())
        self.controller = ControllerProcess(root / "stack", self.bookies.metadata_uri,
                                            port=free_port())

    @property
    def uri(self) -> str:
        return self.controller.uri

    def start(self) -> Streams:
        self.bookies.start()
        self.store.start()
        self.controller.start()
        manager = pravega_client.StreamManager(self.uri)
        manager.create_scope(SCOPE)
        return self

    def close(self) -> None:
        self.controller.stop()
        self.store.stop()
        self.bookies.close()


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Streams]:
    started = Streams(tmp_path_factory.mktemp("stream-sink")).start()
    yield started
    started.close()


def create_stream(streams: Streams, name: str, segments: int = 3) -> None:
    assert pravega_client.StreamManager(streams.uri).create_stream(SCOPE, name, segments)


def stream_bytes(uri: str, name: str) -> int:
    """Bytes in the stream's segments (events and their 8-byte headers)."""
    async def size(controller: ControllerClient, segments: RemoteSegmentStore) -> int:
        return sum((await tail_cut(controller, segments, SCOPE, name)).values())
    return with_stream_clients(uri, size)


def framed(events: list[str]) -> int:
    return sum(len(e.encode()) + 8 for e in events)


def table_keys(uri: str, name: str) -> list[str]:
    """The keys of the Spark writes' table of stream ``name`` (registrations, records)."""
    async def keys(controller: ControllerClient, segments: RemoteSegmentStore) -> list[str]:
        found: list[str] = []
        async for entry in StreamCommits(controller, segments)._entries(
                writes_table(SCOPE, name), ""):
            found.append(entry.key.decode())
        return found
    return with_stream_clients(uri, keys)


def read_events(uri: str, name: str, count: int) -> list[str]:
    """What the real Pravega client reads of the stream: ``count`` events
    (the stream's byte count is checked separately, so none more)."""
    manager = pravega_client.StreamManager(uri)
    group = manager.create_reader_group(f"g{uuid.uuid4().hex[:12]}", SCOPE, name)
    reader = group.create_reader("r1")
    return asyncio.run(read_slices(reader, count, time.monotonic() + 60))


def events_of(rows: list[tuple[str, str]]) -> list[str]:
    return [e for e, _ in rows]


def assert_stream_is(uri: str, name: str, rows: list[tuple[str, str]]) -> None:
    """The stream holds exactly the rows' events: the same bytes, the same
    events read by the Pravega client, each key's events in row order."""
    events = events_of(rows)
    assert stream_bytes(uri, name) == framed(events)
    got = read_events(uri, name, len(events))
    assert sorted(got) == sorted(events)
    assert by_routing_key(got) == by_routing_key(events)


def keyed_rows(prefix: str, count: int, keys: int = 4) -> list[tuple[str, str]]:
    """Events ``key:n`` (by_routing_key's format) routed by their key."""
    return [(f"{prefix}{n % keys}:{n}", f"{prefix}{n % keys}") for n in range(count)]


def save(spark: SparkSession, uri: str, name: str, rows: list[tuple[str, str]],
         partitions: int = 2, transform: Callable[[Any], Any] | None = None) -> None:
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions),
                               "event string, routing_key string")
    if transform is not None:
        df = transform(df)
    (df.write.format("quire").option("controller", uri).option("stream", f"{SCOPE}/{name}")
     .mode("append").save())


def killing_first_batches(marker: Path | None) -> Callable[[Any], Any]:
    """A transform whose partition 1 ends its Python worker with os._exit
    after its first Arrow batch went on to the writer: on the first attempt
    only (``marker`` records it), or on every attempt (``marker`` None)."""
    def kill(batches: Iterator[Any]) -> Iterator[Any]:
        context = TaskContext.get()
        for i, batch in enumerate(batches):
            yield batch
            if context.partitionId() == 1 and i == 1:
                if marker is None:
                    os._exit(3)
                if not marker.exists():
                    marker.write_text(str(context.attemptNumber()))
                    os._exit(3)

    def transform(df: Any) -> Any:
        return df.mapInArrow(kill, df.schema)
    return transform


# --- batch writes -----------------------------------------------------------------------


def test_batch_write_is_exactly_what_the_pravega_client_reads(
        spark: SparkSession, streams: Streams) -> None:
    create_stream(streams, "orders")
    rows = keyed_rows("k", 1200)
    save(spark, streams.uri, "orders", rows, partitions=3)
    assert_stream_is(streams.uri, "orders", rows)
    assert table_keys(streams.uri, "orders") == []  # registrations and the record are gone


def test_binary_events_without_routing_keys(spark: SparkSession, streams: Streams) -> None:
    create_stream(streams, "blobs", segments=2)
    payloads = [bytes([n % 256]) * (1 + n % 50) for n in range(300)]
    df = spark.createDataFrame([(p,) for p in payloads], "event binary")
    (df.write.format("quire").option("controller", streams.uri)
     .option("stream", f"{SCOPE}/blobs").mode("append").save())
    assert stream_bytes(streams.uri, "blobs") == sum(len(p) + 8 for p in payloads)
    manager = pravega_client.StreamManager(streams.uri)
    reader = manager.create_reader_group("blobs-g", SCOPE, "blobs").create_reader("r1")

    async def read() -> list[bytes]:
        got: list[bytes] = []
        try:
            while len(got) < len(payloads):
                piece = await asyncio.wait_for(reader.get_segment_slice_async(), 60)
                got += [bytes(e.data()) for e in piece]
                reader.release_segment(piece)
        finally:
            reader.reader_offline()
        return got
    assert sorted(asyncio.run(read())) == sorted(payloads)


def test_bad_options_and_columns_are_refused(spark: SparkSession, streams: Streams) -> None:
    def save_to(df: Any, stream: str, mode: str = "append", **options: str) -> None:
        writer = df.write.format("quire").option("controller", streams.uri)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.option("stream", stream).mode(mode).save()

    with pytest.raises(Exception, match="column 'event'"):
        save_to(spark.createDataFrame([("a",)], "payload string"), f"{SCOPE}/orders")
    good = spark.createDataFrame([("a",)], "event string")
    with pytest.raises(Exception, match="scope/stream"):
        save_to(good, "x")
    with pytest.raises(Exception, match="append-only"):
        save_to(good, f"{SCOPE}/orders", "overwrite")
    with pytest.raises(Exception, match=r"no stream|NOT_FOUND"):
        save_to(good, f"{SCOPE}/missing", create="false")


def test_a_task_killed_on_every_attempt_leaves_nothing_visible(
        spark: SparkSession, streams: Streams) -> None:
    create_stream(streams, "doomed")
    rows = keyed_rows("d", 2000)
    with pytest.raises(Exception):  # noqa: B017  (Spark wraps the worker's death)
        save(spark, streams.uri, "doomed", rows, transform=killing_first_batches(None))
    assert stream_bytes(streams.uri, "doomed") == 0
    # The job's abort aborted every registered attempt, the killed ones too.
    # Spark fails the job without waiting for the writers' Python workers: one
    # may register after the abort listed the registrations, and then aborts
    # its transaction and removes its registration itself on its way out.
    wait_for(lambda: table_keys(streams.uri, "doomed") == [], "every registration gone")
    assert stream_bytes(streams.uri, "doomed") == 0


def test_a_failed_attempt_aborts_its_transaction_and_removes_its_registration(
        streams: Streams) -> None:
    """What a writer's Python worker does when its input fails, here in the
    test's process: what it wrote is discarded and nothing of it is left for
    the driver's abort (which may already have run) to find."""
    create_stream(streams, "failed")
    opts = StreamSinkOptions(SCOPE, "failed", streams.uri)
    registered: list[list[str]] = []

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array([f"f:{n}" for n in range(50)])], names=["event"])
        registered.append(table_keys(streams.uri, "failed"))  # the attempt is registered by now
        raise ConnectionResetError("the task's input went away")

    with pytest.raises(ConnectionResetError):
        _write_task(opts, "w-failed", "event", None, batches())
    [[key]] = registered
    assert key.startswith("txn/w-failed/")
    txn = int(key.rsplit("/", 1)[1], 16)
    assert table_keys(streams.uri, "failed") == []

    async def state(controller: ControllerClient, _s: RemoteSegmentStore) -> TxnState:
        return await controller.transaction_state(SCOPE, "failed", txn)
    assert with_stream_clients(streams.uri, state) in (TxnState.ABORTING, TxnState.ABORTED)
    assert stream_bytes(streams.uri, "failed") == 0


def test_a_killed_first_attempt_is_retried_and_written_once(
        spark: SparkSession, streams: Streams, tmp_path: Path) -> None:
    create_stream(streams, "retried")
    rows = keyed_rows("r", 2000)
    marker = tmp_path / "killed"
    save(spark, streams.uri, "retried", rows, transform=killing_first_batches(marker))
    assert marker.read_text() == "0"  # the first attempt of partition 1 died part way
    assert_stream_is(streams.uri, "retried", rows)
    # the killed attempt's registration: removed by the commit, or by the
    # attempt itself if its writer registered after the commit listed them
    wait_for(lambda: table_keys(streams.uri, "retried") == [], "every registration gone")


# --- the standalone cluster: a plain write, then a driver crash ---------------------------


@pytest.mark.timeout(900)  # a driver JVM and two executors start (minutes on a loaded host)
def test_driver_crash_after_the_commit_record_rolls_forward_exactly_once(
        spark_standalone: SparkStandalone, streams: Streams) -> None:
    create_stream(streams, "plain")
    create_stream(streams, "crash")
    plain, crash = keyed_rows("p", 800), keyed_rows("c", 800)
    spec = [{"stream": f"{SCOPE}/plain", "rows": plain, "partitions": 2},
            {"stream": f"{SCOPE}/crash", "rows": crash, "partitions": 2}]
    done = spark_standalone.run_driver(
        REPO / "tests" / "support" / "spark_stream_driver.py", streams.uri, json.dumps(spec),
        check=False, timeout_s=800,
        env={"QUIRE_CRASH_AFTER_COMMIT_RECORD": "crash",
             "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "support" / "spark_faults"),
                                            spark_standalone.env["PYTHONPATH"]])})
    assert done.returncode == -9, done.stderr[-3000:]  # the driver's group was killed
    assert json.loads(done.stdout.splitlines()[0]) == {"written": f"{SCOPE}/plain"}
    assert_stream_is(streams.uri, "plain", plain)  # written by the cluster's executors

    # the crash came after the record, before any commit: nothing visible yet
    assert stream_bytes(streams.uri, "crash") == 0
    keys = table_keys(streams.uri, "crash")
    assert [k for k in keys if k.startswith("commit/")] != []
    report = recover_stream_writes(streams.uri, SCOPE, "crash")
    assert len(report.rolled_forward) == 1 and report.committed_txns == 2
    assert_stream_is(streams.uri, "crash", crash)
    assert table_keys(streams.uri, "crash") == []
    again = recover_stream_writes(streams.uri, SCOPE, "crash")  # nothing left to do
    assert again.rolled_forward == [] and again.committed_txns == 0
    assert stream_bytes(streams.uri, "crash") == framed(events_of(crash))


# --- streaming --------------------------------------------------------------------------


def write_log(metadata: str, name: str, payloads: list[bytes]) -> None:
    async def go() -> None:
        client = await Client.connect(metadata)
        try:
            writer = await LogStore(client).open_writer(name, roll_bytes=600)
            await asyncio.gather(*[writer.append(p) for p in payloads])
            await writer.close()
        finally:
            await client.close()
    asyncio.run(go())




def sink_progress(uri: str, name: str, sink_id: str) -> int | None:
    async def progress(controller: ControllerClient, segments: RemoteSegmentStore
                       ) -> int | None:
        record, _ = await StreamCommits(controller, segments).sink_progress(SCOPE, name,
                                                                            sink_id)
        return None if record is None else record.batch_id
    return with_stream_clients(uri, progress)


def test_stream_sink_is_exactly_once_across_a_restart_from_its_checkpoint(
        spark: SparkSession, streams: Streams, tmp_path: Path) -> None:
    create_stream(streams, "events", segments=2)
    metadata = streams.bookies.metadata_uri
    source = [b"s%d:%d" % (n % 3, n) for n in range(250)]
    write_log(metadata, "sink-src", source)
    checkpoint = tmp_path / "checkpoint"

    def run_query() -> None:
        assert run_available_now(
            lambda: spark.readStream.format("quire").option("metadata", metadata)
            .option("log", "sink-src").option("max_rows_per_trigger", "100").load()
            .selectExpr("payload AS event", "split(cast(payload AS string), ':')[0] "
                        "AS routing_key")
            .writeStream.format("quire").option("controller", streams.uri)
            .option("stream", f"{SCOPE}/events").option("sink_id", "copy-1")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()) is None

    def as_rows(payloads: list[bytes]) -> list[tuple[str, str]]:
        return [(p.decode(), p.decode().split(":")[0]) for p in payloads]

    run_query()
    assert sink_progress(streams.uri, "events", "copy-1") == 2
    assert stream_bytes(streams.uri, "events") == framed(events_of(as_rows(source)))
    assert forget_last_commit(checkpoint) == 2
    run_query()  # batch 2 runs again: the sink aborts its transactions
    assert stream_bytes(streams.uri, "events") == framed(events_of(as_rows(source)))
    more = [b"s%d:%d" % (n % 3, n) for n in range(250, 300)]
    write_log(metadata, "sink-src", more)
    run_query()
    assert sink_progress(streams.uri, "events", "copy-1") == 3
    assert_stream_is(streams.uri, "events", as_rows(source + more))
    assert [k for k in table_keys(streams.uri, "events") if not k.startswith("sink/")] == []
