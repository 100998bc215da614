"""The journal's append paths (the event loop's, and the bookie's hot
path): records go into the in-memory buffer with no syscall, each given
its position and seq at append time (see "Positions" in
:mod:`~quire.bookie.storage.journal`).

* :meth:`~JournalAppends.append`: one framed record (state changes);
* :meth:`~JournalAppends.append_add_run` (one ledger's adds as columns),
  :meth:`~JournalAppends.append_add_entries` and
  :meth:`~JournalAppends.append_add_entry`: ADD_ENTRY records, built in one
  go between two file rolls (:func:`~quire.bookie.storage.journal_format.add_records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, itemgetter

from quire.bookie.storage.journal_format import (
    ADD_RECORD_OVERHEAD,
    FILE_HEADER_SIZE,
    U32,
    JournalMark,
    add_records,
    file_salt,
)
from quire.bookie.storage.journal_state import JournalState
from quire.errors import StorageError

_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_U32 = U32
"""A module global, not an imported name: CPython compiles a method call on
an imported name without LOAD_METHOD (a bound method per call)."""


class JournalAppends(JournalState):
    """The append paths of :class:`~quire.bookie.storage.journal.Journal`."""

    def append(self, record: bytes | bytearray | memoryview) -> int:
        """Buffer one framed record (see
        :func:`~quire.bookie.storage.journal_format.encode_record`); return its seq."""
        n = len(record)
        with self._append_lock, self._lock:
            if not self._started:
                raise StorageError("journal not started")
            if self._tail_off + n > self._file_size and self._tail_off > FILE_HEADER_SIZE:
                self._roll_locked()
            buf = self._buf
            at = len(buf)
            buf += record
            if self._tail_salt:
                (crc,) = _U32.unpack_from(buf, at + 4)
                _U32.pack_into(buf, at + 4, crc ^ self._tail_salt)
            self._tail_off += n
            self._appended_bytes += n
            self._seq += 1
            return self._seq

    def append_add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> int:
        """Buffer one ADD_ENTRY record without building it separately first
        (:meth:`append_add_entries` with one add); return its seq."""
        return self.append_add_entries([(ledger_id, entry_id, entry)])

    def append_add_entries(self, adds: Sequence[tuple[int, int, bytes]]) -> int:
        """:meth:`append_add_entry` for each ``(ledger_id, entry_id, entry)``
        (the server's batched add path); their seqs are consecutive, and the
        last one is returned."""
        return self._append_adds(list(map(_FIRST, adds)), list(map(_SECOND, adds)),
                                 list(map(_THIRD, adds)))

    def append_add_run(self, ledger_id: int, entry_ids: Sequence[int],
                       entries: Sequence[bytes]) -> int:
        """:meth:`append_add_entries` for adds of one ledger, given as columns."""
        return self._append_adds([ledger_id] * len(entries), entry_ids, entries)

    def _append_adds(self, ledger_ids: Sequence[int], entry_ids: Sequence[int],
                     entries: Sequence[bytes]) -> int:
        """Buffer one ADD_ENTRY record per position of the three columns;
        return the last seq.

        The records between two file rolls are built in one go
        (:func:`~quire.bookie.storage.journal_format.add_records`, no
        bytecode per record); only a batch that
        crosses the end of the file walks its record sizes one by one to
        place the roll.  They are built under the append lock only, then
        published under the buffer lock in one copy: the fsync thread takes
        the buffer lock to swap the buffer, and waiting there behind a whole
        batch cost it one more wait for the GIL."""
        sizes = list(map(add, repeat(ADD_RECORD_OVERHEAD), map(len, entries)))
        with self._append_lock:
            with self._lock:
                if not self._started:
                    raise StorageError("journal not started")
                tail_file, tail, salt = self._tail_file, self._tail_off, self._tail_salt
            limit = self._file_size
            cuts: list[tuple[int, int, JournalMark]] = []  # (first add of a file, its seq, prev)
            total = sum(sizes)
            if tail + total > limit:
                for i, n in enumerate(sizes):
                    if tail + n > limit and tail > FILE_HEADER_SIZE:  # as _roll_locked does
                        cuts.append((i, tail_file + 1, JournalMark(tail_file, tail)))
                        tail_file, tail = tail_file + 1, FILE_HEADER_SIZE
                    tail += n
            else:
                tail += total
            parts: list[bytes] = []
            rolls: list[tuple[int, int, JournalMark]] = []  # (offset in the batch, seq, prev)
            built = first = 0
            for cut, seq, prev in cuts:
                parts.append(add_records(ledger_ids[first:cut], entry_ids[first:cut],
                                         entries[first:cut], salt))
                built += len(parts[-1])
                rolls.append((built, seq, prev))
                first, salt = cut, file_salt(seq)
            parts.append(add_records(ledger_ids[first:], entry_ids[first:], entries[first:], salt))
            data = b"".join(parts)
            with self._lock:
                base = len(self._buf)
                self._rolls += [(base + at, seq, prev) for at, seq, prev in rolls]
                self._buf += data
                self._tail_file, self._tail_off, self._tail_salt = tail_file, tail, salt
                self._appended_bytes += len(data)
                self._seq += len(entries)
                return self._seq

    def _roll_locked(self) -> None:
        prev = JournalMark(self._tail_file, self._tail_off)
        self._tail_file += 1
        self._tail_off = FILE_HEADER_SIZE
        self._tail_salt = file_salt(self._tail_file)
        self._rolls.append((len(self._buf), self._tail_file, prev))

    def mark(self) -> JournalMark:
        """The position just after the last appended record (buffered or not)."""
        with self._lock:
            return JournalMark(self._tail_file, self._tail_off)

    @property
    def append_seq(self) -> int:
        """Seq of the last appended record (0 if none)."""
        return self._seq

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    @property
    def group_full(self) -> bool:
        """True once the buffer holds ``journal_max_group_bytes`` or more."""
        return len(self._buf) >= self._max_group_bytes
