"""Named logs over ledgers: :class:`LogStore`.

A *log* is a name and an ordered list of ledgers, kept in the metadata store
(the model of DistributedLog and of Pravega's tier-1 durable log); the record
layout is in :mod:`quire.log.records`.  Every change to a log's ledger list
is one metadata transaction that includes a compare-and-set of the log's
head, so membership changes are totally ordered and all-or-nothing:

* a :class:`~quire.log.LogWriter` adds one ledger at a time (a *roll*);
* :meth:`LogStore.bulk_append` adds a batch of closed ledgers at once (and
  may replace the existing ones);
* :meth:`LogStore.truncate` removes whole ledgers from the front.

Ledgers are deleted from the bookies only *after* the transaction that took
them out of the log committed, so a reader never finds a listed ledger
missing except after a truncation or an overwrite, which it can tell from
the head's ``truncated_before``.

Write jobs (:meth:`LogStore.begin_job` ...) let many processes (Spark tasks)
write ledgers for one log and publish them together, exactly once; see the
methods' docstrings for the protocol.
"""

from __future__ import annotations

import builtins
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quire.client import Client
from quire.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    TransactionError,
)
from quire.log import records as rec
from quire.log.errors import (
    JobClosedError,
    LogBusyError,
    LogError,
    LogExistsError,
    LogNotFoundError,
)
from quire.log.position import Position
from quire.log.records import (
    HeadRecord,
    JobRecord,
    LedgerRecord,
    Registration,
    SinkRecord,
)
from quire.metadata import (
    CheckRecord,
    CreateRecord,
    DeleteRecord,
    MetadataStore,
    Op,
    UpdateRecord,
    Versioned,
)
from quire.types import LedgerState

if TYPE_CHECKING:
    from quire.log.reader import LogReader
    from quire.log.writer import LogWriter

log = logging.getLogger("quire.log")

_MAX_ATTEMPTS = 20
"""Compare-and-set retries of one operation before it gives up (each retry
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
class Job:
    """An open write job (see :meth:`LogStore.begin_job`): plain data, safe to
    pickle and send to other processes."""

    log: str
    job_id: str
    version: int
    """The job record's version while it is open (commit is a CAS on it)."""
    kind: rec.JobKind = "batch"


@dataclass
class GarbageReport:
    """What :meth:`LogStore.collect_garbage` did."""

    jobs_aborted: builtins.list[str] = field(default_factory=builtins.list)
    jobs_removed: builtins.list[str] = field(default_factory=builtins.list)
    ledgers_deleted: builtins.list[int] = field(default_factory=builtins.list)


def _now_ms() -> int:
    return int(time.time() * 1000)


