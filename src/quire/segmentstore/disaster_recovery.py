"""Disaster recovery: every container rebuilt from tier-2 alone onto fresh tier-1 logs.

For a lost bookie cluster, a lost metadata store, or both.  Call::

    report = await recover(client, "file:///data/tier2")

with a :class:`~quire.client.Client` of the (new) cluster.  What tier-2
records is read with :func:`~quire.segmentstore.tier2_reader.read_records`
(each container's system journal, then its storage-metadata table), and for
each container:

1. every *live data segment* recorded there (a layout in the
   storage-metadata table, not deleted, not an ``$attributes``/``$index``
   segment) becomes a segment of the recovered container with its recorded
   id, type, length, start offset and sealed flag; its attributes are the
   values of its ``$attributes`` segment's batches, folded in order; the
   container's storage-metadata table segment comes back with its journal
   layout (a new id, above every recorded one);
2. the container's tier-1 log is created with an epoch at or above every
   epoch any chunk name in tier-2 carries (``LogCatalog.create(epoch=...)``),
   so the recovered owner (epoch + 1) and its successors never name a chunk
   that exists already;
3. **seeding**: one checkpoint operation (sequence 2, of the state above,
   every segment's ``storage_length`` equal to its length) is written as
   the log's first record.  A checkpoint that is not operation 1 is what a
   log truncated by the storage writer starts with, so opening the
   container takes the path every truncated log takes: it replays the
   checkpoint, reads every byte from tier-2 (nothing is copied back to
   tier-1), and rebuilds each table's index from its data in tier-2; the
   storage writer then loads the layouts from the storage-metadata table
   and goes on appending to the same tier-2 segments;
4. the container is opened once that way (which also proves every table
   reads back) and closed; its segments are compared with the records, and
   each table's index rebuilt from its data with its ``$index`` segment in
   tier-2 (:attr:`RecoveredContainer.index_mismatches`).

Chunks that no record names (a crash between a chunk write and the record
naming it, chunks dropped from a layout and not yet deleted) are listed as
:attr:`RecoveryReport.orphans` and left in place: recovery deletes nothing.

The container count comes from the metadata store if it has one, else from
tier-2 (:data:`~quire.segmentstore.store.CONTAINER_COUNT_CHUNK`), else from
the ``container_count`` argument; it is then stored in the metadata store.
Recovery refuses (:class:`~quire.errors.RecoveryError`, before writing
anything) when a container's tier-1 log exists already, unless asked to
replace it (``replace_logs``): then the log's records are dropped from the
metadata store (its ledgers are not read, so lost bookies do not matter;
stop the segment stores first: an owner still running could go on
appending to its open ledger) and the log is made again above its old
epoch too.  Those ledgers are not deleted (a surviving copy is the only
place the data acknowledged after the last flush may still be): the report
lists them (:attr:`RecoveryReport.abandoned_ledgers`) and the metadata
store records them, so :func:`~quire.segmentstore.covered_ledgers.delete_covered`
(``--delete-covered-ledgers``) can later delete those whose every entry
tier-2 holds and keep the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client
from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import ConfigError, InvalidChunkNameError, MetadataNotFoundError, RecoveryError
from quire.log import LogCatalog, LogNotFoundError, NamedDataLog
from quire.metadata import MetadataStore
from quire.segmentstore import frames
from quire.segmentstore.chunk_sidecars import sidecar_name
from quire.segmentstore.container import SegmentContainer
from quire.segmentstore.covered_ledgers import record_abandoned
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.names import (
    ATTRIBUTES_SUFFIX,
    CONTAINER_COUNT_KEY,
    INDEX_SUFFIX,
    container_log_name,
    container_of,
)
from quire.segmentstore.operations import CheckpointOp, encode
from quire.segmentstore.storage_records import decode_attribute_batches, decode_index_batches
from quire.segmentstore.store import (
    CONTAINER_COUNT_CHUNK,
    SegmentStoreConfig,
    cluster_container_count,
    read_tier2_container_count,
)
from quire.segmentstore.tier2_reader import (
    StorageRecords,
    Tier2Reader,
    journal_containers,
    journal_name,
    read_records,
    storage_metadata_name,
)
from quire.segmentstore.types import SegmentType
from quire.tier2 import (
    ChunkInfo,
    ChunkStorage,
    SegmentLayout,
    Tier2Config,
    open_chunk_storage,
    parse_chunk_name,
    read_segment,
)

_READS_IN_FLIGHT = 32
"""``$attributes`` segments read at once (one S3 GET or file read each)."""
SEED_SEQUENCE = 2
"""The seed checkpoint's sequence: not 1, so the log reads as truncated."""

