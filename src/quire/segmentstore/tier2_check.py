"""PDP-40's consistency check over tier-2 alone.

PDP-40 calls a flush *consistent* when every recovered offset (an offset
recorded in container metadata or an index, as found in tier-2) is a
*guaranteed offset* (its data is in tier-2), and every offset between a
segment's minimum and maximum recovered length is one too (no gaps).

:func:`check` reads every container's system journal and storage-metadata
table from tier-2 (nothing from tier-1) and reports, as
:class:`Violation` values:

* a recorded layout whose chunk is missing or shorter than recorded (bytes
  between the segment's start offset and its recorded length that cannot
  be found);
* an ``$attributes`` batch whose footer (the data segment's length the
  values belong to) is past the data segment's recorded length in tier-2;
* an ``$index`` batch indexed past its table's recorded length, or a key
  version (an entry's offset) at or past it;
* a chunk of a stream segment without its sidecar, or with one that does not
  fit it (:func:`~quire.segmentstore.chunk_sidecars.sidecar_problem`).

Checking a live tier-2 races the writer (a chunk it just replaced may
vanish between the listing and the read): check a stopped or killed
owner's tier-2, as recovery does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quire.errors import SegmentTruncatedError
from quire.segmentstore.chunk_sidecars import has_sidecars, read_sidecar, sidecar_problem
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX
from quire.segmentstore.storage_records import decode_attribute_batches, decode_index_batches
from quire.segmentstore.tier2_reader import journal_containers, read_records
from quire.tier2 import ChunkStorage, SegmentLayout, Tier2Config, open_chunk_storage, read_segment


@dataclass(frozen=True)
class Violation:
    """One recovered offset that is not a guaranteed offset."""

    container_id: int
    segment: str
    recorded_offset: int
    """The offset tier-2's metadata or an index records."""
    guaranteed_length: int
    """How far the data it points into is actually in tier-2."""
    reason: str

    def __str__(self) -> str:
        return (f"container {self.container_id}: {self.segment}: recorded offset "
                f"{self.recorded_offset}, guaranteed up to {self.guaranteed_length}: "
                f"{self.reason}")


async def check(tier2: ChunkStorage | Tier2Config | str, *,
                container_ids: Iterable[int] | None = None) -> list[Violation]:
    """Every violation of PDP-40's consistency in ``tier2`` (a storage, or a
    URI/config to open and close here); empty when consistent.  Checks every
    container with a system journal, or those of ``container_ids``."""
    if isinstance(tier2, str | Tier2Config):
        storage = await open_chunk_storage(tier2)
        try:
            return await check(storage, container_ids=container_ids)
        finally:
            await storage.close()
    violations: list[Violation] = []
    chunk_lengths = {info.name: info.length for info in await tier2.list_chunks("")}
    ids = await journal_containers(tier2) if container_ids is None else sorted(container_ids)
    for container_id in ids:
        records = await read_records(tier2, container_id)
        layouts = records.layouts
        guaranteed = {name: _guaranteed_length(layout, chunk_lengths)
                      for name, layout in layouts.items()}
        for name, layout in sorted(layouts.items()):
            if guaranteed[name] < layout.length:
                violations.append(Violation(container_id, name, layout.length,
                                            guaranteed[name], "a recorded chunk is missing "
                                            "or short"))
        for name, layout in sorted(layouts.items()):
            if layout.deleted or guaranteed[name] < layout.length:
                continue
            if has_sidecars(name, records.types.get(name, 0)):
                await _check_sidecars(tier2, container_id, layout, violations)
            if name.endswith(ATTRIBUTES_SUFFIX):
                data = name[:-len(ATTRIBUTES_SUFFIX)]
                await _check_attributes(tier2, container_id, layout, data,
                                        _data_length(layouts, guaranteed, data), violations)
            elif name.endswith(INDEX_SUFFIX):
                data = name[:-len(INDEX_SUFFIX)]
                await _check_index(tier2, container_id, layout, data,
                                   _data_length(layouts, guaranteed, data), violations)
    return violations


def _guaranteed_length(layout: SegmentLayout, chunk_lengths: dict[str, int]) -> int:
    """The end of the prefix of ``layout`` (from its start offset) whose
    chunks are all in tier-2 whole."""
    for chunk in layout.chunks:
        if chunk_lengths.get(chunk.name, -1) < chunk.length:
            return max(chunk.offset, layout.start_offset)
    return layout.length


def _data_length(layouts: dict[str, SegmentLayout], guaranteed: dict[str, int],
                 name: str) -> int:
    layout = layouts.get(name)
    if layout is None:
        return 0
    return layout.length if layout.deleted else guaranteed[name]


async def _read_all(storage: ChunkStorage, layout: SegmentLayout) -> bytes | None:
    """The batches from the start offset (a rewrite truncates before a whole batch)."""
    try:
        return await read_segment(storage, layout, layout.start_offset,
                                  layout.length - layout.start_offset)
    except SegmentTruncatedError:
        return None  # vanished since the listing: reported as missing above or racing


async def _check_attributes(storage: ChunkStorage, container_id: int, layout: SegmentLayout,
                            data: str, data_length: int, out: list[Violation]) -> None:
    raw = await _read_all(storage, layout)
    if raw is None:
        return
    for batch in decode_attribute_batches(raw):
        if batch.data_length > data_length:
            out.append(Violation(container_id, layout.segment, batch.data_length, data_length,
                                 f"attributes recorded at a length of {data} that tier-2 "
                                 "does not hold"))


async def _check_index(storage: ChunkStorage, container_id: int, layout: SegmentLayout,
                       data: str, data_length: int, out: list[Violation]) -> None:
    raw = await _read_all(storage, layout)
    if raw is None:
        return
    for batch in decode_index_batches(raw):
        if batch.indexed_length > data_length:
            out.append(Violation(container_id, layout.segment, batch.indexed_length,
                                 data_length, f"indexed past the length of {data} that "
                                 "tier-2 holds"))
        for key, version in batch.versions:
            if version >= data_length:
                out.append(Violation(container_id, layout.segment, version, data_length,
                                     f"key {key!r} at an offset of {data} that tier-2 does "
                                     "not hold"))


async def _check_sidecars(storage: ChunkStorage, container_id: int, layout: SegmentLayout,
                          out: list[Violation]) -> None:
    sidecars = [await read_sidecar(storage, chunk.name) for chunk in layout.chunks]
    problem = sidecar_problem(layout, sidecars)
    if problem:
        out.append(Violation(container_id, layout.segment, layout.start_offset,
                             layout.start_offset, problem))