class LogStore:
    """Named logs on one Quire cluster, over a connected :class:`~quire.Client`.

    ``password`` is the password of every ledger the store writes, and the
    one it opens ledgers with: all ledgers of a log share it (bulk-appended
    ledgers must have it too).  Use the store on the client's event loop.
    Many ``LogStore`` s in many processes may work on the same logs: every
    change is a compare-and-set transaction in the metadata store.
    """

    def __init__(self, client: Client, *, password: bytes = b"",
                 clock_ms: Callable[[], int] = _now_ms) -> None:
        self._client = client
        self._password = password
        self._clock_ms = clock_ms

    @property
    def client(self) -> Client:
        return self._client

    @property
    def metadata_store(self) -> MetadataStore:
        return self._client.metadata_store

    @property
    def password(self) -> bytes:
        return self._password

    def now_ms(self) -> int:
        return self._clock_ms()

    # --- logs ------------------------------------------------------------------

    async def create(self, name: str, *, exist_ok: bool = False) -> bool:
        """Create an empty log; True if this call created it.  LogExistsError
        if it exists (unless ``exist_ok``: then False).  ValueError for a bad
        name (see ``records.check_name``)."""
        head = HeadRecord(name=rec.check_name(name), created_ms=self.now_ms())
        try:
            await self.metadata_store.create_record(rec.head_key(name), rec.encode_head(head))
        except MetadataExistsError:
            if not exist_ok:
                raise LogExistsError(f"log {name!r} already exists") from None
            return False
        return True

    async def exists(self, name: str) -> bool:
        try:
            await self.read_head(name)
        except LogNotFoundError:
            return False
        return True

    async def read_head(self, name: str) -> Versioned[HeadRecord]:
        """The log's head and its version; LogNotFoundError if there is no such log."""
        try:
            found = await self.metadata_store.read_record(rec.head_key(name))
        except MetadataNotFoundError:
            raise LogNotFoundError(f"no log named {name!r}") from None
        return Versioned(rec.decode_head(found.value), found.version)

    async def ledger_records(self, name: str, *,
                             from_seq: int = 0) -> builtins.list[Versioned[LedgerRecord]]:
        """The log's ledger records with seq >= ``from_seq``, in seq order, each
        with its version (records removed while listing are left out)."""
        store = self.metadata_store
        found = []
        for key in await store.list_records(rec.ledgers_prefix(name)):
            seq = rec.seq_of_ledger_key(name, key)
            if seq is None or seq < from_seq:
                continue
            try:
                value = await store.read_record(key)
            except MetadataNotFoundError:
                continue
            found.append(Versioned(rec.decode_ledger(value.value), value.version))
        return found

    async def info(self, name: str, *, from_seq: int = 0) -> LogInfo:
        """A snapshot of the log: head and ledgers (those with seq >=
        ``from_seq``) as of one head version (the listing is repeated while
        the head changes under it)."""
        head = await self.read_head(name)
        for _ in range(_MAX_ATTEMPTS):
            ledgers = await self.ledger_records(name, from_seq=from_seq)
            again = await self.read_head(name)
            if again.version == head.version:
                break
            head = again
        return LogInfo(name, head.value, head.version, tuple(v.value for v in ledgers))

    async def list(self) -> builtins.list[str]:
        """The names of every log, sorted."""
        names = set()
        for key in await self.metadata_store.list_records(rec.ROOT):
            parts = key.split("/")
            if len(parts) == 3 and parts[2] == "head":
                names.add(parts[1])
        return sorted(names)

    async def delete(self, name: str) -> None:
        """Delete the log: its records in one transaction, then its ledgers
        (the log's, and those of unfinished jobs).  LogBusyError while a
        writer holds it; LogNotFoundError if there is no such log."""
        store = self.metadata_store
        for _ in range(_MAX_ATTEMPTS):
            head = await self.read_head(name)
            if head.value.writer is not None:
                raise LogBusyError(f"log {name!r} is held by a writer (epoch "
                                   f"{head.value.writer.epoch}); close it or recover() first")
            keys = [k for k in await store.list_records(rec.log_prefix(name))
                    if k != rec.head_key(name)]
            ledger_ids: set[int] = set()
            for key in keys:
                try:
                    value = (await store.read_record(key)).value
                except MetadataNotFoundError:
                    continue
                if rec.seq_of_ledger_key(name, key) is not None:
                    ledger_ids.add(rec.decode_ledger(value).ledger_id)
                elif (key.startswith(rec.jobs_prefix(name))
                      and "/ledgers/" in key[len(rec.jobs_prefix(name)):]):
                    ledger_ids.add(rec.decode_registration(value).ledger_id)
            # children before parents (ZooKeeper keeps record keys as a tree)
            ops: builtins.list[Op] = [DeleteRecord(k, None) for k in sorted(keys, reverse=True)]
            ops.append(DeleteRecord(rec.head_key(name), head.version))
            try:
                await store.transaction(ops)
            except TransactionError:
                continue  # the log changed meanwhile: look again
            await self.delete_ledgers(ledger_ids)
            return
        raise LogError(f"log {name!r} kept changing; delete gave up")

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
        from quire.log.writer import LogWriter, WriterOptions

        return await LogWriter.open(self, name, WriterOptions(**options))

    async def open_reader(self, name: str, from_position: Position | None = None, *,
                          follow: bool = True, skip_truncated: bool = False,
                          poll_max_ms: int = 200) -> LogReader:
        """A reader of the log from ``from_position`` on (the first entry at or
        after it; None: the earliest entry still in the log).  ``follow``: wait
        at the tail for new entries (else the reader stops at the end it
        finds).  A position removed by truncation raises LogTruncatedError on
        read, unless ``skip_truncated`` (then the reader jumps to the first
        entry still there)."""
        from quire.log.reader import LogReader

        head = await self.read_head(name)  # LogNotFoundError now, not on the first read
        if from_position is None:
            from_position = head.value.truncated_before
        return LogReader(self, name, from_position, follow=follow,
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
        store = self.metadata_store
        for _ in range(_MAX_ATTEMPTS):
            head = await self.read_head(name)
            doomed = [v for v in await self.ledger_records(name)
                      if v.value.closed and (
                          v.value.seq < before.ledger_seq
                          or (v.value.seq == before.ledger_seq
                              and (v.value.entries or 0) <= before.entry_id))]
            if not doomed:
                return []
            last = doomed[-1].value
            boundary = max(head.value.truncated_before, Position(last.seq, last.entries or 0))
            ops: builtins.list[Op] = [UpdateRecord(
                rec.head_key(name), rec.encode_head(head.value.with_(truncated_before=boundary)),
                head.version)]
            ops += [DeleteRecord(rec.ledger_key(name, v.value.seq), v.version) for v in doomed]
            try:
                await store.transaction(ops)
            except TransactionError:
                continue
            ids = [v.value.ledger_id for v in doomed]
            await self.delete_ledgers(ids)
            return ids
        raise LogError(f"log {name!r} kept changing; truncate gave up")

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
            if not hmac.compare_digest(md.password, self._password):
                raise ValueError(f"bulk_append: ledger {ledger_id} has another password "
                                 "than this log store's")
            closed.append((ledger_id, md.last_entry_id + 1, md.length))
        if create:
            await self.create(name, exist_ok=True)
        store = self.metadata_store
        for _ in range(_MAX_ATTEMPTS):
            head = await self.read_head(name)
            if head.value.writer is not None:
                raise LogBusyError(f"log {name!r} is held by a writer (epoch "
                                   f"{head.value.writer.epoch}): bulk append refused")
            first_seq = head.value.next_seq
            now = self.now_ms()
            new_head = head.value.with_(next_seq=first_seq + len(closed))
            removing: builtins.list[Versioned[LedgerRecord]] = []
            if replace:
                removing = await self.ledger_records(name)
                if removing:
                    last = removing[-1].value
                    new_head = new_head.with_(truncated_before=max(
                        new_head.truncated_before, Position(last.seq, last.entries or 0)))
            ops: builtins.list[Op] = []
            if closed or removing:
                ops.append(UpdateRecord(rec.head_key(name), rec.encode_head(new_head),
                                        head.version))
            else:
                ops.append(CheckRecord(rec.head_key(name), head.version))
            ops += [DeleteRecord(rec.ledger_key(name, v.value.seq), v.version) for v in removing]
            records = [LedgerRecord(seq=first_seq + i, ledger_id=ledger_id, state="closed",
                                    created_ms=now, entries=entries, bytes=length)
                       for i, (ledger_id, entries, length) in enumerate(closed)]
            ops += [CreateRecord(rec.ledger_key(name, r.seq), rec.encode_ledger(r))
                    for r in records]
            base = len(ops)
            ops += extra_ops
            try:
                await store.transaction(ops)
            except TransactionError as e:
                if e.failed_index is not None and e.failed_index >= base:
                    raise TransactionError(str(e), e.failed_index - base, e.cause) from e
                continue  # the log changed meanwhile: look again
            except MetadataError:
                # outcome unknown: it landed iff our first record is there
                if not records or not await self._record_is(
                        rec.ledger_key(name, records[0].seq), rec.encode_ledger(records[0])):
                    raise
            if removing:
                await self.delete_ledgers(v.value.ledger_id for v in removing)
            return [r.seq for r in records]
        raise LogError(f"log {name!r} kept changing; bulk append gave up")

    async def _record_is(self, key: str, value: bytes) -> bool:
        try:
            return (await self.metadata_store.read_record(key)).value == value
        except MetadataNotFoundError:
            return False

    async def delete_ledgers(self, ledger_ids: Iterable[int]) -> builtins.list[int]:
        """Delete ledgers, best effort (one already gone is fine; a failure is
        logged and left for a later garbage collection); returns those deleted."""
        deleted = []
        for ledger_id in ledger_ids:
            try:
                await self._client.delete_ledger(ledger_id)
            except MetadataNotFoundError:
                pass
            except MetadataError as e:
                log.warning("could not delete ledger %d: %s", ledger_id, e)
                continue
            deleted.append(ledger_id)
        return deleted

    # --- write jobs -------------------------------------------------------------
    #
    # A job lets many processes write ledgers for one log and publish them in one
    # bulk append.  Protocol:
    #   begin_job        -> job record, state "open", version 0
    #   register_ledger  -> [CheckRecord(job, version), CreateRecord(registration)],
    #                       *before* the first entry is written, so every ledger a
    #                       job ever wrote can be found and deleted
    #   commit_job       -> bulk_append(ledgers, extra_ops=[UpdateRecord(job ->
    #                       committed, version), DeleteRecord(each registration,
    #                       its version)]): fails as a whole if the job was aborted
    #                       or a registration was collected; then the job's other
    #                       ledgers (failed or retried tasks) are deleted
    #   abort_job        -> job -> aborted (CAS), then its ledgers are deleted
    #   collect_garbage  -> aborts jobs older than their ttl, finishes cleanups

    async def begin_job(self, name: str, *, ttl_ms: int, create: bool = True) -> Job:
        """Start a batch write job on the log (creating the log if needed and
        ``create``); ``ttl_ms``: a job not committed by then is garbage."""
        if create:
            await self.create(name, exist_ok=True)
        else:
            await self.read_head(name)
        job = JobRecord(job_id=uuid.uuid4().hex, kind="batch", state="open",
                        created_ms=self.now_ms(), ttl_ms=ttl_ms)
        version = await self.metadata_store.create_record(rec.job_key(name, job.job_id),
                                                          rec.encode_job(job))
        return Job(name, job.job_id, version, "batch")

    async def sink_job(self, name: str, sink_id: str, *, ttl_ms: int,
                       create: bool = True) -> Job:
        """The (single, never committed as a whole) job of a stream sink: its
        ledgers are registered under it, committed batch by batch with
        :meth:`commit_sink_batch`, and collected once older than ``ttl_ms``."""
        if create:
            await self.create(name, exist_ok=True)
        job_id = f"sink-{rec.check_name(sink_id, 'sink id')}"
        key = rec.job_key(name, job_id)
        store = self.metadata_store
        try:
            version = await store.create_record(key, rec.encode_job(JobRecord(
                job_id=job_id, kind="sink", state="open", created_ms=self.now_ms(),
                ttl_ms=ttl_ms)))
        except MetadataExistsError:
            version = (await store.read_record(key)).version
        return Job(name, job_id, version, "sink")

    async def register_ledger(self, job: Job, ledger_id: int, *, task: str = "",
                              batch_id: int | None = None) -> None:
        """Register a ledger with the job before writing to it.  JobClosedError
        if the job is no longer open (the caller should delete its ledger)."""
        reg = Registration(ledger_id=ledger_id, created_ms=self.now_ms(), task=task,
                           batch_id=batch_id)
        try:
            await self.metadata_store.transaction([
                CheckRecord(rec.job_key(job.log, job.job_id), job.version),
                CreateRecord(rec.registration_key(job.log, job.job_id, ledger_id),
                             rec.encode_registration(reg))])
        except TransactionError as e:
            if e.failed_index == 0:
                raise JobClosedError(f"job {job.job_id} of log {job.log!r} is no longer "
                                     "open") from e
            raise

    async def discard_ledgers(self, job: Job, ledger_ids: Iterable[int]) -> None:
        """Delete ledgers of the job that will never be committed, then their
        registrations (a ledger whose registration is already gone is left alone:
        it may have been committed)."""
        store = self.metadata_store
        for ledger_id in ledger_ids:
            key = rec.registration_key(job.log, job.job_id, ledger_id)
            try:
                found = await store.read_record(key)
            except MetadataNotFoundError:
                continue
            await self._discard_registration(job.log, job.job_id, key, found, force=True)

    async def _registrations(self, name: str, job_id: str
                             ) -> dict[int, tuple[str, Versioned[Registration]]]:
        """ledger id -> (key, registration) of the job's registered ledgers."""
        store = self.metadata_store
        found = {}
        for key in await store.list_records(rec.registrations_prefix(name, job_id)):
            try:
                value = await store.read_record(key)
            except MetadataNotFoundError:
                continue
            reg = rec.decode_registration(value.value)
            found[reg.ledger_id] = (key, Versioned(reg, value.version))
        return found

    async def commit_job(self, job: Job, ledger_ids: Sequence[int], *,
                         replace: bool = False) -> builtins.list[int]:
        """Publish the job: ``ledger_ids`` (closed, registered with the job)
        join the log in this order in one transaction with the job's change to
        "committed" (see :meth:`bulk_append`; ``replace`` overwrites the log).
        Every other ledger registered with the job is then deleted, and the job
        record removed.  Returns the new ledgers' seqs.  JobClosedError if the
        job was aborted or collected (nothing was published); LogBusyError
        while a writer holds the log."""
        regs = await self._registrations(job.log, job.job_id)
        missing = [i for i in ledger_ids if i not in regs]
        if missing:
            raise JobClosedError(f"job {job.job_id}: ledgers {missing} are not registered "
                                 "with it (collected?)")
        committed = JobRecord(job_id=job.job_id, kind=job.kind, state="committed",
                              created_ms=self.now_ms(), ttl_ms=0)
        extra: builtins.list[Op] = [UpdateRecord(rec.job_key(job.log, job.job_id),
                                                 rec.encode_job(committed), job.version)]
        extra += [DeleteRecord(regs[i][0], regs[i][1].version) for i in ledger_ids]
        try:
            seqs = await self.bulk_append(job.log, ledger_ids, extra_ops=extra,
                                          replace=replace)
        except TransactionError as e:
            raise JobClosedError(f"job {job.job_id} of log {job.log!r} could not commit: "
                                 f"it was aborted or collected ({e})") from e
        await self._finish_job(job.log, job.job_id)
        return seqs

    async def abort_job(self, job: Job) -> builtins.list[int]:
        """Abort the job: it can no longer commit or take registrations; every
        ledger registered with it is deleted, then the job record.  Returns the
        ledgers deleted.  (Aborting a committed job only cleans up leftovers.)"""
        store = self.metadata_store
        key = rec.job_key(job.log, job.job_id)
        try:
            found = await store.read_record(key)
        except MetadataNotFoundError:
            return []
        current = rec.decode_job(found.value)
        if current.state == "open":
            aborted = JobRecord(job_id=job.job_id, kind=current.kind, state="aborted",
                                created_ms=current.created_ms, ttl_ms=current.ttl_ms)
            try:
                await store.write_record(key, rec.encode_job(aborted), found.version)
            except MetadataVersionError:
                return await self.abort_job(job)  # it changed: decide again
        return await self._finish_job(job.log, job.job_id)

    async def _finish_job(self, name: str, job_id: str) -> builtins.list[int]:
        """Delete every ledger still registered with a job that can no longer
        commit (committed or aborted), then the registrations and the job."""
        deleted = []
        for ledger_id, (key, _reg) in (await self._registrations(name, job_id)).items():
            deleted += await self.delete_ledgers([ledger_id])
            with contextlib.suppress(MetadataNotFoundError):
                await self.metadata_store.delete_record(key)
        with contextlib.suppress(MetadataNotFoundError):
            await self.metadata_store.delete_record(rec.job_key(name, job_id))
        return deleted

    async def _discard_registration(self, name: str, job_id: str, key: str,
                                    found: Versioned[bytes], *, force: bool) -> bool:
        """Retire one registration of a job that stays open: first the
        registration is rewritten (a CAS, so a commit holding the old version
        fails), then the ledger is deleted, then the registration.  Returns
        False if a commit or another collector got there first."""
        reg = rec.decode_registration(found.value)
        doomed = Registration(ledger_id=reg.ledger_id, created_ms=reg.created_ms,
                              task=f"{reg.task} (discarded)" if force else
                              f"{reg.task} (expired)", batch_id=reg.batch_id)
        try:
            await self.metadata_store.write_record(key, rec.encode_registration(doomed),
                                                   found.version)
        except (MetadataVersionError, MetadataNotFoundError):
            return False
        await self.delete_ledgers([reg.ledger_id])
        with contextlib.suppress(MetadataNotFoundError):
            await self.metadata_store.delete_record(key)
        return True

    # --- stream sinks ---------------------------------------------------------------

    async def sink_progress(self, name: str, sink_id: str) -> int | None:
        """The last batch id the sink committed to the log (None: none yet)."""
        try:
            found = await self.metadata_store.read_record(rec.sink_key(name, sink_id))
        except MetadataNotFoundError:
            return None
        return rec.decode_sink(found.value).last_batch_id

    async def commit_sink_batch(self, job: Job, sink_id: str, batch_id: int,
                                ledger_ids: Sequence[int], *,
                                replace: bool = False) -> bool:
        """Publish one stream batch exactly once.

        If the sink record says ``batch_id`` was committed already (a replay),
        the ledgers are deleted and False returned.  Otherwise ``ledger_ids``
        join the log in one transaction with the sink record's move to
        ``batch_id`` (and the removal of their registrations); the job's other
        ledgers registered for this batch (retried tasks) are then deleted.
        JobClosedError if one of the ledgers was collected meanwhile.
        """
        store = self.metadata_store
        key = rec.sink_key(job.log, sink_id)
        for _ in range(_MAX_ATTEMPTS):
            try:
                found: Versioned[bytes] | None = await store.read_record(key)
            except MetadataNotFoundError:
                found = None
            if found is not None and rec.decode_sink(found.value).last_batch_id >= batch_id:
                await self.discard_ledgers(job, ledger_ids)
                await self._discard_batch_leftovers(job, batch_id)
                return False
            regs = await self._registrations(job.log, job.job_id)
            missing = [i for i in ledger_ids if i not in regs]
            if missing:
                raise JobClosedError(f"sink {sink_id}: ledgers {missing} of batch {batch_id} "
                                     "are no longer registered (collected?)")
            value = rec.encode_sink(SinkRecord(sink_id, batch_id, self.now_ms()))
            extra: builtins.list[Op] = [
                CreateRecord(key, value) if found is None
                else UpdateRecord(key, value, found.version)]
            extra += [DeleteRecord(regs[i][0], regs[i][1].version) for i in ledger_ids]
            try:
                await self.bulk_append(job.log, ledger_ids, extra_ops=extra, replace=replace)
            except TransactionError as e:
                if e.failed_index == 0:
                    continue  # another commit moved the sink: decide again
                raise JobClosedError(f"sink {sink_id}: batch {batch_id} could not commit: "
                                     f"a ledger was collected ({e})") from e
            await self._discard_batch_leftovers(job, batch_id)
            return True
        raise LogError(f"sink {sink_id} of log {job.log!r} kept changing; commit gave up")

    async def abort_sink_batch(self, job: Job, batch_id: int,
                               ledger_ids: Sequence[int]) -> None:
        """Delete the ledgers a failed stream batch wrote (those named, and any
        registered for ``batch_id``)."""
        await self.discard_ledgers(job, ledger_ids)
        await self._discard_batch_leftovers(job, batch_id)

    async def _discard_batch_leftovers(self, job: Job, batch_id: int) -> None:
        for key, reg in (await self._registrations(job.log, job.job_id)).values():
            if reg.value.batch_id == batch_id:
                found = Versioned(rec.encode_registration(reg.value), reg.version)
                await self._discard_registration(job.log, job.job_id, key, found, force=True)

    # --- garbage collection -----------------------------------------------------------

    async def collect_garbage(self, name: str | None = None, *,
                              now_ms: int | None = None) -> GarbageReport:
        """Clean up after writers that never finished, on one log or all.

        * a batch job still open ``ttl_ms`` after it began is aborted (a CAS,
          so a late commit fails) and its ledgers deleted;
        * a committed or aborted job whose cleanup was interrupted is finished;
        * a sink job's registrations older than its ``ttl_ms`` are retired
          (their batch never committed) and their ledgers deleted;
        * registrations whose job record is gone are deleted with their ledgers.

        Safe to run at any time, from any process, concurrently with writers.
        """
        now = self.now_ms() if now_ms is None else now_ms
        report = GarbageReport()
        names = [name] if name is not None else await self.list()
        store = self.metadata_store
        for log_name in names:
            prefix = rec.jobs_prefix(log_name)
            job_ids = sorted({key[len(prefix):].split("/", 1)[0]
                              for key in await store.list_records(prefix)})
            for job_id in job_ids:
                try:
                    found: Versioned[bytes] | None = await store.read_record(
                        rec.job_key(log_name, job_id))
                except MetadataNotFoundError:
                    found = None
                if found is None:
                    report.ledgers_deleted += await self._finish_job(log_name, job_id)
                    continue
                job = rec.decode_job(found.value)
                if job.kind == "sink":
                    for key, reg in (await self._registrations(log_name, job_id)).values():
                        if now - reg.value.created_ms > job.ttl_ms and \
                                await self._discard_registration(
                                    log_name, job_id, key,
                                    Versioned(rec.encode_registration(reg.value), reg.version),
                                    force=False):
                            report.ledgers_deleted.append(reg.value.ledger_id)
                    continue
                if job.state == "open":
                    if now - job.created_ms <= job.ttl_ms:
                        continue
                    aborted = JobRecord(job_id=job_id, kind="batch", state="aborted",
                                        created_ms=job.created_ms, ttl_ms=job.ttl_ms)
                    try:
                        await store.write_record(rec.job_key(log_name, job_id),
                                                 rec.encode_job(aborted), found.version)
                    except (MetadataVersionError, MetadataNotFoundError):
                        continue  # it committed or aborted meanwhile: next run
                    report.jobs_aborted.append(job_id)
                report.ledgers_deleted += await self._finish_job(log_name, job_id)
                report.jobs_removed.append(job_id)
        return report

