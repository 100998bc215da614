"""Simulated bookies: the real server and storage engine over a simulated disk.

A :class:`SimBookie` is what ``quire.node`` assembles in a bookie process,
minus the process: the REAL :class:`~quire.bookie.storage.BookieStorage`
(opened with :meth:`~quire.bookie.storage.BookieStorage.open_over` on the
twins of :mod:`quire.simulation.disk`), a real
:class:`~quire.bookie.group_commit.GroupCommitter` that syncs on the loop
(its fsync thread is never started), and the real
:class:`~quire.bookie.server.BookieServer` whose connections are the
network's (:mod:`quire.simulation.network`).  Its background services
(periodic checkpoints, GC, disk watch) are not started: the simulation
checkpoints at times the seed picks (:meth:`SimBookie.checkpoint`).

A crash is a power loss: the listener goes, every connection resets, the
engine is abandoned and the disk keeps only what was synced
(:meth:`~quire.simulation.disk.SimDisk.power_loss`).  A restart opens a new
engine and server over the same disk.  (A bookie that reboots with an empty
disk needs the node's cookie check and BP-46 limbo, which run in
``quire.node``, not here: without them an emptied bookie answers "no such
entry" for entries it acknowledged, which no protocol survives.)
"""

from __future__ import annotations

import random
from pathlib import Path

from quire.bookie.config import BookieConfig
from quire.bookie.durability import SyncCursors
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.server import BookieServer
from quire.bookie.storage import BookieStorage, StorageConfig
from quire.metadata import BookieInfo, MetadataStore
from quire.simulation.disk import SimDisk, SimJournal, SimLedgerStorage
from quire.simulation.network import SimNetwork
from quire.simulation.trace import Trace
from quire.types import BookieState

LOOP_SYNC_ALWAYS_MS = 1e12
"""``journal_sync_on_loop_max_ms`` that keeps every journal sync on the loop."""


def bookie_config(bookie_id: str, *, journal_write_data: bool) -> BookieConfig:
    """The settings of one simulated bookie (paths are names only: nothing
    is opened)."""
    base = Path("/simulated") / bookie_id
    return BookieConfig(
        metadata_uri="memory://", bookie_id=bookie_id, host=bookie_id, port=3181,
        journal_sync_on_loop_max_ms=LOOP_SYNC_ALWAYS_MS,
        storage=StorageConfig(journal_dirs=(base / "journal",), ledger_dirs=(base / "ledgers",),
                              journal_write_data=journal_write_data,
                              write_cache_max_bytes=1 << 20))


class SimBookie:
    """One bookie of the simulated cluster (see the module docstring)."""

    def __init__(self, bookie_id: str, network: SimNetwork, store: MetadataStore,
                 rng: random.Random, trace: Trace, *, journal_write_data: bool = True) -> None:
        self.bookie_id = bookie_id
        self.address = f"{bookie_id}:3181"
        self.config = bookie_config(bookie_id, journal_write_data=journal_write_data)
        self.disk = SimDisk()
        self.server: BookieServer | None = None
        self.boots = 0
        self._network = network
        self._store = store
        self._rng = rng
        self._trace = trace

    @property
    def up(self) -> bool:
        return self.server is not None

    def publish(self, state: BookieState) -> None:
        """:class:`~quire.bookie.status.StatePublisher`: state changes go to the trace."""
        self._trace.event(f"{self.bookie_id} is {state.value}")

    async def start(self) -> None:
        """Open the engine over the disk, serve, and (first boot) register."""
        storage_config = self.config.storage
        storage = BookieStorage.open_over(storage_config, SimJournal(self.disk),
                                          SimLedgerStorage(self.disk, storage_config), [])
        committer = GroupCommitter(storage.journal, loop_sync_max_ms=LOOP_SYNC_ALWAYS_MS)
        self.server = BookieServer(self.config, storage, committer, self._store, self,
                                   SyncCursors.load(storage))
        self._network.listen(self.bookie_id, self.address, self.server.new_connection)
        if self.boots == 0:
            await self._store.register_bookie(
                BookieInfo(self.bookie_id, self.address, BookieState.WRITABLE, None))
        self.boots += 1
        self._trace.event(f"{self.bookie_id} up (boot {self.boots}, "
                          f"{len(storage.list_ledgers())} ledgers)")

    def crash(self) -> None:
        """Power loss (see the module docstring)."""
        server, self.server = self.server, None
        if server is None:
            return
        self._network.unlisten(self.address)
        server.storage.abandon()
        server.committer.close()
        lost = self.disk.power_loss(self._rng)
        self._trace.event(f"{self.bookie_id} crashed, lost {lost} unsynced journal records")

    async def checkpoint(self) -> None:
        if self.server is not None:
            await self.server.services.checkpoint()
            self._trace.event(f"{self.bookie_id} checkpointed")
