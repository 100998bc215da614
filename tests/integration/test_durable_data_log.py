"""The contract of the tier-1 log seam (quire.log.durable_data_log), run
against both implementations: NamedDataLog on real bookie processes, and its
in-memory twin MemoryDataLog (quire.testing)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from quire.client import Client
from quire.log import LogError, LogFencedError, LogWriterClosedError, Position, WriterOptions
from quire.log.durable_data_log import DurableDataLog
from quire.log.named_data_log import NamedDataLog
from quire.testing.memory_data_log import MemoryDataLogs
from tests.support.cluster import Cluster

OpenLog = Callable[[str], Awaitable[DurableDataLog]]
_names = itertools.count()


@pytest.fixture(params=["named", "memory"])
async def open_log(request: pytest.FixtureRequest,
                   connect: Callable[..., Awaitable[Client]]) -> AsyncIterator[OpenLog]:
    """``await open_log(name)``: a new, uninitialized instance on the log
    ``name`` (each named one with a client of its own, as another process
    would have); every instance is closed at teardown."""
    opened: list[DurableDataLog] = []
    if request.param == "named":
        cluster: Cluster = request.getfixturevalue("shared_cluster")

        async def open_named(name: str) -> DurableDataLog:
            # small ledgers, so truncation has whole ledgers to drop
            log = NamedDataLog(await connect(cluster), name, password=b"pw",
                               options=WriterOptions(roll_bytes=200))
            opened.append(log)
            return log

        yield open_named
    else:
        logs = MemoryDataLogs()

        async def open_memory(name: str) -> DurableDataLog:
            log = logs.open(name)
            opened.append(log)
            return log

        yield open_memory
    for log in opened:
        await log.close()


def fresh_name() -> str:
    return f"wal-{next(_names)}"


async def records(log: DurableDataLog,
                  from_address: Position | None = None) -> list[tuple[Position, bytes]]:
    return [record async for record in log.read(from_address)]


async def test_appends_get_increasing_addresses_in_call_order(open_log: OpenLog) -> None:
    log = await open_log(fresh_name())
    await log.initialize()
    completed: list[int] = []
    futures = [log.append(b"r-%03d" % i + b"." * 40) for i in range(40)]
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _f, i=i: completed.append(i))
    addresses = await asyncio.gather(*futures)
    assert completed == list(range(40))
    assert all(a < b for a, b in itertools.pairwise(addresses))
    assert all(Position.parse(str(a)) == a for a in addresses)
    # read at once, the last append included
    assert await records(log) == [(a, b"r-%03d" % i + b"." * 40)
                                  for i, a in enumerate(addresses)]


async def test_read_from_an_address(open_log: OpenLog) -> None:
    log = await open_log(fresh_name())
    await log.initialize()
    addresses = await asyncio.gather(*[log.append(b"%d" % i + b"-" * 40) for i in range(20)])
    everything = await records(log)
    for start in (0, 7, 19):
        assert await records(log, addresses[start]) == everything[start:]
    assert await records(log, addresses[-1].next()) == []
    later = await log.append(b"later")
    assert await records(log, addresses[-1].next()) == [(later, b"later")]


async def test_truncate_drops_nothing_after_the_address(open_log: OpenLog) -> None:
    name = fresh_name()
    log = await open_log(name)
    await log.initialize()
    addresses = await asyncio.gather(*[log.append(b"%02d" % i + b"=" * 48) for i in range(24)])
    everything = await records(log)
    await log.truncate(addresses[9])
    left = await records(log)
    assert left == everything[-len(left):]  # a suffix ...
    assert left[0][0] <= addresses[10]  # ... with every record after the address
    assert left[0][0] > addresses[0]  # and the front went
    await log.close()
    reopened = await open_log(name)
    await reopened.initialize()
    assert await records(reopened) == left


async def test_a_second_owner_fences_the_first(open_log: OpenLog) -> None:
    name = fresh_name()
    first = await open_log(name)
    await first.initialize()
    acked = await asyncio.gather(*[first.append(b"a-%d" % i) for i in range(10)])
    in_flight = [first.append(b"maybe-%d" % i) for i in range(10)]
    second = await open_log(name)
    await second.initialize()
    assert second.epoch > first.epoch
    outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(o, Position | LogFencedError) for o in outcomes)
    for i in range(3):  # after the fence: refused, at once or through the future
        with pytest.raises(LogFencedError):
            await first.append(b"after-%d" % i)
    with pytest.raises(LogFencedError):
        await first.truncate(acked[5])
    mine = await second.append(b"b-0")
    got = await records(second)
    assert got[:10] == [(a, b"a-%d" % i) for i, a in enumerate(acked)]
    assert got[-1] == (mine, b"b-0")
    kept = [o for o in outcomes if isinstance(o, Position)]
    assert set(kept) <= {a for a, _ in got}
    assert not [d for _, d in got if d.startswith(b"after-")]
    await first.close()  # a fenced instance just lets go


async def test_reopen_after_close_sees_everything_acknowledged(open_log: OpenLog) -> None:
    name = fresh_name()
    first = await open_log(name)
    await first.initialize()
    written = [(await first.append(b"x-%d" % i), b"x-%d" % i) for i in range(15)]
    await first.close()
    await first.close()
    with pytest.raises(LogWriterClosedError):
        first.append(b"closed")
    with pytest.raises(LogWriterClosedError):
        await first.truncate(written[0][0])
    second = await open_log(name)
    await second.initialize()
    assert second.epoch > first.epoch
    assert await records(second) == written
    assert await second.append(b"y") > written[-1][0]


async def test_nothing_works_before_initialize(open_log: OpenLog) -> None:
    log = await open_log(fresh_name())
    with pytest.raises(LogError):
        log.append(b"too early")
    with pytest.raises(LogError):
        _ = log.epoch
    with pytest.raises(LogError):
        await records(log)
    await log.initialize()
    with pytest.raises(LogError):
        await log.initialize()