Progress = Callable[[int, int], None]
"""``progress(segments_done, segments_total)``: called as containers are rebuilt."""


@dataclass(frozen=True)
class RecoveredContainer:
    """What recovery brought back for one container."""

    container_id: int
    epoch: int
    """The epoch the recovered owner took on its fresh tier-1 log."""
    segments: int
    """Live data segments recorded in tier-2 and brought back (tables
    included, the storage-metadata table not)."""
    tables: int
    bytes: int
    """Their bytes from start offset to length (all in tier-2)."""
    dangling: tuple[str, ...] = ()
    """``$attributes``/``$index`` layouts whose data segment tier-2 does not
    record as live (left as they are)."""
    index_mismatches: tuple[str, ...] = ()
    """Tables whose ``$index`` in tier-2 disagrees with the index rebuilt
    from their data (the data wins; the next flush writes the whole index
    again).  Empty for a tier-2 PDP-40 kept consistent."""


@dataclass(frozen=True)
class RecoveryReport:
    """The summary :func:`recover` returns."""

    container_count: int
    containers: tuple[RecoveredContainer, ...]
    orphans: tuple[ChunkInfo, ...]
    """Chunks no record names, left in place."""
    elapsed_s: float
    abandoned_ledgers: tuple[int, ...] = ()
    """Ledgers of the tier-1 logs ``replace_logs`` dropped, left untouched
    (their data after the last flush is not in the recovered containers)."""

    @property
    def segments(self) -> int:
        return sum(c.segments for c in self.containers)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.containers)

    def as_json(self) -> dict[str, Any]:
        return {
            "container_count": self.container_count,
            "containers": [{"container": c.container_id, "epoch": c.epoch,
                            "segments": c.segments, "tables": c.tables, "bytes": c.bytes,
                            "dangling": list(c.dangling),
                            "index_mismatches": list(c.index_mismatches)}
                           for c in self.containers],
            "segments": self.segments, "bytes": self.bytes,
            "orphans": [{"chunk": o.name, "bytes": o.length} for o in self.orphans],
            "abandoned_ledgers": list(self.abandoned_ledgers),
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass
class _Plan:
    """One container's recovered state, before it is written."""

    container_id: int
    records: StorageRecords
    metadata: ContainerMetadata
    segments: list[SegmentMetadata] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)


