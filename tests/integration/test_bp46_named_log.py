"""BP-46 under a named log: a bookie of the ledger being written reboots
unclean with the journal off and the protection on, so its boot fences that
ledger (phase one) and recovers it (phase two).  The log's writer, still
holding the log's epoch, rolls to a new ledger and keeps writing: reading
the whole log gives every append once, in order."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from quire.client import Client
from quire.log import Position
from quire.log.catalog import LogCatalog
from quire.log.named_data_log import NamedDataLog
from tests.support.bp46 import PASSWORD, journal_less_cluster
from tests.support.repair import wait_for_repair

NAME = "bp46-log"


def record(i: int) -> bytes:
    return b"record-%06d." % i + b"x" * 100


class Appender:
    """Appends ``record(0)``, ``record(1)``, ... without pause, at most
    ``outstanding`` at once, until stopped; keeps each acknowledged one's
    position by index."""

    def __init__(self, log: NamedDataLog, outstanding: int = 32) -> None:
        self.log = log
        self.positions: dict[int, Position] = {}
        self.failures: list[BaseException] = []
        self.appended = 0
        self._room = asyncio.Semaphore(outstanding)
        self._progress = asyncio.Event()
        self._stopping = False
        self._pending: list[asyncio.Future[Position]] = []

    async def run(self) -> None:
        """Append until stopped, then wait for the appends still pending."""
        while True:
            await self._room.acquire()
            if self._stopping:
                break
            future = self.log.append(record(self.appended))
            future.add_done_callback(functools.partial(self._done, self.appended))
            self._pending.append(future)
            self.appended += 1
        await asyncio.gather(*self._pending, return_exceptions=True)

    def _done(self, index: int, future: asyncio.Future[Position]) -> None:
        self._room.release()
        if future.cancelled() or future.exception() is not None:
            self.failures.append(future.exception() or asyncio.CancelledError())
        else:
            self.positions[index] = future.result()
            self._progress.set()

    async def acknowledged(self, count: int, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.positions) < count:
                self._progress.clear()
                await self._progress.wait()

    def stop(self) -> None:
        self._stopping = True


async def test_log_writer_rolls_past_a_ledger_fenced_by_an_unclean_reboot(
        tmp_path: Path) -> None:
    cluster = journal_less_cluster(tmp_path / "cluster", protected=True, size=4).start()
    try:
        async with await Client.connect(cluster.metadata_uri) as client:
            log = NamedDataLog(client, NAME, password=PASSWORD)
            await log.initialize()
            epoch = log.epoch
            appender = Appender(log)
            appending = asyncio.create_task(appender.run())
            await appender.acknowledged(300)
            seq = max(appender.positions.values()).ledger_seq
            info = await LogCatalog(client.metadata_store).info(NAME)
            ledger = info.ledger(seq)
            assert ledger is not None
            ensemble = (await client.metadata_store.read_ledger(ledger.ledger_id)).value \
                .ensembles[-1][1]
            bookie = cluster.bookies[cluster.index_of(ensemble[0])]
            await asyncio.to_thread(bookie.reboot_after_power_loss)
            await wait_for_repair(bookie)
            await appender.acknowledged(len(appender.positions) + 300)
            appender.stop()
            await appending
            assert appender.failures == []
            written = [(appender.positions[i], record(i)) for i in range(appender.appended)]
            assert written[-1][0].ledger_seq > seq  # the writer rolled
            assert [r async for r in log.read()] == written
            assert log.epoch == epoch
            assert (await LogCatalog(client.metadata_store).info(NAME)).epoch == epoch
            await log.close()
    finally:
        cluster.close()
