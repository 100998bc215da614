"""The single writer of a named log: :class:`LogWriter`.

Contract:

* **One writer at a time.**  Opening a writer bumps the log's epoch and
  takes the hold in the head (compare-and-set), then recovers (fences and
  closes) every ledger of the log still open.  A writer that was fenced out
  gets :class:`~quire.log.LogFencedError` from its pending and later appends,
  its next roll and its close: never a silent loss.  (As in BookKeeper, an
  append that failed has an unknown outcome: recovery may have kept it.)
* **Order.**  Positions are assigned in ``append`` call order and the
  futures complete in that order.
* **Rolling.**  The writer appends to one ledger at a time and moves to a
  new one when the current ledger holds ``roll_bytes`` of payload or is
  older than ``roll_age_ms`` (checked on append).  A roll closes the ledger
  (its pending appends complete first), creates the next one and records
  both in one transaction conditional on the head's version and the
  writer's epoch.  Appends made during a roll wait inside the writer.
* **Closing** waits for pending appends, closes the ledger and releases the
  hold.  An empty ledger is dropped from the log rather than kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic as _monotonic
from typing import TYPE_CHECKING

from quire.client import WriteHandle
from quire.errors import (
    ClientClosedError,
    LedgerFencedError,
    MetadataError,
    MetadataNotFoundError,
    MetadataVersionError,
    QueueFullError,
    QuireError,
    TransactionError,
    UnauthorizedError,
)
from quire.log import records as rec
from quire.log.errors import LogError, LogFencedError, LogNotFoundError, LogWriterClosedError
from quire.log.position import Position
from quire.log.records import HeadRecord, LedgerRecord, WriterHold
from quire.metadata import CheckRecord, CreateRecord, DeleteRecord, Op, UpdateRecord
from quire.types import DigestType, LedgerType

if TYPE_CHECKING:
    from quire.log.store import LogStore

log = logging.getLogger("quire.log")

_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class WriterOptions:
    """How a :class:`LogWriter` writes (keyword options of ``open_writer``)."""

    roll_bytes: int = 256 * 1024 * 1024
    """Move to a new ledger once the current one holds this many payload bytes."""
    roll_age_ms: int = 3_600_000
    """Move to a new ledger once the current one is this old (0: never)."""
    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    ledger_type: LedgerType = LedgerType.PD_JOURNAL
    digest_type: DigestType = DigestType.CRC32C
    create: bool = True
    """Create the log if it does not exist."""

    def __post_init__(self) -> None:
        if self.roll_bytes <= 0 or self.roll_age_ms < 0:
            raise ValueError(f"need roll_bytes > 0 and roll_age_ms >= 0, got "
                             f"{self.roll_bytes}, {self.roll_age_ms}")
        if not 1 <= self.ack_quorum_size <= self.write_quorum_size <= self.ensemble_size:
            raise ValueError("need 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size")


HeadChange = Callable[[HeadRecord], tuple[HeadRecord | None, list[Op]]]
"""Given the current head: the new head (None: only check its version) and
the other ops of one transaction."""


class LogWriter:
    """Appends to a named log; see the module docstring.  Get one with
    :meth:`quire.log.LogStore.open_writer` and use it on the client's loop."""

    def __init__(self, logs: LogStore, name: str, head: HeadRecord, head_version: int,
                 owner: str, options: WriterOptions) -> None:
        self._logs = logs
        self._name = name
        self._head = head
        self._head_version = head_version
        self._epoch = head.epoch
        self._owner = owner
        self._options = options
        self._loop = asyncio.get_running_loop()
        self._ledger: WriteHandle | None = None
        self._seq = -1
        self._record_version = 0
        self._ledger_bytes = 0
        self._ledger_since = 0.0
        self._created_ms = 0
        self._backlog: deque[tuple[bytes, asyncio.Future[Position]]] = deque()
        self._roll_task: asyncio.Task[None] | None = None
        self._last: asyncio.Future[Position] | None = None
        self._last_inner: asyncio.Future[int] | None = None
        self._error: QuireError | None = None
        self._closing = False
        self._closed = False

    # --- opening -------------------------------------------------------------------

    @classmethod
    async def open(cls, logs: LogStore, name: str, options: WriterOptions) -> LogWriter:
        """Take the log (epoch + 1, hold) and recover its open ledgers."""
        store = logs.metadata_store
        owner = uuid.uuid4().hex
        if options.create:
            await logs.create(name, exist_ok=True)
        for _ in range(_MAX_ATTEMPTS):
            current = await logs.read_head(name)
            epoch = current.value.epoch + 1
            head = current.value.with_(
                epoch=epoch, writer=WriterHold(epoch=epoch, owner=owner, since_ms=logs.now_ms()))
            try:
                version = await store.write_record(rec.head_key(name), rec.encode_head(head),
                                                   current.version)
            except MetadataVersionError:
                continue
            except MetadataNotFoundError:
                raise LogNotFoundError(f"no log named {name!r}") from None
            except MetadataError:
                again = await logs.read_head(name)  # outcome unknown: look
                if again.value.writer is None or again.value.writer.owner != owner:
                    continue
                head, version = again.value, again.version
            writer = cls(logs, name, head, version, owner, options)
            await writer._recover_open_ledgers()
            return writer
        raise LogError(f"log {name!r} kept changing; open_writer gave up")

    async def _recover_open_ledgers(self) -> None:
        """Fence and close every ledger of the log still open (a previous
        writer's), recording its end; empty ones leave the log."""
        for found in await self._logs.ledger_records(self._name):
            record = found.value
            if record.closed:
                continue
            try:
                handle = await self._logs.client.open_ledger(
                    record.ledger_id, password=self._logs.password, recovery=True)
            except MetadataNotFoundError:
                entries, length = 0, 0  # the ledger is gone: drop its record
            else:
                entries = handle.metadata.last_entry_id + 1
                length = handle.metadata.length
                await handle.close()
            key = rec.ledger_key(self._name, record.seq)
            op: Op = (DeleteRecord(key, found.version) if entries == 0 else UpdateRecord(
                key, rec.encode_ledger(_closed(record, entries, length)), found.version))

            def check_head(head: HeadRecord, op: Op = op) -> tuple[HeadRecord | None, list[Op]]:
                return None, [op]

            await self._head_txn(check_head)
            if entries == 0:
                await self._logs.delete_ledgers([record.ledger_id])
            log.info("log %s: recovered ledger %d (seq %d) at %d entries", self._name,
                     record.ledger_id, record.seq, entries)

    # --- properties ----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def epoch(self) -> int:
        """This writer's epoch (the log's epoch when it opened)."""
        return self._epoch

    @property
    def ledger_seq(self) -> int | None:
        """The seq of the ledger being written (None before the first append)."""
        return self._seq if self._ledger is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    # --- appending -----------------------------------------------------------------

    def append(self, data: bytes) -> asyncio.Future[Position]:
        """Append one entry; the future gives its position once acknowledged.

        Raises at once LogFencedError / the writer's earlier error if it
        failed, LogWriterClosedError once closing, and QueueFullError when the
        current ledger's queue is full (await earlier futures, then retry).
        """
        self._check_usable()
        future: asyncio.Future[Position] = self._loop.create_future()
        if self._roll_task is not None or self._backlog or self._needs_roll():
            self._backlog.append((data, future))
            self._last = future
            if self._roll_task is None:
                self._roll_task = self._loop.create_task(self._roll())
            return future
        self._send(data, future)
        self._last = future
        return future

    def _check_usable(self) -> None:
        if self._error is not None:
            raise _copy(self._error)
        if self._closing or self._closed:
            raise LogWriterClosedError(f"log {self._name!r}: the writer is closed")

    def _needs_roll(self) -> bool:
        if self._ledger is None:
            return True
        if self._ledger_bytes >= self._options.roll_bytes:
            return True
        age_ms = self._options.roll_age_ms
        return (age_ms > 0 and self._ledger_bytes > 0
                and (_monotonic() - self._ledger_since) * 1000 >= age_ms)

    def _send(self, data: bytes, future: asyncio.Future[Position]) -> None:
        """Append to the current ledger (QueueFullError passes through)."""
        assert self._ledger is not None
        inner = self._ledger.append(data)
        seq = self._seq
        self._ledger_bytes += len(data)
        self._last_inner = inner

        def done(inner: asyncio.Future[int]) -> None:
            if future.done():
                return
            if inner.cancelled():
                future.cancel()
                return
            error = inner.exception()
            if error is None:
                future.set_result(Position(seq, inner.result()))
                return
            mapped = self._map_error(error)
            future.set_exception(mapped)
            self._fail(mapped)

        inner.add_done_callback(done)

    def _map_error(self, error: BaseException) -> BaseException:
        if isinstance(error, LedgerFencedError | UnauthorizedError):
            fenced = LogFencedError(f"log {self._name!r}: writer epoch {self._epoch} was fenced "
                                    f"out ({error})")
            fenced.__cause__ = error
            return fenced
        return error

    def _fail(self, error: BaseException) -> None:
        """The writer cannot go on: fail what waits in the backlog."""
        if self._error is None:
            self._error = error if isinstance(error, QuireError) else LogError(str(error))
            log.warning("log %s: writer (epoch %d) failed: %s", self._name, self._epoch, error)
        while self._backlog:
            _data, future = self._backlog.popleft()
            if not future.done():
                future.set_exception(_copy(self._error))
                future.exception()  # the caller may never look

    async def flush(self) -> Position | None:
        """Wait until every append made so far is acknowledged -- and, for a
        VD_JOURNAL log, synced (BP-14: durable on the bookies, and readable
        by readers); the last position (None if nothing was appended).
        Raises the first failure."""
        if self._last is None:
            if self._error is not None:
                raise _copy(self._error)
            return None
        position = await asyncio.shield(self._last)
        ledger = self._ledger
        if ledger is not None and position.ledger_seq == self._seq:
            try:
                await ledger.sync()  # BP-14: a VD log's entries become durable and readable
            except (LedgerFencedError, UnauthorizedError) as e:
                mapped = self._map_error(e)
                self._fail(mapped)
                raise mapped from e
        return position

    # --- rolling -------------------------------------------------------------------

    async def _roll(self) -> None:
        """Roll, send the appends that waited meanwhile; roll again whenever
        the new ledger fills up before the backlog is empty."""
        try:
            while True:
                await self._roll_once()
                await self._drain_backlog()
                if not self._backlog or self._error is not None:
                    return
        except (LedgerFencedError, UnauthorizedError) as e:
            self._fail(self._map_error(e))
        except QuireError as e:
            self._fail(e)
        except Exception as e:
            log.exception("log %s: roll failed", self._name)
            self._fail(LogError(f"log {self._name!r}: roll failed: {e!r}"))
        finally:
            self._roll_task = None

    async def _roll_once(self) -> None:
        """Close the current ledger, open the next, record both in one
        transaction with the head."""
        old, old_seq, old_version = self._ledger, self._seq, self._record_version
        old_created = self._created_ms
        self._ledger = None
        closed: LedgerRecord | None = None
        if old is not None:
            await old.close()
            md = old.metadata
            closed = LedgerRecord(seq=old_seq, ledger_id=old.ledger_id, state="closed",
                                  created_ms=old_created, entries=md.last_entry_id + 1,
                                  bytes=md.length, epoch=self._epoch)
        options = self._options
        new = await self._logs.client.create_ledger(
            options.ensemble_size, options.write_quorum_size, options.ack_quorum_size,
            ledger_type=options.ledger_type, digest_type=options.digest_type,
            password=self._logs.password,
            custom_metadata={"quire.log": self._name.encode(),
                             "quire.epoch": str(self._epoch).encode()})
        now = self._logs.now_ms()
        created: list[LedgerRecord] = []

        def change(head: HeadRecord) -> tuple[HeadRecord | None, list[Op]]:
            record = LedgerRecord(seq=head.next_seq, ledger_id=new.ledger_id, state="open",
                                  created_ms=now, epoch=self._epoch)
            created[:] = [record]
            ops: list[Op] = []
            if closed is not None:
                key = rec.ledger_key(self._name, old_seq)
                if closed.entries:
                    ops.append(UpdateRecord(key, rec.encode_ledger(closed), old_version))
                else:
                    ops.append(DeleteRecord(key, old_version))
            ops.append(CreateRecord(rec.ledger_key(self._name, record.seq),
                                    rec.encode_ledger(record)))
            return head.with_(next_seq=head.next_seq + 1), ops

        try:
            await self._head_txn(change)
        except BaseException:
            await self._discard(new)
            raise
        if closed is not None and not closed.entries:
            await self._logs.delete_ledgers([closed.ledger_id])
        self._ledger, self._seq, self._record_version = new, created[0].seq, 0
        self._created_ms = now
        self._ledger_bytes = 0
        self._ledger_since = _monotonic()

    async def _drain_backlog(self) -> None:
        """Send waiting appends in order until none is left or the ledger is full."""
        while self._backlog and self._error is None and not self._needs_roll():
            data, future = self._backlog[0]
            if future.done():
                self._backlog.popleft()
                continue
            try:
                self._send(data, future)
            except QueueFullError:
                inner = self._last_inner
                assert inner is not None
                with contextlib.suppress(Exception):
                    await asyncio.shield(inner)
                continue
            self._backlog.popleft()

    async def _discard(self, handle: WriteHandle) -> None:
        with contextlib.suppress(QuireError):
            await handle.close()
        await self._logs.delete_ledgers([handle.ledger_id])

    # --- metadata ------------------------------------------------------------------

    async def _head_txn(self, change: HeadChange) -> None:
        """Run ``change``'s ops in one transaction with a compare-and-set (or
        check) of the head at the version this writer knows.  When the head
        moved, re-read it: still ours (same epoch and hold) -> retry;
        otherwise -> LogFencedError."""
        store = self._logs.metadata_store
        key = rec.head_key(self._name)
        for _ in range(_MAX_ATTEMPTS):
            new_head, ops = change(self._head)
            head_op: Op = (CheckRecord(key, self._head_version) if new_head is None
                           else UpdateRecord(key, rec.encode_head(new_head), self._head_version))
            try:
                versions = await store.transaction([head_op, *ops])
            except TransactionError as e:
                if e.failed_index != 0:
                    raise self._fenced(f"a record of the log changed under it ({e})") from e
                await self._reload_head()
                continue
            except MetadataError:
                # outcome unknown: retry on the head we find (a landed roll
                # shows as a head we know nothing of -> treated as fenced)
                await self._reload_head()
                continue
            if new_head is not None:
                version = versions[0]
                assert version is not None
                self._head, self._head_version = new_head, version
            return
        raise LogError(f"log {self._name!r} kept changing; the writer gave up")

    async def _reload_head(self) -> None:
        try:
            current = await self._logs.read_head(self._name)
        except LogNotFoundError as e:
            raise self._fenced("the log was deleted") from e
        writer = current.value.writer
        if current.value.epoch != self._epoch or writer is None or writer.owner != self._owner:
            raise self._fenced(f"the log is now at epoch {current.value.epoch}")
        self._head, self._head_version = current.value, current.version

    def _fenced(self, why: str) -> LogFencedError:
        error = LogFencedError(f"log {self._name!r}: writer epoch {self._epoch} was fenced "
                               f"out: {why}")
        self._fail(error)
        return error

    # --- closing -------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for pending appends, close the ledger, release the hold.

        Idempotent.  LogFencedError if this writer was fenced out (its ledger
        and the log are then the new writer's).  After another failure the
        ledger is recovered and the hold released; the error was reported
        through the appends' futures.
        """
        if self._closed:
            return
        self._closing = True
        with contextlib.suppress(Exception):
            await self.flush()
        if self._roll_task is not None:
            with contextlib.suppress(Exception):
                await self._roll_task
        if isinstance(self._error, LogFencedError):
            self._closed = True
            raise _copy(self._error)
        ledger = self._ledger
        entries, length = 0, 0
        if ledger is not None:
            try:
                await ledger.close()  # a VD ledger's close syncs first
                entries, length = ledger.metadata.last_entry_id + 1, ledger.metadata.length
            except (LedgerFencedError, UnauthorizedError) as e:
                self._closed = True
                raise self._fenced(str(e)) from e
            except (QuireError, ClientClosedError):
                handle = await self._logs.client.open_ledger(
                    ledger.ledger_id, password=self._logs.password, recovery=True)
                entries, length = handle.metadata.last_entry_id + 1, handle.metadata.length
                await handle.close()
        seq, version = self._seq, self._record_version
        created_ms = self._created_ms

        def change(head: HeadRecord) -> tuple[HeadRecord | None, list[Op]]:
            ops: list[Op] = []
            if ledger is not None:
                key = rec.ledger_key(self._name, seq)
                if entries:
                    ops.append(UpdateRecord(key, rec.encode_ledger(LedgerRecord(
                        seq=seq, ledger_id=ledger.ledger_id, state="closed",
                        created_ms=created_ms, entries=entries, bytes=length,
                        epoch=self._epoch)), version))
                else:
                    ops.append(DeleteRecord(key, version))
            return head.with_(writer=None), ops

        try:
            await self._head_txn(change)
        finally:
            self._closed = True
        if ledger is not None and not entries:
            await self._logs.delete_ledgers([ledger.ledger_id])

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _closed(record: LedgerRecord, entries: int, length: int) -> LedgerRecord:
    return LedgerRecord(seq=record.seq, ledger_id=record.ledger_id, state="closed",
                        created_ms=record.created_ms, entries=entries, bytes=length,
                        epoch=record.epoch)


def _copy(error: BaseException) -> BaseException:
    """A fresh instance to raise (an exception object raised in many places
    would pile up tracebacks)."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error.__cause__
    return copy
