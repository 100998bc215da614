"""Named logs on real bookie processes: writer fencing (in process and after
a writer process is killed), a writer that outlives a bookie fencing its
ledger, rollover, a reader tailing a log being written, truncation, bulk
append (all or nothing; refused while a writer holds the log)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quire.client import Client
from quire.errors import MetadataNotFoundError, StatusCode, TransactionError
from quire.log import (
    LogBusyError,
    LogFencedError,
    LogStore,
    LogTruncatedError,
    Position,
)
from quire.metadata import CheckRecord
from quire.protocol import FLAG_DO_FENCING, LAST_ENTRY_ID, ReadRequest, master_key
from quire.types import LedgerType
from tests.support.bookies import RawBookieClient
from tests.support.cluster import Cluster
from tests.support.logs import read_all

Connect = Callable[..., Awaitable[Client]]
REPO = Path(__file__).resolve().parents[2]

WRITER_SCRIPT = """
import asyncio, json, sys
from quire.client import Client
from quire.log import LogStore

async def main(uri):
    client = await Client.connect(uri)
    writer = await LogStore(client, password=b"pw").open_writer("crash", roll_bytes=400)
    print(json.dumps({"epoch": writer.epoch}), flush=True)
    window = asyncio.Semaphore(32)

    def acked(future):
        window.release()
        if not future.cancelled() and future.exception() is None:
            p = future.result()
            print(json.dumps({"acked": [p.ledger_seq, p.entry_id]}), flush=True)

    i = 0
    while True:
        await window.acquire()
        writer.append(b"entry-%d" % i).add_done_callback(acked)
        i += 1

asyncio.run(main(sys.argv[1]))
"""


async def test_writer_rolls_and_a_second_writer_fences_the_first(
        shared_cluster: Cluster, connect: Connect) -> None:
    first = LogStore(await connect(shared_cluster), password=b"pw")
    second = LogStore(await connect(shared_cluster), password=b"pw")
    writer = await first.open_writer("fence", roll_bytes=1000)
    acked = list(await asyncio.gather(*[writer.append(b"a-%04d" % i + b"." * 40)
                                        for i in range(100)]))
    assert len({p.ledger_seq for p in acked}) >= 4  # rolled by size
    in_flight = [writer.append(b"maybe-%d" % i) for i in range(50)]
    usurper = await second.open_writer("fence")
    assert usurper.epoch == writer.epoch + 1
    outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, LogFencedError) for o in failed)
    with pytest.raises(LogFencedError):
        await writer.append(b"after")
    with pytest.raises(LogFencedError):
        await writer.close()
    last = await usurper.append(b"b-0")
    await usurper.close()
    records = await read_all(second, "fence")
    positions = [p for p, _ in records]
    assert positions == sorted(positions)
    # every acknowledged append survived, in order; the new writer's comes last
    assert positions[:100] == acked
    assert records[-1] == (last, b"b-0")
    kept = [p for p in outcomes if isinstance(p, Position)]
    assert set(kept) <= set(positions)


async def fence_on_bookies(cluster: Cluster, ledger_id: int, bookie_ids: list[str],
                           password: bytes) -> None:
    """Fence a ledger on bookies directly, as a bookie's boot or an
    autorecovery would: a fencing READ_ENTRY with the ledger's master key."""
    for bookie_id in bookie_ids:
        conn = await RawBookieClient.connect(cluster.bookies[cluster.index_of(bookie_id)].address)
        try:
            answer = await conn.call(ReadRequest(conn.next_id(), ledger_id, LAST_ENTRY_ID,
                                                 FLAG_DO_FENCING, master_key(password)))
        finally:
            conn.close()
        assert answer.status in (StatusCode.OK, StatusCode.NO_SUCH_ENTRY)  # type: ignore[union-attr]


