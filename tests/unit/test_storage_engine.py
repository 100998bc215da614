"""BookieStorage: adds, reads, checkpoints, reopen, replay, state, deletion, GC."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from quire.bookie.storage import BookieStorage, LedgerState, StorageConfig
from quire.bookie.storage import entry_log as entry_log_module
from quire.bookie.storage.entry_log import list_entry_logs
from quire.bookie.storage.journal_state import list_journal_files
from quire.errors import (
    BadRequestError,
    ConfigError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
    TooManyRequestsError,
    UnauthorizedError,
)
from quire.protocol.codec import split_records
from tests.support.entries import filler_entry, stored_entry

KEY = bytes(range(20))
OTHER_KEY = bytes(range(1, 21))


def make_config(tmp_path: Path, **overrides: object) -> StorageConfig:
    settings: dict[str, object] = dict(
        journal_dirs=(tmp_path / "disk",), ledger_dirs=(tmp_path / "disk",),
        journal_file_size_bytes=16384, entry_log_max_bytes=65536,
        write_cache_max_bytes=1 << 20, read_cache_max_bytes=64 * 1024,
        index_map_size_bytes=1 << 30)
    settings.update(overrides)
    return StorageConfig(**settings)  # type: ignore[arg-type]


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    return filler_entry(ledger_id, entry_id, size, b"L%dE%d;")


@pytest.fixture
def config(tmp_path: Path) -> StorageConfig:
    return make_config(tmp_path)


@pytest.fixture
def storage(config: StorageConfig) -> Iterator[BookieStorage]:
    s = BookieStorage.open(config)
    yield s
    if not s.closed:
        s.close()


def reopen(s: BookieStorage, *, clean: bool) -> BookieStorage:
    if clean:
        s.close()
    else:
        s.abandon()
    return BookieStorage.open(s.config)


def test_add_and_read_from_write_cache_checkpoint_and_after_reopen(
        storage: BookieStorage) -> None:
    for lid in (1, 2):
        for eid in range(50):
            storage.add_entry(lid, eid, entry(lid, eid), KEY)
    assert storage.read_entry(1, 7) == entry(1, 7)
    assert storage.stats.write_cache_entries == 100
    stats = storage.checkpoint()
    assert stats.entries == 100 and stats.ledger_states == 2
    assert storage.stats.write_cache_entries == 0
    for lid in (1, 2):
        for eid in range(50):
            assert storage.read_entry(lid, eid) == entry(lid, eid)
    storage.add_entry(1, 50, entry(1, 50), KEY)  # half in cache, half checkpointed
    s2 = reopen(storage, clean=True)
    try:
        assert s2.list_ledgers() == [1, 2]
        for eid in range(51):
            assert s2.read_entry(1, eid) == entry(1, eid)
        assert s2.read_entry(1, -1) == entry(1, 50)
        assert s2.last_entry_id(2) == 49
    finally:
        s2.close()


def test_memoryview_entries_are_copied(storage: BookieStorage) -> None:
    buf = bytearray(entry(1, 0))
    storage.add_entry(1, 0, memoryview(buf), KEY)
    buf[:] = bytes(len(buf))
    assert storage.read_entry(1, 0) == entry(1, 0)


def test_read_errors(storage: BookieStorage) -> None:
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(9, 0)
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(9, -1)
    storage.fence(9, KEY)
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(9, -1)
    storage.add_entry(9, 3, entry(9, 3), KEY, recovery=True)
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(9, 0)
    storage.checkpoint()
    with pytest.raises(NoSuchEntryError):
        storage.read_entry(9, 4)
    with pytest.raises(BadRequestError):
        storage.read_entry(9, -2)
    with pytest.raises(BadRequestError):
        storage.add_entry(-1, 0, b"x", KEY)


def test_last_entry_across_cache_and_index(storage: BookieStorage) -> None:
    for eid in (0, 1, 5):
        storage.add_entry(3, eid, entry(3, eid), KEY)
    storage.checkpoint()
    storage.add_entry(3, 2, entry(3, 2), KEY)  # out of order, lower than indexed max
    assert storage.read_entry(3, -1) == entry(3, 5)
    storage.add_entry(3, 9, entry(3, 9), KEY)
    assert storage.read_entry(3, -1) == entry(3, 9)
    s2 = reopen(storage, clean=True)
    try:
        assert s2.last_entry_id(3) == 9
        assert s2.read_entry(3, -1) == entry(3, 9)
    finally:
        s2.close()


def test_journal_replay_after_unclean_stop(storage: BookieStorage) -> None:
    for eid in range(20):
        storage.add_entry(1, eid, entry(1, eid), KEY)
    storage.checkpoint()
    seqs = [storage.add_entry(1, eid, entry(1, eid), KEY) for eid in range(20, 40)]
    storage.set_explicit_lac(1, 30)
    assert storage.journal.sync() >= seqs[-1]
    storage.add_entry(1, 40, entry(1, 40), KEY)  # only in the process's buffer
    s2 = reopen(storage, clean=False)
    try:
        for eid in range(40):
            assert s2.read_entry(1, eid) == entry(1, eid)
        with pytest.raises(NoSuchEntryError):
            s2.read_entry(1, 40)
        assert s2.get_explicit_lac(1) == 30
        assert s2.stats.replayed_records >= 21
    finally:
        s2.close()


def test_write_buffered_entries_survive_process_death(storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    storage.journal.write_buffered()  # page cache only: survives kill -9
    s2 = reopen(storage, clean=False)
    try:
        assert s2.read_entry(1, 0) == entry(1, 0)
    finally:
        s2.close()


def test_master_key_is_checked(storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    with pytest.raises(UnauthorizedError):
        storage.add_entry(1, 1, entry(1, 1), OTHER_KEY)
    with pytest.raises(UnauthorizedError):
        storage.fence(1, OTHER_KEY)
    assert storage.get_master_key(1) == KEY
    assert storage.get_master_key(2) is None
    storage.journal.sync()
    s2 = reopen(storage, clean=False)  # the key comes back from the journal
    try:
        with pytest.raises(UnauthorizedError):
            s2.add_entry(1, 1, entry(1, 1), OTHER_KEY)
        s2.checkpoint()
        s3 = reopen(s2, clean=True)  # ... and from the index
        with pytest.raises(UnauthorizedError):
            s3.add_entry(1, 1, entry(1, 1), OTHER_KEY)
        s3.close()
    finally:
        if not s2.closed:
            s2.close()


def test_fence_refuses_adds_but_not_recovery_adds(storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    seq = storage.fence(1, KEY)
    assert seq == storage.journal.append_seq
    assert storage.is_fenced(1)
    assert storage.fence(1, KEY) == seq  # idempotent: nothing new to wait for
    with pytest.raises(LedgerFencedError):
        storage.add_entry(1, 1, entry(1, 1), KEY)
    storage.add_entry(1, 1, entry(1, 1), KEY, recovery=True)
    assert storage.read_entry(1, 1) == entry(1, 1)


def test_fence_creates_unknown_ledger_and_is_durable_across_restart(
        storage: BookieStorage) -> None:
    seq = storage.fence(5, KEY)
    assert storage.ledger_exists(5) and storage.is_fenced(5)
    assert storage.journal.sync() >= seq
    s2 = reopen(storage, clean=False)  # from the journal
    try:
        assert s2.is_fenced(5)
        with pytest.raises(LedgerFencedError):
            s2.add_entry(5, 0, b"x", KEY)
        s2.checkpoint()
        s3 = reopen(s2, clean=False)  # from the index (journal files gone)
        assert s3.is_fenced(5) and s3.get_master_key(5) == KEY
        s3.close()
    finally:
        if not s2.closed:
            s2.close()


def test_ledger_state_updates(storage: BookieStorage) -> None:
    with pytest.raises(NoSuchLedgerError):
        storage.update_ledger_state(4, limbo=True)
    with pytest.raises(NoSuchLedgerError):
        storage.get_explicit_lac(4)
    storage.add_entry(4, 0, entry(4, 0), KEY)
    assert storage.get_explicit_lac(4) == -1
    storage.set_explicit_lac(4, 10)
    assert storage.set_explicit_lac(4, 3) == storage.journal.append_seq  # never goes back
    storage.update_ledger_state(4, limbo=True, sync_cursor=b"\x01cursor")
    with pytest.raises(ValueError):
        storage.update_ledger_state(4, master_key=OTHER_KEY)
    expected = LedgerState(KEY, fenced=False, explicit_lac=10, limbo=True,
                           sync_cursor=b"\x01cursor")
    assert storage.get_ledger_state(4) == expected
    storage.journal.sync()
    s2 = reopen(storage, clean=False)
    try:
        assert s2.get_ledger_state(4) == expected
        s2.checkpoint()
        s3 = reopen(s2, clean=True)
        assert s3.get_ledger_state(4) == expected
        s3.close()
    finally:
        if not s2.closed:
            s2.close()


def test_ledger_state_codec_round_trip_and_rejects_unknown_version() -> None:
    state = LedgerState(KEY, True, 7, True, b"abc")
    assert LedgerState.decode(state.encode()) == state
    with pytest.raises(StorageError):
        LedgerState.decode(b"\x02" + state.encode()[1:])
    with pytest.raises(StorageError):
        LedgerState.decode(state.encode()[:-1])


def test_delete_ledger_stops_reads_at_once_and_durably(storage: BookieStorage) -> None:
    for eid in range(10):
        storage.add_entry(1, eid, entry(1, eid), KEY)
        storage.add_entry(2, eid, entry(2, eid), KEY)
    storage.checkpoint()
    storage.read_entry(1, 3)  # now in the read cache too
    storage.add_entry(1, 10, entry(1, 10), KEY)  # and one in the write cache
    seq = storage.delete_ledger(1)
    for eid in (3, 10, -1):
        with pytest.raises(NoSuchLedgerError):
            storage.read_entry(1, eid)
    assert not storage.ledger_exists(1) and storage.list_ledgers() == [2]
    assert storage.journal.sync() >= seq
    s2 = reopen(storage, clean=False)  # deletion replayed from the journal
    try:
        with pytest.raises(NoSuchLedgerError):
            s2.read_entry(1, 3)
        s2.checkpoint()
        assert s2.ledger_storage.index.entry_count(1) == 0
        assert not s2.ledger_storage.index.has_ledger_state(1)
        s3 = reopen(s2, clean=True)
        assert s3.list_ledgers() == [2]
        assert s3.read_entry(2, 9) == entry(2, 9)
        s3.close()
    finally:
        if not s2.closed:
            s2.close()


def test_many_ledgers_deleted_at_once_leave_the_others_whole(storage: BookieStorage) -> None:
    """GC's batch: ledgers checkpointed (and read-cached), in the write cache,
    and mid-checkpoint, dropped in one call; the rest untouched."""
    for lid in range(1, 41):
        for eid in range(3):
            storage.add_entry(lid, eid, entry(lid, eid), KEY)
    storage.checkpoint()
    for lid in range(1, 41):
        storage.read_entry(lid, 1)  # read-cached
        storage.add_entry(lid, 3, entry(lid, 3), KEY)  # and one in the write cache
    real_flush = storage.ledger_storage.flush

    def flush_with_delete(*args: object, **kwargs: object) -> None:
        # mid-checkpoint: odd ledgers go, plus one unknown and one twice
        storage.delete_ledgers([*range(1, 41, 2), 999, 1])
        real_flush(*args, **kwargs)  # type: ignore[arg-type]

    storage.ledger_storage.flush = flush_with_delete  # type: ignore[method-assign]
    storage.checkpoint()
    storage.ledger_storage.flush = real_flush  # type: ignore[method-assign]
    storage.add_entry(2, 4, entry(2, 4), KEY)
    seq = storage.delete_ledgers([4, 6])  # from the write cache and the index
    gone = {*range(1, 41, 2), 4, 6}
    assert storage.list_ledgers() == sorted(set(range(1, 41)) - gone)
    for lid in range(1, 41):
        for eid in (1, 3):
            if lid in gone:
                with pytest.raises(NoSuchLedgerError):
                    storage.read_entry(lid, eid)
            else:
                assert storage.read_entry(lid, eid) == entry(lid, eid)
    assert storage.journal.sync() >= seq
    s2 = reopen(storage, clean=False)  # the deletions replayed from the journal
    try:
        assert s2.list_ledgers() == sorted(set(range(1, 41)) - gone)
        assert s2.read_entry(2, 4) == entry(2, 4)
    finally:
        s2.close()


def test_delete_during_checkpoint_flush(storage: BookieStorage) -> None:
    """A deletion racing the checkpoint that writes the ledger's entries."""
    for eid in range(5):
        storage.add_entry(1, eid, entry(1, eid), KEY)
    real_flush = storage.ledger_storage.flush

    def flush_with_delete(*args: object, **kwargs: object) -> None:
        storage.delete_ledger(1)  # the loop thread deletes mid-checkpoint
        with pytest.raises(NoSuchLedgerError):
            storage.read_entry(1, 0)
        real_flush(*args, **kwargs)  # type: ignore[arg-type]

    storage.ledger_storage.flush = flush_with_delete  # type: ignore[method-assign]
    storage.checkpoint()
    storage.ledger_storage.flush = real_flush  # type: ignore[method-assign]
    with pytest.raises(NoSuchLedgerError):
        storage.read_entry(1, 0)
    storage.checkpoint()  # the deletion itself
    assert storage.ledger_storage.index.entry_count(1) == 0


