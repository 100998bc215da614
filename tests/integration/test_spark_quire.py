"""The ``quire`` Spark data source on a real local Spark (``local[2,2]``)
against real bookie processes: round trips (one of them to bookies that
serve mutual TLS), failed and retried tasks, overwrite, streaming reads
restarted from a checkpoint, exactly-once streaming writes, and
``format("quire")`` without a register call.

One SparkSession and one 3-bookie cluster serve the whole module (session
fixtures in conftest); every test uses its own log names.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pyarrow  # noqa: F401  (a missing dependency fails, never skips)
import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from quire.client import Client
from quire.log import LogInfo, LogJobs, LogStore, Position
from quire.log import records as rec
from quire.spark import QuireDataSource, collect_garbage
from tests.support.cluster import Cluster
from tests.support.spark import forget_last_commit, read_available_now, run_available_now
from tests.support.tls import Pki, secure_bookies

T = TypeVar("T")

# UDFs defined here run in Spark's Python workers, which cannot import this
# test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(300)


# --- helpers -----------------------------------------------------------------------------


def with_logs(uri: str, fn: Callable[[LogStore], Awaitable[T]]) -> T:
    async def go() -> T:
        client = await Client.connect(uri)
        try:
            return await fn(LogStore(client))
        finally:
            await client.close()

    return asyncio.run(go())


def write_log(uri: str, name: str, payloads: Iterable[bytes], *,
              roll_bytes: int = 1 << 30) -> list[Position]:
    async def write(logs: LogStore) -> list[Position]:
        writer = await logs.open_writer(name, roll_bytes=roll_bytes)
        positions = await asyncio.gather(*[writer.append(p) for p in payloads])
        await writer.close()
        return list(positions)

    return with_logs(uri, write)


def log_info(uri: str, name: str) -> LogInfo:
    return with_logs(uri, lambda logs: logs.info(name))


def ledger_ids(uri: str) -> set[int]:
    async def ids(logs: LogStore) -> set[int]:
        return set(await logs.metadata_store.list_ledgers())

    return with_logs(uri, ids)


def next_ledger_id(uri: str) -> int:
    async def new_id(logs: LogStore) -> int:
        return await logs.metadata_store.new_ledger_id()

    return with_logs(uri, new_id)


def job_keys(uri: str, name: str) -> list[str]:
    async def keys(logs: LogStore) -> list[str]:
        return await logs.metadata_store.list_records(rec.jobs_prefix(name))

    return with_logs(uri, keys)


def reader(spark: SparkSession, uri: str, name: str, **options: str) -> DataFrame:
    frame = spark.read.format("quire").option("metadata", uri).option("log", name)
    for key, value in options.items():
        frame = frame.option(key, value)
    return frame.load()


def rows_of(df: DataFrame) -> list[tuple[int, int, bytes]]:
    return sorted((r.ledger_seq, r.entry_id, bytes(r.payload)) for r in df.collect())


def payloads_in_log_order(spark: SparkSession, uri: str, name: str) -> list[bytes]:
    return [p for _, _, p in rows_of(reader(spark, uri, name))]


def save(df: DataFrame, uri: str, name: str, mode: str = "append", **options: str) -> None:
    writer = df.write.format("quire").option("metadata", uri).option("log", name)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode(mode).save()




# --- registration ---------------------------------------------------------------------------


def test_format_quire_works_without_register(spark: SparkSession,
                                             spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    positions = write_log(uri, "noreg", [b"n%d" % i for i in range(20)])
    fresh = spark.newSession()  # a new session state: nothing registered in it
    df = reader(fresh, uri, "noreg")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("ledger_seq", "bigint"), ("ledger_id", "bigint"), ("entry_id", "bigint"),
        ("payload", "binary")]
    assert [(s, e) for s, e, _ in rows_of(df)] == [(p.ledger_seq, p.entry_id) for p in positions]
    explicit = spark.newSession()
    explicit.dataSource.register(QuireDataSource)
    assert reader(explicit, uri, "noreg").count() == 20


# --- batch ---------------------------------------------------------------------------------


def test_round_trip_of_a_dataframe(spark: SparkSession, spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    before = ledger_ids(uri)
    df = spark.createDataFrame([(f"row-{i:05d}",) for i in range(3000)], "payload string")
    save(df.repartition(3), uri, "round")
    info = log_info(uri, "round")
    assert len(info.ledgers) == 3 and sum(r.entries or 0 for r in info.ledgers) == 3000
    assert job_keys(uri, "round") == []
    assert ledger_ids(uri) - before == {r.ledger_id for r in info.ledgers}
    back = reader(spark, uri, "round", partition_entries="400")
    assert back.rdd.getNumPartitions() == 9
    rows = rows_of(back)
    assert sorted(p for _, _, p in rows) == [f"row-{i:05d}".encode() for i in range(3000)]
    assert [(s, e) for s, e, _ in rows] == [
        (r.seq, e) for r in info.ledgers for e in range(r.entries or 0)]
    # binary payloads, appended after
    blobs = spark.createDataFrame([(bytes([i % 256]) * (i % 50),) for i in range(500)],
                                  "payload binary")
    save(blobs.coalesce(1), uri, "round")
    info = log_info(uri, "round")
    assert len(info.ledgers) == 4
    tail = reader(spark, uri, "round", start=f"{info.ledgers[3].seq}:0")
    assert [p for _, _, p in rows_of(tail)] == [bytes([i % 256]) * (i % 50) for i in range(500)]
    # a range: start inclusive, end exclusive
    ranged = reader(spark, uri, "round", start="1:10", end="2:5")
    expected = [(1, e) for e in range(10, info.ledgers[1].entries or 0)] + [
        (2, e) for e in range(5)]
    assert [(s, e) for s, e, _ in rows_of(ranged)] == expected
    assert reader(spark, uri, "round").agg(F.sum(F.length("payload"))).first()[0] == (
        sum(len(f"row-{i:05d}") for i in range(3000)) + sum(i % 50 for i in range(500)))


def test_a_round_trip_to_bookies_that_serve_mutual_tls(
        spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The sink's tasks and the source's planner and tasks (Spark's Python
    workers) reach the bookies with the TLS options' client certificate."""
    root = tmp_path_factory.mktemp("spark-tls")
    cluster = Cluster(root / "cluster", 3)
    secure_bookies(cluster, Pki(root / "pki"))
    cluster.start()
    try:
        uri, tls = cluster.metadata_uri, cluster.client_settings
        df = spark.createDataFrame([(f"tls-{i:04d}",) for i in range(500)], "payload string")
        save(df.repartition(2), uri, "secure", **tls)
        back = rows_of(reader(spark, uri, "secure", partition_entries="100", **tls))
        assert sorted(p for _, _, p in back) == [f"tls-{i:04d}".encode() for i in range(500)]
        without = {"tls_ca": tls["tls_ca"]}  # trusts the bookies, shows no certificate
        with pytest.raises(Exception, match=r"BookieUnavailableError|EntryNotAvailableError"):
            reader(spark, uri, "secure", **without).collect()
    finally:
        cluster.close()


