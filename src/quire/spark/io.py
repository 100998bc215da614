"""The work Spark tasks do against Quire: reading ledger ranges as Arrow
record batches, and writing one task's rows to one ledger of a write job.

Everything here runs inside Spark Python workers through the process's
:mod:`~quire.spark._runtime`; the objects that travel between processes
(:class:`LedgerRange`, :class:`QuireCommitMessage`) hold plain data only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition, WriterCommitMessage

from quire.client import ClientConfig, LedgerEntry, ReadHandle, WriteHandle
from quire.errors import (
    EntryNotAvailableError,
    MetadataNotFoundError,
    QueueFullError,
    QuireError,
)
from quire.log import Job, LogJobs, LogStore, LogTruncatedError
from quire.spark._runtime import Runtime, runtime
from quire.types import BookieState, LedgerType

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class LedgerRange(InputPartition):
    """One input partition: entries ``first..last`` of one ledger of a log."""

    metadata: str
    log: str
    password: bytes
    ledger_seq: int
    ledger_id: int
    first: int
    last: int
    batch_entries: int = 8192
    missing_ok: bool = False
    """A ledger gone by read time yields nothing (else LogTruncatedError)."""
    client_config: ClientConfig | None = None
    """The ledger client's settings (its TLS files; None: the defaults)."""

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def read_range(part: LedgerRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The partition's entries as record batches of ``schema`` (columns
    ledger_seq, ledger_id, entry_id, payload), in entry order, up to
    ``batch_entries`` rows each.  The next batched read is on the wire while
    the current batch is converted and handed to Spark."""
    import numpy as np
    import pyarrow as pa

    rt = runtime()
    handle = rt.run(_open_for_read(rt, part))
    if handle is None:
        return
    try:
        chunk = part.batch_entries
        first = part.first
        pending: concurrent.futures.Future[list[LedgerEntry]] | None = rt.submit(
            _read_chunk(handle, first, min(part.last, first + chunk - 1)))
        while pending is not None:
            entries = pending.result()
            count = len(entries)
            following = first + count
            pending = (rt.submit(_read_chunk(handle, following,
                                             min(part.last, following + chunk - 1)))
                       if following <= part.last else None)
            yield pa.RecordBatch.from_arrays([
                pa.array(np.full(count, part.ledger_seq, dtype=np.int64)),
                pa.array(np.full(count, part.ledger_id, dtype=np.int64)),
                pa.array(np.arange(first, following, dtype=np.int64)),
                pa.array([e.data for e in entries], type=pa.binary()),
            ], schema=schema)
            first = following
    finally:
        rt.run(handle.close())


async def _open_for_read(rt: Runtime, part: LedgerRange) -> ReadHandle | None:
    client = await rt.client(part.metadata, part.client_config)
    try:
        handle = await client.open_ledger(part.ledger_id, password=part.password,
                                          recovery=False)
    except MetadataNotFoundError:
        if part.missing_ok:
            return None
        raise LogTruncatedError(
            f"log {part.log!r}: ledger {part.ledger_id} (seq {part.ledger_seq}) was removed "
            "after the query was planned (truncated or overwritten)") from None
    delay = 0.005
    for _ in range(8):
        if handle.is_closed or handle.last_add_confirmed >= part.last:
            return handle
        # an open ledger: learn its LAC (the planner saw it at least at part.last)
        if await handle.read_last_add_confirmed() >= part.last:
            return handle
        await asyncio.sleep(delay)
        delay *= 2
    await handle.close()
    raise EntryNotAvailableError(f"ledger {part.ledger_id}: its bookies report a "
                                 f"LastAddConfirmed below entry {part.last} planned to be read")


async def _read_chunk(handle: ReadHandle, first: int, last: int) -> list[LedgerEntry]:
    """Entries first..last exactly, in order, with batched reads."""
    entries: list[LedgerEntry] = []
    following = first
    while following <= last:
        # size 0: the client's batch_read_max_bytes (a loose limit)
        got = await handle.batch_read(following, last - following + 1, 0)
        if got[0].entry_id != following:
            raise EntryNotAvailableError(f"ledger {handle.ledger_id}: asked for entry "
                                         f"{following}, got {got[0].entry_id}")
        entries += got
        following = got[-1].entry_id + 1
    return entries


# --- writing ------------------------------------------------------------------------


@dataclass
class QuireCommitMessage(WriterCommitMessage):
    """What a write task reports: the ledgers it wrote and closed."""

    partition_id: int
    attempt: int
    ledger_ids: list[int] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0


async def live_bookie_count(logs: LogStore) -> int:
    return sum(1 for b in await logs.metadata_store.list_bookies()
               if b.state is BookieState.WRITABLE)


class TaskLedgerWriter:
    """Writes one task's payloads to one VD_JOURNAL ledger of a job.

    The ledger is created and registered with the job before its first
    entry (so an abort or the garbage collector can always find it);
    appends are pipelined (``write`` returns once the batch is handed to the
    ledger, not acknowledged); ``finish`` waits for every acknowledgement,
    syncs (BP-14) and closes the ledger.  ``discard`` deletes it.
    """

    _MARK_EVERY = 1024

    def __init__(self, rt: Runtime, jobs: LogJobs, job: Job,
                 quorums: tuple[int, int, int], *, task: str,
                 batch_id: int | None = None) -> None:
        self._rt = rt
        self._jobs = jobs
        self._logs = jobs.logs
        self._job = job
        self._quorums = quorums
        self._task = task
        self._batch_id = batch_id
        self._handle: WriteHandle | None = None
        self._marks: deque[asyncio.Future[int]] = deque()
        self._last: asyncio.Future[int] | None = None
        self._pending: concurrent.futures.Future[None] | None = None
        """The batch being handed to the ledger on the loop."""
        self.rows = 0
        self.bytes = 0

    @property
    def ledger_id(self) -> int | None:
        return None if self._handle is None else self._handle.ledger_id

    def write(self, payloads: list[bytes]) -> None:
        """Hand ``payloads`` to the ledger (after the previous batch)."""
        if not payloads:
            return
        if self._pending is not None:
            self._pending.result()
        self.rows += len(payloads)
        self.bytes += sum(map(len, payloads))
        self._pending = self._rt.submit(self._append(payloads))

    async def _append(self, payloads: list[bytes]) -> None:
        if self._handle is None:
            await self._start()
        handle = self._handle
        assert handle is not None
        for count, payload in enumerate(payloads, 1):
            while True:
                try:
                    future = handle.append(payload)
                    break
                except QueueFullError:
                    if not self._marks:
                        if self._last is None:
                            raise
                        await self._last
                    else:
                        await self._marks.popleft()
            if count % self._MARK_EVERY == 0:
                self._marks.append(future)
            self._last = future

    async def _start(self) -> None:
        ensemble, write, ack = self._quorums
        job = self._job
        self._handle = await self._logs.client.create_ledger(
            ensemble, write, ack, ledger_type=LedgerType.VD_JOURNAL,
            password=self._logs.password,
            custom_metadata={"quire.log": job.log.encode(), "quire.job": job.job_id.encode(),
                             "quire.task": self._task.encode()})
        try:
            await self._jobs.register_ledger(job, self._handle.ledger_id, task=self._task,
                                             batch_id=self._batch_id)
        except BaseException:
            handle, self._handle = self._handle, None
            with contextlib.suppress(QuireError):
                await handle.close()
            await self._logs.delete_ledgers([handle.ledger_id])
            raise

    def finish(self) -> list[int]:
        """Wait for every append, sync and close; the ledger ids written."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if self._handle is None:
            return []
        self._rt.run(self._finish())
        return [self._handle.ledger_id]

    async def _finish(self) -> None:
        handle = self._handle
        assert handle is not None
        if self._last is not None:
            await self._last
        await handle.sync()  # BP-14: the task's VD ledger is durable before the close
        await handle.close()

    def discard(self) -> None:
        """Best effort: close and delete the ledger and its registration (the
        job's abort or the garbage collector covers what this misses)."""
        if self._pending is not None:
            with contextlib.suppress(Exception):
                self._pending.result()
        handle = self._handle
        if handle is None:
            return

        async def go() -> None:
            with contextlib.suppress(QuireError):
                await handle.close()
            await self._jobs.discard_ledgers(self._job, [handle.ledger_id])

        with contextlib.suppress(Exception):
            self._rt.run(go())
