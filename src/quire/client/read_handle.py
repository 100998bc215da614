"""Reading a ledger: :class:`ReadHandle`.

Terms as in BookKeeper.  A ledger's metadata lists its *fragments*: from
entry ``first`` on, entries are stored on one *ensemble* of ``E`` bookies;
entry ``e`` goes to its *write set*, ``W`` of them (see
:mod:`quire.client.placement`), and is *acknowledged* once ``A`` (the ack
quorum) of those answered OK.  The *LAC* (LastAddConfirmed) is the highest
entry such that it and every entry before it are acknowledged; it travels
piggy-backed in every stored entry's header and, for an idle writer, in
explicit WRITE_LAC requests.  The writer is
:class:`~quire.client.write_handle.WriteHandle`, a ReadHandle too.
"""

from __future__ import annotations

import asyncio
import bisect

from quire.client.batch_reads import batch_read
from quire.client.context import ClientContext
from quire.client.placement import write_set_bookies
from quire.client.reads import LedgerEntry, read_range
from quire.errors import (
    EXPLICIT_NEGATIVES,
    BookieUnavailableError,
    ClientTimeoutError,
    EntryNotAvailableError,
    NoSuchEntryError,
    QuireError,
    ReadBeyondLastAddConfirmedError,
)
from quire.metadata import LedgerMetadata, Versioned, Watch
from quire.protocol import DigestManager, LedgerKeys
from quire.types import NO_ENTRY, LedgerState


