"""Copy entries of a ledger from the bookies that hold them to one that lacks them.

One copier for every kind of re-replication: BP-46 repair copies what this
bookie lost into its own storage (:class:`~quire.node.repair.LocalSink`);
autorecovery copies a lost bookie's entries into the bookie that replaces it
(:class:`RemoteSink`).

For each entry the sources are the bookies of its write set (the fragment's
ensemble, striping included) other than the target and the bookies to
avoid (a lost one), tried in turn.  Runs of entries one
source holds are read with BP-62 batch reads, the rest one entry at a time.
Every copy is verified with the ledger's digest (and its ledger and entry
ids) before it is handed to the sink: a corrupted copy is refused and the
next source tried.  Only an answer that carries the entry counts; a
refusal, an UNKNOWN or a timeout from one source just moves on to the next.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quire.client.placement import write_set_bookies
from quire.errors import (
    EXPLICIT_NEGATIVES,
    DigestMismatchError,
    QuireError,
    UnknownStateError,
    UnsupportedError,
)
from quire.metadata import LedgerMetadata
from quire.peer import BookieClient, BookiePool
from quire.protocol import FLAG_RECOVERY_ADD, DigestManager, ReadResponse

log = logging.getLogger("quire.node.copier")

_RECORD_LEN = struct.Struct(">I")
_SOURCE_BLOCK = 256
"""Consecutive entries asked of one source in a round."""
_LACKS: tuple[type[QuireError], ...] = (*EXPLICIT_NEGATIVES, UnknownStateError)
"""Answers that a source does not have an entry (or cannot say): the
copier goes on past it with that source; any other failure ends the
source's turn."""
"""Consecutive entries asked of one source in a round."""


class EntrySink(Protocol):
    """Where copied entries go.

    :meth:`store` keeps each ``(entry_id, entry)`` of the ledger verbatim
    (``entry`` is the stored form, digest included, already verified) under
    ``master_key``, even if the ledger is fenced there, and returns once
    they are all durable.  It raises a :class:`~quire.errors.QuireError` if
    it cannot; then none of them counts as copied."""

    async def store(self, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]]) -> None: ...


@dataclass
class CopyReport:
    """What one :meth:`EntryCopier.copy` did."""

    copied: int = 0
    """Entries verified and stored."""
    refused: int = 0
    """Copies that failed their digest or ids (each tried elsewhere)."""
    unavailable: list[int] = field(default_factory=list)
    """Entries no source could give now (every source refused, lacked the
    entry, or did not answer): copy them again later."""


