"""Write jobs and stream sinks on named logs (the Spark source's protocol):
:class:`LogJobs`.

A job lets many processes (Spark tasks) write ledgers for one log and
publish them together, exactly once, in one
:meth:`~quire.log.LogStore.bulk_append`.  Protocol::

    begin_job        -> job record, state "open", version 0
    register_ledger  -> [CheckRecord(job, version), CreateRecord(registration)],
                        *before* the first entry is written, so every ledger a
                        job ever wrote can be found and deleted
    commit_job       -> bulk_append(ledgers, extra_ops=[UpdateRecord(job ->
                        committed, version), DeleteRecord(each registration,
                        its version)]): fails as a whole if the job was aborted
                        or a registration was collected; then the job's other
                        ledgers (failed or retried tasks) are deleted
    abort_job        -> job -> aborted (CAS), then its ledgers are deleted
    collect_garbage  -> aborts jobs older than their ttl, finishes cleanups

A stream sink is one job that never commits as a whole: each micro-batch is
published by :meth:`LogJobs.commit_sink_batch` together with the sink
record's move to the batch id, so a replayed batch is dropped.  The records
(``logs/NAME/jobs/...``, ``logs/NAME/sinks/...``) are in
:mod:`quire.log.records`.
"""

from __future__ import annotations

import builtins
import contextlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from quire.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    TransactionError,
)
from quire.log import records as rec
from quire.log.catalog import MAX_ATTEMPTS
from quire.log.errors import JobClosedError, LogError
from quire.log.records import JobRecord, Registration, SinkRecord
from quire.log.store import LogStore
from quire.metadata import CheckRecord, CreateRecord, DeleteRecord, Op, UpdateRecord, Versioned


@dataclass(frozen=True)
class Job:
    """An open write job (see :meth:`LogJobs.begin_job`): plain data, safe to
    pickle and send to other processes."""

    log: str
    job_id: str
    version: int
    """The job record's version while it is open (commit is a CAS on it)."""
    kind: rec.JobKind = "batch"


@dataclass
class GarbageReport:
    """What :meth:`LogJobs.collect_garbage` did."""

    jobs_aborted: builtins.list[str] = field(default_factory=builtins.list)
    jobs_removed: builtins.list[str] = field(default_factory=builtins.list)
    ledgers_deleted: builtins.list[int] = field(default_factory=builtins.list)


class LogJobs:
    """Write jobs and stream sinks on the logs of one :class:`~quire.log.LogStore`
    (its client, password and clock); see the module docstring.  Any number
    of them in any number of processes may work on the same jobs."""

    def __init__(self, logs: LogStore) -> None:
        self._logs = logs

    @property
    def logs(self) -> LogStore:
        return self._logs

    async def begin_job(self, name: str, *, ttl_ms: int, create: bool = True) -> Job:
        """Start a batch write job on the log (creating the log if needed and
        ``create``); ``ttl_ms``: a job not committed by then is garbage."""
        if create:
            await self._logs.create(name, exist_ok=True)
        else:
            await self._logs.read_head(name)
        job = JobRecord(job_id=uuid.uuid4().hex, kind="batch", state="open",
                        created_ms=self._logs.clock.wall_ms(), ttl_ms=ttl_ms)
        version = await self._logs.metadata_store.create_record(rec.job_key(name, job.job_id),
                                                          rec.encode_job(job))
        return Job(name, job.job_id, version, "batch")

    async def sink_job(self, name: str, sink_id: str, *, ttl_ms: int,
                       create: bool = True) -> Job:
        """The (single, never committed as a whole) job of a stream sink: its
        ledgers are registered under it, committed batch by batch with
        :meth:`commit_sink_batch`, and collected once older than ``ttl_ms``."""
        if create:
            await self._logs.create(name, exist_ok=True)
        job_id = f"sink-{rec.check_name(sink_id, 'sink id')}"
        key = rec.job_key(name, job_id)
        store = self._logs.metadata_store
        try:
            version = await store.create_record(key, rec.encode_job(JobRecord(
                job_id=job_id, kind="sink", state="open", created_ms=self._logs.clock.wall_ms(),
                ttl_ms=ttl_ms)))
        except MetadataExistsError:
            version = (await store.read_record(key)).version
        return Job(name, job_id, version, "sink")

    async def register_ledger(self, job: Job, ledger_id: int, *, task: str = "",
                              batch_id: int | None = None) -> None:
        """Register a ledger with the job before writing to it.  JobClosedError
        if the job is no longer open (the caller should delete its ledger)."""
        reg = Registration(ledger_id=ledger_id, created_ms=self._logs.clock.wall_ms(), task=task,
                           batch_id=batch_id)
        try:
            await self._logs.metadata_store.transaction([
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
        store = self._logs.metadata_store
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
        store = self._logs.metadata_store
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
        "committed" (see :meth:`~quire.log.LogStore.bulk_append`; ``replace`` overwrites the log).
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
                              created_ms=self._logs.clock.wall_ms(), ttl_ms=0)
        extra: builtins.list[Op] = [UpdateRecord(rec.job_key(job.log, job.job_id),
                                                 rec.encode_job(committed), job.version)]
        extra += [DeleteRecord(regs[i][0], regs[i][1].version) for i in ledger_ids]
        try:
            seqs = await self._logs.bulk_append(job.log, ledger_ids, extra_ops=extra,
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
        store = self._logs.metadata_store
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
            deleted += await self._logs.delete_ledgers([ledger_id])
            with contextlib.suppress(MetadataNotFoundError):
                await self._logs.metadata_store.delete_record(key)
        with contextlib.suppress(MetadataNotFoundError):
            await self._logs.metadata_store.delete_record(rec.job_key(name, job_id))
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
            await self._logs.metadata_store.write_record(key, rec.encode_registration(doomed),
                                                   found.version)
        except (MetadataVersionError, MetadataNotFoundError):
            return False
        await self._logs.delete_ledgers([reg.ledger_id])
        with contextlib.suppress(MetadataNotFoundError):
            await self._logs.metadata_store.delete_record(key)
        return True

    # --- stream sinks ---------------------------------------------------------------

    async def sink_progress(self, name: str, sink_id: str) -> int | None:
        """The last batch id the sink committed to the log (None: none yet)."""
        try:
            found = await self._logs.metadata_store.read_record(rec.sink_key(name, sink_id))
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
        store = self._logs.metadata_store
        key = rec.sink_key(job.log, sink_id)
        for _ in range(MAX_ATTEMPTS):
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
            value = rec.encode_sink(SinkRecord(sink_id, batch_id, self._logs.clock.wall_ms()))
            extra: builtins.list[Op] = [
                CreateRecord(key, value) if found is None
                else UpdateRecord(key, value, found.version)]
            extra += [DeleteRecord(regs[i][0], regs[i][1].version) for i in ledger_ids]
            try:
                await self._logs.bulk_append(job.log, ledger_ids, extra_ops=extra, replace=replace)
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
        now = self._logs.clock.wall_ms() if now_ms is None else now_ms
        report = GarbageReport()
        names = [name] if name is not None else await self._logs.list()
        store = self._logs.metadata_store
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

