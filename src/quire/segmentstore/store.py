"""The segment store: the containers one process hosts, and the routing to them.

:class:`SegmentStore` maps every segment name to a container
(:func:`~quire.segmentstore.names.container_of`, modulo the cluster's
``container_count``, which is kept in the metadata store under
:data:`CONTAINER_COUNT_KEY` and fixed once set) and forwards each request to
the :class:`~quire.segmentstore.container.SegmentContainer` hosting it.
A request for a container this store does not host fails with
:class:`~quire.errors.ContainerNotOwnedError` (the wire server's WrongHost).

Which store hosts which container is decided above this class (part 3:
leased ownership records); here :meth:`SegmentStore.start_container` and
:meth:`SegmentStore.stop_container` take and give up one.  Taking one fences
its previous owner through the tier-1 log's epoch.

A write proves ownership by itself (a fenced log refuses it); a read does
not: a store cut off from the metadata store that writes nothing is never
fenced and would answer from the state it has while another store took its
container over and wrote on.  So while :attr:`SegmentStore.confirm_reads`
is set (the ownership part sets it while this host's lease is not
confirmed), every read (``read``, ``get_info``, ``get_attributes``, the
table reads) first has its container prove ownership through tier-1
(:meth:`SegmentContainer.confirm_ownership`): a probe operation written
after the request arrived; once the new owner fenced the log, the probe
fails, the container with it, and the request is refused (WrongHost on the
wire: the client asks the controller again).  With a confirmed lease a read
costs one attribute test more.
"""

from __future__ import annotations

import asyncio
import collections
import io
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client, LedgerPasswords
from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import (
    ChunkExistsError,
    ChunkNotFoundError,
    ConfigError,
    ContainerNotOwnedError,
    MetadataExistsError,
    MetadataNotFoundError,
    SegmentStoreError,
)
from quire.log import DurableDataLog, NamedDataLog, WriterOptions
from quire.metadata import MetadataStore
from quire.segmentstore.container import ContainerConfig, SegmentContainer
from quire.segmentstore.futures import failed_future
from quire.segmentstore.names import (
    CONTAINER_COUNT_KEY,
    SYSTEM_SCOPE,
    container_log_name,
    container_of,
)
from quire.segmentstore.segment_rates import policy_attributes
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tables import TableDelta, TableEntry, TableIteratorPage
from quire.segmentstore.tier2_reader import Tier2Reader
from quire.segmentstore.types import (
    AppendResult,
    AttributeUpdate,
    MergeResult,
    ReadResult,
    SegmentInfo,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.writer_source import ContainerWriterSource, WriterSource
from quire.tier2 import ChunkStorage, Tier2Config, open_chunk_storage

DEFAULT_CONTAINER_COUNT = 4
LEGACY_LOG_PASSWORD = b"quire-segmentstore"
"""The password every tier-1 ledger had before it came from configuration
(``ledger_password_file``).  Kept only as the upgrade path: see
:func:`tier1_passwords`."""
_ROUTE_CACHE_SIZE = 100_000
"""Names whose container is remembered (hashing a name costs a microsecond per append)."""

OpenLog = Callable[[int], DurableDataLog]
"""``open_log(container_id)``: a new, uninitialized instance on the container's log."""
StartWriter = Callable[[WriterSource, ChunkStorage, StorageWriterConfig, int],
                       Awaitable[StorageWriter]]
"""``start_writer(source, tier2, config, max_chunk_bytes)``: a started storage
writer for a container (:meth:`StorageWriter.start`, unless a test gives another)."""


async def start_storage_writer(source: WriterSource, storage: ChunkStorage,
                               config: StorageWriterConfig,
                               max_chunk_bytes: int) -> StorageWriter:
    """The :data:`StartWriter` of a store: PDP-40's :class:`StorageWriter`."""
    return await StorageWriter.start(source, storage, config, max_chunk_bytes=max_chunk_bytes)


def tier1_passwords(configured: bytes | None) -> LedgerPasswords:
    """The passwords of the containers' tier-1 ledgers.

    With a configured password (the cluster's ``ledger_password_file``: one
    secret shared by every segment store), new ledgers get it, and ledgers
    made before with :data:`LEGACY_LOG_PASSWORD` still open: each ledger
    opens with the password its own metadata's master key says it was made
    with (:class:`~quire.client.LedgerPasswords`), so an upgraded cluster
    keeps reading and recovering its old ledgers, and they leave as the
    storage writer truncates the logs behind tier-2 (or as the logs roll).
    Nothing records which password a log uses: the keys in each ledger's
    metadata tell.  Without one (None), the legacy password, as before: a
    host warns about it at its start.
    """
    if configured is None:
        return LedgerPasswords(LEGACY_LOG_PASSWORD)
    return LedgerPasswords(configured, previous=(LEGACY_LOG_PASSWORD,))


@dataclass(frozen=True)
class SegmentStoreConfig:
    container_count: int | None = None
    """The cluster's container count: stored on first use (None: the stored
    one, or :data:`DEFAULT_CONTAINER_COUNT` if none is stored)."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    tier1: WriterOptions = field(default_factory=WriterOptions)
    """How the containers' tier-1 logs write their ledgers (ensemble, write
    and ack quorums: E3 W3 A2 by default)."""
    storage_writer: StorageWriterConfig = field(default_factory=StorageWriterConfig)
    """Each container's storage writer (when the store has tier-2)."""
    tier1_passwords: LedgerPasswords = field(default_factory=lambda: tier1_passwords(None))
    """The passwords of the tier-1 ledgers (:func:`tier1_passwords`)."""


