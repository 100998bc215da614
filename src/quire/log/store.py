"""Named logs over ledgers: :class:`LogStore`.

A *log* is a name and an ordered list of ledgers, kept in the metadata store
(the model of DistributedLog and of Pravega's tier-1 durable log); the record
layout is in :mod:`quire.log.records`, and every change to it is one
conditional transaction of :mod:`quire.log.catalog`:

* a :class:`~quire.log.LogWriter` adds one ledger at a time (a *roll*);
* :meth:`LogStore.bulk_append` adds a batch of closed ledgers at once (and
  may replace the existing ones);
* :meth:`LogStore.truncate` removes whole ledgers from the front.

Ledgers are deleted from the bookies only *after* the transaction that took
them out of the log committed, so a reader never finds a listed ledger
missing except after a truncation or an overwrite, which it can tell from
the head's ``truncated_before``.

Write jobs (many processes writing ledgers for one log and publishing them
together) are :class:`~quire.log.jobs.LogJobs`, on top of this store.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Any

from quire.client import Client, Password, keys_for
from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import UnauthorizedError
from quire.log.catalog import ClosedLedger, LogCatalog, LogInfo
from quire.log.errors import LogNotFoundError
from quire.log.ledgers import delete_ledgers
from quire.log.position import Position
from quire.log.reader import LogReader
from quire.log.records import HeadRecord, LedgerRecord
from quire.log.writer import LogWriter, WriterOptions
from quire.metadata import MetadataStore, Op, Versioned
from quire.types import LedgerState


class LogStore:
    """Named logs on one Quire cluster, over a connected :class:`~quire.Client`.

    ``password`` is the password of every ledger the store writes, and the
    one it opens ledgers with: all ledgers of a log share it (bulk-appended
    ledgers must have it too).  Use the store on the client's event loop.
    Many ``LogStore`` s in many processes may work on the same logs: every
    change is a compare-and-set transaction in the metadata store.
    """

    def __init__(self, client: Client, *, password: Password = b"",
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._client = client
        self._password = password
        self._catalog = LogCatalog(client.metadata_store, clock=clock)

    @property
    def client(self) -> Client:
        return self._client

    @property
    def catalog(self) -> LogCatalog:
        """The logs' metadata records (see :mod:`quire.log.catalog`)."""
        return self._catalog

    @property
    def metadata_store(self) -> MetadataStore:
        return self._client.metadata_store

    @property
    def password(self) -> Password:
        return self._password

    @property
    def clock(self) -> Clock:
        """The wall clock that stamps the logs' records (the system clock unless given)."""
        return self._catalog.clock

    # --- logs ------------------------------------------------------------------

    async def create(self, name: str, *, exist_ok: bool = False) -> bool:
        """Create an empty log; True if this call created it.  LogExistsError
        if it exists (unless ``exist_ok``: then False).  ValueError for a bad
        name (see ``records.check_name``)."""
        return await self._catalog.create(name, exist_ok=exist_ok)

    async def exists(self, name: str) -> bool:
        try:
            await self._catalog.read_head(name)
        except LogNotFoundError:
            return False
        return True

    async def read_head(self, name: str) -> Versioned[HeadRecord]:
        """The log's head and its version; LogNotFoundError if there is no such log."""
        return await self._catalog.read_head(name)

    async def ledger_records(self, name: str, *,
                             from_seq: int = 0) -> builtins.list[Versioned[LedgerRecord]]:
        """The log's ledger records with seq >= ``from_seq``, in seq order, each
        with its version (records removed while listing are left out)."""
        return await self._catalog.ledger_records(name, from_seq=from_seq)

    async def info(self, name: str, *, from_seq: int = 0) -> LogInfo:
        """A snapshot of the log: head and ledgers (those with seq >=
        ``from_seq``) as of one head version (the listing is repeated while
        the head changes under it)."""
        return await self._catalog.info(name, from_seq=from_seq)

    async def list(self) -> builtins.list[str]:
        """The names of every log, sorted."""
        return await self._catalog.names()

    async def delete(self, name: str) -> None:
        """Delete the log: its records in one transaction, then its ledgers
        (the log's, and those of unfinished jobs).  LogBusyError while a
        writer holds it; LogNotFoundError if there is no such log."""
        await self.delete_ledgers(await self._catalog.remove(name))

    # --- writers and readers -------------------------------------------------------

    async def open_writer(self, name: str, **options: Any) -> LogWriter:
        """Become the log's only writer (creating the log if needed, unless
        ``create=False``).

        Bumps the log's epoch in the head (compare-and-set) and takes the
        writer hold, then recovers every ledger of the log still open (fences
        it, closes it at its last recoverable entry), so the previous writer
        can add nothing more and gets LogFencedError.  ``options`` are the
        fields of :class:`~quire.log.WriterOptions` (``roll_bytes``,
        ``roll_age_ms``, quorum sizes, ledger and digest type).
        """
        return await LogWriter.open(self._catalog, self._client, name,
                                    WriterOptions(**options), password=self._password)

    async def open_reader(self, name: str, from_position: Position | None = None, *,
                          follow: bool = True, skip_truncated: bool = False,
                          poll_max_ms: int = 200) -> LogReader:
        """A reader of the log from ``from_position`` on (the first entry at or
        after it; None: the earliest entry still in the log).  ``follow``: wait
        at the tail for new entries (else the reader stops at the end it
        finds).  A position removed by truncation raises LogTruncatedError on
        read, unless ``skip_truncated`` (then the reader jumps to the first
        entry still there)."""
        head = await self._catalog.read_head(name)  # LogNotFoundError now, not on read
        if from_position is None:
            from_position = head.value.truncated_before
        return LogReader(self._catalog, self._client, name, from_position,
                         password=self._password, follow=follow,
                         skip_truncated=skip_truncated, poll_max_ms=poll_max_ms)

    async def recover(self, name: str) -> None:
        """Fence out whatever writer holds the log (one that died, say), close
        its ledger at its last recoverable entry and release the hold."""
        writer = await self.open_writer(name, create=False)
        await writer.close()

    # --- truncation --------------------------------------------------------------

    async def truncate(self, name: str, before: Position) -> builtins.list[int]:
        """Remove every ledger entirely below ``before`` (closed ledgers with a
        lower seq, and the ledger ``before.ledger_seq`` if it is closed and
        ``before`` is at or past its end): their records and the head's
        ``truncated_before`` in one transaction, then the ledgers themselves.
        Entries of a partly covered ledger stay.  Returns the ledger ids removed.
        """
        removed = await self._catalog.remove_front(name, before)
        ids = [r.ledger_id for r in removed]
        await self.delete_ledgers(ids)
        return ids

    # --- bulk append ---------------------------------------------------------------

    async def bulk_append(self, name: str, ledger_ids: Iterable[int], *,
                          extra_ops: Sequence[Op] = (), replace: bool = False,
                          create: bool = False) -> builtins.list[int]:
        """Make already CLOSED ledgers the end of the log, in the given order,
        in one transaction; returns their seqs.

        All or nothing: the head's compare-and-set, one new ledger record per
        ledger and ``extra_ops`` (the caller's own record changes, e.g. a job
        or sink record) commit together or not at all.  If one of
        ``extra_ops`` fails, TransactionError is raised with ``failed_index``
        the index *in extra_ops*; concurrent changes to the log itself are
        retried.  ``replace`` (overwrite): the log's current ledgers leave it in
        the same transaction (``truncated_before`` moves past them) and are
        deleted afterwards.  LogBusyError while a writer holds the log;
        ValueError for a ledger that is not closed, repeated, or has another
        password; ``create`` makes the log if it does not exist.
        """
        ids = builtins.list(ledger_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"bulk_append: repeated ledger ids in {ids}")
        closed = []
        for ledger_id in ids:
            md = (await self.metadata_store.read_ledger(ledger_id)).value
            if md.state is not LedgerState.CLOSED:
                raise ValueError(f"bulk_append: ledger {ledger_id} is {md.state.value}, "
                                 "not CLOSED")
            try:
                keys_for(ledger_id, md, self._password)
            except UnauthorizedError:
                raise ValueError(f"bulk_append: ledger {ledger_id} has another password "
                                 "than this log store's") from None
            closed.append(ClosedLedger(ledger_id, md.last_entry_id + 1, md.length))
        if create:
            await self.create(name, exist_ok=True)
        seqs, removed = await self._catalog.append_closed(name, closed, extra_ops=extra_ops,
                                                          replace=replace)
        if removed:
            await self.delete_ledgers(r.ledger_id for r in removed)
        return seqs

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> builtins.list[int]:
        """Delete ledgers, best effort (one already gone is fine; a failure is
        logged and left for a later garbage collection); returns those deleted."""
        return await delete_ledgers(self._client, ledger_ids)
