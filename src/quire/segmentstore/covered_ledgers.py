"""Abandoned tier-1 ledgers: kept by disaster recovery, deleted once tier-2 covers them.

Disaster recovery with ``replace_logs`` drops the records of the
containers' old tier-1 logs and leaves their ledgers alone: a surviving
copy may be the only place of what was acknowledged after the last flush.
It records each such ledger in the metadata store
(``segmentstore/abandoned_ledgers/<id>``, with its container:
:func:`record_abandoned`), and :func:`delete_covered` (``quire
segmentstore recover --delete-covered-ledgers``) deletes only those whose
every entry tier-2 already holds, and lists the others with the first
operation it does not.

A container's abandoned ledgers are read in order (opened with recovery,
so a writer that was never stopped can add nothing more) and each
operation is held against what tier-2 records for the container now
(:func:`~quire.segmentstore.tier2_reader.read_records`): segments are
matched by id *and* name (the name from the ledgers' checkpoints and
creations: a recovered container reuses the ids of segments tier-2 never
recorded), and an operation is covered when

* its segment is gone for good: deleted or merged away later in these
  ledgers, or recorded as deleted in tier-2;
* an append's bytes are in tier-2 (its recorded length reaches its end, or
  its start offset passed it), and for an append or an attribute update,
  each attribute it sets has, in tier-2, the last value these ledgers give it;
* a creation's segment is recorded; a seal is recorded sealed; a truncation
  is recorded at or past its offset; a deletion leaves no live record; a
  merge's bytes are in its target;
* a checkpoint or an ownership probe (nothing a client was told).

A ledger that cannot be read now (its bookies down) is kept and said so.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client, Password
from quire.errors import MetadataExistsError, MetadataNotFoundError, QuireError
from quire.log import Position
from quire.metadata import MetadataStore
from quire.segmentstore.metadata import ContainerMetadata
from quire.segmentstore.names import ATTRIBUTES_SUFFIX
from quire.segmentstore.operation_log import operations_of
from quire.segmentstore.operations import (
    AppendOp,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    ProbeOp,
    SealOp,
    SegmentMapOp,
    TruncateOp,
)
from quire.segmentstore.storage_records import decode_attribute_batches
from quire.segmentstore.store import tier1_passwords
from quire.segmentstore.tier2_reader import StorageRecords, read_records
from quire.tier2 import ChunkStorage, Tier2Config, open_chunk_storage, read_segment

ABANDONED_PREFIX = "segmentstore/abandoned_ledgers/"
_READ_BATCH = 64


async def record_abandoned(metadata: MetadataStore, container_id: int,
                           ledger_ids: Iterable[int]) -> None:
    """Remember that ``ledger_ids`` were container ``container_id``'s tier-1
    ledgers, abandoned by disaster recovery."""
    for ledger_id in ledger_ids:
        try:
            await metadata.create_record(f"{ABANDONED_PREFIX}{ledger_id}",
                                         json.dumps({"container": container_id}).encode())
        except MetadataExistsError:
            continue  # recorded by a recovery run before


async def abandoned_ledgers(metadata: MetadataStore) -> dict[int, list[int]]:
    """Container id -> its recorded abandoned ledgers, in creation order."""
    found: dict[int, list[int]] = {}
    for key in await metadata.list_records(ABANDONED_PREFIX):
        try:
            value = json.loads((await metadata.read_record(key)).value)
        except MetadataNotFoundError:
            continue
        found.setdefault(int(value["container"]), []).append(int(key[len(ABANDONED_PREFIX):]))
    return {cid: sorted(ids) for cid, ids in sorted(found.items())}


@dataclass(frozen=True)
class KeptLedger:
    ledger_id: int
    container_id: int
    reason: str
    """The first thing tier-2 does not hold, or why the ledger was not read."""


@dataclass
class CoverageReport:
    deleted: list[int] = field(default_factory=list)
    kept: list[KeptLedger] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"deleted": self.deleted,
                "kept": [{"ledger": k.ledger_id, "container": k.container_id,
                          "reason": k.reason} for k in self.kept]}


class _Coverage:
    """One container's abandoned ledgers held against tier-2 (module docstring)."""

    def __init__(self, records: StorageRecords, attributes: dict[str, dict[int, int]]) -> None:
        self.records = records
        self.tier2_attributes = attributes
        self.names: dict[int, str] = {}
        self.gone: set[int] = set()
        self.last_values: dict[int, dict[int, int]] = {}

    def learn(self, op: Operation) -> None:
        """Pass one: names, what goes for good, each attribute's last value."""
        if isinstance(op, CheckpointOp):
            for s in ContainerMetadata.restore(op.checkpoint).segments.values():
                self.names[s.segment_id] = s.name
        elif isinstance(op, SegmentMapOp):
            self.names[op.segment_id] = op.name
        elif isinstance(op, DeleteOp):
            self.gone.add(op.segment_id)
        elif isinstance(op, MergeOp):
            self.gone.add(op.source_id)
        if isinstance(op, AppendOp | AttributesOp):
            self.last_values.setdefault(op.segment_id, {}).update(op.attributes)

    def uncovered(self, op: Operation) -> str | None:
        """Pass two: what of ``op`` tier-2 does not hold (None: all of it)."""
        if isinstance(op, CheckpointOp | ProbeOp):
            return None
        sid = op.target_id if isinstance(op, MergeOp) else op.segment_id
        if sid in self.gone:
            return None
        name = self.names.get(sid)
        layout = None if name is None else self.records.layouts.get(name)
        owner = self.records.owners.get(name or "", sid)  # (the journal's layouts have none)
        if layout is not None and owner != sid:
            layout = None
        if isinstance(op, DeleteOp):
            return None if layout is None or layout.deleted else f"the deletion of {name!r}"
        if layout is not None and layout.deleted:
            return None
        if layout is None:
            return f"segment {name or sid!r} (id {sid}), which tier-2 does not record"
        if isinstance(op, AppendOp):
            end = op.offset + len(op.data)
            if layout.length < end and layout.start_offset < end:
                return f"{name!r} bytes {op.offset}..{end} (tier-2 holds {layout.length})"
        if isinstance(op, AppendOp | AttributesOp) and op.attributes:
            recorded = self.tier2_attributes.get(name or "", {})
            last = self.last_values.get(sid, {})
            for key, _value in op.attributes:
                if recorded.get(key) != last[key]:
                    return f"{name!r} attribute {key:#x} = {last[key]}"
        if isinstance(op, SealOp) and not layout.sealed:
            return f"the seal of {name!r}"
        if isinstance(op, TruncateOp) and layout.start_offset < op.start_offset:
            return f"the truncation of {name!r} at {op.start_offset}"
        if isinstance(op, MergeOp) and layout.length < op.target_offset + op.length:
            return f"a merge into {name!r} ending at {op.target_offset + op.length}"
        return None


