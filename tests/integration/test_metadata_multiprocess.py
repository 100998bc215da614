"""Several processes sharing one store (the drivers that can be shared)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quire.errors import MetadataNotFoundError
from quire.metadata import BookieInfo, LedgerMetadata, MetadataStore, watch_leader
from quire.types import BookieState
from tests.support.metadata import Target, Worker, target_for

DRIVERS = ["sqlite", pytest.param("zk", marks=pytest.mark.zookeeper),
           pytest.param("zk-digest", marks=pytest.mark.zookeeper)]
"""``zk-digest``: every process authenticates with the same digest, and
changes what another one made (the ACL names the user, not a session)."""
TIMED = pytest.mark.parametrize("target", DRIVERS[:2], indirect=True)
"""For the tests that wait out a lease or a session: ACLs change nothing there."""


@pytest.fixture(params=DRIVERS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    zookeeper = (request.getfixturevalue("zookeeper_server")
                 if request.param.startswith("zk") else None)
    return target_for(request.param, tmp_path, zookeeper)


@pytest.fixture
async def store(target: Target) -> AsyncIterator[MetadataStore]:
    store = await target.open()
    yield store
    await store.close()


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    """Worker processes started by a test; killed at its end."""
    started: list[Worker] = []
    yield started
    await asyncio.gather(*(worker.stop() for worker in started))


async def start_ready(workers: list[Worker], target: Target, count: int,
                      *command: str) -> list[Worker]:
    """Start ``count`` workers and wait until each has printed "ready"."""
    new = [await Worker.start(target, *command) for _ in range(count)]
    workers.extend(new)
    assert await asyncio.gather(*(w.read_line() for w in new)) == ["ready"] * count
    return new


async def test_racing_compare_and_set_has_one_winner(
        target: Target, store: MetadataStore, workers: list[Worker]) -> None:
    md = LedgerMetadata(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
    await store.create_ledger(1, md)
    racers = await start_ready(workers, target, 2, "cas", "1")
    for racer in racers:
        racer.release()
    outcomes = await asyncio.gather(*(racer.read_line() for racer in racers))
    assert sorted(outcomes) == ["lost", "won"]
    final = await store.read_ledger(1)
    assert final.version == 1
    winner = racers[outcomes.index("won")].process.pid
    assert final.value.custom_metadata["winner"] == str(winner).encode()


async def test_ledger_ids_are_unique_across_processes(
        target: Target, workers: list[Worker]) -> None:
    allocators = await start_ready(workers, target, 2, "ids", "50")
    for allocator in allocators:
        allocator.release()
    batches = [[int(i) for i in line.split()]
               for line in await asyncio.gather(*(a.read_line() for a in allocators))]
    for batch in batches:
        assert len(batch) == 50
        assert batch == sorted(batch) and batch[0] >= 1
    assert len(set(batches[0]) | set(batches[1])) == 100


@TIMED
async def test_killed_registrant_leaves_the_live_list(
        target: Target, store: MetadataStore, workers: list[Worker]) -> None:
    [registrant] = await start_ready(workers, target, 1, "register", "doomed")
    await store.register_bookie(BookieInfo("survivor", "127.0.0.1:3182", BookieState.WRITABLE))
    assert [b.bookie_id for b in await store.list_bookies()] == ["doomed", "survivor"]

    registrant.process.kill()  # SIGKILL: no chance to unregister
    killed_at = time.monotonic()
    deadline = killed_at + target.liveness_period + 5.0
    while [b.bookie_id for b in await store.list_bookies()] != ["survivor"]:
        assert time.monotonic() < deadline, "the dead bookie is still listed"
        await asyncio.sleep(0.05)
    assert time.monotonic() - killed_at >= target.liveness_period * 0.5


@TIMED
async def test_killed_leaseholders_record_disappears(
        target: Target, store: MetadataStore, workers: list[Worker]) -> None:
    [holder] = await start_ready(workers, target, 1, "lease", "locks/doomed")
    assert (await store.read_record("locks/doomed")).value == str(holder.process.pid).encode()

    holder.process.kill()  # SIGKILL: no chance to delete it
    killed_at = time.monotonic()
    deadline = killed_at + target.liveness_period + 5.0
    while True:
        try:
            await store.read_record("locks/doomed")
        except MetadataNotFoundError:
            break
        assert time.monotonic() < deadline, "the dead process's leased record is still there"
        await asyncio.sleep(0.05)
    assert time.monotonic() - killed_at >= target.liveness_period * 0.5
    assert await store.list_records("locks/") == []
    assert await store.create_record("locks/doomed", b"free again") == 0


@TIMED
async def test_a_killed_leader_is_replaced_and_a_resigning_one_hands_over(
        target: Target, store: MetadataStore, workers: list[Worker]) -> None:
    seen: asyncio.Queue[str | None] = asyncio.Queue()
    watch_leader(store, "auditor", seen.put_nowait)
    named = {}
    for name in ("w0", "w1", "w2"):
        [worker] = await start_ready(workers, target, 1, "elect", name)
        named[name] = worker

    async def next_leader(before: set[str], timeout: float) -> str:
        async def scan() -> str:
            while (name := await seen.get()) is None or name in before:
                pass
            return name
        name = await asyncio.wait_for(scan(), timeout)
        await named[name].read_until("leading")
        return name

    first = await next_leader(set(), 20.0)
    named[first].process.kill()  # SIGKILL: the lease runs out
    second = await next_leader({first}, target.liveness_period + 5.0)

    named[second].send("resign")
    await named[second].read_until("resigned")
    third = await next_leader({first, second}, 20.0)
    assert {first, second, third} == {"w0", "w1", "w2"}
    assert named[third].process.returncode is None
