"""The processes of the simulated stream tier: segment stores and their
containers' tier-1 logs.

A :class:`SimProcess` is a process on a node of the simulated network: it
boots a new *life* (:meth:`SimProcess.start`, run as the node), and a crash
(:meth:`SimProcess.crash`) ends it at once: the network forgets the life
(its connections reset, nothing it still runs reaches anyone), the loop
cancels its tasks and timers, its metadata session is left to expire.
Nothing is closed cleanly: a crash is ``kill -9``.  A boot that fails
(the metadata store cut off, say) is a process that exits; it is started
again a little later, as a supervisor would.

:class:`SimSegmentStore` assembles what ``quire segmentstore start``
assembles (:class:`~quire.hosts.segmentstore_host.SegmentStoreHost`): a
metadata session, a ledger client, a
:class:`~quire.segmentstore.SegmentStore` whose containers log to
:class:`~quire.log.NamedDataLog` s and flush to the simulated tier-2, the
wire server (:class:`~quire.segmentserver.SegmentServer`'s connections,
listening on the simulated network) and
:class:`~quire.segmentstore.ContainerOwnership`.  Each container's log is
wrapped in a :class:`RecordingLog`, which notes what each owner appended
(for the invariant that only one owner's writes take effect per epoch).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from quire.client import Client, ClientConfig
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.log import NamedDataLog, Position, WriterOptions
from quire.metadata.memory import _Instance
from quire.segmentserver import SegmentServer, SegmentServerConfig
from quire.segmentstore import ContainerConfig, ContainerOwnership, OwnershipSettings
from quire.segmentstore.names import container_log_name
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.store import (
    SegmentStore,
    SegmentStoreConfig,
    cluster_container_count,
    record_container_count,
    tier1_passwords,
)
from quire.simulation.loop import SimLoop, VirtualClock
from quire.simulation.metadata import NodeMetadataStore
from quire.simulation.network import SimNetwork
from quire.simulation.tier2 import SimTier2
from quire.simulation.trace import Trace

STORE_PORT = 12345
TIER1_PASSWORD = b"sim-tier1"
TIER1_CLIENT = ClientConfig(add_entry_timeout_ms=4000, read_timeout_ms=3000,
                            speculative_read_timeout_ms=500, explicit_lac_interval_ms=0,
                            connect_timeout_ms=2000, timeout_check_interval_ms=250)


@dataclass(frozen=True)
class StreamSettings:
    """The simulated stream tier's sizes and timings (virtual ms)."""

    containers: int = 4
    lease_ms: int = 3000
    """Each process's metadata session."""
    rebalance_interval_ms: int = 1000
    roll_bytes: int = 16 << 10
    """Tier-1 ledgers roll this often (rolls are part of the path)."""
    max_chunk_bytes: int = 4 << 10
    flush_threshold_bytes: int = 2 << 10
    flush_threshold_ms: int = 1500
    flush_interval_ms: int = 500
    checkpoint_every_bytes: int = 8 << 10
    max_frame_bytes: int = 64 << 10
    restart_delay_s: tuple[float, float] = (0.2, 2.0)
    """A process that failed to boot starts again after this long."""

    def store_config(self) -> SegmentStoreConfig:
        return SegmentStoreConfig(
            container_count=self.containers,
            container=ContainerConfig(max_frame_bytes=self.max_frame_bytes,
                                      checkpoint_every_bytes=self.checkpoint_every_bytes,
                                      read_index_budget_bytes=64 << 10),
            tier1=WriterOptions(roll_bytes=self.roll_bytes, roll_age_ms=0),
            storage_writer=StorageWriterConfig(
                flush_threshold_bytes=self.flush_threshold_bytes,
                flush_threshold_ms=self.flush_threshold_ms,
                iteration_interval_ms=self.flush_interval_ms, flush_concurrency=4),
            tier1_passwords=tier1_passwords(TIER1_PASSWORD))


@dataclass
class Cluster:
    """What every process of a run shares: the network, the metadata
    store's data, tier-2, the wall clock, the seed's randomness, the trace."""

    network: SimNetwork
    loop: SimLoop
    metadata: _Instance
    tier2: SimTier2
    clock: VirtualClock
    rng: random.Random
    trace: Trace
    settings: StreamSettings
    logs: LogBook = field(default_factory=lambda: LogBook())

    def session(self, lease_ms: int | None = None) -> NodeMetadataStore:
        """A new metadata session for the running node."""
        return NodeMetadataStore(self.network, self.metadata, self.clock,
                                 lease_ms=lease_ms or self.settings.lease_ms)


