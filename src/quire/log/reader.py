"""Reading a named log across its ledgers: :class:`LogReader`.

A reader holds a *next position*.  Each read finds the ledger at that
position (or the next one in the log), reads what is there up to the
ledger's end (closed) or its LastAddConfirmed (open) with batched reads,
and moves on.  At the tail a following reader waits: it polls the open
ledger's LAC (``read_last_add_confirmed``) and the log's head (for ledgers
that joined) with an exponential backoff from 2 ms up to ``poll_max_ms``.

Entries are delivered in position order, each once.  A next position that
was removed by a truncation or an overwrite raises
:class:`~quire.log.LogTruncatedError` (or, with ``skip_truncated``, the
reader jumps to the first entry still in the log).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass

from quire.client import Client, Password, ReadHandle
from quire.errors import MetadataNotFoundError
from quire.log.catalog import LogCatalog
from quire.log.errors import LogTruncatedError
from quire.log.position import Position
from quire.log.records import HeadRecord, LedgerRecord

_POLL_MIN_S = 0.002


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One entry of a log: where it is and what it holds."""

    position: Position
    payload: bytes

    @property
    def ledger_seq(self) -> int:
        return self.position.ledger_seq

    @property
    def entry_id(self) -> int:
        return self.position.entry_id


class LogReader:
    """Reads a log in order from a position; see the module docstring.  Get
    one with :meth:`quire.log.LogStore.open_reader`; ``password`` is the
    log's ledgers' password.  Iterate with
    ``async for record in reader`` (which ends at the tail unless the reader
    follows it) or call :meth:`read_next`."""

    def __init__(self, catalog: LogCatalog, client: Client, name: str, position: Position, *,
                 password: Password = b"", follow: bool = True, skip_truncated: bool = False,
                 poll_max_ms: int = 200,
                 own_handle: Callable[[int], ReadHandle | None] | None = None) -> None:
        self._catalog = catalog
        self._client = client
        self._password = password
        self._own_handle = own_handle
        """ledger seq -> a handle this process writes that ledger with (its
        writer's ``ledger_handle``), read instead of opening one; never closed here."""
        self._name = name
        self._position = position
        self._follow = follow
        self._skip_truncated = skip_truncated
        self._poll_max_s = max(poll_max_ms, 1) / 1000.0
        self._head: HeadRecord | None = None
        self._head_version = -1
        self._ledgers: list[LedgerRecord] = []
        self._seqs: list[int] = []
        self._handle: ReadHandle | None = None
        self._handle_seq = -1
        self._buffer: list[LogRecord] = []
        self._closed = False

    @property
    def position(self) -> Position:
        """The position the next record will be at or after."""
        return self._buffer[0].position if self._buffer else self._position

    @property
    def name(self) -> str:
        return self._name

    # --- reading ----------------------------------------------------------------------

    async def read_next(self, max_entries: int = 1000, *,
                        timeout: float | None = None) -> list[LogRecord]:
        """The next records in order, at least one and at most ``max_entries``.

        A following reader waits at the tail until an entry comes (or
        ``timeout`` seconds pass: then ``[]``); a reader that does not follow
        returns ``[]`` at the tail.
        """
        if max_entries <= 0:
            raise ValueError("max_entries must be > 0")
        if self._buffer:
            out, self._buffer = self._buffer[:max_entries], self._buffer[max_entries:]
            return out
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = _POLL_MIN_S
        while True:
            records = await self._read_available(max_entries)
            if records or not self._follow:
                return records
            wait = delay
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return []
            await asyncio.sleep(wait)
            delay = min(delay * 2, self._poll_max_s)

    def __aiter__(self) -> LogReader:
        return self

    async def __anext__(self) -> LogRecord:
        if not self._buffer:
            self._buffer = await self.read_next(1000)
            if not self._buffer:
                raise StopAsyncIteration
        return self._buffer.pop(0)

    async def _read_available(self, max_entries: int) -> list[LogRecord]:
        """What can be read now without waiting ([] at the tail)."""
        if self._head is None:
            await self._refresh(force=True)
        refreshed = False
        while True:
            pos = self._position
            index = bisect.bisect_left(self._seqs, pos.ledger_seq)
            ledger = self._ledgers[index] if index < len(self._ledgers) else None
            if ledger is None or ledger.seq != pos.ledger_seq:
                if not refreshed and await self._refresh():
                    refreshed = True
                    continue
                self._check_truncated(pos)
                if ledger is None:
                    return []  # nothing after pos yet
                self._position = Position(ledger.seq, 0)
                continue
            try:
                handle = await self._open(ledger)
            except MetadataNotFoundError:
                await self._refresh(force=True)  # removed under us: truncation?
                self._check_truncated(pos)
                if ledger in self._ledgers:
                    raise  # listed, yet gone: not a truncation
                continue
            last = handle.last_add_confirmed
            if pos.entry_id > last and not handle.is_closed:
                last = await handle.read_last_add_confirmed()
            if pos.entry_id <= last:
                stop = min(last, pos.entry_id + max_entries - 1)
                # size 0: the client's batch_read_max_bytes (a loose limit)
                entries = await handle.batch_read(pos.entry_id, stop - pos.entry_id + 1, 0)
                seq = ledger.seq
                records = [LogRecord(Position(seq, e.entry_id), e.data) for e in entries]
                self._position = Position(seq, entries[-1].entry_id + 1)
                return records
            if handle.is_closed:
                following = self._ledgers[index + 1] if index + 1 < len(self._ledgers) else None
                if following is not None:
                    self._position = Position(following.seq, 0)
                    await self._drop_handle()
                    continue
            if not refreshed and await self._refresh():
                refreshed = True
                continue
            return []

    def _check_truncated(self, pos: Position) -> None:
        """``pos`` is not in the listed ledgers: fail (or skip) if truncation
        removed it."""
        assert self._head is not None
        before = self._head.truncated_before
        if pos >= before:
            return
        if not self._skip_truncated:
            raise LogTruncatedError(f"log {self._name!r}: position {pos} was truncated "
                                    f"(entries before {before} are gone)")
        self._position = before

    async def _refresh(self, *, force: bool = False) -> bool:
        """Re-read the head; re-list the ledgers if it changed.  True if it did."""
        head = await self._catalog.read_head(self._name)
        if not force and head.version == self._head_version:
            return False
        found = await self._catalog.ledger_records(
            self._name, from_seq=min(self._position.ledger_seq, head.value.next_seq))
        self._head, self._head_version = head.value, head.version
        self._ledgers = [v.value for v in found]
        self._seqs = [r.seq for r in self._ledgers]
        return True

    async def _open(self, ledger: LedgerRecord) -> ReadHandle:
        own = self._own_handle(ledger.seq) if self._own_handle is not None else None
        if own is not None:
            return own
        if self._handle is not None and self._handle_seq == ledger.seq:
            return self._handle
        await self._drop_handle()
        self._handle = await self._client.open_ledger(
            ledger.ledger_id, password=self._password, recovery=False)
        self._handle_seq = ledger.seq
        return self._handle

    async def _drop_handle(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            await handle.close()

    async def close(self) -> None:
        """Release the reader (its open ledger handle)."""
        self._closed = True
        await self._drop_handle()

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
