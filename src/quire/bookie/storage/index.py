"""The ledger index: one LMDB environment in ``ledgers/index/``.

LMDB is always opened with ``sync=True, metasync=True``: a write transaction
is durable when ``commit()`` returns.  (The power-loss test seam therefore
treats every committed transaction as durable; LMDB rewrites pages in place
behind a double meta page, so byte-level truncation would not model it.)

Named databases, keys and values big-endian so that byte order is numeric
order (ids are below 2**63):

=========  ===========================  =====================================
database   key                          value
=========  ===========================  =====================================
entries    ledger_id u64, entry_id u64  log_id u32, offset u64, length u32
ledgers    ledger_id u64                encoded LedgerState (``state`` module)
logs       log_id u64                   ledger ids u64 ... (sorted): ledgers
                                        with entries in that entry log
usage      log_id u64, ledger_id u64    bytes u64, first u64, last u64:
                                        record bytes (length prefix + entry)
                                        the ledger has in that entry log,
                                        and the lowest and highest entry id
                                        of them (compaction's live fraction,
                                        and where its walk starts and ends;
                                        see ``compaction``)
meta       b"journal_mark"              file_seq u64, offset u64
meta       b"format"                    format version u32 (= 1)
meta       b"running"                   journal_write_data u8 (0 or 1): the
                                        unclean-shutdown mark (BP-46), see
                                        ``shutdown``
=========  ===========================  =====================================

``offset`` is the entry's record in the entry log (see ``entry_log``);
``length`` is the entry's length.

A checkpoint commits, in **one** transaction: removal of deleted ledgers
(their entries and state), the new index rows, the dirty ledger states, the
per-log ledger sets and byte totals, and the journal replay mark.  So after
a crash the index, the states and the mark always agree.

The ``usage`` database came after format 1 and is an addition to it, not a
new format: an index written before it (or by a build without it) simply
has no usage rows for its logs; :meth:`LedgerIndex.log_usage` then counts
those logs' bytes from the ``entries`` rows once and stores the totals.  A
log's usage rows are all written by the run that wrote the log (every open
starts a new log), so a log has either all its rows or none.  Rows of
deleted ledgers stay until their log goes: readers count only the ledgers
that still exist.

Compaction (``compaction``) moves a log's live rows to a new log in one
transaction of its own (:meth:`LedgerIndex.commit_compaction`), which also
drops the old log's ``logs`` and ``usage`` records.

The ``running`` key is written in a transaction of its own when the engine
opens and deleted in one as the last step of a clean close; it is never
touched by a checkpoint.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from itertools import compress
from operator import eq
from pathlib import Path
from typing import NamedTuple

import lmdb

from quire.bookie.storage import entry_log
from quire.bookie.storage.entry_log import RECORD_PREFIX_SIZE, IndexRows
from quire.bookie.storage.journal_format import JournalMark
from quire.bookie.storage.state import LedgerState
from quire.errors import StorageError

INDEX_FORMAT = 1
ENTRY_KEY = struct.Struct(">QQ")
ENTRY_VALUE = struct.Struct(">IQI")
LEDGER_KEY = struct.Struct(">Q")
LOG_KEY = struct.Struct(">Q")
USAGE_KEY = struct.Struct(">QQ")
USAGE_VALUE = struct.Struct(">QQQ")
_COUNTED = (1 << 64) - 1
"""Usage row ledger id (no ledger's: ids are below 2**63) of a log whose
usage was counted from its entry rows, so that a log they gave nothing
(none of its rows left) is not counted again."""
MARK_VALUE = struct.Struct(">QQ")
_FORMAT_VALUE = struct.Struct(">I")
_MARK_KEY = b"journal_mark"
_FORMAT_KEY = b"format"
_RUNNING_KEY = b"running"
_RUNNING_VALUE = struct.Struct(">B")


def _pack_ids(ids: Iterable[int]) -> bytes:
    ordered = sorted(ids)
    return struct.pack(f">{len(ordered)}Q", *ordered)


def _unpack_ids(data: bytes) -> set[int]:
    return set(struct.unpack(f">{len(data) // 8}Q", data))


class LedgerUse(NamedTuple):
    """What one ledger has in one entry log."""

    record_bytes: int
    """Of its records there (length prefix + entry)."""
    first_entry: int
    """The lowest entry id the index has in that log (perhaps rewritten
    elsewhere since: the range only bounds where to look)."""
    last_entry: int
    """The highest."""

    def merged(self, other: LedgerUse) -> LedgerUse:
        return LedgerUse(self.record_bytes + other.record_bytes,
                         min(self.first_entry, other.first_entry),
                         max(self.last_entry, other.last_entry))


LogUsage = Mapping[tuple[int, int], LedgerUse]
"""By ``(log id, ledger id)``."""


class MovedRows(NamedTuple):
    """Entries compaction copied, one column per field: their keys, where
    the index had them when they were read, and where the copies went."""

    ledger_ids: list[int]
    entry_ids: list[int]
    old_values: list[bytes]
    """The ``entries`` values read (packed): a row is moved only if it
    still holds exactly this."""
    copies: IndexRows
    """Where each copy went (same positions; in key order, log ids never
    going down, as the entry logger writes them)."""


def usage_of_rows(rows: IndexRows) -> dict[tuple[int, int], LedgerUse]:
    """What ``rows`` put in each log, by ``(log id, ledger id)``.  ``rows``
    are in key order and their log ids never go down (as a checkpoint writes
    them), so each pair is one run, found by two ``bisect`` s: Python loops
    per run only, and the per-entry work (a ``sum`` of a slice per run) is
    C-level and short."""
    ledger_ids, entry_ids, log_ids, lengths = (rows.ledger_ids, rows.entry_ids, rows.log_ids,
                                               rows.lengths)
    out: dict[tuple[int, int], LedgerUse] = {}
    pos, count = 0, len(ledger_ids)
    while pos < count:
        ledger_id, log_id = ledger_ids[pos], log_ids[pos]
        end = bisect_right(ledger_ids, ledger_id, pos)
        end = max(pos + 1, bisect_right(log_ids, log_id, pos, end))
        use = LedgerUse(sum(lengths[pos:end]) + RECORD_PREFIX_SIZE * (end - pos),
                        min(entry_ids[pos], entry_ids[end - 1]),
                        max(entry_ids[pos], entry_ids[end - 1]))
        pair = (log_id, ledger_id)
        old = out.get(pair)
        out[pair] = use if old is None else old.merged(use)
        pos = end
    return out


class LedgerIndex:
    """Thread-safe: each call uses its own LMDB transaction (LMDB serialises
    writers and gives readers a snapshot)."""

    def __init__(self, path: Path, *, map_size_bytes: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(str(path), subdir=True, map_size=map_size_bytes, max_dbs=8,
                                 sync=True, metasync=True, map_async=False, writemap=False,
                                 readahead=False, meminit=False, lock=True)
        except lmdb.Error as e:
            raise StorageError(f"cannot open ledger index {path}: {e}") from e
        self._entries = self.env.open_db(b"entries")
        self._ledgers = self.env.open_db(b"ledgers")
        self._logs = self.env.open_db(b"logs")
        self._usage = self.env.open_db(b"usage")
        self._meta = self.env.open_db(b"meta")
        with self.env.begin(db=self._meta, write=True) as txn:
            found = txn.get(_FORMAT_KEY)
            self.created = found is None
            """True if this open created the index (a new or emptied directory)."""
            if found is None:
                txn.put(_FORMAT_KEY, _FORMAT_VALUE.pack(INDEX_FORMAT))
            elif _FORMAT_VALUE.unpack(found)[0] != INDEX_FORMAT:
                raise StorageError(f"ledger index {path} has format "
                                   f"{_FORMAT_VALUE.unpack(found)[0]}, expected {INDEX_FORMAT}")

    # --- reads --------------------------------------------------------------

    def get(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """``(log_id, offset, length)`` of an entry, or None."""
        try:
            with self.env.begin(db=self._entries) as txn:
                value = txn.get(ENTRY_KEY.pack(ledger_id, entry_id))
        except lmdb.Error as e:
            raise StorageError(f"ledger index read failed: {e}") from e
        if value is None:
            return None
        log_id, offset, length = ENTRY_VALUE.unpack(value)
        return log_id, offset, length

    def locate_run(self, ledger_id: int, entry_id: int, max_bytes: int,
                   max_count: int = 1 << 62) -> tuple[int, list[tuple[int, int, int]]]:
        """Read-ahead plan: the entry log id, and ``(entry_id, offset,
        length)`` of ``entry_id`` and the ledger's following entries while
        they sit back to back in that log, up to ``max_bytes`` of records
        (the first always) and ``max_count`` entries.  ``(0, [])`` if
        ``entry_id`` is not indexed.  One cursor walk: what the index says,
        never a guess from the log's bytes, so a copy of an entry that a later
        checkpoint rewrote elsewhere is never picked up."""
        run: list[tuple[int, int, int]] = []
        key_unpack, value_unpack = ENTRY_KEY.unpack, ENTRY_VALUE.unpack
        header = RECORD_PREFIX_SIZE
        try:
            with self.env.begin(db=self._entries) as txn:
                cursor = txn.cursor()
                if not cursor.set_key(ENTRY_KEY.pack(ledger_id, entry_id)):
                    return 0, run
                log_id, offset, length = value_unpack(cursor.value())
                run.append((entry_id, offset, length))
                end = offset + header + length
                limit = offset + max_bytes
                expected = entry_id + 1
                last_wanted = entry_id + max_count - 1
                if expected <= last_wanted and cursor.next():
                    for key, value in cursor.iternext():
                        lid, eid = key_unpack(key)
                        next_log, next_offset, next_length = value_unpack(value)
                        if lid != ledger_id or eid != expected or next_log != log_id \
                                or next_offset != end or end + header + next_length > limit:
                            break
                        run.append((eid, next_offset, next_length))
                        end = next_offset + header + next_length
                        if eid == last_wanted:
                            break
                        expected += 1
        except lmdb.Error as e:
            raise StorageError(f"ledger index read failed: {e}") from e
        return log_id, run

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of the ledger, -1 if none."""
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            if cursor.set_range(ENTRY_KEY.pack(ledger_id + 1, 0)):
                if not cursor.prev():
                    return -1
            elif not cursor.last():
                return -1
            lid, eid = ENTRY_KEY.unpack(cursor.key())
        return int(eid) if lid == ledger_id else -1

    def entry_ids(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The indexed entry ids of the ledger from ``first`` to ``last``
        (inclusive), in order: one cursor walk (BP-46 repair's scan)."""
        found: list[int] = []
        if last < first:
            return found
        key_unpack = ENTRY_KEY.unpack
        end = ENTRY_KEY.pack(ledger_id, last)
        try:
            with self.env.begin(db=self._entries) as txn:
                cursor = txn.cursor()
                if cursor.set_range(ENTRY_KEY.pack(ledger_id, first)):
                    for key in cursor.iternext(keys=True, values=False):
                        if key > end:
                            break
                        found.append(key_unpack(key)[1])
        except lmdb.Error as e:
            raise StorageError(f"ledger index read failed: {e}") from e
        return found

    def entry_count(self, ledger_id: int) -> int:
        """How many entries of the ledger are indexed (tests, tools)."""
        prefix = LEDGER_KEY.pack(ledger_id)
        count = 0
        with self.env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                for key in cursor.iternext(keys=True, values=False):
                    if key[:8] != prefix:
                        break
                    count += 1
        return count

    def load_ledger_states(self) -> dict[int, LedgerState]:
        states: dict[int, LedgerState] = {}
        with self.env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                states[LEDGER_KEY.unpack(key)[0]] = LedgerState.decode(value)
        return states

    def has_ledger_state(self, ledger_id: int) -> bool:
        with self.env.begin(db=self._ledgers) as txn:
            return txn.get(LEDGER_KEY.pack(ledger_id)) is not None

    def journal_mark(self) -> JournalMark | None:
        with self.env.begin(db=self._meta) as txn:
            value = txn.get(_MARK_KEY)
        if value is None:
            return None
        file_seq, offset = MARK_VALUE.unpack(value)
        return JournalMark(file_seq, offset)

    def running_mark(self) -> bool | None:
        """The unclean-shutdown mark: None if absent, else whether the run
        that set it wrote add data to the journal."""
        with self.env.begin(db=self._meta) as txn:
            value = txn.get(_RUNNING_KEY)
        if value is None:
            return None
        return bool(_RUNNING_VALUE.unpack(value)[0])

    def log_ledgers(self) -> dict[int, set[int]]:
        """Every entry log id with an index record, with its ledger ids."""
        out: dict[int, set[int]] = {}
        with self.env.begin(db=self._logs) as txn:
            for key, value in txn.cursor():
                out[LOG_KEY.unpack(key)[0]] = _unpack_ids(value)
        return out

    def log_usage(self, log_ids: Iterable[int]) -> dict[int, dict[int, LedgerUse]]:
        """What each ledger has in each of ``log_ids`` (``{}`` for a log
        without entries).  Logs without usage rows (an index from before
        them) are counted from the ``entries`` rows in one walk, and their
        figures stored."""
        wanted = set(log_ids)
        out: dict[int, dict[int, LedgerUse]] = {log_id: {} for log_id in wanted}
        try:
            with self.env.begin(db=self._usage) as txn:
                for key, value in txn.cursor():
                    log_id, ledger_id = USAGE_KEY.unpack(key)
                    if log_id in wanted:
                        out[log_id][ledger_id] = LedgerUse(*USAGE_VALUE.unpack(value))
            missing = {log_id for log_id in wanted if not out[log_id]}
            if missing:
                counted = self._count_usage(missing)
                with self.env.begin(db=self._usage, write=True) as txn:
                    for log_id in missing:  # counted, even if to nothing
                        txn.put(USAGE_KEY.pack(log_id, _COUNTED), USAGE_VALUE.pack(0, 0, 0))
                    for (log_id, ledger_id), use in counted.items():
                        txn.put(USAGE_KEY.pack(log_id, ledger_id), USAGE_VALUE.pack(*use))
                        out[log_id][ledger_id] = use
        except lmdb.Error as e:
            raise StorageError(f"ledger index usage read failed: {e}") from e
        for usage in out.values():
            usage.pop(_COUNTED, None)
        return out

    def _count_usage(self, log_ids: set[int]) -> dict[tuple[int, int], LedgerUse]:
        counted: dict[tuple[int, int], LedgerUse] = {}
        key_unpack, value_unpack = ENTRY_KEY.unpack, ENTRY_VALUE.unpack
        with self.env.begin(db=self._entries) as txn:
            for key, value in txn.cursor():
                log_id, _offset, length = value_unpack(value)
                if log_id in log_ids:
                    ledger_id, entry_id = key_unpack(key)
                    use = LedgerUse(RECORD_PREFIX_SIZE + length, entry_id, entry_id)
                    old = counted.get((log_id, ledger_id))
                    counted[(log_id, ledger_id)] = use if old is None else old.merged(use)
        return counted

    def rows_in_log(self, log_id: int, ranges: Iterable[tuple[int, int, int]]
                    ) -> list[tuple[int, int, bytes, int, int]]:
        """``(ledger_id, entry_id, packed value, offset, length)`` of every
        entry that the index has in entry log ``log_id`` among ``(ledger_id,
        first entry, last entry)`` ranges (as :meth:`log_usage` gives them),
        in key order: one cursor walk per range, so a long-lived ledger's
        entries in other logs are not visited."""
        found: list[tuple[int, int, bytes, int, int]] = []
        key_unpack, value_unpack = ENTRY_KEY.unpack, ENTRY_VALUE.unpack
        try:
            with self.env.begin(db=self._entries) as txn:
                cursor = txn.cursor()
                for ledger_id, first, last in sorted(ranges):
                    end = ENTRY_KEY.pack(ledger_id, last)
                    if not cursor.set_range(ENTRY_KEY.pack(ledger_id, first)):
                        continue
                    for key, value in cursor.iternext():
                        if key > end:
                            break
                        row_log, offset, length = value_unpack(value)
                        if row_log == log_id:
                            found.append((ledger_id, key_unpack(key)[1], value, offset, length))
        except lmdb.Error as e:
            raise StorageError(f"ledger index read failed: {e}") from e
        return found

    # --- writes -------------------------------------------------------------

    def commit_checkpoint(self, rows: IndexRows, log_ledgers: Mapping[int, set[int]],
                          states: Mapping[int, LedgerState], deletions: Iterable[int],
                          mark: JournalMark, usage: LogUsage | None = None) -> None:
        """One durable transaction: deletions first, then rows, states, the
        per-log ledger sets and byte totals (``usage``, added to what the
        index has) and the mark."""
        try:
            self._commit_checkpoint(rows, log_ledgers, states, deletions, mark, usage or {})
        except lmdb.Error as e:
            raise StorageError(f"ledger index commit failed: {e}") from e

    def _commit_checkpoint(self, rows: IndexRows, log_ledgers: Mapping[int, set[int]],
                           states: Mapping[int, LedgerState], deletions: Iterable[int],
                           mark: JournalMark, usage: LogUsage) -> None:
        with self.env.begin(write=True) as txn:
            for ledger_id in deletions:
                self._delete_ledger(txn, ledger_id)
            if rows.ledger_ids:
                cursor = txn.cursor(db=self._entries)
                step = entry_log.CHUNK_ENTRIES  # (each putmulti holds the GIL throughout)
                for start in range(0, len(rows.ledger_ids), step):
                    end = start + step
                    cursor.putmulti(zip(
                        map(ENTRY_KEY.pack, rows.ledger_ids[start:end], rows.entry_ids[start:end]),
                        map(ENTRY_VALUE.pack, rows.log_ids[start:end], rows.offsets[start:end],
                            rows.lengths[start:end]), strict=True))
            for ledger_id, state in states.items():
                txn.put(LEDGER_KEY.pack(ledger_id), state.encode(), db=self._ledgers)
            for log_id, ledger_ids in log_ledgers.items():
                key = LOG_KEY.pack(log_id)
                old = txn.get(key, db=self._logs)
                merged = ledger_ids | _unpack_ids(old) if old is not None else ledger_ids
                txn.put(key, _pack_ids(merged), db=self._logs)
            self._add_usage(txn, usage)
            txn.put(_MARK_KEY, MARK_VALUE.pack(mark.file_seq, mark.offset), db=self._meta)

    def _add_usage(self, txn: lmdb.Transaction, usage: LogUsage) -> None:
        for (log_id, ledger_id), use in usage.items():
            key = USAGE_KEY.pack(log_id, ledger_id)
            old = txn.get(key, db=self._usage)
            if old is not None:
                use = LedgerUse(*USAGE_VALUE.unpack(old)).merged(use)
            txn.put(key, USAGE_VALUE.pack(*use), db=self._usage)

    def commit_compaction(self, old_log_id: int, moved: MovedRows) -> tuple[int, int]:
        """One durable transaction: each moved row that still holds the value
        compaction read points to its copy (a row deleted or rewritten
        meanwhile is left alone), the copies' ledgers and bytes are added to
        their logs' records, and entry log ``old_log_id``'s records are
        removed.  Returns ``(rows moved, their record bytes)``."""
        try:
            return self._commit_compaction(old_log_id, moved)
        except lmdb.Error as e:
            raise StorageError(f"ledger index commit failed: {e}") from e

    def _commit_compaction(self, old_log_id: int, moved: MovedRows) -> tuple[int, int]:
        # Columns and C-level steps (getmulti, map, compress, putmulti), a
        # chunk at a time, as a checkpoint's commit: no bytecode per entry.
        copies = moved.copies
        kept = IndexRows([], [], [], [], [])
        step = entry_log.CHUNK_ENTRIES
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._entries)
            for start in range(0, len(moved.ledger_ids), step):
                end = start + step
                keys = list(map(ENTRY_KEY.pack, moved.ledger_ids[start:end],
                                moved.entry_ids[start:end]))
                now = dict(cursor.getmulti(keys))
                same = list(map(eq, map(now.get, keys), moved.old_values[start:end]))
                values = map(ENTRY_VALUE.pack, copies.log_ids[start:end],
                             copies.offsets[start:end], copies.lengths[start:end])
                cursor.putmulti(zip(compress(keys, same), compress(values, same), strict=True))
                for column, source in zip(kept, copies, strict=True):
                    column.extend(compress(source[start:end], same))
            usage = usage_of_rows(kept)
            log_ledgers: dict[int, set[int]] = {}
            for log_id, ledger_id in usage:
                log_ledgers.setdefault(log_id, set()).add(ledger_id)
            for log_id, ledger_ids in log_ledgers.items():
                key = LOG_KEY.pack(log_id)
                old = txn.get(key, db=self._logs)
                merged = ledger_ids | _unpack_ids(old) if old is not None else ledger_ids
                txn.put(key, _pack_ids(merged), db=self._logs)
            self._add_usage(txn, usage)
            self._remove_log_records(txn, old_log_id)
        return len(kept.lengths), sum(use.record_bytes for use in usage.values())

    def _remove_log_records(self, txn: lmdb.Transaction, log_id: int) -> None:
        txn.delete(LOG_KEY.pack(log_id), db=self._logs)
        prefix = LOG_KEY.pack(log_id)
        cursor = txn.cursor(db=self._usage)
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                if not cursor.delete():
                    break

    def _delete_ledger(self, txn: lmdb.Transaction, ledger_id: int) -> None:
        prefix = LEDGER_KEY.pack(ledger_id)
        cursor = txn.cursor(db=self._entries)
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                if not cursor.delete():
                    break
        txn.delete(prefix, db=self._ledgers)

    def set_running_mark(self, journal_write_data: bool) -> None:
        """Durably record that a run (with this journal mode) has started."""
        self._write_meta(_RUNNING_KEY, _RUNNING_VALUE.pack(1 if journal_write_data else 0))

    def clear_running_mark(self) -> None:
        """Durably remove the running mark (the last step of a clean close)."""
        self._write_meta(_RUNNING_KEY, None)

    def _write_meta(self, key: bytes, value: bytes | None) -> None:
        try:
            with self.env.begin(db=self._meta, write=True) as txn:
                if value is None:
                    txn.delete(key)
                else:
                    txn.put(key, value)
        except lmdb.Error as e:
            raise StorageError(f"ledger index commit failed: {e}") from e

    def remove_logs(self, log_ids: Iterable[int]) -> None:
        with self.env.begin(write=True) as txn:
            for log_id in log_ids:
                self._remove_log_records(txn, log_id)

    def close(self) -> None:
        self.env.close()