class SimProcess:
    """A process on node ``name`` (module docstring)."""

    def __init__(self, name: str, cluster: Cluster) -> None:
        self.name = name
        self.cluster = cluster
        self.up = False
        self.boots = 0
        self.wanted = False
        """Whether the run wants it running (a failed boot is retried while so)."""
        self._life = 0
        self._booting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Boot a new life, as the node; returns once it is up (or the boot
        failed: then it is retried later, in the background)."""
        self.wanted = True
        if self.up or self._booting is not None:
            return
        network = self.cluster.network
        network.node_up(self.name)
        self._life = network.life_of(self.name)
        self.boots += 1
        task = self.cluster.loop.create_task(self._boot_or_retry(),
                                             context=network.context_of(self.name))
        self._booting = task
        await asyncio.wait([task])

    async def _boot_or_retry(self) -> None:
        try:
            await self._boot()
        except Exception as e:  # the process exits; a supervisor starts it again
            self.cluster.trace.event(f"{self.name} failed to start: {e!r}")
            self._booting = None
            self._end_life()
            self.cluster.loop.create_task(self._restart_later(),
                                          context=self.cluster.network.context_of("nemesis"))
            return
        self._booting = None
        self.up = True
        self.cluster.trace.event(f"{self.name} up (boot {self.boots})")

    async def _restart_later(self) -> None:
        await asyncio.sleep(self.cluster.rng.uniform(*self.cluster.settings.restart_delay_s))
        if self.wanted and not self.up:
            await self.start()

    async def _boot(self) -> None:
        raise NotImplementedError

    def crash(self) -> None:
        """``kill -9`` (module docstring)."""
        self.wanted = False
        if not self.up and self._booting is None:
            return
        self._booting = None
        self._end_life()
        self.cluster.trace.event(f"{self.name} crashed")

    def _end_life(self) -> None:
        self.up = False
        life = self.cluster.network.kill(self.name)
        self.cluster.loop.kill(self.name, life)
        self._forget()

    def _forget(self) -> None:
        """Drop the references to the life that ended."""


class LogBook:
    """What each container owner appended to its tier-1 log, and when each
    owner took the log: for the one-owner-per-epoch invariant."""

    def __init__(self) -> None:
        self.appended: dict[int, dict[bytes, set[int]]] = {}
        """container id -> digest of a record -> the epochs that appended it
        (several when a new owner's operation is byte for byte one an older
        owner appended but never saw durable: its client's retry, the same
        sequence number, a clock stuck at the same millisecond; seed 105508)."""
        self.owners: list[tuple[int, int, str, float]] = []
        """(container id, epoch, node, virtual time) of every log taken."""

    @staticmethod
    def digest(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=12).digest()


class RecordingLog:
    """A :class:`~quire.log.DurableDataLog` that notes what it appends in a
    :class:`LogBook` (everything else is the wrapped log's)."""

    def __init__(self, log: NamedDataLog, container_id: int, book: LogBook, node: str) -> None:
        self._log = log
        self._container_id = container_id
        self._book = book
        self._node = node
        self._appended = book.appended.setdefault(container_id, {})

    @property
    def epoch(self) -> int:
        return self._log.epoch

    async def initialize(self) -> None:
        await self._log.initialize()
        self._book.owners.append((self._container_id, self._log.epoch, self._node,
                                  asyncio.get_running_loop().time()))

    def append(self, data: bytes) -> asyncio.Future[Position]:
        future = self._log.append(data)
        self._appended.setdefault(LogBook.digest(data), set()).add(self._log.epoch)
        return future

    def read(self, from_address: Position | None = None
             ) -> AsyncIterator[tuple[Position, bytes]]:
        return self._log.read(from_address)

    async def truncate(self, up_to: Position) -> None:
        await self._log.truncate(up_to)

    async def close(self) -> None:
        await self._log.close()


class SimSegmentStore(SimProcess):
    """A segment store process (module docstring)."""

    def __init__(self, name: str, cluster: Cluster) -> None:
        super().__init__(name, cluster)
        self.address = f"{name}:{STORE_PORT}"
        self.clock = VirtualClock(cluster.loop, cluster.clock.start_ms)
        self.metadata: NodeMetadataStore | None = None
        self.client: Client | None = None
        self.store: SegmentStore | None = None
        self.ownership: ContainerOwnership | None = None

    async def _boot(self) -> None:
        cluster, settings = self.cluster, self.cluster.settings
        self.metadata = metadata = cluster.session()
        from quire.peer import BookiePool
        pool = await BookiePool.open(metadata, TIER1_CLIENT.peer_config())
        ctx = ClientContext(metadata, pool, TIER1_CLIENT, RandomPlacement(cluster.rng))
        self.client = client = Client(ctx, owns_store=False)
        tier2 = cluster.tier2.storage()
        config = settings.store_config()
        count = await cluster_container_count(metadata, config.container_count)
        await record_container_count(tier2, count)
        book, node = cluster.logs, self.name

        def open_log(container_id: int) -> RecordingLog:
            return RecordingLog(NamedDataLog(client, container_log_name(container_id),
                                             password=config.tier1_passwords,
                                             options=config.tier1), container_id, book, node)
        self.store = store = SegmentStore(count, open_log, config, tier2,
                                          settings.max_chunk_bytes, clock=self.clock)
        server = SegmentServer(store, SegmentServerConfig(tail_read_wait_ms=1000))
        cluster.network.listen(self.name, self.address, server.protocol)
        self.ownership = ContainerOwnership(
            metadata, store, self.name, self.address,
            OwnershipSettings(rebalance_interval_ms=settings.rebalance_interval_ms,
                              register_wait_ms=4 * settings.lease_ms))
        await self.ownership.start()

    def _forget(self) -> None:
        self.cluster.network.unlisten(self.address)
        self.metadata = self.client = self.store = self.ownership = None

    def hosted(self) -> list[int]:
        """The containers open here now."""
        if self.store is None:
            return []
        return [c for c in self.store.container_ids if self.store.container(c).failure is None]