@pytest.mark.parametrize("fenced", ["one bookie", "every bookie"])
async def test_writer_rolls_past_its_ledger_fenced_on_bookies_losing_nothing(
        shared_cluster: Cluster, connect: Connect, fenced: str) -> None:
    logs = LogStore(await connect(shared_cluster), password=b"pw")
    name = f"refenced-{fenced.split()[0]}"
    writer = await logs.open_writer(name)
    window = asyncio.Semaphore(64)
    futures: list[asyncio.Future[Position]] = []
    total, fence_after = 1500, 500
    for i in range(total):
        await window.acquire()
        future = writer.append(b"e-%05d" % i)
        future.add_done_callback(lambda _f: window.release())
        futures.append(future)
        if i == fence_after:  # the writer goes on appending while the fence lands
            seq = writer.ledger_seq
            assert seq is not None
            ledger_id = (await logs.info(name)).ledger(seq).ledger_id  # type: ignore[union-attr]
            ensemble = (await logs.metadata_store.read_ledger(ledger_id)).value.last_ensemble
            await fence_on_bookies(shared_cluster, ledger_id,
                                   list(ensemble if fenced == "every bookie" else ensemble[:1]),
                                   b"pw")
    positions = await asyncio.gather(*futures)  # no append failed
    await writer.close()
    assert positions == sorted(positions) and len(set(positions)) == total
    info = await logs.info(name)
    assert info.epoch == writer.epoch and not info.writer_held
    assert len(info.ledgers) >= 2 and info.ledgers[0].ledger_id == ledger_id
    records = await read_all(logs, name)
    assert [p for p, _ in records] == positions  # each acknowledged append, once, in order
    assert [d for _, d in records] == [b"e-%05d" % i for i in range(total)]


def _read_json_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, object]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            loaded: dict[str, object] = json.loads(line)
            return loaded
    raise AssertionError("the writer process said nothing in time")


async def test_killed_writer_process_is_recovered_by_the_next_writer(
        cluster: Cluster, connect: Connect) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, cluster.metadata_uri],
                            cwd=REPO, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    acked: list[Position] = []
    try:
        deadline = time.monotonic() + 60
        assert _read_json_line(proc, deadline) == {"epoch": 1}
        while len(acked) < 300:
            line = _read_json_line(proc, deadline)
            seq, entry = line["acked"]  # type: ignore[misc]
            acked.append(Position(seq, entry))
    finally:
        proc.kill()
        proc.wait(10)
    logs = LogStore(await connect(cluster), password=b"pw")
    assert (await logs.info("crash")).writer_held  # the dead writer's hold
    writer = await logs.open_writer("crash")
    await writer.close()
    info = await logs.info("crash")
    assert not info.writer_held and all(r.closed for r in info.ledgers)
    records = await read_all(logs, "crash")
    positions = [p for p, _ in records]
    assert set(acked) <= set(positions)  # nothing acknowledged was lost
    assert [d for _, d in records] == [b"entry-%d" % i for i in range(len(records))]


async def test_reader_tails_a_log_being_written(shared_cluster: Cluster,
                                                connect: Connect) -> None:
    writer_client = await connect(shared_cluster, explicit_lac_interval_ms=20)
    logs = LogStore(writer_client, password=b"pw")
    await logs.create("tail")
    readers = LogStore(await connect(shared_cluster), password=b"pw")
    reader = await readers.open_reader("tail", poll_max_ms=20)
    total = 600
    got: list[tuple[Position, bytes]] = []

    async def consume() -> None:
        while len(got) < total:
            got.extend((r.position, r.payload) for r in await reader.read_next(100))

    consumer = asyncio.create_task(consume())
    writer = await logs.open_writer("tail", roll_bytes=2000)
    written = []
    for i in range(0, total, 50):
        written += await asyncio.gather(*[writer.append(b"t-%04d" % j)
                                          for j in range(i, i + 50)])
        await asyncio.sleep(0)  # let the reader catch up between bursts
    await asyncio.wait_for(consumer, 30)
    assert [p for p, _ in got] == written
    assert [d for _, d in got] == [b"t-%04d" % j for j in range(total)]
    assert len({p.ledger_seq for p in written}) > 1
    # the reader is at the tail: a new entry shows up, nothing else does
    late = await writer.append(b"late")
    assert [(r.position, r.payload) for r in await reader.read_next(timeout=10)] == [
        (late, b"late")]
    assert await reader.read_next(timeout=0.1) == []
    await writer.close()
    await reader.close()