class EntryCopier:
    """Reads entries from peers, verifies them, stores them through a sink."""

    def __init__(self, pool: BookiePool, *, timeout_ms: int, chunk_max_bytes: int,
                 batch_max_bytes: int) -> None:
        self._pool = pool
        self._timeout_s = timeout_ms / 1000.0
        self._chunk_max_bytes = chunk_max_bytes
        self._batch_max_bytes = batch_max_bytes

    async def copy(self, ledger_id: int, metadata: LedgerMetadata, entry_ids: Sequence[int],
                   sink: EntrySink, *, target: str, avoid: Collection[str] = (),
                   on_stored: Callable[[int], None] | None = None) -> CopyReport:
        """Copy ``entry_ids`` (ascending) of the ledger into ``sink`` (the
        storage of bookie ``target``), a chunk at a time, never reading from
        ``target`` or the bookies in ``avoid``; ``on_stored(count)`` once a
        chunk is stored (durably).  The next chunk is read while one is
        being stored: at most two chunks in memory."""
        excluded = {target, *avoid}
        digest = DigestManager.of_keys(ledger_id, metadata.digest_type, metadata.keys)
        key = metadata.keys.master_key
        report = CopyReport()
        chunks = self._chunks(list(entry_ids))

        def fetch(chunk: list[int]) -> asyncio.Task[dict[int, bytes]]:
            return asyncio.ensure_future(
                self._fetch(ledger_id, metadata, chunk, digest, excluded, report))

        fetching = fetch(chunks[0]) if chunks else None
        try:
            for index, chunk in enumerate(chunks):
                assert fetching is not None
                got = await fetching
                fetching = fetch(chunks[index + 1]) if index + 1 < len(chunks) else None
                if got:
                    entries = sorted(got.items())
                    await sink.store(ledger_id, key, entries)
                    report.copied += len(entries)
                    if on_stored is not None:
                        on_stored(len(entries))
                report.unavailable.extend(e for e in chunk if e not in got)
        finally:
            if fetching is not None and not fetching.done():
                fetching.cancel()
        return report

    def _chunks(self, entry_ids: list[int]) -> list[list[int]]:
        # Chunks bounded by count, with the byte size bounded by the batch
        # reads (entries are not sized before they are read).
        count = max(1, self._chunk_max_bytes // 1024)
        return [entry_ids[i:i + count] for i in range(0, len(entry_ids), count)]

    async def _fetch(self, ledger_id: int, metadata: LedgerMetadata, chunk: list[int],
                     digest: DigestManager, excluded: set[str], report: CopyReport
                     ) -> dict[int, bytes]:
        """Verified copies of the chunk's entries, from each entry's sources
        in turn (round ``r`` asks every entry's ``r``-th source)."""
        # each entry's sources in one order (not the write set's, which turns
        # with the entry id): neighbours then share sources, and runs form
        sources = {e: sorted(b for b in write_set_bookies(metadata.ensemble_at(e), e,
                                                          metadata.write_quorum_size)
                             if b not in excluded)
                   for e in chunk}
        got: dict[int, bytes] = {}
        for round_ in range(metadata.write_quorum_size):
            by_source: dict[str, list[int]] = {}
            for entry_id in chunk:
                if entry_id in got:
                    continue
                candidates = sources[entry_id]
                if round_ < len(candidates):
                    # spread the load over the sources a block of entries at a
                    # time (a source's run of a block is one batch read)
                    source = candidates[(entry_id // _SOURCE_BLOCK + round_) % len(candidates)]
                    by_source.setdefault(source, []).append(entry_id)
            if not by_source:
                break
            answers = await asyncio.gather(*(
                self._from_source(ledger_id, source, ids, digest, report)
                for source, ids in by_source.items()))
            for answer in answers:
                got.update(answer)
        return got

    async def _from_source(self, ledger_id: int, source: str, entry_ids: list[int],
                           digest: DigestManager, report: CopyReport) -> dict[int, bytes]:
        """What ``source`` gives of ``entry_ids`` (ascending), verified:
        batch reads over runs of consecutive ids."""
        got: dict[int, bytes] = {}
        runs: list[list[int]] = []
        for entry_id in entry_ids:
            if runs and runs[-1][-1] + 1 == entry_id:
                runs[-1].append(entry_id)
            else:
                runs.append([entry_id])
        client = self._pool.client(source)
        for run in runs:
            start = 0
            while start < len(run):
                try:
                    entries = await self._read_run(client, ledger_id, run[start], len(run) - start)
                except UnsupportedError:
                    entries = await self._read_one(client, ledger_id, run[start])
                except _LACKS:
                    start += 1  # it lacks this one (or cannot say): go on past it
                    continue
                except QuireError as e:
                    log.debug("ledger %d: %s gave no copy from entry %d: %s",
                              ledger_id, source, run[start], e)
                    break  # not answering: the next round asks another source
                if not entries:
                    start += 1
                    continue
                for offset, entry in enumerate(entries):
                    entry_id = run[start + offset]
                    try:
                        digest.verify(entry, entry_id)
                    except DigestMismatchError as e:
                        report.refused += 1
                        log.warning("ledger %d: refused the copy of entry %d from %s: %s",
                                    ledger_id, entry_id, source, e)
                        continue
                    got[entry_id] = entry
                start += len(entries)
        return got

    async def _read_run(self, client: BookieClient, ledger_id: int, first: int,
                        count: int) -> list[bytes]:
        answer = await client.batch_read(ledger_id, first, count, self._batch_max_bytes,
                                         self._timeout_s)
        records = answer.records
        entries: list[bytes] = []
        pos = 0
        unpack = _RECORD_LEN.unpack_from
        while pos < len(records) and len(entries) < count:
            (length,) = unpack(records, pos)
            pos += 4
            entries.append(records[pos:pos + length])
            pos += length
        return entries

    async def _read_one(self, client: BookieClient, ledger_id: int, entry_id: int
                        ) -> list[bytes]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ReadResponse | QuireError] = loop.create_future()

        def settle(_token: object, result: ReadResponse | QuireError) -> None:
            if not future.done():
                future.set_result(result)

        client.read_entry(ledger_id, entry_id, self._timeout_s, settle, None)
        result = await future
        if isinstance(result, QuireError):
            raise result
        return [] if result.entry is None else [result.entry]


class RemoteSink:
    """:class:`EntrySink` into another bookie: RECOVERY_ADDs (past a fence),
    pipelined; stored once that bookie acknowledged every one (its
    acknowledgement of a recovery add is after its journal fsync)."""

    def __init__(self, pool: BookiePool, bookie_id: str, *, timeout_ms: int) -> None:
        self._client = pool.client(bookie_id)
        self._timeout_s = timeout_ms / 1000.0

    async def store(self, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]]) -> None:
        client, timeout_s = self._client, self._timeout_s
        await asyncio.gather(*(client.add(master_key, entry, FLAG_RECOVERY_ADD, timeout_s)
                               for _entry_id, entry in entries))
