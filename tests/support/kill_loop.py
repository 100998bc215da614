"""BP-46's ``kill -9`` loop on real bookie processes, for the integration
test and ``benchmarks/soak_bp46.py``.

A writer appends pipelined E3 W3 A2 entries without pause, to one ledger
after another (a new ledger every ``entries_per_ledger`` entries, or as soon
as its ledger is fenced); a recoverer, on a second client, opens the
writer's current ledger with recovery now and then, so the writer is fenced
and must move on.  Meanwhile one bookie at a time is killed with ``kill -9``,
loses everything it never fsynced (power-loss emulation) and starts again;
the next kill waits until that bookie's phase two has cleared its limbo
(two power-lost replicas of one write set lose entries for real: BP-46
detects that but cannot prevent it).

At the end every ledger is recovered (closed) and read back whole: an
acknowledged entry missing, an entry read back different from what was
appended at its id, or a ledger closed below an acknowledged entry is a
loss.  Every payload is a function of (ledger, entry id), so unacknowledged
entries that recovery kept are checked too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from quire.client import Client, ClientConfig, ReadHandle, WriteHandle
from quire.errors import QuireError
from tests.support.bp46 import PASSWORD, journal_less_cluster, recover_until_closed
from tests.support.cluster import Cluster
from tests.support.repair import wait_for_repair

T = TypeVar("T")


@dataclass(frozen=True)
class KillLoopParams:
    cycles: int = 3
    bookies: int = 4
    """More than E = 3, so that ledgers can be created and ensembles changed
    while one bookie is down."""
    journal_write_data: bool = False
    protected: bool = True
    """``data_integrity_checking`` on every bookie."""
    entries_per_ledger: int = 2000
    entry_bytes: int = 256
    outstanding_adds: int = 64
    entries_per_cycle: int = 3000
    """Acknowledged entries the writer adds between two kills (and after
    each restart, before the next kill)."""
    recovery_every_entries: int = 2500
    """The recoverer fences the writer's ledger each time this many more
    entries were acknowledged."""
    max_entries_per_s: int = 0
    """Pace the writer to at most this rate (0: as fast as it goes); long
    soaks use it to bound the data they write and verify."""
    flush_interval_ms: int = 600_000
    """The bookies' checkpoint interval: what a power loss can cost them
    (by default no timed checkpoint: a power loss costs a journal-less
    bookie every entry it stored since it started)."""
    cycle_timeout_s: float = 90.0


@dataclass
class CycleReport:
    cycle: int
    bookie: str
    entries_acknowledged: int
    ledgers: int
    recoveries: int
    entries_copied: int
    """By the restarted bookie's phase two (what its power loss cost it)."""
    seconds: float


@dataclass
class KillLoopReport:
    cycles: int = 0
    ledgers: int = 0
    recoveries: int = 0
    entries_acknowledged: int = 0
    entries_verified: int = 0
    entries_copied: int = 0
    """Copied back by the restarted bookies' phase two, summed over cycles."""
    losses: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "ledgers": self.ledgers, "recoveries": self.recoveries,
                "entries_acknowledged": self.entries_acknowledged,
                "entries_verified": self.entries_verified,
                "entries_copied": self.entries_copied, "losses": len(self.losses),
                "loss_details": self.losses[:50], "seconds": round(self.seconds, 1)}


def payload_of(ledger_id: int, entry_id: int, size: int) -> bytes:
    """What the writer appends as ``entry_id`` of ``ledger_id``."""
    stamp = f"{ledger_id}:{entry_id};".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


class _Writer:
    """The writer and what it was told was acknowledged."""

    def __init__(self, client: Client, params: KillLoopParams) -> None:
        self.client = client
        self.params = params
        self.acknowledged: dict[int, set[int]] = {}
        self.ledgers: list[int] = []
        self.current: int | None = None
        self.count = 0
        self.progress = asyncio.Event()
        self.stopping = False
        self._appended = 0
        self._started = time.monotonic()

    async def run(self) -> None:
        while not self.stopping:
            try:
                ledger = await self.client.create_ledger(3, 3, 2, password=PASSWORD)
            except QuireError:  # too few writable bookies for a moment
                await asyncio.sleep(0.1)
                continue
            self.ledgers.append(ledger.ledger_id)
            self.acknowledged[ledger.ledger_id] = set()
            self.current = ledger.ledger_id
            await self._fill(ledger)

    async def _fill(self, ledger: WriteHandle) -> None:
        params, ledger_id = self.params, ledger.ledger_id
        acknowledged = self.acknowledged[ledger_id]
        room = asyncio.Semaphore(params.outstanding_adds)
        failed = asyncio.Event()
        pending: list[asyncio.Future[int]] = []

        def on_done(future: asyncio.Future[int], expected: int) -> None:
            room.release()
            if future.cancelled() or future.exception() is not None:
                failed.set()
                return
            assert future.result() == expected, (ledger_id, future.result(), expected)
            acknowledged.add(expected)
            self.count += 1
            self.progress.set()

        for entry_id in range(params.entries_per_ledger):
            await room.acquire()
            if self.stopping or failed.is_set():
                room.release()
                break
            await self._pace()
            try:
                future = ledger.append(payload_of(ledger_id, entry_id, params.entry_bytes))
            except QuireError:
                room.release()
                break
            future.add_done_callback(functools.partial(on_done, expected=entry_id))
            pending.append(future)
        await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(QuireError):
            await ledger.close()  # refused when fenced: the recoverer owns the end

    async def _pace(self) -> None:
        rate = self.params.max_entries_per_s
        if rate:
            self._appended += 1
            ahead_s = self._started + self._appended / rate - time.monotonic()
            if ahead_s > 0:
                await asyncio.sleep(ahead_s)  # load shaping, not synchronisation

    async def acknowledged_more(self, count: int, timeout_s: float) -> None:
        """Wait until ``count`` more entries were acknowledged (or the writer
        is stopping)."""
        target = self.count + count
        try:
            async with asyncio.timeout(timeout_s):
                while self.count < target and not self.stopping:
                    self.progress.clear()
                    await self.progress.wait()
        except TimeoutError:
            raise AssertionError(f"the writer stalled at {self.count} acknowledged "
                                 f"entries") from None

    def stop(self) -> None:
        self.stopping = True
        self.progress.set()