class ReadHandle:
    """Reads of one ledger (BookKeeper's read-only LedgerHandle).

    For a ledger that is not closed the handle follows its metadata (a
    watch), so reads find the fragments of later ensemble changes; its LAC is
    what :meth:`read_last_add_confirmed` last learnt (-1 until then).  For a
    closed ledger the LAC is its last entry id.
    """

    def __init__(self, ctx: ClientContext, ledger_id: int,
                 versioned: Versioned[LedgerMetadata], keys: LedgerKeys, *,
                 follow: bool = True) -> None:
        md = versioned.value
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._digest = DigestManager.of_keys(ledger_id, md.digest_type, keys)
        self._keys = keys
        self._master_key = keys.master_key
        self._versioned = versioned
        self._firsts: list[int] = []
        self._lac = NO_ENTRY
        self._watch: Watch | None = None
        self._follows_metadata = follow
        self._apply_metadata(versioned)
        if follow and md.state is not LedgerState.CLOSED:
            self._watch = ctx.store.watch_ledger(ledger_id, self._on_metadata_change)

    # --- properties ---------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this handle last saw it."""
        return self._versioned.value

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry known to be acknowledged, with all before it (-1: none)."""
        return self._lac

    @property
    def is_closed(self) -> bool:
        """True once the ledger's metadata says CLOSED."""
        return self._versioned.value.state is LedgerState.CLOSED

    # --- metadata -----------------------------------------------------------

    def _apply_metadata(self, versioned: Versioned[LedgerMetadata]) -> None:
        self._versioned = versioned
        md = versioned.value
        self._firsts = [first for first, _ in md.ensembles]
        if md.state is LedgerState.CLOSED:
            self._lac = md.last_entry_id
            self._stop_watch()

    def _on_metadata_change(self, versioned: Versioned[LedgerMetadata] | None) -> None:
        if versioned is not None and versioned.version > self._versioned.version:
            self._apply_metadata(versioned)

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def _refresh_metadata(self) -> bool:
        """Re-read the metadata; True if it changed."""
        before = self._versioned.version
        self._on_metadata_change(await self._ctx.store.read_ledger(self._ledger_id))
        return self._versioned.version != before

    # --- reads --------------------------------------------------------------

    def _replicas(self, entry_id: int) -> tuple[str, ...]:
        """Entry ``entry_id``'s write set, healthy bookies first."""
        index = bisect.bisect_right(self._firsts, entry_id) - 1
        if index < 0:
            raise ValueError(f"ledger {self._ledger_id} has no fragment for entry {entry_id}")
        md = self._versioned.value
        return self._ctx.pool.order_for_reads(
            write_set_bookies(md.ensembles[index][1], entry_id, md.write_quorum_size))

    def _read_limit(self) -> int:
        return self._lac

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first_entry_id..last_entry_id`` inclusive, in order.

        Refuses (ReadBeyondLastAddConfirmedError) past the LAC, the last entry
        of a closed ledger.  Each entry comes from the first replica of its
        write set that returns a copy whose digest verifies; failing that,
        the error says why: EntryNotAvailableError if any replica's answer was
        unknown, DigestMismatchError if every existing copy is corrupt,
        NoSuchEntryError only if every replica said it has no such entry.
        """
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        limit = self._read_limit()
        if last_entry_id > limit:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self._ledger_id}: entry {last_entry_id} is beyond the "
                + ("last entry" if self.is_closed else "LastAddConfirmed") + f" ({limit})")
        version = self._versioned.version
        try:
            return await self._read_range(first_entry_id, last_entry_id)
        except (NoSuchEntryError, EntryNotAvailableError):
            # a reader of an open ledger may hold metadata older than the
            # fragment it reads: look again before giving up
            if (not self._follows_metadata or self.is_closed
                    or (self._versioned.version == version and not await self._refresh_metadata())):
                raise
        return await self._read_range(first_entry_id, last_entry_id)

    async def read_unconfirmed(self, first_entry_id: int,
                               last_entry_id: int) -> list[LedgerEntry]:
        """BP-14 readUnconfirmed: like :meth:`read` without the LAC check.

        Entries between the LAC and the last pushed entry are not guaranteed
        to exist (BP-14): one may be missing (NoSuchEntryError only when every
        replica said so) or unknown (EntryNotAvailableError)."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        return await self._read_range(first_entry_id, last_entry_id)

    async def batch_read(self, start_entry_id: int, max_count: int,
                         max_size: int) -> list[LedgerEntry]:
        """BP-62: 1 to ``max_count`` entries in order from ``start_entry_id``
        in one request where possible (loose limits: see
        :mod:`quire.client.batch_reads`).  ``max_count <= 0`` means no count
        limit; ``max_size <= 0`` or a huge one is clamped to the frame limit;
        the size is exceeded only by a large first entry.  Every entry is at
        or below the LAC (a closed ledger's last entry); a start beyond it
        raises ReadBeyondLastAddConfirmedError."""
        if start_entry_id < 0:
            raise ValueError(f"bad start entry {start_entry_id}")
        limit = self._read_limit()
        if start_entry_id > limit:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self._ledger_id}: entry {start_entry_id} is beyond the "
                + ("last entry" if self.is_closed else "LastAddConfirmed") + f" ({limit})")
        return await self._batch(start_entry_id, max_count, max_size, limit)

    async def _batch(self, start: int, max_count: int, max_size: int,
                     last_allowed: int) -> list[LedgerEntry]:
        index = bisect.bisect_right(self._firsts, start) - 1
        md = self._versioned.value
        fragment_end = (self._firsts[index + 1] - 1 if index + 1 < len(self._firsts)
                        else last_allowed)
        striped = len(md.ensembles[index][1]) > md.write_quorum_size
        return await batch_read(self._ctx, self._digest, self._replicas, start, max_count,
                                max_size, last_allowed, batchable=not striped,
                                fragment_end=fragment_end)

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        """``read()``'s work: runs of entries by batch reads where possible
        (several batches on the wire), else entry by entry."""
        config = self._ctx.config
        if last == first or not config.batch_read_enabled:
            return await read_range(self._ctx, self._digest, self._replicas, first, last)
        step = config.read_batch_entries
        slots = asyncio.Semaphore(config.max_outstanding_batch_reads)

        async def chunk(low: int, high: int) -> list[LedgerEntry]:
            out: list[LedgerEntry] = []
            async with slots:
                while low <= high:
                    got = await self._batch(low, high - low + 1, 0, high)
                    out.extend(got)
                    low = got[-1].entry_id + 1
            return out

        chunks = await asyncio.gather(*(chunk(low, min(low + step - 1, last))
                                        for low in range(first, last + 1, step)))
        return [entry for part in chunks for entry in part]

    async def read_last_add_confirmed(self) -> int:
        """Ask the current ensemble for the LAC (READ_LAC) and return the
        highest answer (never lower than what the handle knew); a closed
        ledger's is its last entry.  ClientTimeoutError if no bookie answered
        in time, BookieUnavailableError if none could answer."""
        md = self._versioned.value
        if md.state is LedgerState.CLOSED:
            return self._lac
        answers = await asyncio.gather(*(self._read_lac_from(b) for b in md.last_ensemble))
        known = [lac for lac in answers if isinstance(lac, int)]
        if not known:
            failures = [a for a in answers if isinstance(a, QuireError)]
            kind = ClientTimeoutError if failures and all(
                isinstance(f, ClientTimeoutError) for f in failures) else BookieUnavailableError
            raise kind(f"ledger {self._ledger_id}: no bookie of {', '.join(md.last_ensemble)} "
                       f"answered READ_LAC ({'; '.join(str(f) for f in failures)})")
        if not self.is_closed:
            # a fragment starts at LAC+1 of the writer that made it
            self._lac = max(self._lac, *known, md.ensembles[-1][0] - 1)
        return self._lac

    async def sync_replicas(self) -> dict[str, int | QuireError]:
        """BP-14 SYNC to the last fragment's ensemble: each bookie fsyncs what
        it holds of the ledger and answers its LastAddSynced (an admin view;
        the writer's own :meth:`WriteHandle.sync` is what moves the LAC)."""
        bookies = self._versioned.value.last_ensemble

        async def one(bookie: str) -> int | QuireError:
            try:
                return await self._ctx.pool.client(bookie).sync(self._ledger_id,
                                                                self._ctx.add_timeout_s)
            except QuireError as e:
                return e

        return dict(zip(bookies, await asyncio.gather(*(one(b) for b in bookies)), strict=True))

    async def _read_lac_from(self, bookie: str) -> int | QuireError:
        """The bookie's LAC, or why it gave none."""
        try:
            return await self._ctx.pool.client(bookie).read_lac(self._ledger_id,
                                                                self._ctx.read_timeout_s)
        except EXPLICIT_NEGATIVES:
            return NO_ENTRY  # the bookie holds nothing of it yet
        except QuireError as e:
            return e

    async def close(self) -> None:
        """Release the handle (stops following the metadata)."""
        self._stop_watch()

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
