"""The metadata side of named logs: :class:`LogCatalog` and :class:`LogHold`.

A log's head and ledger records (layout in :mod:`quire.log.records`) are
read and changed here, and nowhere else above the metadata store.  Every
change to a log's ledger list is one metadata transaction that includes a
compare-and-set (or a check) of the log's head, so membership changes are
totally ordered and all-or-nothing.  The catalog touches no ledger: deleting
the ledgers a change took out of the log is the caller's next step, after
the transaction committed.

Epochs: :meth:`LogCatalog.take` makes the caller the log's only writer (the
head's epoch goes up by one and the head records the hold) and returns a
:class:`LogHold`.  A hold stays valid while the head names its epoch and
owner; every transaction made through it is conditional on that, and the
first one that finds the head moved to another owner raises
:class:`~quire.log.LogFencedError`.  That is the only way a writer learns it
lost the log.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    TransactionError,
)
from quire.log import records as rec
from quire.log.errors import (
    LogBusyError,
    LogError,
    LogExistsError,
    LogFencedError,
    LogNotFoundError,
)
from quire.log.position import Position
from quire.log.records import HeadRecord, LedgerRecord, WriterHold
from quire.metadata import (
    CheckRecord,
    CreateRecord,
    DeleteRecord,
    MetadataStore,
    Op,
    UpdateRecord,
    Versioned,
)

MAX_ATTEMPTS = 20
"""Compare-and-set retries of one change before it gives up (each retry
means another process changed the log in between)."""


@dataclass(frozen=True)
class LogInfo:
    """A consistent snapshot of one log: its head (with the head record's
    version) and its ledgers in seq order."""

    name: str
    head: HeadRecord
    version: int
    ledgers: tuple[LedgerRecord, ...]

    @property
    def epoch(self) -> int:
        return self.head.epoch

    @property
    def writer_held(self) -> bool:
        """True while a writer holds the log."""
        return self.head.writer is not None

    @property
    def next_seq(self) -> int:
        return self.head.next_seq

    @property
    def truncated_before(self) -> Position:
        return self.head.truncated_before

    @property
    def start(self) -> Position:
        """The first position that may hold an entry (the first ledger's start)."""
        return Position(self.ledgers[0].seq, 0) if self.ledgers else Position(self.next_seq, 0)

    def ledger(self, seq: int) -> LedgerRecord | None:
        """The ledger with this seq, if it is in the log."""
        return next((r for r in self.ledgers if r.seq == seq), None)


@dataclass(frozen=True)
class ClosedLedger:
    """A closed ledger about to join a log: its id, entry count and payload bytes."""

    ledger_id: int
    entries: int
    bytes: int


HeadChange = Callable[[HeadRecord], tuple[HeadRecord | None, list[Op]]]
"""Given the current head: the new head (None: only check its version) and
the other ops of one transaction."""


class LogCatalog:
    """Named logs' records in one :class:`~quire.metadata.MetadataStore`.

    Any number of catalogs in any number of processes may work on the same
    logs: every change is conditional on the head's version and is retried
    (up to :data:`MAX_ATTEMPTS` times) when another process got there first.
    ``clock`` stamps the records (wall time).
    """

    def __init__(self, store: MetadataStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock

    @property
    def store(self) -> MetadataStore:
        return self._store

    @property
    def clock(self) -> Clock:
        """The wall clock that stamps the records."""
        return self._clock

    # --- reading -------------------------------------------------------------------

    async def read_head(self, name: str) -> Versioned[HeadRecord]:
        """The log's head and its version; LogNotFoundError if there is no such log."""
        try:
            found = await self._store.read_record(rec.head_key(name))
        except MetadataNotFoundError:
            raise LogNotFoundError(f"no log named {name!r}") from None
        return Versioned(rec.decode_head(found.value), found.version)

    async def ledger_records(self, name: str, *,
                             from_seq: int = 0) -> list[Versioned[LedgerRecord]]:
        """The log's ledger records with seq >= ``from_seq``, in seq order, each
        with its version (records removed while listing are left out)."""
        found = []
        for key in await self._store.list_records(rec.ledgers_prefix(name)):
            seq = rec.seq_of_ledger_key(name, key)
            if seq is None or seq < from_seq:
                continue
            try:
                value = await self._store.read_record(key)
            except MetadataNotFoundError:
                continue
            found.append(Versioned(rec.decode_ledger(value.value), value.version))
        return found

    async def info(self, name: str, *, from_seq: int = 0) -> LogInfo:
        """A snapshot of the log: head and ledgers (those with seq >=
        ``from_seq``) as of one head version (the listing is repeated while
        the head changes under it)."""
        head = await self.read_head(name)
        for _ in range(MAX_ATTEMPTS):
            ledgers = await self.ledger_records(name, from_seq=from_seq)
            again = await self.read_head(name)
            if again.version == head.version:
                break
            head = again
        return LogInfo(name, head.value, head.version, tuple(v.value for v in ledgers))

    async def names(self) -> list[str]:
        """The names of every log, sorted."""
        found = set()
        for key in await self._store.list_records(rec.ROOT):
            parts = key.split("/")
            if len(parts) == 3 and parts[2] == "head":
                found.add(parts[1])
        return sorted(found)

    async def record_is(self, key: str, value: bytes) -> bool:
        """True if the record ``key`` exists and holds ``value``."""
        try:
            return (await self._store.read_record(key)).value == value
        except MetadataNotFoundError:
            return False

    # --- changing ------------------------------------------------------------------

    async def create(self, name: str, *, exist_ok: bool = False, epoch: int = 0) -> bool:
        """Create an empty log; True if this call created it.  LogExistsError
        if it exists (unless ``exist_ok``: then False).  ValueError for a bad
        name (see ``records.check_name``).  ``epoch``: the head's epoch, so
        its first writer takes ``epoch + 1`` (a log made again after a
        disaster starts above every epoch its lost predecessor gave out)."""
        if epoch < 0:
            raise ValueError(f"log {name!r}: epoch {epoch} is negative")
        head = HeadRecord(name=rec.check_name(name), created_ms=self._clock.wall_ms(), epoch=epoch)
        try:
            await self._store.create_record(rec.head_key(name), rec.encode_head(head))
        except MetadataExistsError:
            if not exist_ok:
                raise LogExistsError(f"log {name!r} already exists") from None
            return False
        return True

    async def take(self, name: str) -> LogHold:
        """Become the log's writer: the head's epoch goes up by one and names
        a new owner (compare-and-set).  Whoever held the log before is fenced
        from then on (its next transaction through its hold fails), though
        its open ledgers are still the caller's to recover."""
        owner = uuid.uuid4().hex
        for _ in range(MAX_ATTEMPTS):
            current = await self.read_head(name)
            epoch = current.value.epoch + 1
            hold = WriterHold(epoch=epoch, owner=owner, since_ms=self._clock.wall_ms())
            head = current.value.with_(epoch=epoch, writer=hold)
            try:
                version = await self._store.write_record(rec.head_key(name),
                                                         rec.encode_head(head), current.version)
            except MetadataVersionError:
                continue
            except MetadataNotFoundError:
                raise LogNotFoundError(f"no log named {name!r}") from None
            except MetadataError:
                again = await self.read_head(name)  # outcome unknown: look
                if again.value.writer is None or again.value.writer.owner != owner:
                    continue
                head, version = again.value, again.version
            return LogHold(self, name, head, version)
        raise LogError(f"log {name!r} kept changing; taking it gave up")

    async def remove_front(self, name: str, before: Position, *,
                           hold: LogHold | None = None) -> list[LedgerRecord]:
        """Take every ledger entirely below ``before`` out of the log (closed
        ledgers with a lower seq, and the ledger ``before.ledger_seq`` if it is
        closed and ``before`` is at or past its end): their records and the
        head's ``truncated_before`` change in one transaction.  Returns the
        records removed (their ledgers are the caller's to delete).

        With ``hold``, the change is made as that writer: LogFencedError if
        the log is no longer held by it.
        """
        for _ in range(MAX_ATTEMPTS):
            head = await self.read_head(name)
            if hold is not None:
                hold.adopt(head)
            doomed = [v for v in await self.ledger_records(name)
                      if v.value.closed and (
                          v.value.seq < before.ledger_seq
                          or (v.value.seq == before.ledger_seq
                              and (v.value.entries or 0) <= before.entry_id))]
            if not doomed:
                return []
            last = doomed[-1].value
            boundary = max(head.value.truncated_before, Position(last.seq, last.entries or 0))
            new_head = head.value.with_(truncated_before=boundary)
            ops: list[Op] = [UpdateRecord(rec.head_key(name), rec.encode_head(new_head),
                                          head.version)]
            ops += [DeleteRecord(rec.ledger_key(name, v.value.seq), v.version) for v in doomed]
            try:
                versions = await self._store.transaction(ops)
            except TransactionError:
                continue
            if hold is not None and versions[0] is not None:
                hold.adopt(Versioned(new_head, versions[0]))
            return [v.value for v in doomed]
        raise LogError(f"log {name!r} kept changing; truncate gave up")

    async def append_closed(self, name: str, ledgers: Sequence[ClosedLedger], *,
                            extra_ops: Sequence[Op] = (), replace: bool = False
                            ) -> tuple[list[int], list[LedgerRecord]]:
        """Make closed ledgers the end of a log that no writer holds, in one
        transaction with ``extra_ops``; returns their seqs and, with
        ``replace``, the records of the ledgers that left the log (to delete).

        If one of ``extra_ops`` fails, TransactionError is raised with
        ``failed_index`` the index *in extra_ops*; concurrent changes to the
        log itself are retried.  LogBusyError while a writer holds the log.
        """
        for _ in range(MAX_ATTEMPTS):
            head = await self.read_head(name)
            if head.value.writer is not None:
                raise LogBusyError(f"log {name!r} is held by a writer (epoch "
                                   f"{head.value.writer.epoch}): bulk append refused")
            first_seq = head.value.next_seq
            now = self._clock.wall_ms()
            new_head = head.value.with_(next_seq=first_seq + len(ledgers))
            removing: list[Versioned[LedgerRecord]] = []
            if replace:
                removing = await self.ledger_records(name)
                if removing:
                    last = removing[-1].value
                    new_head = new_head.with_(truncated_before=max(
                        new_head.truncated_before, Position(last.seq, last.entries or 0)))
            ops: list[Op] = []
            if ledgers or removing:
                ops.append(UpdateRecord(rec.head_key(name), rec.encode_head(new_head),
                                        head.version))
            else:
                ops.append(CheckRecord(rec.head_key(name), head.version))
            ops += [DeleteRecord(rec.ledger_key(name, v.value.seq), v.version) for v in removing]
            records = [LedgerRecord(seq=first_seq + i, ledger_id=ledger.ledger_id,
                                    state="closed", created_ms=now, entries=ledger.entries,
                                    bytes=ledger.bytes)
                       for i, ledger in enumerate(ledgers)]
            ops += [CreateRecord(rec.ledger_key(name, r.seq), rec.encode_ledger(r))
                    for r in records]
            base = len(ops)
            ops += extra_ops
            try:
                await self._store.transaction(ops)
            except TransactionError as e:
                if e.failed_index is not None and e.failed_index >= base:
                    raise TransactionError(str(e), e.failed_index - base, e.cause) from e
                continue  # the log changed meanwhile: look again
            except MetadataError:
                # outcome unknown: it landed iff our first record is there
                if not records or not await self.record_is(
                        rec.ledger_key(name, records[0].seq), rec.encode_ledger(records[0])):
                    raise
            return [r.seq for r in records], [v.value for v in removing]
        raise LogError(f"log {name!r} kept changing; bulk append gave up")

    async def discard(self, name: str) -> tuple[HeadRecord, set[int]]:
        """Remove every record of a log *whoever holds it*, in one
        transaction: for disaster recovery, when its ledgers are lost or are
        to be abandoned.  Returns the head as it was (its epoch: a log made
        again must start above it) and the ids of the ledgers it named, left
        untouched.  A writer still holding it fails at its next metadata
        change (a roll, a truncation, its close), but appends to its open
        ledger go on succeeding until then: stop the writer first.
        LogNotFoundError if there is no such log."""
        return await self._remove_records(name, even_if_held=True)

    async def _record_removals(self, name: str) -> tuple[set[int], list[Op]]:
        """The ids of the ledgers the log's records name and the deletions of
        those records (not of its head), children first."""
        keys = [k for k in await self._store.list_records(rec.log_prefix(name))
                if k != rec.head_key(name)]
        ledger_ids: set[int] = set()
        for key in keys:
            try:
                value = (await self._store.read_record(key)).value
            except MetadataNotFoundError:
                continue
            if rec.seq_of_ledger_key(name, key) is not None:
                ledger_ids.add(rec.decode_ledger(value).ledger_id)
            elif rec.is_registration_key(name, key):
                ledger_ids.add(rec.decode_registration(value).ledger_id)
        # children before parents (ZooKeeper keeps record keys as a tree)
        return ledger_ids, [DeleteRecord(k, None) for k in sorted(keys, reverse=True)]

    async def remove(self, name: str) -> set[int]:
        """Remove every record of a log that no writer holds, in one
        transaction; returns the ids of the ledgers they named (the log's and
        those registered by unfinished jobs), the caller's to delete.
        LogBusyError while a writer holds it; LogNotFoundError if there is no
        such log."""
        _head, ledger_ids = await self._remove_records(name, even_if_held=False)
        return ledger_ids

    async def _remove_records(self, name: str, *, even_if_held: bool
                              ) -> tuple[HeadRecord, set[int]]:
        """Every record of the log and its head, in one transaction, retried
        while the log changes; the head as it was and the ledger ids the
        records named.  LogBusyError if a writer holds it, unless
        ``even_if_held`` (:meth:`discard`)."""
        for _ in range(MAX_ATTEMPTS):
            head = await self.read_head(name)
            if head.value.writer is not None and not even_if_held:
                raise LogBusyError(f"log {name!r} is held by a writer (epoch "
                                   f"{head.value.writer.epoch}); close it or recover() first")
            ledger_ids, ops = await self._record_removals(name)
            ops.append(DeleteRecord(rec.head_key(name), head.version))
            try:
                await self._store.transaction(ops)
            except TransactionError:
                continue  # the log changed meanwhile: look again
            return head.value, ledger_ids
        raise LogError(f"log {name!r} kept changing; "
                       f"{'discarding it' if even_if_held else 'delete'} gave up")


class LogHold:
    """One writer's hold on a log (from :meth:`LogCatalog.take`): its epoch
    and owner id, and the head as the holder last saw it.

    Contract: the hold is valid while the log's head names this epoch and
    owner.  :meth:`transact` commits a change conditional on the head
    version the hold knows; when the head moved it is re-read, and the change
    is retried if the hold is still valid.  :meth:`check` and
    :meth:`transact` raise :class:`~quire.log.LogFencedError` once the head
    names another epoch or owner (or the log was deleted): a writer that gets
    it has lost the log for good.  A ledger fenced under a valid hold is not
    a lost log.
    """

    def __init__(self, catalog: LogCatalog, name: str, head: HeadRecord, version: int) -> None:
        assert head.writer is not None
        self._catalog = catalog
        self.name = name
        """The log held (read-only)."""
        self.epoch = head.writer.epoch
        """The hold's epoch (read-only)."""
        self._owner = head.writer.owner
        self._head = head
        """The head as this holder last saw it, and its version."""
        self._version = version

    def holds(self, head: HeadRecord) -> bool:
        """True if ``head`` still names this hold."""
        writer = head.writer
        return (head.epoch == self.epoch and writer is not None
                and writer.epoch == self.epoch and writer.owner == self._owner)

    def fenced(self, why: str) -> LogFencedError:
        """The error of a writer whose hold is gone."""
        return LogFencedError(f"log {self.name!r}: writer epoch {self.epoch} was fenced "
                              f"out: {why}")

    def adopt(self, head: Versioned[HeadRecord]) -> None:
        """Take ``head`` as the current one: LogFencedError if it is not ours."""
        if not self.holds(head.value):
            raise self.fenced(f"the log is now at epoch {head.value.epoch}")
        if head.version >= self._version:
            self._head, self._version = head.value, head.version

    async def check(self) -> None:
        """Re-read the head: LogFencedError unless the log is still ours."""
        try:
            current = await self._catalog.read_head(self.name)
        except LogNotFoundError as e:
            raise self.fenced("the log was deleted") from e
        self.adopt(current)

    async def transact(self, change: HeadChange) -> None:
        """Run ``change``'s ops in one transaction with a compare-and-set (or
        check) of the head at the version this hold knows.  When the head
        moved, re-read it: still ours -> retry; otherwise LogFencedError.  A
        failure of one of the other ops (a record changed under the writer)
        is LogFencedError too: only another writer changes them."""
        store = self._catalog.store
        key = rec.head_key(self.name)
        for _ in range(MAX_ATTEMPTS):
            new_head, ops = change(self._head)
            head_op: Op = (CheckRecord(key, self._version) if new_head is None
                           else UpdateRecord(key, rec.encode_head(new_head), self._version))
            try:
                versions = await store.transaction([head_op, *ops])
            except TransactionError as e:
                if e.failed_index != 0:
                    raise self.fenced(f"a record of the log changed under it ({e})") from e
                await self.check()
                continue
            except MetadataError:
                # outcome unknown: retry on the head we find (a landed change
                # shows as a head we know nothing of -> treated as fenced)
                await self.check()
                continue
            if new_head is not None:
                version = versions[0]
                assert version is not None
                self._head, self._version = new_head, version
            return
        raise LogError(f"log {self.name!r} kept changing; the writer gave up")