async def _recover_now_and_then(client: Client, writer: _Writer, params: KillLoopParams,
                                recoveries: list[int]) -> None:
    """Fence the writer's current ledger each ``recovery_every_entries``."""
    while not writer.stopping:
        await writer.acknowledged_more(params.recovery_every_entries, 3600)
        if writer.current is None or writer.stopping:
            continue
        with contextlib.suppress(QuireError):  # cannot decide now: fine, the writer goes on
            await client.open_ledger(writer.current, password=PASSWORD, recovery=True)
            recoveries.append(writer.current)


async def verify(client: Client, writer: _Writer, params: KillLoopParams,
                 report: KillLoopReport) -> None:
    """Recover and read back every ledger the writer created."""
    for ledger_id in writer.ledgers:
        acknowledged = writer.acknowledged[ledger_id]
        report.entries_acknowledged += len(acknowledged)
        try:
            ledger = await recover_until_closed(client, ledger_id)
        except QuireError as e:
            report.losses.append(f"ledger {ledger_id}: cannot be recovered: {e!r}")
            continue
        last = ledger.last_add_confirmed
        highest = max(acknowledged, default=-1)
        if last < highest:
            report.losses.append(f"ledger {ledger_id}: closed at {last} below acknowledged "
                                 f"entry {highest}")
        for entry_id, data in (await _read_all(ledger, last)).items():
            if isinstance(data, QuireError):
                report.losses.append(f"ledger {ledger_id}: entry {entry_id} (of 0..{last}) "
                                     f"unreadable: {data}")
            elif data != payload_of(ledger_id, entry_id, params.entry_bytes):
                report.losses.append(f"ledger {ledger_id}: entry {entry_id} reads back "
                                     f"different")
            elif entry_id in acknowledged:
                report.entries_verified += 1


async def _read_all(ledger: ReadHandle, last: int) -> dict[int, bytes | QuireError]:
    """Entries 0..last of a closed ledger; entry by entry (with each one's
    error) if reading them at once fails."""
    try:
        return {e.entry_id: e.data for e in await ledger.read(0, last)} if last >= 0 else {}
    except QuireError:
        pass
    found: dict[int, bytes | QuireError] = {}
    for entry_id in range(last + 1):
        try:
            found[entry_id] = (await ledger.read(entry_id, entry_id))[0].data
        except QuireError as e:
            found[entry_id] = e
    return found


def kill_loop_cluster(root: Path, params: KillLoopParams) -> Cluster:
    return journal_less_cluster(root, protected=params.protected, size=params.bookies,
                                journal_write_data=params.journal_write_data,
                                flush_interval_ms=params.flush_interval_ms)


async def run_kill_loop(cluster: Cluster, params: KillLoopParams,
                        on_cycle: Callable[[CycleReport], None] | None = None,
                        ) -> KillLoopReport:
    """Run ``params.cycles`` kill/restart cycles on the started cluster under
    the writer and the recoverer, then verify; the report's ``losses`` must
    stay empty."""
    report = KillLoopReport()
    started = time.monotonic()
    config = ClientConfig(add_entry_timeout_ms=3000, read_timeout_ms=2000)
    recoveries: list[int] = []
    async with await Client.connect(cluster.metadata_uri, config) as writer_client, \
            await Client.connect(cluster.metadata_uri, config) as recoverer_client:
        writer = _Writer(writer_client, params)
        writing = asyncio.create_task(writer.run())
        recovering = asyncio.create_task(
            _recover_now_and_then(recoverer_client, writer, params, recoveries))
        try:
            for cycle in range(params.cycles):
                cycle_started = time.monotonic()
                await _race(writing, writer.acknowledged_more(params.entries_per_cycle,
                                                              params.cycle_timeout_s))
                bookie = cluster.bookies[cycle % len(cluster)]
                await asyncio.to_thread(bookie.reboot_after_power_loss)
                copied = 0
                if params.protected:
                    repair = await _race(writing, wait_for_repair(
                        bookie, timeout_s=params.cycle_timeout_s))
                    copied = int(repair["entries_copied_total"])
                report.cycles += 1
                report.entries_copied += copied
                if on_cycle is not None:
                    on_cycle(CycleReport(cycle + 1, bookie.bookie_id, writer.count,
                                         len(writer.ledgers), len(recoveries), copied,
                                         time.monotonic() - cycle_started))
            await _race(writing, writer.acknowledged_more(params.entries_per_cycle,
                                                          params.cycle_timeout_s))
        finally:
            writer.stop()
            await asyncio.gather(writing, recovering, return_exceptions=True)
        if writing.done() and not writing.cancelled() and writing.exception() is not None:
            raise writing.exception()  # type: ignore[misc]
        await verify(recoverer_client, writer, params, report)
    report.ledgers = len(writer.ledgers)
    report.recoveries = len(recoveries)
    report.seconds = time.monotonic() - started
    return report


async def _race(background: asyncio.Task[None], awaited: Awaitable[T]) -> T:
    """Await ``awaited``, failing at once if ``background`` dies first."""
    task = asyncio.ensure_future(awaited)
    done, _ = await asyncio.wait({task, background}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        background.result()
        raise AssertionError("the writer stopped")
    return task.result()
