"""The named-log layer over a real client and in-process fake bookies
(memory:// metadata): writer epochs and fencing, rolls, readers, truncation,
bulk append, write jobs and stream sinks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quire.client import Client
from quire.errors import MetadataNotFoundError, StatusCode, TransactionError
from quire.log import (
    JobClosedError,
    LogBusyError,
    LogError,
    LogExistsError,
    LogFencedError,
    LogJobs,
    LogNotFoundError,
    LogStore,
    LogTruncatedError,
    LogWriterClosedError,
    Position,
)
from quire.log import records as rec
from quire.metadata import CheckRecord, CreateRecord
from quire.testing.clock import ManualClock
from quire.types import LedgerState
from tests.support.fake_bookie import FakeCluster
from tests.support.logs import read_all


@pytest.fixture
async def fakes() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster.start(3)
    yield cluster
    await cluster.close()


@pytest.fixture
async def client(fakes: FakeCluster) -> Client:
    return await fakes.client(explicit_lac_interval_ms=20)


@pytest.fixture
def logs(client: Client) -> LogStore:
    return LogStore(client, password=b"pw")


async def closed_ledger(client: Client, payloads: list[bytes], password: bytes = b"pw") -> int:
    ledger = await client.create_ledger(3, 3, 2, password=password)
    await asyncio.gather(*[ledger.append(p) for p in payloads])
    await ledger.close()
    return ledger.ledger_id


# --- positions and records ---------------------------------------------------------


def test_positions_are_totally_ordered_and_parse() -> None:
    assert Position(0, 5) < Position(1, 0) < Position(1, 1)
    assert sorted([Position(2, 0), Position(0, 9), Position(1, 3)]) == [
        Position(0, 9), Position(1, 3), Position(2, 0)]
    assert Position.parse(" 3:14 ") == Position(3, 14) and str(Position(3, 14)) == "3:14"
    assert Position(0, 0) == Position.START
    for bad in ("3", "a:1", "-1:0", "1:-2"):
        with pytest.raises(ValueError):
            Position.parse(bad)
    with pytest.raises(AttributeError):
        Position(1, 1).entry_id = 2  # type: ignore[misc]


def test_records_round_trip_and_names_are_checked() -> None:
    head = rec.HeadRecord(name="a", created_ms=5, epoch=3,
                          writer=rec.WriterHold(3, "me", 7), next_seq=9,
                          truncated_before=Position(4, 10))
    assert rec.decode_head(rec.encode_head(head)) == head
    ledger = rec.LedgerRecord(seq=1, ledger_id=77, state="closed", created_ms=1, entries=3,
                              bytes=30, epoch=2)
    assert rec.decode_ledger(rec.encode_ledger(ledger)) == ledger
    assert rec.ledger_key("a", 12) == "logs/a/ledgers/000000000012"
    assert rec.seq_of_ledger_key("a", "logs/a/ledgers/000000000012") == 12
    assert rec.seq_of_ledger_key("a", "logs/ab/ledgers/000000000012") is None
    for bad in ("", "a/b", ".hidden", "-x", "x" * 201, "sp ace"):
        with pytest.raises(ValueError):
            rec.check_name(bad)


# --- create, list, delete ---------------------------------------------------------


async def test_create_list_delete(logs: LogStore) -> None:
    await logs.create("one")
    await logs.create("two")
    with pytest.raises(LogExistsError):
        await logs.create("one")
    await logs.create("one", exist_ok=True)
    assert await logs.list() == ["one", "two"]
    writer = await logs.open_writer("one")
    await writer.append(b"x")
    with pytest.raises(LogBusyError):
        await logs.delete("one")
    await writer.close()
    ledger_id = (await logs.info("one")).ledgers[0].ledger_id
    await logs.delete("one")
    assert await logs.list() == ["two"]
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(ledger_id)
    with pytest.raises(LogNotFoundError):
        await logs.info("one")


async def test_discard_drops_a_held_log_and_it_is_made_again_above_its_epoch(
        logs: LogStore) -> None:
    writer = await logs.open_writer("lost")
    await writer.append(b"x")
    with pytest.raises(LogBusyError):
        await logs.delete("lost")
    ledger_id = (await logs.info("lost")).ledgers[0].ledger_id
    head, ledgers = await logs.catalog.discard("lost")
    assert head.epoch == writer.epoch and ledgers == {ledger_id}
    assert await logs.list() == []
    await logs.metadata_store.read_ledger(ledger_id)  # left as it was: never read
    with pytest.raises((LogFencedError, LogNotFoundError)):
        await writer.close()  # the holder's next metadata change fails
    with pytest.raises(LogNotFoundError):
        await logs.catalog.discard("lost")
    await logs.catalog.create("lost", epoch=head.epoch + 5)
    again = await logs.open_writer("lost")
    assert again.epoch == head.epoch + 6
    assert await again.append(b"y") == Position(0, 0)
    await again.close()
    with pytest.raises(ValueError):
        await logs.catalog.create("negative", epoch=-1)


# --- writer --------------------------------------------------------------------------


async def test_writer_rolls_by_size_and_reader_reads_across_ledgers(logs: LogStore) -> None:
    writer = await logs.open_writer("rolled", roll_bytes=100)
    futures = [writer.append(b"%03d-" % i + b"x" * 20) for i in range(30)]
    positions = await asyncio.gather(*futures)
    assert positions == sorted(positions) and len(set(positions)) == 30
    assert await writer.flush() == positions[-1]
    await writer.close()
    info = await logs.info("rolled")
    assert len(info.ledgers) >= 6 and not info.writer_held
    assert [r.seq for r in info.ledgers] == list(range(len(info.ledgers)))
    assert all(r.closed and r.entries for r in info.ledgers)
    assert sum(r.entries or 0 for r in info.ledgers) == 30
    got = await read_all(logs, "rolled")
    assert got == [(p, b"%03d-" % i + b"x" * 20) for i, p in enumerate(positions)]
    # from a position in the middle, and past the end of a ledger
    middle = positions[11]
    assert [p for p, _ in await read_all(logs, "rolled", middle)] == positions[11:]
    end_of_first = Position(0, info.ledgers[0].entries or 0)
    assert (await read_all(logs, "rolled", end_of_first))[0][0] == Position(1, 0)
    with pytest.raises(LogWriterClosedError):
        writer.append(b"late")


async def test_writer_rolls_by_age(logs: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("quire.log.writer._monotonic", lambda: clock[0])
    writer = await logs.open_writer("aged", roll_age_ms=1000)
    first = await writer.append(b"a")
    clock[0] += 0.5
    second = await writer.append(b"b")
    clock[0] += 1.0
    third = await writer.append(b"c")
    await writer.close()
    assert (first.ledger_seq, second.ledger_seq) == (0, 0)
    assert third == Position(1, 0)


async def test_second_writer_fences_the_first(logs: LogStore, fakes: FakeCluster) -> None:
    first = await logs.open_writer("fenced")
    acked = [await first.append(b"a%d" % i) for i in range(5)]
    second = await logs.open_writer("fenced")
    assert second.epoch == first.epoch + 1
    with pytest.raises(LogFencedError):
        await first.append(b"lost?")
    with pytest.raises(LogFencedError):
        first.append(b"after")
    with pytest.raises(LogFencedError):
        await first.close()
    info = await logs.info("fenced")
    assert info.ledgers[0].closed and info.ledgers[0].entries == 5
    pos = await second.append(b"b")
    assert pos == Position(1, 0)
    await second.close()
    got = await read_all(logs, "fenced")
    assert [p for p, _ in got][:5] == acked and got[-1] == (Position(1, 0), b"b")


async def test_fenced_writer_roll_fails(logs: LogStore) -> None:
    first = await logs.open_writer("fenced-roll", roll_bytes=1)
    await first.append(b"a")  # the next append rolls
    second = await logs.open_writer("fenced-roll")
    with pytest.raises(LogFencedError):
        await first.append(b"b")
    await second.close()
    info = await logs.info("fenced-roll")
    assert [r.entries for r in info.ledgers] == [1]


async def test_writer_close_drops_an_empty_ledger_and_recover(logs: LogStore) -> None:
    writer = await logs.open_writer("empty")
    assert writer.ledger_seq is None
    await writer.close()
    info = await logs.info("empty")
    assert info.ledgers == () and not info.writer_held
    dead = await logs.open_writer("empty")
    await dead.append(b"kept")
    # the process "dies": the hold stays, bulk append is refused until recover()
    with pytest.raises(LogBusyError):
        await logs.bulk_append("empty", [])
    await logs.recover("empty")
    info = await logs.info("empty")
    assert not info.writer_held and info.ledgers[0].entries == 1
    await logs.bulk_append("empty", [])


# --- readers --------------------------------------------------------------------------


async def test_reader_follows_the_tail(logs: LogStore) -> None:
    writer = await logs.open_writer("tail", roll_bytes=50)
    reader = await logs.open_reader("tail")
    got: list[bytes] = []

    async def consume() -> None:
        async for record in reader:
            got.append(record.payload)
            if len(got) == 40:
                return

    task = asyncio.create_task(consume())
    for i in range(40):
        await writer.append(b"e%02d" % i)
        if i % 7 == 0:
            await asyncio.sleep(0)
    await writer.flush()
    await asyncio.wait_for(task, 10)
    assert got == [b"e%02d" % i for i in range(40)]
    assert await reader.read_next(timeout=0.05) == []
    await writer.close()
    await reader.close()


# --- truncation ---------------------------------------------------------------------


async def test_truncate_removes_whole_ledgers_below(logs: LogStore) -> None:
    writer = await logs.open_writer("trunc", roll_bytes=30)
    positions = [await writer.append(b"x" * 10) for _ in range(12)]  # 3 per ledger
    await writer.close()
    info = await logs.info("trunc")
    assert [r.entries for r in info.ledgers] == [3, 3, 3, 3]
    assert await logs.truncate("trunc", Position(1, 2)) == [info.ledgers[0].ledger_id]
    assert await logs.truncate("trunc", Position(1, 2)) == []
    removed = await logs.truncate("trunc", Position(2, 3))  # ledger 2 is entirely below
    assert removed == [info.ledgers[1].ledger_id, info.ledgers[2].ledger_id]
    for ledger_id in (info.ledgers[0].ledger_id, *removed):
        with pytest.raises(MetadataNotFoundError):
            await logs.metadata_store.read_ledger(ledger_id)
    assert [p for p, _ in await read_all(logs, "trunc", Position(2, 3))] == positions[9:]
    with pytest.raises(LogTruncatedError):
        await read_all(logs, "trunc", Position(1, 0))
    reader = await logs.open_reader("trunc", Position.START, follow=False, skip_truncated=True)
    assert [r.position async for r in reader] == positions[9:]


# --- bulk append ---------------------------------------------------------------------


async def test_bulk_append_all_or_nothing(logs: LogStore, client: Client) -> None:
    await logs.create("bulk")
    a = await closed_ledger(client, [b"a0", b"a1"])
    b = await closed_ledger(client, [b"b0"])
    assert await logs.bulk_append("bulk", [a, b]) == [0, 1]
    c = await closed_ledger(client, [b"c0"])
    before = await logs.info("bulk")
    # an extra op that fails takes the whole batch down
    with pytest.raises(TransactionError) as failed:
        await logs.bulk_append("bulk", [c], extra_ops=[
            CreateRecord("app/marker", b"1"), CheckRecord("app/missing", 0)])
    assert failed.value.failed_index == 1
    after = await logs.info("bulk")
    assert after.ledgers == before.ledgers and after.next_seq == before.next_seq
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_record("app/marker")
    # refused: open ledger, repeated ids, wrong password, a writer holding the log
    open_ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    with pytest.raises(ValueError, match="not CLOSED"):
        await logs.bulk_append("bulk", [open_ledger.ledger_id])
    with pytest.raises(ValueError, match="repeated"):
        await logs.bulk_append("bulk", [c, c])
    other = await closed_ledger(client, [b"z"], password=b"other")
    with pytest.raises(ValueError, match="password"):
        await logs.bulk_append("bulk", [other])
    writer = await logs.open_writer("bulk")
    with pytest.raises(LogBusyError):
        await logs.bulk_append("bulk", [c])
    await writer.close()
    assert await logs.bulk_append("bulk", [c]) == [2]
    assert [d for _, d in await read_all(logs, "bulk")] == [b"a0", b"a1", b"b0", b"c0"]


async def test_bulk_append_replace(logs: LogStore, client: Client) -> None:
    await logs.create("over")
    a = await closed_ledger(client, [b"a0", b"a1"])
    await logs.bulk_append("over", [a])
    b = await closed_ledger(client, [b"b0"])
    assert await logs.bulk_append("over", [b], replace=True) == [1]
    info = await logs.info("over")
    assert [r.ledger_id for r in info.ledgers] == [b]
    assert info.truncated_before == Position(0, 2)
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(a)
    assert await read_all(logs, "over") == [(Position(1, 0), b"b0")]
    with pytest.raises(LogTruncatedError):
        await read_all(logs, "over", Position(0, 1))


# --- jobs -----------------------------------------------------------------------------


async def test_job_commits_only_named_ledgers(logs: LogStore, client: Client) -> None:
    jobs = LogJobs(logs)
    job = await jobs.begin_job("jobs", ttl_ms=60_000)
    ledgers = []
    for payloads in ([b"p0"], [b"p1-first-attempt"], [b"p1"]):
        ledger = await client.create_ledger(3, 3, 2, password=b"pw")
        await jobs.register_ledger(job, ledger.ledger_id, task="t")
        for p in payloads:
            await ledger.append(p)
        await ledger.close()
        ledgers.append(ledger.ledger_id)
    assert await jobs.commit_job(job, [ledgers[0], ledgers[2]]) == [0, 1]
    assert [d for _, d in await read_all(logs, "jobs")] == [b"p0", b"p1"]
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(ledgers[1])
    assert await logs.metadata_store.list_records(rec.jobs_prefix("jobs")) == []
    with pytest.raises(JobClosedError):
        await jobs.register_ledger(job, 12345)


async def test_job_abort_and_garbage_collection(logs: LogStore, client: Client) -> None:
    clock = ManualClock(1_000_000)
    logs = LogStore(client, password=b"pw", clock=clock)
    jobs = LogJobs(logs)
    await logs.create("gc")
    aborted = await jobs.begin_job("gc", ttl_ms=1000)
    stale = await jobs.begin_job("gc", ttl_ms=1000)
    ids = []
    for job in (aborted, stale):
        ledger = await client.create_ledger(3, 3, 2, password=b"pw")
        await jobs.register_ledger(job, ledger.ledger_id)
        await ledger.append(b"x")
        await ledger.close()
        ids.append(ledger.ledger_id)
    assert await jobs.abort_job(aborted) == [ids[0]]
    report = await jobs.collect_garbage()
    assert report.jobs_aborted == []  # not stale yet
    clock.advance(2000)
    report = await jobs.collect_garbage("gc")
    assert report.jobs_aborted == [stale.job_id] and report.ledgers_deleted == [ids[1]]
    with pytest.raises(JobClosedError):
        await jobs.commit_job(stale, [ids[1]])
    assert (await logs.info("gc")).ledgers == ()
    for ledger_id in ids:
        with pytest.raises(MetadataNotFoundError):
            await logs.metadata_store.read_ledger(ledger_id)


async def test_sink_batches_commit_exactly_once(logs: LogStore, client: Client) -> None:
    jobs = LogJobs(logs)
    job = await jobs.sink_job("sink", "q1", ttl_ms=60_000)
    assert await jobs.sink_progress("sink", "q1") is None

    async def write(batch_id: int, payload: bytes) -> int:
        ledger = await client.create_ledger(3, 3, 2, password=b"pw")
        await jobs.register_ledger(job, ledger.ledger_id, batch_id=batch_id)
        await ledger.append(payload)
        await ledger.close()
        return ledger.ledger_id

    assert await jobs.commit_sink_batch(job, "q1", 0, [await write(0, b"b0")])
    retried = await write(1, b"b1-failed-attempt")
    assert await jobs.commit_sink_batch(job, "q1", 1, [await write(1, b"b1")])
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(retried)
    replay = await write(1, b"b1-replayed")
    assert not await jobs.commit_sink_batch(job, "q1", 1, [replay])
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(replay)
    assert await jobs.sink_progress("sink", "q1") == 1
    assert [d for _, d in await read_all(logs, "sink")] == [b"b0", b"b1"]
    failed = await write(2, b"b2")
    await jobs.abort_sink_batch(job, 2, [])
    with pytest.raises(MetadataNotFoundError):
        await logs.metadata_store.read_ledger(failed)


async def test_sink_registrations_expire(client: Client) -> None:
    clock = ManualClock(5_000_000)
    logs = LogStore(client, password=b"pw", clock=clock)
    jobs = LogJobs(logs)
    job = await jobs.sink_job("sink-gc", "q", ttl_ms=1000)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    await jobs.register_ledger(job, ledger.ledger_id, batch_id=7)
    await ledger.close()
    clock.advance(5000)
    report = await jobs.collect_garbage("sink-gc")
    assert report.ledgers_deleted == [ledger.ledger_id]
    with pytest.raises(JobClosedError):
        await jobs.commit_sink_batch(job, "q", 7, [ledger.ledger_id])
    assert (await logs.info("sink-gc")).ledgers == ()
    md = await logs.metadata_store.list_ledgers()
    assert ledger.ledger_id not in md


async def test_ledger_states_recorded(logs: LogStore) -> None:
    writer = await logs.open_writer("states")
    await writer.append(b"x")
    info = await logs.info("states")
    assert info.ledgers[0].state == "open" and info.writer_held
    md = (await logs.metadata_store.read_ledger(info.ledgers[0].ledger_id)).value
    assert md.state is LedgerState.OPEN and md.custom_metadata["quire.log"] == b"states"
    await writer.close()
    info = await logs.info("states")
    assert info.ledgers[0].state == "closed" and info.ledgers[0].entries == 1


async def test_following_reader_crosses_a_writer_failover(logs: LogStore,
                                                          client: Client) -> None:
    first = await logs.open_writer("failover")
    reader = await logs.open_reader("failover", poll_max_ms=20)
    got: list[bytes] = []

    async def consume(count: int) -> None:
        while len(got) < count:
            got.extend(r.payload for r in await reader.read_next(10))

    acked = [await first.append(b"a%d" % i) for i in range(5)]
    second = await logs.open_writer("failover")  # fences first, closes its ledger
    after = [await second.append(b"b%d" % i) for i in range(3)]
    await second.close()
    await asyncio.wait_for(consume(8), 10)
    assert got == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"b1", b"b2"]
    assert reader.position == after[-1].next()
    assert [p.ledger_seq for p in acked + after] == [0] * 5 + [1] * 3
    await reader.close()
    with pytest.raises(LogFencedError):
        await first.close()


# --- a fenced ledger is not a lost log ------------------------------------------------


async def test_writer_rolls_past_a_fenced_ledger_keeping_what_it_kept(
        logs: LogStore, fakes: FakeCluster) -> None:
    writer = await logs.open_writer("refenced")
    acked = [await writer.append(b"a%d" % i) for i in range(5)]
    ledger_id = (await logs.info("refenced")).ledgers[0].ledger_id
    for bookie in fakes.bookies:
        bookie.hold_adds = {5, 6, 7}  # stored everywhere, answers held back
        bookie.fence_at[ledger_id] = 8  # fenced by no other writer (as at a boot)
    kept = [writer.append(b"a%d" % i) for i in range(5, 8)]
    refused = [writer.append(b"a%d" % i) for i in range(8, 10)]  # stored nowhere
    done = await asyncio.gather(*kept, *refused)
    for bookie in fakes.bookies:
        bookie.release()
    assert done == [Position(0, 5), Position(0, 6), Position(0, 7),
                    Position(1, 0), Position(1, 1)]
    later = await writer.append(b"a10")
    assert later == Position(1, 2)
    await writer.close()
    info = await logs.info("refenced")
    assert info.epoch == writer.epoch == 1
    assert [(r.ledger_id == ledger_id, r.entries) for r in info.ledgers] == [
        (True, 8), (False, 3)]
    got = await read_all(logs, "refenced")
    assert got == list(zip([*acked, *done, later], [b"a%d" % i for i in range(11)],
                           strict=True))


async def test_writer_rolls_again_when_the_next_ledger_is_fenced_too(
        logs: LogStore, fakes: FakeCluster) -> None:
    writer = await logs.open_writer("twice")
    first = await writer.append(b"a0")
    ledger_id = (await logs.info("twice")).ledgers[0].ledger_id
    for bookie in fakes.bookies:
        bookie.fence_at[ledger_id] = 1
        bookie.fence_at[ledger_id + 1] = 1  # the next ledger (memory:// ids count up)
    rest = await asyncio.gather(*[writer.append(b"a%d" % i) for i in range(1, 4)])
    assert rest == [Position(1, 0), Position(2, 0), Position(2, 1)]
    await writer.close()
    info = await logs.info("twice")
    assert [(r.ledger_id - ledger_id, r.entries) for r in info.ledgers] == [
        (0, 1), (1, 1), (2, 2)]
    assert await read_all(logs, "twice") == list(zip(
        [first, *rest], [b"a%d" % i for i in range(4)], strict=True))


async def test_writer_gives_up_when_every_new_ledger_refuses(logs: LogStore,
                                                              fakes: FakeCluster) -> None:
    writer = await logs.open_writer("refusing")
    await writer.append(b"kept")
    for bookie in fakes.bookies:
        bookie.add_status = StatusCode.FENCED  # every add, of every ledger
    with pytest.raises(LogError, match="in a row") as failed:
        await writer.append(b"never")
    assert not isinstance(failed.value, LogFencedError)
    for bookie in fakes.bookies:
        bookie.add_status = None
    await writer.close()  # recovers what is left and lets go
    assert [d for _, d in await read_all(logs, "refusing")] == [b"kept"]


async def test_fenced_ledger_after_an_epoch_change_fails_the_writer(
        logs: LogStore, fakes: FakeCluster) -> None:
    first = await logs.open_writer("taken")
    await first.append(b"a0")
    ledger_id = (await logs.info("taken")).ledgers[0].ledger_id
    # another writer takes the head, but has not recovered the ledger yet
    hold = await logs.catalog.take("taken")
    for bookie in fakes.bookies:
        bookie.ledgers[ledger_id].fenced = True
    with pytest.raises(LogFencedError, match="epoch 2"):
        await first.append(b"a1")
    with pytest.raises(LogFencedError):
        first.append(b"a2")
    with pytest.raises(LogFencedError):
        await first.close()
    assert hold.epoch == 2
    info = await logs.info("taken")
    assert [r.state for r in info.ledgers] == ["open"]  # left to the new writer


async def test_writer_truncates_only_while_it_holds_the_log(logs: LogStore) -> None:
    writer = await logs.open_writer("held-trunc", roll_bytes=1)
    positions = [await writer.append(b"x%d" % i) for i in range(4)]  # one per ledger
    info = await logs.info("held-trunc")
    assert await writer.truncate(positions[2]) == [r.ledger_id for r in info.ledgers[:2]]
    assert await writer.append(b"y") == Position(4, 0)  # the hold moved on with the head
    second = await logs.open_writer("held-trunc")
    with pytest.raises(LogFencedError):
        await writer.truncate(Position(4, 0))
    await second.close()
    assert [p for p, _ in await read_all(logs, "held-trunc")] == [*positions[2:],
                                                                  Position(4, 0)]