def wait_until_writing(uri: str, name: str, attempt: int, timeout_s: float = 60.0) -> None:
    """Block (inside a UDF) until the data source's writer of this task
    attempt has registered its ledger: from then on, the task has written."""
    import time

    from quire.metadata import open_store

    context = TaskContext.get()
    task = f"partition {context.partitionId()} attempt {attempt}"

    async def registered() -> bool:
        store = await open_store(uri)
        try:
            for key in await store.list_records(rec.jobs_prefix(name)):
                if "/ledgers/" in key and rec.decode_registration(
                        (await store.read_record(key)).value).task == task:
                    return True
            return False
        finally:
            await store.close()

    deadline = time.monotonic() + timeout_s
    while not asyncio.run(registered()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the writer of {task} never registered a ledger")
        time.sleep(0.02)


FILLER = b"." * 1000
"""Rows this big push the UDF's output through Spark's buffers early, so the
data source's writer sees rows while the UDF still runs."""


def test_failed_task_leaves_the_log_unchanged(spark: SparkSession,
                                              spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "failing", [b"kept-%d" % i for i in range(10)])
    before, ledgers_before = log_info(uri, "failing"), ledger_ids(uri)
    mark = next_ledger_id(uri)

    @F.udf("binary")
    def payload(i):  # type: ignore[no-untyped-def]  (no hints: Spark reads them)
        if i == 3999:  # the end of partition 1, once its writer is writing
            wait_until_writing(uri, "failing", TaskContext.get().attemptNumber())
            raise ValueError("boom at row 3999")
        return b"new-%d" % i + FILLER

    df = spark.range(0, 4000, numPartitions=2).select(payload("id").alias("payload"))
    with pytest.raises(Exception, match="boom at row 3999"):
        save(df, uri, "failing")
    after = log_info(uri, "failing")
    assert after.ledgers == before.ledgers and after.next_seq == before.next_seq
    assert payloads_in_log_order(spark, uri, "failing") == [b"kept-%d" % i for i in range(10)]
    assert job_keys(uri, "failing") == []
    assert ledger_ids(uri) == ledgers_before  # every ledger the job wrote is gone
    assert next_ledger_id(uri) - mark - 1 >= 2  # ... and both attempts of partition 1 wrote


def test_retried_task_does_not_duplicate_rows(spark: SparkSession,
                                              spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    before = ledger_ids(uri)
    mark = next_ledger_id(uri)

    @F.udf("binary")
    def payload(i):  # type: ignore[no-untyped-def]  (no hints: Spark reads them)
        context = TaskContext.get()
        if i == 3999 and context.attemptNumber() == 0:
            wait_until_writing(uri, "retried", 0)
            raise RuntimeError("first attempt of partition 1 fails after writing")
        return b"r-%05d" % i + FILLER

    df = spark.range(0, 4000, numPartitions=2).select(payload("id").alias("payload"))
    save(df, uri, "retried")
    assert payloads_in_log_order(spark, uri, "retried") == [
        b"r-%05d" % i + FILLER for i in range(4000)]
    info = log_info(uri, "retried")
    assert len(info.ledgers) == 2
    assert ledger_ids(uri) - before == {r.ledger_id for r in info.ledgers}
    assert next_ledger_id(uri) - mark - 1 == 3  # the failed attempt's ledger existed
    assert job_keys(uri, "retried") == []


def test_overwrite_replaces_the_log(spark: SparkSession, spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    save(spark.createDataFrame([(f"old-{i}",) for i in range(100)], "payload string"),
         uri, "over")
    old = log_info(uri, "over")
    fresh = spark.createDataFrame([(f"new-{i}",) for i in range(50)], "payload string")
    save(fresh.coalesce(1), uri, "over", mode="overwrite")
    info = log_info(uri, "over")
    assert payloads_in_log_order(spark, uri, "over") == [b"new-%d" % i for i in range(50)]
    assert {r.ledger_id for r in info.ledgers}.isdisjoint(r.ledger_id for r in old.ledgers)
    assert not {r.ledger_id for r in old.ledgers} & ledger_ids(uri)  # old ledgers deleted
    assert info.truncated_before > Position(old.ledgers[-1].seq, 0)


def test_collect_garbage_removes_stale_jobs(spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri

    async def stale_job(logs: LogStore) -> int:
        jobs = LogJobs(logs)
        job = await jobs.begin_job("gc", ttl_ms=0)
        ledger = await logs.client.create_ledger(3, 3, 2)
        await jobs.register_ledger(job, ledger.ledger_id)
        await ledger.append(b"never committed")
        await ledger.close()
        return ledger.ledger_id

    orphan = with_logs(uri, stale_job)
    report = collect_garbage(uri, "gc")
    assert report.ledgers_deleted == [orphan] and len(report.jobs_aborted) == 1
    assert orphan not in ledger_ids(uri) and job_keys(uri, "gc") == []


# --- streaming -----------------------------------------------------------------------------


def test_stream_read_restarts_from_its_checkpoint_exactly(
        spark: SparkSession, spark_cluster: Cluster, tmp_path: Path) -> None:
    uri = spark_cluster.metadata_uri
    first = write_log(uri, "events", [b"e-%03d" % i for i in range(300)], roll_bytes=500)
    assert len({p.ledger_seq for p in first}) >= 3
    checkpoint = tmp_path / "checkpoint"
    seen: list[tuple[int, list[tuple[int, int, bytes]]]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen.append((batch_id, rows_of(batch)))

    def run_query() -> None:
        assert run_available_now(
            lambda: spark.readStream.format("quire").option("metadata", uri)
            .option("log", "events").option("max_rows_per_trigger", "70").load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()) is None

    run_query()
    first_run = dict(seen)
    assert [len(rows) for _, rows in sorted(first_run.items())] == [70, 70, 70, 70, 20]
    replayed = forget_last_commit(checkpoint)
    second = write_log(uri, "events", [b"e-%03d" % i for i in range(300, 450)], roll_bytes=500)
    seen.clear()
    run_query()
    second_run = dict(seen)
    assert second_run[replayed] == first_run[replayed]  # the same batch, exactly
    delivered = [row for batch_id, rows in sorted({**first_run, **second_run}.items())
                 for row in rows]
    expected = [(p.ledger_seq, p.entry_id, b"e-%03d" % i)
                for i, p in enumerate(first + second)]
    assert delivered == expected  # nothing lost, nothing twice, in log order


def test_stream_offsets_respect_read_limits(spark_cluster: Cluster) -> None:
    """The stream reader's planning on its own (no query): offsets move by at
    most the row or byte limit, across ledgers, and only to readable entries."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

    from quire.spark import SCHEMA, QuireOptions, QuireStreamReader

    uri = spark_cluster.metadata_uri
    positions = write_log(uri, "limits", [b"%010d" % i for i in range(100)], roll_bytes=300)
    assert len({p.ledger_seq for p in positions}) == 4  # 30, 30, 30, 10 entries

    def stream(**options: str) -> QuireStreamReader:
        return QuireStreamReader(QuireOptions.parse(
            {"metadata": uri, "log": "limits", **options}), SCHEMA)

    def offset(p: Position) -> dict[str, int]:
        return {"ledger_seq": p.ledger_seq, "entry_id": p.entry_id}

    reader = stream(max_rows_per_trigger="45")
    start = reader.initialOffset()
    assert start == offset(Position(0, 0))
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert first == offset(Position(1, 15))
    assert reader.latestOffset(first, ReadMaxBytes(100)) == offset(Position(1, 25))
    end = reader.latestOffset(first, ReadAllAvailable())
    assert end == offset(Position(3, 10))
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing new
    ranges = reader.partitions(first, end)
    assert [(r.ledger_seq, r.first, r.last) for r in ranges] == [
        (1, 15, 29), (2, 0, 29), (3, 0, 9)]
    assert reader.partitions(end, end) == []
    latest = stream(start="latest", max_bytes_per_trigger="50")
    assert latest.initialOffset() == end
    assert isinstance(latest.getDefaultReadLimit(), ReadMaxBytes)
    assert latest.latestOffset(offset(Position(0, 0)), ReadMaxBytes(5)) == offset(
        Position(0, 1))  # at least one entry


def test_empty_log_reads_as_no_rows(spark: SparkSession, spark_cluster: Cluster) -> None:
    uri = spark_cluster.metadata_uri
    with_logs(uri, lambda logs: logs.create("nothing"))
    assert reader(spark, uri, "nothing").count() == 0
    with pytest.raises(Exception, match="no log named"):
        reader(spark, uri, "no-such-log").count()


def test_stream_read_detects_truncated_offsets(spark: SparkSession, spark_cluster: Cluster,
                                               tmp_path: Path) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "lossy", [b"a-%06d" % i for i in range(20)], roll_bytes=40)  # 5 per ledger
    checkpoint = tmp_path / "checkpoint"
    got: list[bytes] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        got.extend(p for _, _, p in rows_of(batch))

    def run_query(**options: str) -> BaseException | None:
        return read_available_now(spark, checkpoint, collect, metadata=uri, log="lossy",
                                  **options)

    assert run_query() is None and len(got) == 20
    later = write_log(uri, "lossy", [b"b-%06d" % i for i in range(20)], roll_bytes=40)
    assert later[10] == Position(6, 0)
    # the unread b-000000..b-000009 go too: the checkpointed offset is lost
    with_logs(uri, lambda logs: logs.truncate("lossy", later[10]))
    error = run_query()
    assert error is not None and "truncated" in str(error)
    got.clear()
    assert run_query(fail_on_data_loss="false") is None
    assert got == [b"b-%06d" % i for i in range(10, 20)]


def test_stream_write_is_exactly_once(spark: SparkSession, spark_cluster: Cluster,
                                      tmp_path: Path) -> None:
    uri = spark_cluster.metadata_uri
    source = [b"s-%03d" % i for i in range(250)]
    write_log(uri, "stream-src", source, roll_bytes=600)
    checkpoint = tmp_path / "checkpoint"

    def run_query() -> None:
        assert run_available_now(
            lambda: spark.readStream.format("quire").option("metadata", uri)
            .option("log", "stream-src").option("max_rows_per_trigger", "100").load()
            .select("payload")
            .writeStream.format("quire").option("metadata", uri)
            .option("log", "stream-dst").option("sink_id", "copy-1")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()) is None

    run_query()
    assert payloads_in_log_order(spark, uri, "stream-dst") == source
    assert with_logs(uri, lambda logs: LogJobs(logs).sink_progress("stream-dst", "copy-1")) == 2
    dst_ledgers = {r.ledger_id for r in log_info(uri, "stream-dst").ledgers}
    all_before = ledger_ids(uri)
    replayed = forget_last_commit(checkpoint)
    assert replayed == 2
    run_query()  # batch 2 runs again: the sink drops it
    assert payloads_in_log_order(spark, uri, "stream-dst") == source
    assert {r.ledger_id for r in log_info(uri, "stream-dst").ledgers} == dst_ledgers
    assert ledger_ids(uri) == all_before  # the replay's ledgers were deleted
    more = [b"s-%03d" % i for i in range(250, 300)]
    write_log(uri, "stream-src", more, roll_bytes=600)
    run_query()
    assert payloads_in_log_order(spark, uri, "stream-dst") == source + more
    assert with_logs(uri, lambda logs: LogJobs(logs).sink_progress("stream-dst", "copy-1")) == 3
    assert [k for k in job_keys(uri, "stream-dst") if "/ledgers/" in k] == []


def test_stream_sink_needs_a_sink_id(spark: SparkSession, spark_cluster: Cluster,
                                     tmp_path: Path) -> None:
    uri = spark_cluster.metadata_uri
    write_log(uri, "needs-id", [b"x"])
    stream = (spark.readStream.format("quire").option("metadata", uri)
              .option("log", "needs-id").load().select("payload"))
    error = run_available_now(
        lambda: stream.writeStream.format("quire").option("metadata", uri)
        .option("log", "needs-id-dst")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True).start())
    assert error is not None and "sink_id" in str(error), error
    shutil.rmtree(tmp_path / "cp", ignore_errors=True)


def test_options_are_parsed_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from quire.spark import QuireOptions

    monkeypatch.delenv("QUIRE_METADATA", raising=False)
    from quire.spark.options import parse_duration_ms

    opts = QuireOptions.parse({"metadata": "memory://x", "log": "events", "start": "2:5",
                               "end": "3:0", "job_ttl": "15m", "password": "pw",
                               "fail_on_data_loss": "false"})
    assert (opts.start_position, opts.end) == (Position(2, 5), Position(3, 0))
    assert opts.job_ttl_ms == 900_000 and opts.password == b"pw"
    assert not opts.fail_on_data_loss
    assert opts.quorums(5) == (3, 3, 2) and opts.quorums(2) == (2, 2, 2)
    assert opts.quorums(1) == (1, 1, 1)
    assert QuireOptions.parse({"metadata": "m", "log": "l", "start": "LATEST"}).start == "latest"
    monkeypatch.setenv("QUIRE_TLS_CA", "ca.pem")
    tls = QuireOptions.parse({"metadata": "m", "log": "l", "tls_cert": "c.pem",
                              "tls_key": "c.key"})
    assert (tls.client_config.tls_ca, tls.client_config.tls_cert) == ("ca.pem", "c.pem")
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        QuireOptions.parse({"metadata": "m", "log": "l", "tls_cert": "c.pem"})
    monkeypatch.delenv("QUIRE_TLS_CA")
    assert [parse_duration_ms(t) for t in ("90", "250ms", "2h", "1d")] == [
        90_000, 250, 7_200_000, 86_400_000]
    for bad in ({"log": "l"}, {"metadata": "m"}, {"metadata": "m", "log": "a/b"},
                {"metadata": "m", "log": "l", "start": "nope"},
                {"metadata": "m", "log": "l", "max_rows_per_trigger": "0"},
                {"metadata": "m", "log": "l", "fail_on_data_loss": "maybe"},
                {"metadata": "m", "log": "l", "ensemble_size": "2", "write_quorum_size": "3"}):
        with pytest.raises(ValueError):
            QuireOptions.parse(bad).quorums(3)