CONTAINER_COUNT_CHUNK = f"{SYSTEM_SCOPE}/containers/container_count.E0.0"
"""The tier-2 chunk holding the cluster's container count (ASCII digits),
written by every store opened with tier-2 (the same bytes each time: a chunk
write of existing bytes is a no-op), so disaster recovery knows how names
map to containers when the metadata store is lost too."""


async def record_container_count(storage: ChunkStorage, count: int) -> None:
    """Put ``count`` in tier-2 (:data:`CONTAINER_COUNT_CHUNK`); ConfigError if
    tier-2 already belongs to a cluster with another count."""
    try:
        await storage.write_chunk(CONTAINER_COUNT_CHUNK, str(count).encode())
    except ChunkExistsError:
        stored = await read_tier2_container_count(storage)
        raise ConfigError(f"tier-2 holds the chunks of a cluster of {stored} containers; "
                          f"this one has {count}") from None


async def read_tier2_container_count(storage: ChunkStorage) -> int | None:
    """The container count tier-2 records (None if it records none)."""
    try:
        raw = await storage.read(CONTAINER_COUNT_CHUNK, 0,
                                 await storage.length(CONTAINER_COUNT_CHUNK))
    except ChunkNotFoundError:
        return None
    try:
        return int(raw.decode())
    except ValueError:
        raise ConfigError(f"tier-2 chunk {CONTAINER_COUNT_CHUNK} holds {raw[:20]!r}, "
                          "not a container count") from None


async def cluster_container_count(metadata: MetadataStore, wanted: int | None) -> int:
    """The container count kept in the metadata store, set to ``wanted`` (or
    the default) if none is; ConfigError if ``wanted`` differs from it."""
    if wanted is not None and wanted <= 0:
        raise ConfigError(f"container_count must be positive, got {wanted}")
    try:
        stored = int((await metadata.read_record(CONTAINER_COUNT_KEY)).value)
    except MetadataNotFoundError:
        count = wanted or DEFAULT_CONTAINER_COUNT
        try:
            await metadata.create_record(CONTAINER_COUNT_KEY, str(count).encode())
            return count
        except MetadataExistsError:
            stored = int((await metadata.read_record(CONTAINER_COUNT_KEY)).value)
    if wanted is not None and wanted != stored:
        raise ConfigError(f"container_count is {stored} in the metadata store and is fixed; "
                          f"asked for {wanted}")
    return stored