async def _tier2_attributes(storage: ChunkStorage, records: StorageRecords
                            ) -> dict[str, dict[int, int]]:
    """Each data segment's attributes as tier-2's ``$attributes`` batches fold."""
    out: dict[str, dict[int, int]] = {}
    for name, layout in records.layouts.items():
        if name.endswith(ATTRIBUTES_SUFFIX) and not layout.deleted:
            data = await read_segment(storage, layout, layout.start_offset,
                                      layout.length - layout.start_offset)
            folded: dict[int, int] = {}
            for batch in decode_attribute_batches(data):
                folded.update(batch.values)
            out[name[:-len(ATTRIBUTES_SUFFIX)]] = folded
    return out


async def _entries(client: Client, ledger_ids: list[int], passwords: Password
                   ) -> AsyncIterator[tuple[Position, bytes]]:
    """The ledgers' entries one after another (opened with recovery)."""
    for seq, ledger_id in enumerate(ledger_ids):
        handle = await client.open_ledger(ledger_id, password=passwords, recovery=True)
        last = handle.last_add_confirmed
        for first in range(0, last + 1, _READ_BATCH):
            for entry in await handle.read(first, min(first + _READ_BATCH - 1, last)):
                yield Position(seq, entry.entry_id), entry.data


async def delete_covered(client: Client, tier2: str | Tier2Config, *,
                         passwords: Password | None = None,
                         dry_run: bool = False) -> CoverageReport:
    """Delete the recorded abandoned ledgers whose every entry tier-2 holds
    (with ``dry_run`` only say which); report those deleted and those kept.
    ``passwords``: the tier-1 ledgers' (the segment stores'
    :func:`~quire.segmentstore.store.tier1_passwords`; None: the built-in one)."""
    if passwords is None:
        passwords = tier1_passwords(None)
    report = CoverageReport()
    metadata = client.metadata_store
    storage = await open_chunk_storage(Tier2Config(uri=tier2) if isinstance(tier2, str)
                                       else tier2)
    try:
        for cid, ledger_ids in (await abandoned_ledgers(metadata)).items():
            records = await read_records(storage, cid)
            coverage = _Coverage(records, await _tier2_attributes(storage, records))
            try:
                async for _address, ops in operations_of(_entries(client, ledger_ids, passwords)):
                    for op in ops:
                        coverage.learn(op)
                reasons: dict[int, str] = {}
                async for address, ops in operations_of(_entries(client, ledger_ids, passwords)):
                    for op in ops:
                        reason = coverage.uncovered(op)
                        if reason is not None:
                            reasons.setdefault(ledger_ids[address.ledger_seq], reason)
            except (QuireError, OSError) as e:
                report.kept += [KeptLedger(lid, cid, f"not read: {e}") for lid in ledger_ids]
                continue
            for lid in ledger_ids:
                if lid in reasons:
                    report.kept.append(KeptLedger(lid, cid, f"tier-2 lacks {reasons[lid]}"))
                    continue
                if not dry_run:
                    with contextlib.suppress(MetadataNotFoundError):  # deleted already
                        await client.delete_ledger(lid)
                    await metadata.delete_record(f"{ABANDONED_PREFIX}{lid}")
                report.deleted.append(lid)
    finally:
        await storage.close()
    return report
