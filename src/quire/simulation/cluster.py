"""Simulated bookies: the real server, storage engine and BP-46 boot over a simulated disk.

A :class:`SimBookie` is what :class:`~quire.node.bookie_node.BookieNode`
assembles in a bookie process, minus the process, in the same order:

1. the cookie check: a disk that lost its cookie (:meth:`SimBookie.crash`
   with ``wipe``: the bookie reboots with an empty disk) while metadata
   has the bookie's cookie fails it (the real check reads files; here the
   disk's ``cookie`` flag stands for them);
2. the REAL :class:`~quire.bookie.storage.BookieStorage`, opened with
   :meth:`~quire.bookie.storage.BookieStorage.open_over` on the twins of
   :mod:`quire.simulation.disk` (journal replay, the running mark), and a
   :class:`SimCommitter`: the real
   :class:`~quire.bookie.group_commit.GroupCommitter`, syncing on the loop
   (its fsync thread is never started), after a virtual delay when the
   disk is slow;
3. BP-46 phase one, the REAL :func:`~quire.node.integrity.protect_if_needed`:
   after a failed cookie check, or a crash while running without the
   journal (``journal_write_data=false``, ``data_integrity_checking=true``),
   the bookie's ledgers are fenced and the open ones put in limbo before
   anything is served;
4. the REAL :class:`~quire.bookie.server.BookieServer`, listening on the
   network (:mod:`quire.simulation.network`);
5. BP-46 phase two, the REAL :class:`~quire.node.repair.LedgerRepair`
   (recovery through a real client of this node, copies through the real
   :class:`~quire.node.entry_copier.EntryCopier`) in the background.

Every answer a bookie sends to a read is watched (:class:`WatchedConnection`):
a negative (NO_SUCH_ENTRY, NO_SUCH_LEDGER, or READ_LAC's "no LAC") about a
ledger the bookie holds in limbo breaks BP-46, and is recorded in
:data:`LimboNegatives` for the ``limbo-negative`` invariant.

Its background services (GC, disk watch) are not started; checkpoints run
at times the seed picks (:meth:`SimBookie.checkpoint`, and periodically on
a bookie without the journal, whose adds only a checkpoint makes durable).

A crash is a power loss: the listener and every connection of the node go,
the engine is abandoned and the disk keeps only what was synced
(:meth:`~quire.simulation.disk.SimDisk.power_loss`); with ``wipe`` the disk
is replaced by an empty one.  What a crash took is recorded in
:attr:`Losses` (the invariants excuse what the protocol allows to be lost).
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections import defaultdict
from pathlib import Path

from prometheus_client import CollectorRegistry

from quire.bookie.config import BookieConfig
from quire.bookie.connection import BookieConnection
from quire.bookie.durability import SyncCursors
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.server import BookieServer
from quire.bookie.storage import BookieStorage, StorageConfig
from quire.bookie.storage.seams import SyncableJournal
from quire.client import Client, ClientConfig
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.errors import StatusCode
from quire.metadata import BookieInfo, MetadataStore
from quire.node.entry_copier import EntryCopier
from quire.node.integrity import protect_if_needed
from quire.node.repair import (
    ClientRecoverer,
    LedgerRepair,
    LocalSink,
    RepairMetrics,
    RepairSettings,
)
from quire.peer import BookiePool
from quire.protocol import OpCode
from quire.simulation import bugs
from quire.simulation.disk import SimDisk, SimJournal, SimLedgerStorage
from quire.simulation.network import SimNetwork, current_node
from quire.simulation.trace import Trace
from quire.types import BookieState

LOOP_SYNC_ALWAYS_MS = 1e12
"""``journal_sync_on_loop_max_ms`` that keeps every journal sync on the loop."""
REPAIR_CLIENT_CONFIG = ClientConfig(add_entry_timeout_ms=4000, read_timeout_ms=3000,
                                    speculative_read_timeout_ms=500,
                                    explicit_lac_interval_ms=0, connect_timeout_ms=2000)
REPAIR_SETTINGS = RepairSettings(start_delay_ms=0, retry_interval_ms=1000, parallel_ledgers=2,
                                 progress_every_ledgers=1000)

Losses = dict[int, dict[str, set[int]]]
"""ledger id -> bookie id -> entries that bookie held and a crash took."""
LimboNegatives = dict[tuple[str, int], str]
"""(bookie id, ledger id) -> the first negative answer that bookie gave
about a ledger it held in limbo (BP-46 forbids any), in words."""

_FRAME_HEAD = struct.Struct(">II")  # frame length, version | op | flags
_READ_ANSWER = struct.Struct(">8xQiqq")  # request id, status, ledger id, entry id (or LAC)
_BATCH_ANSWER = struct.Struct(">8xiqq")  # status, ledger id, first entry id
_NEGATIVES = frozenset({StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER})


def negative_answer(frame: bytes) -> tuple[int, str] | None:
    """The ledger id and a description of ``frame`` if it is a negative
    answer to a read (NO_SUCH_ENTRY or NO_SUCH_LEDGER to a read or batch
    read or READ_LAC, or READ_LAC's OK with no LAC); None for anything else
    (a bare error names no ledger)."""
    _length, header = _FRAME_HEAD.unpack_from(frame)
    op = (header >> 16) & 0xFF
    if op in (OpCode.READ_ENTRY, OpCode.READ_LAC) and len(frame) >= _READ_ANSWER.size:
        _rid, status, ledger_id, number = _READ_ANSWER.unpack_from(frame)
        if status in _NEGATIVES:
            what = "READ_LAC" if op == OpCode.READ_LAC else \
                f"a read of entry {number}" if number >= 0 else "a read of the last entry"
            return ledger_id, f"answered {StatusCode(status).name} to {what}"
        if op == OpCode.READ_LAC and status == StatusCode.OK and number < 0:
            return ledger_id, "answered READ_LAC with no LAC (OK, -1)"
    elif op == OpCode.BATCH_READ_ENTRY and len(frame) >= _BATCH_ANSWER.size:
        status, ledger_id, first = _BATCH_ANSWER.unpack_from(frame)
        if status in _NEGATIVES:
            return ledger_id, (f"answered {StatusCode(status).name} to a batch read "
                               f"from entry {first}")
    return None


class WatchedConnection(BookieConnection):
    """The real connection, whose every answer is first checked against
    the limbo rule (module docstring).  Checking reads only the frame's
    head and, for a negative, the engine's limbo flag: it draws nothing
    from the run's randomness and writes nothing to the trace."""

    def __init__(self, server: BookieServer, bookie_id: str,
                 limbo_negatives: LimboNegatives) -> None:
        super().__init__(server.hub, server)
        self._storage = server.storage
        self._bookie_id = bookie_id
        self._limbo_negatives = limbo_negatives

    def send(self, frame: bytes, request_bytes: int = 0) -> None:
        negative = negative_answer(frame)
        if negative is not None and self._storage.is_limbo(negative[0]):
            ledger_id, what = negative
            self._limbo_negatives.setdefault(
                (self._bookie_id, ledger_id),
                f"{self._bookie_id} {what} of L{ledger_id} while holding it in limbo")
        super().send(frame, request_bytes)


def bookie_config(bookie_id: str, *, journal_write_data: bool) -> BookieConfig:
    """The settings of one simulated bookie (paths are names only: nothing
    is opened).  Without the journal, data integrity checking is on (BP-46)."""
    base = Path("/simulated") / bookie_id
    return BookieConfig(
        metadata_uri="memory://", bookie_id=bookie_id, host=bookie_id, port=3181,
        journal_sync_on_loop_max_ms=LOOP_SYNC_ALWAYS_MS,
        data_integrity_checking=not journal_write_data,
        data_integrity_stamp_missing_cookies=True,
        storage=StorageConfig(journal_dirs=(base / "journal",), ledger_dirs=(base / "ledgers",),
                              journal_write_data=journal_write_data,
                              write_cache_max_bytes=1 << 20))


class SimCommitter(GroupCommitter):
    """The real group committer; on a slow disk each loop sync starts a
    virtual delay after it was asked for (and covers what was appended
    until then), so acknowledgements wait and a crash meanwhile loses the
    records written but not yet synced."""

    def __init__(self, journal: SyncableJournal, rng: random.Random,
                 slow_sync_ms: float) -> None:
        super().__init__(journal, loop_sync_max_ms=LOOP_SYNC_ALWAYS_MS)
        self._rng = rng
        self._slow_sync_ms = slow_sync_ms

    def _sync_on_loop(self) -> None:
        if self._slow_sync_ms <= 0:
            super()._sync_on_loop()
            return
        delay_s = self._rng.uniform(0.0, self._slow_sync_ms) / 1000.0
        self._loop.call_later(delay_s, GroupCommitter._sync_on_loop, self)


class SimBookie:
    """One bookie of the simulated cluster (see the module docstring)."""

    def __init__(self, bookie_id: str, network: SimNetwork, store: MetadataStore,
                 rng: random.Random, trace: Trace, losses: Losses, *,
                 journal_write_data: bool = True, slow_sync_ms: float = 0.0,
                 limbo_negatives: LimboNegatives | None = None) -> None:
        self.bookie_id = bookie_id
        self.address = f"{bookie_id}:3181"
        self.config = bookie_config(bookie_id, journal_write_data=journal_write_data)
        self.journal_write_data = journal_write_data
        self.disk = SimDisk()
        self.server: BookieServer | None = None
        self.boots = 0
        self.wipes = 0
        self._slow_sync_ms = slow_sync_ms
        self._network = network
        self._store = store
        self._rng = rng
        self._trace = trace
        self._losses = losses
        self.limbo_negatives: LimboNegatives = {} if limbo_negatives is None \
            else limbo_negatives
        """Where this bookie's negative answers about limbo ledgers go."""
        self._held: dict[int, set[int]] = {}
        """What the engine held when it crashed (until the restart compares)."""
        self._repair_client: Client | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._abandoned: list[BookieServer] = []
        """Servers of earlier boots: kept so that their tasks, stuck on a
        committer that will never sync again, are cancelled at the end of
        the run rather than collected while pending."""

    @property
    def up(self) -> bool:
        return self.server is not None

    def publish(self, state: BookieState) -> None:
        """:class:`~quire.bookie.status.StatePublisher`: state changes go to the trace."""
        self._trace.event(f"{self.bookie_id} is {state.value}")

    async def start(self) -> None:
        """Boot as the node does (module docstring), as this node."""
        token = current_node.set(self.bookie_id)
        try:
            await self._boot()
        finally:
            current_node.reset(token)

    async def _boot(self) -> None:
        disk, storage_config = self.disk, self.config.storage
        self._network.node_up(self.bookie_id)
        cookie_failed = self.boots > 0 and not disk.cookie
        storage = BookieStorage.open_over(storage_config, SimJournal(disk),
                                          SimLedgerStorage(disk, storage_config), [])
        committer = SimCommitter(storage.journal, self._rng, self._slow_sync_ms)
        self._count_losses(storage)
        protection = None
        if bugs.active != "forget-limbo":
            protection = await protect_if_needed(
                self._store, storage, self.bookie_id, cookie_failed=cookie_failed,
                data_integrity_checking=self.config.data_integrity_checking)
        disk.cookie = True
        self.server = server = BookieServer(self.config, storage, committer, self._store, self,
                                            SyncCursors.load(storage))
        self._network.listen(self.bookie_id, self.address, lambda: WatchedConnection(
            server, self.bookie_id, self.limbo_negatives))
        if self.boots == 0:
            await self._store.register_bookie(
                BookieInfo(self.bookie_id, self.address, BookieState.WRITABLE, None))
        self.boots += 1
        self._trace.event(
            f"{self.bookie_id} up (boot {self.boots}, {len(storage.list_ledgers())} ledgers"
            + ("" if protection is None else
               f"; phase one fenced {protection.fenced}, {protection.limbo} in limbo") + ")")
        loop = asyncio.get_running_loop()
        if self.config.data_integrity_checking or storage.limbo_ledgers():
            self._tasks.append(loop.create_task(self._phase_two(server)))
        if not self.journal_write_data:
            self._tasks.append(loop.create_task(self._checkpoints()))

    def _count_losses(self, storage: BookieStorage) -> None:
        """Compare what the engine holds after a restart with what it held
        when it crashed; record the difference if the crash may lose data
        (an emptied disk, a write cache without the journal; a journaled
        bookie loses only what it never acknowledged as durable)."""
        held, self._held = self._held, {}
        for ledger_id, entries in held.items():
            now = storage.stored_entry_ids(ledger_id, 0, max(entries))
            lost = entries - now
            if lost:
                self._losses.setdefault(ledger_id, defaultdict(set))[self.bookie_id] |= lost

    async def _phase_two(self, server: BookieServer) -> None:
        storage = server.storage
        pool = await BookiePool.open(self._store, REPAIR_CLIENT_CONFIG.peer_config())
        ctx = ClientContext(self._store, pool, REPAIR_CLIENT_CONFIG, RandomPlacement(self._rng))
        self._repair_client = client = Client(ctx, owns_store=False)
        copier = EntryCopier(pool, timeout_ms=3000, chunk_max_bytes=1 << 20,
                             batch_max_bytes=1 << 20)
        metrics = RepairMetrics(CollectorRegistry(), lambda: len(storage.limbo_ledgers()))
        repair = LedgerRepair(self.bookie_id, self._store, storage, ClientRecoverer(client),
                              copier, LocalSink(storage, server.services.covering),
                              server.committer.wait_durable, REPAIR_SETTINGS, metrics)
        self._trace.event(f"{self.bookie_id} phase two starts "
                          f"({len(storage.limbo_ledgers())} in limbo)")
        await repair.run(everything_first=self.config.data_integrity_checking)
        self._trace.event(f"{self.bookie_id} phase two done: {metrics.entries_copied} entries "
                          f"copied, {metrics.ledgers_repaired} ledgers repaired")

    async def _checkpoints(self) -> None:
        """Without the journal only checkpoints make adds durable: one now
        and then, as ``flush_interval_ms`` does."""
        while True:
            await asyncio.sleep(self._rng.uniform(0.2, 2.0))
            await self.checkpoint()

    @property
    def unsynced(self) -> bool:
        """Whether the bookie holds journal records not yet synced, or
        (without the journal) adds no checkpoint wrote out."""
        server = self.server
        if server is None:
            return False
        storage = server.storage
        if not self.journal_write_data:
            return storage.write_cache_bytes > 0
        return storage.journal.append_seq > server.committer.durable_seq

    def crash(self, *, wipe: bool = False) -> None:
        """Power loss (see the module docstring); ``wipe``: the disk comes
        back empty."""
        server, self.server = self.server, None
        if server is None:
            return
        storage = server.storage
        self._held = {} if self.journal_write_data and not wipe else {
            lid: ids for lid in storage.list_ledgers()
            if (ids := storage.stored_entry_ids(lid, 0, storage.last_entry_id(lid)))}
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self._network.unlisten(self.address)
        self._network.node_down(self.bookie_id)
        if self._repair_client is not None:
            client, self._repair_client = self._repair_client, None
            asyncio.get_running_loop().create_task(client.close())
        storage.abandon()
        server.committer.close()
        self._abandoned.append(server)
        lost = self.disk.power_loss(self._rng)
        if wipe:
            self.disk = SimDisk()
            self.wipes += 1
        self._trace.event(f"{self.bookie_id} crashed, lost {lost} unsynced journal records"
                          + (", rebooting with an empty disk" if wipe else ""))

    async def checkpoint(self) -> None:
        if self.server is not None:
            await self.server.services.checkpoint()
            self._trace.event(f"{self.bookie_id} checkpointed")