def test_gc_removes_dead_entry_logs_and_keeps_partly_live_ones(
        storage: BookieStorage) -> None:
    log_dir = storage.config.entry_log_dir
    for lid in (1, 2):
        for eid in range(5):
            storage.add_entry(lid, eid, entry(lid, eid), KEY)
    storage.checkpoint()
    s = reopen(storage, clean=True)  # next checkpoint writes a new log
    for eid in range(5):
        s.add_entry(3, eid, entry(3, eid), KEY)
    s.checkpoint()
    s = reopen(s, clean=True)
    try:
        assert list_entry_logs(log_dir) == [1, 2]
        assert s.gc_entry_logs() == []
        s.delete_ledger(3)
        assert s.gc_entry_logs() == [2]  # all of log 2's ledgers are gone
        s.delete_ledger(1)
        assert s.gc_entry_logs() == []  # log 1 still holds ledger 2
        assert list_entry_logs(log_dir) == [1]
        for eid in range(5):
            assert s.read_entry(2, eid) == entry(2, eid)
        s.delete_ledger(2)
        assert s.gc_entry_logs() == [1]
        assert list_entry_logs(log_dir) == []
    finally:
        s.close()


def test_gc_never_removes_the_log_being_written(storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    storage.checkpoint()
    storage.delete_ledger(1)
    assert storage.gc_entry_logs() == []
    assert list_entry_logs(storage.config.entry_log_dir) == [1]


def test_gc_removes_orphan_logs_of_a_crashed_checkpoint(storage: BookieStorage,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.ledger_storage.index, "commit_checkpoint", fail)
    with pytest.raises(StorageError):
        storage.checkpoint()
    monkeypatch.undo()
    # Nothing lost in memory: the failed work is retried by the next checkpoint.
    assert storage.read_entry(1, 0) == entry(1, 0)
    assert list_entry_logs(storage.config.entry_log_dir) == [1]
    storage.journal.sync()
    s2 = reopen(storage, clean=False)
    try:
        assert s2.read_entry(1, 0) == entry(1, 0)  # from the journal
        s2.checkpoint()
        assert s2.gc_entry_logs() == [1]  # the orphan; log 2 is current
        assert s2.read_entry(1, 0) == entry(1, 0)
    finally:
        s2.close()


def test_journal_files_before_the_mark_are_removed_by_checkpoint(
        storage: BookieStorage) -> None:
    journal_dir = storage.config.journal_dir
    for eid in range(200):
        storage.add_entry(1, eid, entry(1, eid, 300), KEY)
        if eid % 20 == 0:
            storage.journal.write_buffered()
    storage.journal.sync()
    assert len(list_journal_files(journal_dir)) >= 4
    stats = storage.checkpoint()
    assert stats.journal_files_removed >= 3
    assert list_journal_files(journal_dir) == [stats.mark.file_seq]
    s2 = reopen(storage, clean=False)
    try:
        assert s2.stats.replayed_records == 0
        assert s2.read_entry(1, 199) == entry(1, 199, 300)
    finally:
        s2.close()


def test_checkpoint_due_and_write_cache_limit(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, write_cache_max_bytes=10_000, write_cache_reject_ratio=2.0)
    s = BookieStorage.open(cfg)
    try:
        eid = 0
        while not s.checkpoint_due:
            s.add_entry(1, eid, entry(1, eid, 1000), KEY)
            eid += 1
        assert eid == 10
        for _ in range(10):
            s.add_entry(1, eid, entry(1, eid, 1000), KEY)
            eid += 1
        with pytest.raises(TooManyRequestsError):
            s.add_entry(1, eid, entry(1, eid, 1000), KEY)
        s.checkpoint()
        assert not s.checkpoint_due
        s.add_entry(1, eid, entry(1, eid, 1000), KEY)
    finally:
        s.close()


def test_entry_logs_roll_and_reads_span_them(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, entry_log_max_bytes=8192, read_cache_max_bytes=0)
    s = BookieStorage.open(cfg)
    try:
        for eid in range(100):
            s.add_entry(1, eid, entry(1, eid, 500), KEY)
        s.checkpoint()
        assert len(list_entry_logs(cfg.entry_log_dir)) >= 6
        for eid in range(100):
            assert s.read_entry(1, eid) == entry(1, eid, 500)
    finally:
        s.close()


def test_read_cache_serves_repeated_reads(storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    storage.checkpoint()
    storage.read_entry(1, 0)
    storage.read_entry(1, 0)
    stats = storage.stats
    assert stats.read_cache_hits == 1 and stats.read_cache_misses == 1


def test_rewritten_entry_is_not_served_stale_from_the_read_cache(
        storage: BookieStorage) -> None:
    storage.add_entry(1, 0, stored_entry(1, 0, b"old"), KEY)
    storage.checkpoint()
    assert storage.read_entry(1, 0) == stored_entry(1, 0, b"old")  # now in the read cache
    storage.add_entry(1, 0, stored_entry(1, 0, b"new"), KEY, recovery=True)
    assert storage.read_entry(1, 0) == stored_entry(1, 0, b"new")
    storage.checkpoint()
    assert storage.read_entry(1, 0) == stored_entry(1, 0, b"new")


def test_a_miss_reads_ahead_the_ledgers_next_entries_with_one_pread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = BookieStorage.open(make_config(tmp_path, read_cache_max_bytes=1 << 20,
                                       read_ahead_bytes=4096))
    try:
        for eid in range(100):
            s.add_entry(1, eid, entry(1, eid), KEY)
            s.add_entry(2, eid, entry(2, eid), KEY)
        s.checkpoint()
        preads: list[int] = []
        real_pread = entry_log_module.pread_exact

        def counting(fd: int, n: int, offset: int) -> bytes:
            preads.append(n)
            return real_pread(fd, n, offset)

        monkeypatch.setattr(entry_log_module, "pread_exact", counting)
        assert [s.read_entry(1, eid) for eid in range(100)] == [
            entry(1, eid) for eid in range(100)]
        # 100 records of 100 bytes + header, at most 4096 bytes per pread
        per_pread = 4096 // (100 + entry_log_module.RECORD_PREFIX_SIZE)
        assert len(preads) == -(-100 // per_pread) and max(preads) <= 4096
        # read-ahead stops at the ledger's end: ledger 2 was never read ahead
        assert s.read_entry(2, 0) == entry(2, 0) and len(preads) == -(-100 // per_pread) + 1
    finally:
        s.close()


def checkpoint_then_rewrite(storage: BookieStorage, count: int, rewritten: int) -> list[bytes]:
    """Entries ``0..count-1`` of ledger 1 ("old") checkpointed into one log,
    then entry ``rewritten`` added again ("new", as recovery does) and
    checkpointed into a later log; returns what ledger 1 now holds."""
    for eid in range(count):
        storage.add_entry(1, eid, stored_entry(1, eid, b"old"), KEY)
    storage.checkpoint()
    storage.add_entry(1, rewritten, stored_entry(1, rewritten, b"new"), KEY, recovery=True)
    storage.checkpoint()
    return [stored_entry(1, eid, b"new" if eid == rewritten else b"old")
            for eid in range(count)]


def test_read_ahead_never_serves_an_older_copy_of_a_rewritten_entry(
        storage: BookieStorage) -> None:
    checkpoint_then_rewrite(storage, 3, 1)
    # a miss: reads ahead from the first log
    assert storage.read_entry(1, 0) == stored_entry(1, 0, b"old")
    assert storage.read_entry(1, 1) == stored_entry(1, 1, b"new")
    assert storage.read_entry(1, 2) == stored_entry(1, 2, b"old")


def entries_of(records: tuple[int, list[bytes]]) -> list[bytes]:
    """The entries of ``read_records``' answer, split as a client splits a
    batch answer's entry list (which raises if the lengths do not add up)."""
    count, chunks = records
    entries = split_records(b"".join(chunks))
    assert len(entries) == count
    return entries


def test_read_records_spans_checkpointed_and_cached_entries_within_limits(
        storage: BookieStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    for eid in range(50):
        storage.add_entry(1, eid, entry(1, eid), KEY)
    storage.checkpoint()  # 0..49 in an entry log
    for eid in range(50, 80):
        storage.add_entry(1, eid, entry(1, eid), KEY)  # 50..79 in the write cache
    preads: list[int] = []
    real_pread = entry_log_module.pread_exact
    monkeypatch.setattr(entry_log_module, "pread_exact",
                        lambda fd, n, off: preads.append(n) or real_pread(fd, n, off))
    got = storage.read_records(1, 10, 1000, 1 << 20)
    assert entries_of(got) == [entry(1, eid) for eid in range(10, 80)]  # ends at the missing 80
    assert len(preads) == 1  # 10..49 with one pread
    assert entries_of(storage.read_records(1, 10, 5, 1 << 20)) == [
        entry(1, eid) for eid in range(10, 15)]
    # size: records of 4 + 100 bytes; the first entry is always returned
    assert storage.read_records(1, 40, 1000, 520)[0] == 5
    assert storage.read_records(1, 60, 1000, 520)[0] == 5  # from the write cache
    assert storage.read_records(1, 60, 1000, 1)[0] == 1
    assert storage.read_records(1, 45, 1000, 4 * 104 - 1)[0] == 3  # log run, then stop
    with pytest.raises(NoSuchEntryError):
        storage.read_records(1, 80, 10, 1 << 20)
    with pytest.raises(NoSuchLedgerError):
        storage.read_records(2, 0, 10, 1 << 20)


def test_read_records_from_the_read_cache_and_past_a_rewritten_entry(
        storage: BookieStorage) -> None:
    expected = checkpoint_then_rewrite(storage, 10, 5)  # 5 in a later log than 0..4, 6..9
    assert entries_of(storage.read_records(1, 0, 100, 1 << 20)) == expected
    assert storage.read_entry(1, 0) == expected[0]  # a miss: reads 0..4 ahead into the cache
    hits = storage.stats.read_cache_hits
    assert entries_of(storage.read_records(1, 0, 100, 1 << 20)) == expected
    assert storage.stats.read_cache_hits > hits


def test_an_entry_log_that_does_not_match_the_index_is_refused_not_served(
        storage: BookieStorage) -> None:
    for eid in range(3):
        storage.add_entry(1, eid, entry(1, eid), KEY)
    storage.checkpoint()
    log_file = storage.config.entry_log_dir / entry_log_module.entry_log_name(1)
    data = bytearray(log_file.read_bytes())
    # the last record's entry names another entry id (a batch checks the
    # ends of a run; the index placed every record right after the one
    # before, and readers verify each entry's ids and digest)
    last = entry_log_module.LOG_HEADER_SIZE + 2 * (4 + 100)
    data[last + 4 + 8:last + 4 + 16] = struct.pack(">Q", 7)
    log_file.write_bytes(bytes(data))
    with pytest.raises(StorageError, match=r"holds \(1, 7, 100 bytes\), index expected "
                                           r"\(1, 2, 100 bytes\)"):
        storage.read_records(1, 0, 10, 1 << 20)
    with pytest.raises(StorageError, match="index expected"):
        storage.read_entry(1, 0)  # read-ahead checks every record


def test_an_entry_log_of_format_version_1_is_refused_with_a_clear_error(
        storage: BookieStorage) -> None:
    storage.add_entry(1, 0, entry(1, 0), KEY)
    storage.checkpoint()
    log_file = storage.config.entry_log_dir / entry_log_module.entry_log_name(1)
    data = bytearray(log_file.read_bytes())
    data[4:6] = struct.pack(">H", 1)
    log_file.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="format version 1; this bookie reads version 2"):
        storage.read_entry(1, 0)


def test_separate_journal_and_ledger_dirs(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, journal_dirs=(tmp_path / "j",), ledger_dirs=(tmp_path / "l",))
    s = BookieStorage.open(cfg)
    s.add_entry(1, 0, entry(1, 0), KEY)
    s = reopen(s, clean=True)
    try:
        assert s.read_entry(1, 0) == entry(1, 0)
        assert (tmp_path / "j" / "journal").is_dir()
        assert (tmp_path / "l" / "ledgers" / "index").is_dir()
        assert not (tmp_path / "j" / "ledgers").exists()
    finally:
        s.close()


def test_second_open_of_the_same_dirs_is_refused(storage: BookieStorage) -> None:
    with pytest.raises(StorageError):
        BookieStorage.open(storage.config)


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        make_config(tmp_path, journal_dirs=())
    with pytest.raises(ConfigError):
        make_config(tmp_path, ledger_dirs=(tmp_path / "a", tmp_path / "b"))
    with pytest.raises(ConfigError):
        make_config(tmp_path, journal_file_size_bytes=100)


def test_closed_engine_refuses_work(storage: BookieStorage) -> None:
    storage.close()
    storage.close()  # idempotent
    with pytest.raises(StorageError):
        storage.add_entry(1, 0, entry(1, 0), KEY)
    with pytest.raises(StorageError):
        storage.read_entry(1, 0)


def test_disk_usage(storage: BookieStorage) -> None:
    free, total = storage.disk_usage()
    assert 0 < free <= total
