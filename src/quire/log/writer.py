"""The single writer of a named log: :class:`LogWriter`.

Contract:

* **One writer at a time.**  Opening a writer takes the log (its epoch goes
  up by one: :meth:`~quire.log.catalog.LogCatalog.take`), then recovers
  (fences and closes) every ledger of the log still open.  A writer whose
  log was taken gets :class:`~quire.log.LogFencedError` from its pending
  and later appends, its next roll, flush, truncate and close: never a
  silent loss.  (As in BookKeeper, an append that failed has an *unknown*
  outcome: recovery may have kept it.)
* **A fenced ledger is not a lost log.**  When the ledger being written
  refuses an add (FENCED or UNAUTHORIZED: a bookie fenced it at boot, a
  recovery ran), the writer re-reads the log's head.  Only if the epoch
  there is no longer its own does it fail.  Otherwise it recovers the ledger
  (closes it at its last recoverable entry), completes every pending append
  the ledger kept with its position there, and sends the others, in order
  and ahead of later appends, to a new ledger (a roll): nothing acknowledged
  is lost and nothing is written twice.
* **Order.**  Positions increase in ``append`` call order and the futures
  complete in that order.
* **Rolling.**  The writer appends to one ledger at a time and moves to a
  new one when the current ledger holds ``roll_bytes`` of payload or is
  older than ``roll_age_ms`` (checked on append), or refused an add.  A roll
  closes the ledger (its pending appends complete first), creates the next
  one and records both in one transaction conditional on the writer's hold
  on the log.  Appends made during a roll wait inside the writer.
* **Closing** waits for pending appends, closes the ledger and releases the
  hold.  An empty ledger is dropped from the log rather than kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from time import monotonic as _monotonic

from quire.client import Client, Password, ReadHandle, WriteHandle
from quire.errors import (
    ClientClosedError,
    LedgerFencedError,
    QueueFullError,
    QuireError,
    UnauthorizedError,
    fresh_copy,
)
from quire.log import records as rec
from quire.log.catalog import LogCatalog, LogHold
from quire.log.errors import LogError, LogFencedError, LogWriterClosedError
from quire.log.ledgers import LedgerEnd, delete_ledgers, recover_end
from quire.log.position import Position
from quire.log.records import HeadRecord, LedgerRecord
from quire.metadata import CreateRecord, DeleteRecord, Op, UpdateRecord
from quire.types import DigestType, LedgerType

log = logging.getLogger("quire.log")

_REFUSALS = (LedgerFencedError, UnauthorizedError)
"""How a ledger refuses its writer: fenced (a recovery ran, or a bookie
fenced it), or its master key no longer accepted."""

MAX_EMPTY_REFUSALS = 5
"""A writer whose ledgers refuse their first add this many times in a row
(nothing is getting through: no fence at a boot looks like this) fails."""


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


_Append = tuple[bytes, "asyncio.Future[Position]"]
"""An append the writer still answers for: its payload and its future."""


class LogWriter:
    """Appends to a named log; see the module docstring.  Get one with
    :meth:`quire.log.LogStore.open_writer` (or :meth:`open`) and use it on
    the client's loop."""

    def __init__(self, catalog: LogCatalog, client: Client, hold: LogHold,
                 options: WriterOptions, *, password: Password) -> None:
        self._catalog = catalog
        self._client = client
        self._hold = hold
        self._name = hold.name
        self._epoch = hold.epoch
        self._options = options
        self._password = password
        self._loop = asyncio.get_running_loop()
        self._ledger: WriteHandle | None = None
        self._seq = -1
        self._record_version = 0
        self._ledger_bytes = 0
        self._ledger_since = 0.0
        self._created_ms = 0
        self._unacked: deque[_Append] = deque()
        """Appends sent to the current ledger and not yet acknowledged, in
        entry order (the last ones the ledger was given)."""
        self._refused: WriteHandle | None = None
        """The current ledger once it refused an add (a roll settles it)."""
        self._empty_refusals = 0
        """Refused ledgers in a row that kept no entry."""
        self._backlog: deque[_Append] = deque()
        self._roll_task: asyncio.Task[None] | None = None
        self._last: asyncio.Future[Position] | None = None
        self._last_inner: asyncio.Future[int] | None = None
        self._error: QuireError | None = None
        self._closing = False
        self._closed = False

    # --- opening -------------------------------------------------------------------

    @classmethod
    async def open(cls, catalog: LogCatalog, client: Client, name: str,
                   options: WriterOptions, *, password: Password) -> LogWriter:
        """Take the log (epoch + 1, hold) and recover its open ledgers."""
        if options.create:
            await catalog.create(name, exist_ok=True)
        hold = await catalog.take(name)
        writer = cls(catalog, client, hold, options, password=password)
        await writer._recover_open_ledgers()
        return writer

    async def _recover_open_ledgers(self) -> None:
        """Fence and close every ledger of the log still open (a previous
        writer's), recording its end; empty ones leave the log."""
        for found in await self._catalog.ledger_records(self._name):
            record = found.value
            if record.closed:
                continue
            end = await recover_end(self._client, record.ledger_id, self._password)
            key = rec.ledger_key(self._name, record.seq)
            op: Op = (DeleteRecord(key, found.version) if end.entries == 0 else UpdateRecord(
                key, rec.encode_ledger(_closed(record, end)), found.version))

            def check_head(head: HeadRecord, op: Op = op) -> tuple[HeadRecord | None, list[Op]]:
                return None, [op]

            await self._hold.transact(check_head)
            if end.entries == 0:
                await delete_ledgers(self._client, [record.ledger_id])
            log.info("log %s: recovered ledger %d (seq %d) at %d entries", self._name,
                     record.ledger_id, record.seq, end.entries)

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

    def ledger_handle(self, ledger_seq: int) -> ReadHandle | None:
        """The handle of the ledger being written if its seq is ``ledger_seq``
        (else None).  Its LastAddConfirmed is this writer's last acknowledged
        entry there, which readers elsewhere learn only later; do not close it.
        None once the writer failed or closed."""
        ledger = self._ledger
        if ledger is None or self._seq != ledger_seq or self._error is not None or self._closed:
            return None
        return ledger

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
            self._start_roll()
            return future
        try:
            self._send(data, future)
        except _REFUSALS:
            # the ledger failed an add; its futures' callbacks have not run yet
            self._backlog.append((data, future))
            self._refused_by(self._ledger)
        self._last = future
        return future

    def _check_usable(self) -> None:
        if self._error is not None:
            raise fresh_copy(self._error)
        if self._closing or self._closed:
            raise LogWriterClosedError(f"log {self._name!r}: the writer is closed")

    def _needs_roll(self) -> bool:
        ledger = self._ledger
        if ledger is None or self._refused is ledger:
            return True
        if self._ledger_bytes >= self._options.roll_bytes:
            return True
        age_ms = self._options.roll_age_ms
        return (age_ms > 0 and self._ledger_bytes > 0
                and (_monotonic() - self._ledger_since) * 1000 >= age_ms)

    def _send(self, data: bytes, future: asyncio.Future[Position]) -> None:
        """Append to the current ledger (QueueFullError, and the ledger's
        error once it failed, pass through)."""
        ledger = self._ledger
        assert ledger is not None
        inner = ledger.append(data)
        unacked = self._unacked
        unacked.append((data, future))
        seq = self._seq
        self._ledger_bytes += len(data)
        self._last_inner = inner

        def done(inner: asyncio.Future[int]) -> None:
            error = (LogError(f"log {self._name!r}: an append was cancelled")
                     if inner.cancelled() else inner.exception())
            if error is None:
                unacked.popleft()
                if not future.done():
                    future.set_result(Position(seq, inner.result()))
                return
            if isinstance(error, _REFUSALS):
                self._refused_by(ledger)  # the append stays unacked: the roll settles it
                return
            if not future.done():
                future.set_exception(error)
            self._fail(error)

        inner.add_done_callback(done)

    def _refused_by(self, ledger: WriteHandle | None) -> None:
        """``ledger`` refused an add: roll away from it (the roll decides
        whether the log is still ours)."""
        if ledger is not None and ledger is self._ledger:
            self._refused = ledger
        self._start_roll()

    def _fail(self, error: BaseException) -> None:
        """The writer cannot go on: fail every append it still answers for."""
        if self._error is None:
            self._error = error if isinstance(error, QuireError) else LogError(str(error))
            log.warning("log %s: writer (epoch %d) failed: %s", self._name, self._epoch, error)
        for _data, future in (*self._unacked, *self._backlog):
            if not future.done():
                future.set_exception(fresh_copy(self._error))
                future.exception()  # the caller may never look
        self._backlog.clear()

    async def flush(self) -> Position | None:
        """Wait until every append made so far is acknowledged -- and, for a
        VD_JOURNAL log, synced (BP-14: durable on the bookies, and readable
        by readers); the last position (None if nothing was appended).
        Raises the first failure."""
        last = self._last
        if last is None:
            if self._error is not None:
                raise fresh_copy(self._error)
            return None
        while True:
            position = await asyncio.shield(last)
            ledger = self._ledger
            if ledger is None or position.ledger_seq != self._seq:
                return position  # its ledger was closed (synced first)
            try:
                await ledger.sync()  # BP-14: a VD log's entries become durable and readable
                return position
            except _REFUSALS:
                self._refused_by(ledger)
                task = self._roll_task
                if task is not None:
                    await asyncio.shield(task)  # the roll closes (recovers) that ledger
                if self._error is not None:
                    raise fresh_copy(self._error) from None

    # --- rolling -------------------------------------------------------------------

    def _start_roll(self) -> None:
        if self._roll_task is None and self._error is None:
            self._roll_task = self._loop.create_task(self._roll())

    async def _roll(self) -> None:
        """Roll, send the appends that waited meanwhile; roll again whenever
        the new ledger fills up (or refuses an add) before they are sent."""
        try:
            while self._error is None:
                await self._roll_once()
                await self._drain_backlog()
                if not self._backlog and self._refused is not self._ledger:
                    return
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
            end = await self._close_or_recover(old)
            self._settle(old, old_seq, end)
            closed = LedgerRecord(seq=old_seq, ledger_id=old.ledger_id, state="closed",
                                  created_ms=old_created, entries=end.entries,
                                  bytes=end.bytes, epoch=self._epoch)
        options = self._options
        new = await self._client.create_ledger(
            options.ensemble_size, options.write_quorum_size, options.ack_quorum_size,
            ledger_type=options.ledger_type, digest_type=options.digest_type,
            password=self._password,
            custom_metadata={"quire.log": self._name.encode(),
                             "quire.epoch": str(self._epoch).encode()})
        now = self._catalog.clock.wall_ms()
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
            await self._hold.transact(change)
        except BaseException:
            await self._discard(new)
            raise
        if closed is not None and not closed.entries:
            await delete_ledgers(self._client, [closed.ledger_id])
        self._ledger, self._seq, self._record_version = new, created[0].seq, 0
        self._unacked = deque()
        self._refused = None
        self._created_ms = now
        self._ledger_bytes = 0
        self._ledger_since = _monotonic()

    async def _close_or_recover(self, ledger: WriteHandle) -> LedgerEnd:
        """Close the ledger; if it refuses (it was fenced), recover it --
        unless the log is no longer ours (LogFencedError)."""
        try:
            await ledger.close()  # a VD ledger's close syncs first
        except _REFUSALS as e:
            await self._hold.check()
            log.info("log %s: ledger %d was fenced while writer epoch %d holds the log (%s); "
                     "recovering it and rolling", self._name, ledger.ledger_id, self._epoch, e)
            end = await recover_end(self._client, ledger.ledger_id, self._password)
            self._empty_refusals = 0 if end.entries else self._empty_refusals + 1
            if self._empty_refusals >= MAX_EMPTY_REFUSALS:
                raise LogError(f"log {self._name!r}: {self._empty_refusals} ledgers in a row "
                               f"refused their first add; last: {e}") from e
            return end
        md = ledger.metadata
        return LedgerEnd(md.last_entry_id + 1, md.length)

    def _settle(self, ledger: WriteHandle, seq: int, end: LedgerEnd) -> None:
        """The closed ledger ``seq`` kept ``end.entries`` entries: complete
        the unacknowledged appends it kept, and put the others back at the
        front of the backlog, in order, for the next ledger."""
        unacked = self._unacked
        first = ledger.last_add_pushed + 1 - len(unacked)
        resend: list[_Append] = []
        for offset, (data, future) in enumerate(unacked):
            if future.done():
                continue
            if first + offset < end.entries:
                future.set_result(Position(seq, first + offset))
            else:
                resend.append((data, future))
        if resend:
            log.info("log %s: resending %d appends that ledger %d (seq %d) did not keep",
                     self._name, len(resend), ledger.ledger_id, seq)
            self._backlog.extendleft(reversed(resend))

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
            except _REFUSALS:
                self._refused = self._ledger
                return
            self._backlog.popleft()

    async def _discard(self, handle: WriteHandle) -> None:
        with contextlib.suppress(QuireError):
            await handle.close()
        await delete_ledgers(self._client, [handle.ledger_id])

    # --- truncating ----------------------------------------------------------------

    async def truncate(self, before: Position) -> list[int]:
        """Truncate the log as its writer: as
        :meth:`~quire.log.LogStore.truncate` (whole closed ledgers below
        ``before`` leave the log and are deleted; returns their ids), but
        conditional on this writer's hold: LogFencedError once the log is no
        longer this writer's."""
        self._check_usable()
        try:
            removed = await self._catalog.remove_front(self._name, before, hold=self._hold)
        except LogFencedError as e:
            self._fail(e)
            raise
        ids = [r.ledger_id for r in removed]
        await delete_ledgers(self._client, ids)
        return ids

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
            raise fresh_copy(self._error)
        ledger = self._ledger
        end = LedgerEnd(0, 0)
        try:
            if ledger is not None:
                end = await self._close_ledger(ledger)
            seq, version = self._seq, self._record_version
            created_ms = self._created_ms

            def change(head: HeadRecord) -> tuple[HeadRecord | None, list[Op]]:
                ops: list[Op] = []
                if ledger is not None:
                    key = rec.ledger_key(self._name, seq)
                    if end.entries:
                        ops.append(UpdateRecord(key, rec.encode_ledger(LedgerRecord(
                            seq=seq, ledger_id=ledger.ledger_id, state="closed",
                            created_ms=created_ms, entries=end.entries, bytes=end.bytes,
                            epoch=self._epoch)), version))
                    else:
                        ops.append(DeleteRecord(key, version))
                return head.with_(writer=None), ops

            await self._hold.transact(change)
        except LogFencedError as e:
            self._fail(e)
            raise
        finally:
            self._closed = True
        if ledger is not None and not end.entries:
            await delete_ledgers(self._client, [ledger.ledger_id])

    async def _close_ledger(self, ledger: WriteHandle) -> LedgerEnd:
        """Close the last ledger at close(); recover it if it was fenced while
        the log is ours (LogFencedError if not) or if the close failed."""
        try:
            await ledger.close()  # a VD ledger's close syncs first
        except _REFUSALS:
            await self._hold.check()
        except (QuireError, ClientClosedError):
            pass
        else:
            return LedgerEnd(ledger.metadata.last_entry_id + 1, ledger.metadata.length)
        return await recover_end(self._client, ledger.ledger_id, self._password)

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _closed(record: LedgerRecord, end: LedgerEnd) -> LedgerRecord:
    return LedgerRecord(seq=record.seq, ledger_id=record.ledger_id, state="closed",
                        created_ms=record.created_ms, entries=end.entries, bytes=end.bytes,
                        epoch=record.epoch)