async def recover(client: Client, tier2: str | Tier2Config | ChunkStorage, *,
                  container_ids: Iterable[int] | None = None,
                  progress: Progress | None = None,
                  container_count: int | None = None,
                  config: SegmentStoreConfig | None = None,
                  replace_logs: bool = False, clock: Clock = SYSTEM_CLOCK) -> RecoveryReport:
    """Rebuild containers (all, or ``container_ids``) from ``tier2`` alone
    onto fresh tier-1 logs on ``client``'s cluster (see the module
    docstring).  ``container_count`` is used only if neither the metadata
    store nor tier-2 records one; ``config`` gives the tier-1 logs' writer
    options and the container settings of the check-open (defaults:
    :class:`SegmentStoreConfig`'s).  Raises
    :class:`~quire.errors.RecoveryError` for existing tier-1 logs (unless
    ``replace_logs``: their records are dropped and their ledgers left
    unread; stop every segment store first, as an owner still running is
    not fenced at its open ledger) or records
    that do not fit; a failure part-way leaves the logs made so far (run
    again with ``replace_logs``) and never touches tier-2.  ``tier2``: a
    URI or configuration (opened and closed here) or an open storage;
    ``clock`` stamps the recovered state (:class:`~quire.clock.Clock`)."""
    started = time.monotonic()
    config = config or SegmentStoreConfig()
    opened = isinstance(tier2, str | Tier2Config)
    storage: ChunkStorage
    if isinstance(tier2, str | Tier2Config):
        storage = await open_chunk_storage(Tier2Config(uri=tier2) if isinstance(tier2, str)
                                           else tier2)
    else:
        storage = tier2
    try:
        metadata = client.metadata_store
        count = await _container_count(metadata, storage, container_count)
        ids = sorted(set(range(count) if container_ids is None else container_ids))
        for cid in ids:
            if not 0 <= cid < count:
                raise ConfigError(f"container {cid} is not in 0..{count - 1}")
        catalog = LogCatalog(metadata)
        existing = {container_log_name(cid): cid for cid in ids
                    if await _log_exists(catalog, container_log_name(cid))}
        if existing and not replace_logs:
            raise RecoveryError(f"tier-1 logs exist already: {', '.join(existing)}; recovery "
                                "rebuilds onto fresh logs (replace_logs / --replace-logs "
                                "drops them)")
        await _probe(client, config)
        chunks = await storage.list_chunks("")
        floor = _highest_epoch(chunks)
        abandoned: set[int] = set()
        for name, cid in existing.items():
            head, ledgers = await catalog.discard(name)
            await record_abandoned(metadata, cid, sorted(ledgers))
            floor = max(floor, head.epoch)
            abandoned |= ledgers
        recorded = {cid: await read_records(storage, cid)
                    for cid in sorted(set(await journal_containers(storage)) | set(ids))}
        plans = [await _plan(cid, recorded[cid], storage, count, clock) for cid in ids]
        await cluster_container_count(metadata, count)
        total = sum(len(p.segments) for p in plans)
        done = 0
        if progress is not None:
            progress(done, total)
        out = []
        for plan in plans:
            out.append(await _rebuild(client, catalog, storage, plan, floor, config, clock))
            done += len(plan.segments)
            if progress is not None:
                progress(done, total)
        orphans = _orphans(chunks, recorded)
        return RecoveryReport(count, tuple(out), tuple(orphans), time.monotonic() - started,
                              tuple(sorted(abandoned)))
    finally:
        if opened:
            await storage.close()


async def _container_count(metadata: MetadataStore, storage: ChunkStorage,
                           fallback: int | None) -> int:
    in_tier2 = await read_tier2_container_count(storage)
    try:
        stored: int | None = int((await metadata.read_record(CONTAINER_COUNT_KEY)).value)
    except MetadataNotFoundError:
        stored = None
    if stored is not None and in_tier2 is not None and stored != in_tier2:
        raise RecoveryError(f"the metadata store says {stored} containers, tier-2 says "
                            f"{in_tier2}: they belong to different clusters")
    count = stored or in_tier2 or fallback
    if count is None:
        raise RecoveryError("neither the metadata store nor tier-2 records the container "
                            "count: give it (container_count)")
    if fallback is not None and fallback != count:
        raise RecoveryError(f"asked for {fallback} containers; the cluster has {count}")
    return count


async def _probe(client: Client, config: SegmentStoreConfig) -> None:
    """Write one entry to a ledger as the containers' logs will, and delete
    it: a cluster that cannot take the logs fails here, before any is made."""
    options = config.tier1
    handle = await client.create_ledger(options.ensemble_size, options.write_quorum_size,
                                        options.ack_quorum_size,
                                        ledger_type=options.ledger_type,
                                        digest_type=options.digest_type,
                                        password=config.tier1_passwords)
    try:
        await handle.append(b"quire recovery probe")
    finally:
        await handle.close()
        await client.delete_ledger(handle.ledger_id)


async def _log_exists(catalog: LogCatalog, name: str) -> bool:
    try:
        await catalog.read_head(name)
    except LogNotFoundError:
        return False
    return True


