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
per-log ledger sets and the journal replay mark.  So after a crash the index,
the states and the mark always agree.

The ``running`` key is written in a transaction of its own when the engine
opens and deleted in one as the last step of a clean close; it is never
touched by a checkpoint.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import lmdb

from quire.bookie.storage import entry_log
from quire.bookie.storage.entry_log import RECORD_PREFIX_SIZE, IndexRows
from quire.bookie.storage.journal import JournalMark
from quire.bookie.storage.state import LedgerState
from quire.errors import StorageError

INDEX_FORMAT = 1
ENTRY_KEY = struct.Struct(">QQ")
ENTRY_VALUE = struct.Struct(">IQI")
LEDGER_KEY = struct.Struct(">Q")
LOG_KEY = struct.Struct(">Q")
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

    # --- writes -------------------------------------------------------------

    def commit_checkpoint(self, rows: IndexRows, log_ledgers: Mapping[int, set[int]],
                          states: Mapping[int, LedgerState], deletions: Iterable[int],
                          mark: JournalMark) -> None:
        """One durable transaction: deletions first, then rows, states, the
        per-log ledger sets and the mark."""
        try:
            self._commit_checkpoint(rows, log_ledgers, states, deletions, mark)
        except lmdb.Error as e:
            raise StorageError(f"ledger index commit failed: {e}") from e

    def _commit_checkpoint(self, rows: IndexRows, log_ledgers: Mapping[int, set[int]],
                           states: Mapping[int, LedgerState], deletions: Iterable[int],
                           mark: JournalMark) -> None:
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
            txn.put(_MARK_KEY, MARK_VALUE.pack(mark.file_seq, mark.offset), db=self._meta)

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
        with self.env.begin(write=True, db=self._logs) as txn:
            for log_id in log_ids:
                txn.delete(LOG_KEY.pack(log_id))

    def close(self) -> None:
        self.env.close()