async def test_truncation_deletes_whole_ledgers(shared_cluster: Cluster,
                                                connect: Connect) -> None:
    logs = LogStore(await connect(shared_cluster), password=b"pw")
    writer = await logs.open_writer("trunc", roll_bytes=100)
    positions = [await writer.append(b"%02d" % i + b"-" * 48) for i in range(12)]  # 2 per ledger
    info = await logs.info("trunc")
    assert len(info.ledgers) == 6
    cut = positions[5]  # the second entry of ledger 2: ledgers 0 and 1 go
    removed = await logs.truncate("trunc", cut)
    assert removed == [r.ledger_id for r in info.ledgers[:2]]
    for ledger_id in removed:
        with pytest.raises(MetadataNotFoundError):
            await logs.metadata_store.read_ledger(ledger_id)
    # (the last entry of the open ledger shows once its LAC reaches the bookies)
    assert [p for p, _ in await read_all(logs, "trunc")] in (positions[4:], positions[4:-1])
    with pytest.raises(LogTruncatedError):
        await read_all(logs, "trunc", positions[1])
    # truncation goes on while the writer writes; the writer's rolls retry
    more = [await writer.append(b"x" * 60) for _ in range(4)]
    await logs.truncate("trunc", more[0])
    await writer.close()
    assert [p for p, _ in await read_all(logs, "trunc")][-4:] == more


async def test_bulk_append_is_all_or_nothing_and_refused_while_held(
        shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    logs = LogStore(client, password=b"pw")
    await logs.create("bulk")

    async def closed_ledger(tag: bytes, count: int) -> int:
        ledger = await client.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*[ledger.append(tag + b"%d" % i) for i in range(count)])
        await ledger.close()
        return ledger.ledger_id

    batch = [await closed_ledger(b"a", 10), await closed_ledger(b"b", 5)]
    writer = await logs.open_writer("bulk")
    await writer.append(b"w0")
    with pytest.raises(LogBusyError):
        await logs.bulk_append("bulk", batch)
    await writer.close()
    before = await logs.info("bulk")
    with pytest.raises(TransactionError):
        await logs.bulk_append("bulk", batch, extra_ops=[CheckRecord("nope/none", 0)])
    assert (await logs.info("bulk")).ledgers == before.ledgers
    seqs = await logs.bulk_append("bulk", batch)
    assert seqs == [before.next_seq, before.next_seq + 1]
    payloads = [d for _, d in await read_all(logs, "bulk")]
    assert payloads == [b"w0", *[b"a%d" % i for i in range(10)], *[b"b%d" % i for i in range(5)]]


async def test_flush_of_a_vd_log_syncs_and_shows_entries_to_readers(
        shared_cluster: Cluster, connect: Connect) -> None:
    logs = LogStore(await connect(shared_cluster), password=b"pw")
    writer = await logs.open_writer("volatile", ledger_type=LedgerType.VD_JOURNAL)
    positions = await asyncio.gather(*[writer.append(b"v%d" % i) for i in range(50)])
    assert await writer.flush() == positions[-1]
    readers = LogStore(await connect(shared_cluster), password=b"pw")
    got = await read_all(readers, "volatile")
    assert [p for p, _ in got] == list(positions)  # all of them, the last one too
    await writer.close()
    info = await logs.info("volatile")
    assert info.ledgers[0].entries == 50
