"""Ledger storage: entry logs + index + read cache (the checkpointed data).

This is the durable half of the engine, below the write cache that
:class:`~quire.bookie.storage.BookieStorage` keeps in memory:

* :meth:`LedgerStorage.flush` (checkpoint thread) appends a sorted batch to
  the current entry log, fsyncs it, then commits index rows, ledger states,
  per-log ledger sets and the journal replay mark in one LMDB transaction;
* :meth:`LedgerStorage.read` (any thread) serves an entry from the read
  cache, or looks it up in the index and ``pread`` s it from its entry log,
  together with the ledger's entries that follow it there (read-ahead, up to
  ``read_ahead_bytes``: sequential readers then cost one ``pread`` per run);
* :meth:`LedgerStorage.gc_entry_logs` deletes entry logs whose ledgers are
  all gone; compaction (:mod:`~quire.bookie.storage.compaction`) copies the
  live entries out of partly dead logs so that they can go too.  A read that
  finds its entry log gone (compaction moved the entry and removed the log
  between the index lookup and the ``pread``) looks the entry up again.

Byte layouts: see :mod:`~quire.bookie.storage.entry_log` (entry log files)
and :mod:`~quire.bookie.storage.index` (index keys and values).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import lt
from typing import overload

from quire.bookie.storage import entry_log
from quire.bookie.storage.compaction import Compactor, kill_at
from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.entry_log import RECORD_PREFIX, RECORD_PREFIX_SIZE, EntryLogger
from quire.bookie.storage.index import LedgerIndex, usage_of_rows
from quire.bookie.storage.journal_format import JournalMark
from quire.bookie.storage.state import LedgerState
from quire.bookie.storage.sync_tracker import SyncTracker
from quire.errors import StorageError

log = logging.getLogger(__name__)

EntryKey = tuple[int, int]


def _sorted_keys(entries: Mapping[EntryKey, bytes]) -> list[EntryKey]:
    """The keys of ``entries`` in order.  Usually they were added in order
    already (each ledger's entries in turn): that is checked a chunk at a
    time, and only keys out of order are sorted, in one call."""
    keys = list(entries)
    step = entry_log.CHUNK_ENTRIES
    for start in range(0, len(keys) - 1, step):
        if not all(map(lt, keys[start:start + step], keys[start + 1:start + step + 1])):
            keys.sort()
            break
    return keys


class _ItemsInKeyOrder(Sequence[tuple[EntryKey, bytes]]):
    """``(key, entries[key])`` for each of ``keys``, made a slice at a time
    as the entry logger takes them (never all 70,000 at once: see
    :data:`~quire.bookie.storage.entry_log.CHUNK_ENTRIES`)."""

    def __init__(self, keys: list[EntryKey], entries: Mapping[EntryKey, bytes]) -> None:
        self._keys = keys
        self._entries = entries

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, index: int) -> tuple[EntryKey, bytes]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[EntryKey, bytes]]: ...

    def __getitem__(self, index: int | slice
                    ) -> tuple[EntryKey, bytes] | list[tuple[EntryKey, bytes]]:
        if isinstance(index, slice):
            keys = self._keys[index]
            return list(zip(keys, map(self._entries.__getitem__, keys), strict=True))
        key = self._keys[index]
        return key, self._entries[key]


class ReadCache:
    """LRU of entries read back from entry logs, bounded by entry bytes.

    Also keeps the cached entry ids of each ledger, so that dropping a
    deleted ledger costs its own entries, not a scan of the whole cache (GC
    deleting thousands of ledgers scanned a full cache once per ledger, on
    the event loop: every connection stalled for as long)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[EntryKey, bytes] = OrderedDict()
        self._by_ledger: dict[int, set[int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: EntryKey) -> bytes | None:
        with self._lock:
            data = self._entries.get(key)
            if data is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return data

    def get_run(self, ledger_id: int, start: int, max_count: int,
                max_bytes: int) -> list[bytes]:
        """Cached entries ``start, start + 1, ...`` up to the first one not
        cached, at most ``max_count`` and, as entry log records, about
        ``max_bytes`` (the first always); one lock for the run."""
        out: list[bytes] = []
        size = 0
        with self._lock:
            entries = self._entries
            move = entries.move_to_end
            entry_id = start
            while len(out) < max_count:
                key = (ledger_id, entry_id)
                data = entries.get(key)
                if data is None:
                    self.misses += 1
                    break
                size += RECORD_PREFIX_SIZE + len(data)
                if out and size > max_bytes:
                    break
                move(key)
                out.append(data)
                entry_id += 1
            self.hits += len(out)
        return out

    def put_many(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        """Cache ``(entry_id, data)`` pairs of one ledger (a read-ahead run);
        the least recently used entries go beyond ``max_bytes``."""
        with self._lock:
            cache = self._entries
            total = self._bytes
            for entry_id, data in entries:
                size = len(data)
                if size > self._max_bytes:
                    continue
                key = (ledger_id, entry_id)
                old = cache.pop(key, None)
                if old is not None:
                    total -= len(old)
                cache[key] = data
                self._by_ledger.setdefault(ledger_id, set()).add(entry_id)
                total += size
            while total > self._max_bytes:
                key, evicted = cache.popitem(last=False)
                total -= len(evicted)
                self._forget_key(key)
            self._bytes = total

    def _forget_key(self, key: EntryKey) -> None:
        ids = self._by_ledger.get(key[0])
        if ids is not None:
            ids.discard(key[1])
            if not ids:
                del self._by_ledger[key[0]]

    def invalidate(self, keys: Mapping[EntryKey, object]) -> None:
        """Drop cached entries that ``keys`` rewrote (an entry added again
        after it was checkpointed, e.g. by ledger recovery)."""
        with self._lock:
            entries = self._entries
            if not entries:
                return
            small, large = (keys, entries) if len(keys) < len(entries) else (entries, keys)
            for key in [k for k in small if k in large]:  # a scan of the smaller only
                self._bytes -= len(entries.pop(key))
                self._forget_key(key)

    def discard_ledger(self, ledger_id: int) -> None:
        with self._lock:
            for entry_id in self._by_ledger.pop(ledger_id, ()):
                self._bytes -= len(self._entries.pop((ledger_id, entry_id)))

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class LedgerStorage:
    def __init__(self, config: StorageConfig, tracker: SyncTracker | None = None) -> None:
        self.index = LedgerIndex(config.index_dir, map_size_bytes=config.index_map_size_bytes)
        try:
            self.entry_logger = EntryLogger(
                config.entry_log_dir, max_bytes=config.entry_log_max_bytes,
                write_buffer_bytes=config.entry_log_write_buffer_bytes,
                bulk_write_buffer_bytes=config.entry_log_bulk_write_buffer_bytes, tracker=tracker,
                remove_pages_from_cache=config.entry_log_remove_pages_from_cache,
                direct_io=config.entry_log_direct_io)
        except BaseException:
            self.index.close()
            raise
        self.read_cache = ReadCache(config.read_cache_max_bytes)
        self._read_ahead_bytes = config.read_ahead_bytes
        kill_step = config.test_kill_during_compaction
        self.compactor = Compactor(self.index, self.entry_logger,
                                   chunk_bytes=config.compaction_chunk_bytes,
                                   on_step=kill_at(kill_step) if kill_step else None)

    def read(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The checkpointed entry, or None if the index does not have it."""
        key = (ledger_id, entry_id)
        data = self.read_cache.get(key)
        if data is not None:
            return data
        # Read-ahead (BookKeeper's DbLedgerStorage does the same): a miss
        # reads the entry and the ledger's next ones that follow it in the
        # same log, up to read_ahead_bytes, with one pread, and caches them.
        log_id, plan = self.index.locate_run(ledger_id, entry_id, self._read_ahead_bytes)
        if not plan:
            return None
        try:
            entries = self.entry_logger.read_run(log_id, ledger_id, plan)
        except StorageError:
            moved = self._moved(log_id, ledger_id, entry_id, self._read_ahead_bytes)
            if moved is None:
                raise
            log_id, plan = moved
            if not plan:
                return None
            entries = self.entry_logger.read_run(log_id, ledger_id, plan)
        self.read_cache.put_many(ledger_id, entries)
        return entries[0][1]

    def read_records(self, ledger_id: int, start: int, max_count: int,
                     max_bytes: int) -> tuple[int, list[bytes]]:
        """Checkpointed entries ``start, start + 1, ...`` as entry log
        records, ``(u32 length | entry)*`` (BP-62's entry list): how many,
        and the byte strings that joined make them.  At most ``max_count``,
        about ``max_bytes`` of records, at least one unless ``start`` is not
        indexed (then ``(0, [])``).  The run the read cache holds, or else
        one ``pread`` of the entry log, passed on as read.  A batch asks for
        what it needs, so this reads no further and caches nothing: with
        batches spread over the replicas, read-ahead made every bookie read
        (and cache) every entry to serve a third of them."""
        run = self.read_cache.get_run(ledger_id, start, max_count, max_bytes)
        if run:
            pack = RECORD_PREFIX.pack
            chunks = []
            for data in run:
                chunks.append(pack(len(data)))
                chunks.append(data)
            return len(run), chunks
        log_id, plan = self.index.locate_run(ledger_id, start, max_bytes, max_count)
        if not plan:
            return 0, []
        try:
            return len(plan), [self.entry_logger.read_records(log_id, ledger_id, plan)]
        except StorageError:
            moved = self._moved(log_id, ledger_id, start, max_bytes, max_count)
            if moved is None:
                raise
            log_id, plan = moved
            if not plan:
                return 0, []
            return len(plan), [self.entry_logger.read_records(log_id, ledger_id, plan)]

    def _moved(self, log_id: int, ledger_id: int, entry_id: int, max_bytes: int,
               max_count: int = 1 << 62) -> tuple[int, list[tuple[int, int, int]]] | None:
        """After a failed read from entry log ``log_id``: the entry's new
        plan if compaction moved it meanwhile (a read racing a compaction
        gets the old copy while its log exists, else the new one), or None
        if the index still names that log (the failure stands)."""
        new_log_id, plan = self.index.locate_run(ledger_id, entry_id, max_bytes, max_count)
        if plan and new_log_id == log_id:
            return None
        return new_log_id, plan

    def flush(self, entries: Mapping[EntryKey, bytes], states: Mapping[int, LedgerState],
              deletions: Iterable[int], mark: JournalMark) -> int:
        """Write ``entries`` sorted by key to the entry log, fsync, then commit
        everything to the index in one transaction; returns the entry bytes
        written.  Until this returns, the caller must keep serving
        ``entries`` from memory (the read cache may hold older versions of
        them until the end)."""
        rows, log_ledgers = self.entry_logger.write_batch(
            _ItemsInKeyOrder(_sorted_keys(entries), entries))
        nbytes = sum(rows.lengths)
        deletions = list(deletions)
        self.index.commit_checkpoint(rows, log_ledgers, states, deletions, mark,
                                     usage_of_rows(rows))
        self.read_cache.invalidate(entries)
        for ledger_id in deletions:
            self.read_cache.discard_ledger(ledger_id)
        return nbytes

    def gc_entry_logs(self, is_live: Callable[[int], bool]) -> list[int]:
        """Remove every entry log (but the current one) none of whose ledgers
        ``is_live``, and logs the index does not know (left by a checkpoint
        that crashed before its commit).  Must not run concurrently with
        :meth:`flush`.  Returns the removed log ids."""
        known = self.index.log_ledgers()
        current = self.entry_logger.current_log_id
        on_disk = self.entry_logger.log_ids()
        dead: list[int] = []
        for log_id in on_disk:
            if log_id == current:
                continue
            ledgers = known.get(log_id)
            if ledgers is None or not any(is_live(lid) for lid in ledgers):
                dead.append(log_id)
        stale_records = [log_id for log_id in known if log_id not in set(on_disk)]
        if dead or stale_records:
            self.index.remove_logs([*dead, *stale_records])
        for log_id in dead:
            log.info("removing dead entry log %d", log_id)
            self.entry_logger.remove(log_id)
        return dead

    def close(self) -> None:
        try:
            self.entry_logger.close()
        finally:
            self.index.close()