class SegmentStore:
    """Segment containers hosted in this process; get one with :meth:`open`.

    Mutations (``create_segment``, ``append``, ``seal``, ``truncate``,
    ``delete``, ``update_attributes``) are plain methods returning a future:
    the request is ordered when called, so appends to one segment apply in
    call order however their futures are awaited.  Errors come through the
    future.
    """

    def __init__(self, container_count: int, open_log: OpenLog,
                 config: SegmentStoreConfig, tier2: ChunkStorage | None = None,
                 max_chunk_bytes: int = 0,
                 start_writer: StartWriter = start_storage_writer,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.container_count = container_count
        self._open_log = open_log
        self._config = config
        self.tier2 = tier2
        self._max_chunk_bytes = max_chunk_bytes
        self._start_writer = start_writer
        self.clock = clock
        """The containers' clock (their operations' timestamps, their writers' thresholds)."""
        self._containers: dict[int, SegmentContainer] = {}
        self.writers: dict[int, StorageWriter] = {}
        """Each hosted container's storage writer (none without tier-2)."""
        self.flush_failures: collections.Counter[str] = collections.Counter()
        """Failed flush attempts of every writer this store ran, by cause."""
        self._writer_tasks: dict[int, asyncio.Task[None]] = {}
        self._starting: dict[int, asyncio.Task[SegmentContainer]] = {}
        self._stopping: dict[int, str] = {}
        self._stopping_writers: dict[int, asyncio.Task[None]] = {}
        self._routes: dict[str, int] = {}
        self.confirm_reads = False
        """Whether each read first confirms its container's ownership through
        tier-1 (module docstring); set while this host's lease is uncertain."""

    @classmethod
    async def open(cls, client: Client | None, container_ids: Iterable[int] = (),
                   tier2: str | Tier2Config | None = None, *,
                   config: SegmentStoreConfig | None = None,
                   metadata_store: MetadataStore | None = None,
                   open_log: OpenLog | None = None,
                   start_writer: StartWriter = start_storage_writer,
                   clock: Clock = SYSTEM_CLOCK) -> SegmentStore:
        """A store hosting ``container_ids`` (each opened: fenced, replayed).
        The containers' tier-1 logs are named logs on ``client``'s cluster,
        unless ``open_log`` gives others (tests: the in-memory twin, with
        ``metadata_store`` and no client).  With ``tier2`` (a URI or a
        :class:`~quire.tier2.Tier2Config`), each container runs a
        :class:`~quire.segmentstore.storage_writer.StorageWriter` flushing to it
        (``start_writer`` starts it: tests give a writer of their own).
        ``clock`` is the containers' (:class:`~quire.clock.Clock`)."""
        config = config or SegmentStoreConfig()
        if metadata_store is None:
            if client is None:
                raise ConfigError("SegmentStore.open needs a client or a metadata store")
            metadata_store = client.metadata_store
        if open_log is None:
            if client is None:
                raise ConfigError("SegmentStore.open needs a client or open_log")
            named_client, options, passwords = client, config.tier1, config.tier1_passwords

            def open_named(container_id: int) -> DurableDataLog:
                return NamedDataLog(named_client, container_log_name(container_id),
                                    password=passwords, options=options)
            open_log = open_named
        count = await cluster_container_count(metadata_store, config.container_count)
        storage = None
        max_chunk_bytes = 0
        if tier2 is not None:
            tier2_config = Tier2Config(uri=tier2) if isinstance(tier2, str) else tier2
            storage = await open_chunk_storage(tier2_config)
            max_chunk_bytes = tier2_config.max_chunk_bytes
            try:
                await record_container_count(storage, count)
            except BaseException:
                await storage.close()
                raise
        store = cls(count, open_log, config, storage, max_chunk_bytes, start_writer, clock)
        try:
            await asyncio.gather(*(store.start_container(c) for c in container_ids))
        except BaseException:
            await store.close()
            raise
        return store

    # --- ownership -----------------------------------------------------------

    def container_for(self, name: str) -> int:
        found = self._routes.get(name)
        if found is None:
            if len(self._routes) >= _ROUTE_CACHE_SIZE:
                self._routes.clear()
            found = self._routes[name] = container_of(name, self.container_count)
        return found

    def owns(self, name: str) -> bool:
        """Whether this store hosts (and has opened) ``name``'s container."""
        return self.container_for(name) in self._containers

    @property
    def container_ids(self) -> list[int]:
        return sorted(self._containers)

    def container(self, container_id: int) -> SegmentContainer:
        found = self._containers.get(container_id)
        if found is None:
            raise ContainerNotOwnedError(f"container {container_id} is not hosted here")
        return found

    async def start_container(self, container_id: int) -> None:
        """Take container ``container_id``: fence its previous owner, replay its log.
        The container is registered when it opens, even if this call is cancelled."""
        if not 0 <= container_id < self.container_count:
            raise ConfigError(f"container {container_id} is not in 0..{self.container_count - 1}")
        if container_id in self._containers:
            return
        task = self._starting.get(container_id)
        if task is None:
            task = asyncio.ensure_future(self._open(container_id))
            self._starting[container_id] = task
        await asyncio.shield(task)

    async def _open(self, container_id: int) -> SegmentContainer:
        try:
            reader = None if self.tier2 is None else \
                await Tier2Reader.load(self.tier2, container_id)
            container = await SegmentContainer.open(
                container_id, self._open_log(container_id), self._config.container,
                clock=self.clock, tier2_read=None if reader is None else reader.read)
            if self.tier2 is not None:
                try:
                    writer = await self._start_writer(
                        ContainerWriterSource(container), self.tier2,
                        self._config.storage_writer, self._max_chunk_bytes)
                except BaseException:
                    await container.close()
                    raise
                writer.health.counts = self.flush_failures
                self.writers[container_id] = writer
                self._writer_tasks[container_id] = asyncio.ensure_future(writer.run())
            self._containers[container_id] = container
            return container
        finally:
            self._starting.pop(container_id, None)

    async def stop_container(self, container_id: int) -> None:
        """Give up container ``container_id`` (after its queued operations);
        one still starting is stopped once it has started.  While it stops,
        :attr:`transitions` names the step it waits for."""
        self._stopping[container_id] = "its start"
        try:
            starting = self._starting.get(container_id)
            if starting is not None:
                await asyncio.wait([starting])
                if not starting.cancelled():
                    starting.exception()  # its starter saw it
            task = self._writer_tasks.pop(container_id, None)
            writer = self.writers.pop(container_id, None)
            if task is not None:
                self._stopping[container_id] = "its storage writer"
                self._stopping_writers[container_id] = task
                if writer is not None:
                    writer.stop()
                task.cancel()
                await asyncio.wait([task])
            container = self._containers.pop(container_id, None)
            if container is not None:
                self._stopping[container_id] = "its queued operations and tier-1 log"
                await container.close()
        finally:
            self._stopping.pop(container_id, None)
            self._stopping_writers.pop(container_id, None)

    def cancel_writer_again(self, container_id: int) -> str | None:
        """Cancel again the storage writer a stop of ``container_id`` waits
        for (a cancellation can be lost: Python 3.11's ``asyncio.wait_for``
        returns its inner result when the two race); where that writer
        waits, as a stack, or None if no stop waits for one."""
        task = self._stopping_writers.get(container_id)
        if task is None or task.done():
            return None
        where = io.StringIO()
        task.print_stack(limit=12, file=where)
        task.cancel()
        return where.getvalue()

    @property
    def transitions(self) -> dict[str, Any]:
        """Containers on their way in or out, for status and diagnostics:
        ``{"starting": [ids], "stopping": {id: the step it waits for}}``."""
        return {"starting": sorted(self._starting),
                "stopping": {c: self._stopping[c] for c in sorted(self._stopping)}}

    async def close(self) -> None:
        await asyncio.gather(*(self.stop_container(c)
                               for c in {*self._containers, *self._starting}))
        if self.tier2 is not None:
            await self.tier2.close()

    # --- segments --------------------------------------------------------------

    def _route(self, name: str) -> SegmentContainer:
        return self.container(self.container_for(name))

    def create_segment(self, name: str, segment_type: SegmentType = SegmentType.STREAM,
                       attributes: Mapping[int, int] | Sequence[AttributeUpdate] | None = None,
                       ) -> asyncio.Future[None]:
        try:
            return self._route(name).create_segment(name, segment_type, attributes)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def append(self, name: str, data: bytes, attribute_updates: Sequence[AttributeUpdate] = (),
               expected_offset: int | None = None,
               writer: tuple[int, int] | None = None) -> asyncio.Future[AppendResult]:
        """Append ``data``; the future gives an :class:`AppendResult` once it
        is durable.  ``expected_offset``: fail with BadOffsetError unless the
        segment's length is that.  ``writer=(writer_id, last_event_number)``:
        a block whose number is not above the writer's stored one is a
        duplicate, acknowledged without being written.  Attribute updates
        apply with the data, all or nothing."""
        container_id = self._routes.get(name)  # the hot path: a name seen before
        if container_id is not None:
            container = self._containers.get(container_id)
            if container is not None:
                return container.append(name, data, attribute_updates, expected_offset, writer)
        try:
            return self._route(name).append(name, data, attribute_updates, expected_offset,
                                            writer)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def seal(self, name: str) -> asyncio.Future[int]:
        try:
            return self._route(name).seal(name)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def truncate(self, name: str, offset: int) -> asyncio.Future[None]:
        try:
            return self._route(name).truncate(name, offset)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def delete(self, name: str) -> asyncio.Future[None]:
        try:
            return self._route(name).delete(name)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def update_attributes(self, name: str,
                          updates: Sequence[AttributeUpdate]) -> asyncio.Future[None]:
        try:
            return self._route(name).update_attributes(name, updates)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def update_segment_policy(self, name: str, scale_type: int,
                              target_rate: int) -> asyncio.Future[None]:
        """Set the segment's scaling policy (Pravega's UpdateSegmentPolicy;
        see :mod:`~quire.segmentstore.segment_rates`)."""
        return self.update_attributes(name, [
            AttributeUpdate(key, UpdateType.REPLACE, value)
            for key, value in policy_attributes(scale_type, target_rate).items()])

    def merge(self, target: str, source: str) -> asyncio.Future[MergeResult]:
        """Append all of ``source`` to ``target`` (sealing ``source`` first if
        needed); ``source`` is gone afterwards.  Both must share a container
        (a transaction or transient segment and its parent do)."""
        try:
            if self.container_for(source) != self.container_for(target):
                raise SegmentStoreError(f"{source!r} and {target!r} are in different containers")
            return self._route(target).merge(target, source)
        except SegmentStoreError as e:
            return failed_future(e)

    def create_transient_segment(self, parent: str, writer_id: int) -> asyncio.Future[str]:
        """A new server-named segment in ``parent``'s container (its name)."""
        try:
            return self._route(parent).create_transient_segment(parent, writer_id)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> asyncio.Future[list[int]]:
        """Set ``(key, value, expected_version)`` entries, all or nothing; the
        new versions (expected None: any; ``NOT_EXISTS``: must not exist)."""
        try:
            return self._route(name).tables.put(name, entries)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    def table_remove(self, name: str, keys_with_versions: Sequence[tuple[bytes, int | None]]
                     ) -> asyncio.Future[None]:
        try:
            return self._route(name).tables.remove(name, keys_with_versions)
        except ContainerNotOwnedError as e:
            return failed_future(e)

    # --- reads: while confirm_reads, each confirms its container's ownership first --

    async def table_get(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.tables.get(name, keys)

    async def table_iterate(self, name: str, keys_only: bool = False,
                            token: bytes | None = None,
                            max_entries: int = 1000) -> TableIteratorPage:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.tables.iterate(name, keys_only, token, max_entries)

    async def table_read_delta(self, name: str, from_position: int,
                               max_entries: int) -> TableDelta:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.tables.read_delta(name, from_position, max_entries)

    async def get_attributes(self, name: str, keys: Iterable[int]) -> dict[int, int]:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.get_attributes(name, keys)

    async def get_info(self, name: str) -> SegmentInfo:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.get_info(name)

    async def read(self, name: str, offset: int, max_length: int,
                   wait_ms: int = 0) -> ReadResult:
        container = self._route(name)
        if self.confirm_reads:
            await container.confirm_ownership()
        return await container.read(name, offset, max_length, wait_ms)

    async def append_times(self, name: str, start: int, end: int) -> list[tuple[int, int]]:
        """When the segment's bytes ``start .. end`` were appended: ``(offset,
        time_ms)`` entries, the first at ``start`` (time -1: not known)."""
        return await self._route(name).append_times(name, start, end)

    async def locate_append_time(self, name: str, time_ms: int) -> int:
        """The start of the segment's first append at or after ``time_ms``
        (its length if none)."""
        return await self._route(name).locate_append_time(name, time_ms)