def _highest_epoch(chunks: list[ChunkInfo]) -> int:
    """The highest epoch any chunk name carries (journal chunks included)."""
    highest = 0
    for info in chunks:
        try:
            highest = max(highest, parse_chunk_name(info.name)[1])
        except InvalidChunkNameError:
            continue
    return highest


async def _plan(container_id: int, records: StorageRecords, storage: ChunkStorage,
                count: int, clock: Clock) -> _Plan:
    """The container's segments as tier-2 records them."""
    layouts, owners = records.layouts, records.owners
    metadata = ContainerMetadata(container_id)
    plan = _Plan(container_id, records, metadata)
    now = clock.wall_ms()
    reads: list[Coroutine[Any, Any, None]] = []
    limit = asyncio.Semaphore(_READS_IN_FLIGHT)
    for name, layout in sorted(layouts.items()):
        if name not in owners or layout.deleted:
            continue
        if name.endswith((ATTRIBUTES_SUFFIX, INDEX_SUFFIX)):
            base = name.removesuffix(ATTRIBUTES_SUFFIX).removesuffix(INDEX_SUFFIX)
            data = layouts.get(base)
            if data is None or data.deleted or owners.get(base) != owners[name]:
                plan.dangling.append(name)
            continue
        if container_of(name, count) != container_id:
            for read in reads:
                read.close()  # never started
            raise RecoveryError(f"container {container_id} records {name!r}, which belongs to "
                                f"container {container_of(name, count)} of {count}: is the "
                                "container count right?")
        attribute_layout = layouts.get(name + ATTRIBUTES_SUFFIX)
        segment_type = _segment_type(name, records)
        s = SegmentMetadata(owners[name], name, segment_type, length=layout.length,
                            start_offset=layout.start_offset, sealed=layout.sealed,
                            storage_length=layout.length, last_modified_ms=now)
        if attribute_layout is not None and not attribute_layout.deleted \
                and owners.get(name + ATTRIBUTES_SUFFIX) == owners[name]:
            reads.append(_fold_attributes(storage, attribute_layout, s, limit))
        plan.segments.append(s)
        metadata.segments[s.segment_id] = s
        metadata.by_name[name] = s.segment_id
    await asyncio.gather(*reads)
    meta_id = max(owners.values(), default=0) + 1
    table = storage_metadata_name(container_id)
    table_layout = layouts.get(table)
    if table_layout is not None:
        s = SegmentMetadata(meta_id, table, SegmentType.TABLE, length=table_layout.length,
                            start_offset=table_layout.start_offset,
                            storage_length=table_layout.length, last_modified_ms=now)
        metadata.segments[meta_id] = s
        metadata.by_name[table] = meta_id
    metadata.next_segment_id = meta_id + 1
    metadata.sequence = SEED_SEQUENCE - 1
    return plan


async def _fold_attributes(storage: ChunkStorage, layout: SegmentLayout,
                           segment: SegmentMetadata, limit: asyncio.Semaphore) -> None:
    """The segment's attributes: its ``$attributes`` batches, in order."""
    async with limit:
        data = await _read_all(storage, layout)
    for batch in decode_attribute_batches(data):
        segment.attributes.update(batch.values)


def _segment_type(name: str, records: StorageRecords) -> SegmentType:
    """The type tier-2 records for ``name``; for a record without one (0),
    TABLE if it has an ``$index`` segment, else STREAM."""
    try:
        return SegmentType(records.types.get(name, 0))
    except ValueError:
        return SegmentType.TABLE if name + INDEX_SUFFIX in records.layouts \
            else SegmentType.STREAM


async def _read_all(storage: ChunkStorage, layout: SegmentLayout) -> bytes:
    """An ``$attributes``/``$index`` segment's batches from its start offset
    (the storage writer truncates one before a whole batch of its values)."""
    return await read_segment(storage, layout, layout.start_offset,
                              layout.length - layout.start_offset)


def _seed_records(metadata: ContainerMetadata, max_frame_bytes: int,
                  now_ms: int) -> list[bytes]:
    """The tier-1 records holding the seed checkpoint (one frame, or part frames)."""
    raw = encode(CheckpointOp(SEED_SEQUENCE, now_ms, metadata.checkpoint()))
    framed = frames.framed(raw)
    if frames.FRAME_OVERHEAD + len(framed) <= max_frame_bytes:
        return [frames.join(1, [framed])]
    return frames.split(raw, max_frame_bytes)


async def _rebuild(client: Client, catalog: LogCatalog, storage: ChunkStorage, plan: _Plan,
                   floor: int, config: SegmentStoreConfig, clock: Clock) -> RecoveredContainer:
    cid = plan.container_id
    name = container_log_name(cid)
    await catalog.create(name, epoch=floor)
    log = NamedDataLog(client, name, password=config.tier1_passwords, options=config.tier1)
    await log.initialize()
    try:
        if plan.metadata.segments:
            for record in _seed_records(plan.metadata, config.container.max_frame_bytes,
                                        clock.wall_ms()):
                await log.append(record)
    finally:
        await log.close()
    records = plan.records
    reader = Tier2Reader(storage, dict(records.layouts), dict(records.owners))
    container = await SegmentContainer.open(cid, NamedDataLog(
        client, name, password=config.tier1_passwords, options=config.tier1), config.container,
        clock=clock, tier2_read=reader.read)
    try:
        epoch = container.epoch
        for want in plan.segments:
            got = container.committed.get(want.name)
            if got is None or (got.segment_id, got.type, got.length, got.start_offset,
                               got.sealed, got.attributes) != (
                    want.segment_id, want.type, want.length, want.start_offset, want.sealed,
                    want.attributes):
                raise RecoveryError(f"container {cid}: {want.name!r} did not come back as "
                                    "recorded")
        mismatches = [want.name for want in plan.segments
                      if want.type is SegmentType.TABLE and not await _index_agrees(
                          storage, records, want, container)]
    finally:
        await container.close()
    return RecoveredContainer(
        cid, epoch, len(plan.segments),
        sum(1 for s in plan.segments if s.type is SegmentType.TABLE),
        sum(s.length - s.start_offset for s in plan.segments), tuple(plan.dangling),
        tuple(mismatches))


async def _index_agrees(storage: ChunkStorage, records: StorageRecords, table: SegmentMetadata,
                        container: SegmentContainer) -> bool:
    """Whether the table's ``$index`` in tier-2 (its batches folded, as of
    their last ``indexed_length`` L) agrees with the index the container
    rebuilt from the table's data: every live key at a version below L has
    that version in the ``$index``, and no key the ``$index`` holds is at
    another version below L.  A table without an ``$index`` record is not
    compared (a compacted table's copied entries keep their versions)."""
    name = table.name + INDEX_SUFFIX
    layout = records.layouts.get(name)
    if layout is None or layout.deleted or records.owners.get(name) != table.segment_id:
        return True
    indexed = 0
    folded: dict[bytes, int] = {}
    for batch in decode_index_batches(await _read_all(storage, layout)):
        for key, version in batch.versions:
            if version < 0:
                folded.pop(key, None)
            else:
                folded[key] = version
        indexed = batch.indexed_length
    rebuilt = container.tables.committed.get(table.segment_id)
    entries = {} if rebuilt is None else {k: v[0] for k, v in rebuilt.entries.items()}
    if any(version < indexed and folded.get(key) != version
           for key, version in entries.items()):
        return False
    return all(key not in entries or entries[key] == version or entries[key] >= indexed
               for key, version in folded.items())


def _orphans(chunks: list[ChunkInfo], recorded: dict[int, StorageRecords]) -> list[ChunkInfo]:
    """The chunks that no record of any container names."""
    named = {CONTAINER_COUNT_CHUNK}
    journals = tuple(journal_name(cid) + ".E" for cid in recorded)
    for records in recorded.values():
        for layout in records.layouts.values():
            named.update(c.name for c in layout.chunks)
            named.update(sidecar_name(c.name) for c in layout.chunks)
    return [info for info in chunks
            if info.name not in named and not info.name.startswith(journals)]
