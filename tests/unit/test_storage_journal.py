"""Journal: framing, sequence numbers, rolling, replay, torn tails, holes."""

from __future__ import annotations

import errno
import mmap
import os
import struct
import threading
from pathlib import Path

import pytest

from quire.bookie.storage import journal_files as journal_files_module
from quire.bookie.storage import journal_format
from quire.bookie.storage.files import sync_file as real_sync_file
from quire.bookie.storage.journal import Journal
from quire.bookie.storage.journal_format import (
    FILE_HEADER_SIZE,
    REC_ADD_ENTRY,
    REC_FENCE,
    JournalMark,
    decode_add_entry,
    decode_ledger_id,
    encode_fence,
    encode_record,
    journal_file_name,
)
from quire.bookie.storage.journal_state import list_journal_files
from quire.errors import StorageError
from tests.support.page_cache import record_dontneed

FILE_SIZE = 8192


def open_journal(directory: Path, file_size: int = FILE_SIZE) -> Journal:
    return Journal.open(directory, file_size_bytes=file_size, max_group_bytes=1024)


def started(directory: Path, mark: JournalMark | None = None,
            file_size: int = FILE_SIZE) -> tuple[Journal, list[tuple[int, int, bytes]]]:
    """Open, replay (collecting ADD_ENTRY records) and start."""
    j = open_journal(directory, file_size)
    adds = []
    for rec in j.replay(mark):
        if rec.rtype == REC_ADD_ENTRY:
            adds.append(decode_add_entry(rec.body))
    j.start()
    return j, adds


def entry(i: int, size: int = 100) -> bytes:
    return (b"%08d" % i) * (size // 8)


def test_seqs_are_monotonic_and_write_sync_report_them(tmp_path: Path) -> None:
    j, _ = started(tmp_path)
    assert (j.append_seq, j.written_seq, j.synced_seq) == (0, 0, 0)
    seqs = [j.append_add_entry(1, i, entry(i)) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert j.buffered_bytes > 0 and j.written_seq == 0
    assert j.write_buffered() == 5
    assert j.buffered_bytes == 0 and j.synced_seq == 0
    assert j.append(encode_fence(1)) == 6
    assert j.sync() == 6
    assert j.synced_seq == 6
    stats = j.last_sync_stats
    assert stats is not None and stats.records == 6 and stats.durable_seq == 6
    assert stats.bytes > 5 * 100
    # Nothing new: no fsync, same answer.
    assert j.sync() == 6
    assert j.counters().fsync_count == 1
    j.close()


def test_replay_returns_records_from_a_mark(tmp_path: Path) -> None:
    j, _ = started(tmp_path)
    for i in range(3):
        j.append_add_entry(7, i, entry(i))
    mark = j.mark()
    for i in range(3, 6):
        j.append_add_entry(7, i, entry(i))
    j.append(encode_fence(7))
    j.close()

    j2 = open_journal(tmp_path)
    records = list(j2.replay(mark))
    assert [r.rtype for r in records] == [REC_ADD_ENTRY] * 3 + [REC_FENCE]
    assert [decode_add_entry(r.body) for r in records[:3]] == [
        (7, i, entry(i)) for i in range(3, 6)]
    assert decode_ledger_id(records[3].body) == 7
    # Each record's end is the next one's start; the last end is the replay end.
    assert records[0].end.offset > mark.offset
    assert j2.replay_end == records[-1].end
    j2.start()
    j2.close()

    # Replaying everything from the beginning sees all six adds.
    j3, adds = started(tmp_path)
    assert adds == [(7, i, entry(i)) for i in range(6)]
    j3.close()


def test_rolls_to_new_files_and_replays_across_them(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=4096)
    for i in range(100):
        j.append_add_entry(1, i, entry(i, 200))
        if i % 7 == 0:
            j.write_buffered()
    j.sync()
    files = list_journal_files(tmp_path)
    assert len(files) >= 5
    for seq in files:  # preallocated, never overfilled
        assert (tmp_path / journal_file_name(seq)).stat().st_size == 4096
    j.close()
    j2, adds = started(tmp_path, file_size=4096)
    assert adds == [(1, i, entry(i, 200)) for i in range(100)]
    j2.close()


def test_record_larger_than_a_file_gets_its_own_file(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=4096)
    j.append_add_entry(1, 0, entry(0, 100))
    j.append_add_entry(1, 1, entry(1, 10000))
    j.append_add_entry(1, 2, entry(2, 100))
    j.close()
    _j2, adds = started(tmp_path, file_size=4096)
    assert [a[1] for a in adds] == [0, 1, 2] and adds[1][2] == entry(1, 10000)
    _j2.close()


def test_batched_appends_write_what_single_appends_write_across_rolls(tmp_path: Path) -> None:
    """append_add_entries builds its records (and rolls) on its own: it
    writes what the generic append of each encoded record writes, same
    seqs, same marks, same files, even when the batch rolls over two files."""
    adds = [(1 + i % 3, i, entry(i, 700)) for i in range(30)]  # ~21 KB: 8 KiB files roll
    one, batch = started(tmp_path / "one")[0], started(tmp_path / "batch")[0]
    seqs = [one.append(encode_record(REC_ADD_ENTRY, struct.pack(">QQ", lid, eid) + data))
            for lid, eid, data in adds]
    assert batch.append_add_entries(adds[:1]) == seqs[0]
    assert batch.append_add_entries(adds[1:]) == seqs[-1]
    assert batch.mark() == one.mark()
    for j in (one, batch):
        j.sync()
        j.close()
    assert list_journal_files(tmp_path / "batch") == list_journal_files(tmp_path / "one")
    assert len(list_journal_files(tmp_path / "one")) >= 3
    for seq in list_journal_files(tmp_path / "one"):
        name = journal_file_name(seq)
        assert (tmp_path / "batch" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert started(tmp_path / "batch")[1] == adds


def test_mark_is_exact_for_buffered_records_across_a_roll(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=4096)
    for i in range(30):  # crosses at least one roll, all still buffered
        j.append_add_entry(1, i, entry(i, 200))
    mark = j.mark()
    assert j.written_seq == 0
    j.append_add_entry(1, 30, entry(30, 200))
    j.close()
    j2 = open_journal(tmp_path, 4096)
    records = list(j2.replay(mark))
    assert [decode_add_entry(r.body)[1] for r in records] == [30]
    j2.start()
    j2.close()


def test_torn_tail_is_ignored_and_later_opens_stay_consistent(tmp_path: Path) -> None:
    j, _ = started(tmp_path)
    for i in range(5):
        j.append_add_entry(1, i, entry(i))
    end = j.mark()
    j.close()
    # A record header promising more bytes than were written, then garbage.
    path = tmp_path / journal_file_name(end.file_seq)
    with open(path, "r+b") as f:
        f.seek(end.offset)
        f.write(b"\x00\x00\x01\x00\xde\xad\xbe\xef\x01partial")
    j2, adds = started(tmp_path)
    assert [a[1] for a in adds] == [0, 1, 2, 3, 4]
    assert j2.replay_end == end
    j2.append_add_entry(1, 5, entry(5))
    j2.close()
    # The new file links to where valid data ended: nothing is lost or discarded.
    j3, adds = started(tmp_path)
    assert [a[1] for a in adds] == [0, 1, 2, 3, 4, 5]
    assert not list(tmp_path.glob("*.discarded"))
    j3.close()


def test_crc_mismatch_stops_replay(tmp_path: Path) -> None:
    j, _ = started(tmp_path)
    j.append_add_entry(1, 0, entry(0))
    second = j.mark()
    j.append_add_entry(1, 1, entry(1))
    j.append_add_entry(1, 2, entry(2))
    j.close()
    path = tmp_path / journal_file_name(second.file_seq)
    with open(path, "r+b") as f:
        f.seek(second.offset + 40)  # inside the second record's entry bytes
        byte = f.read(1)
        f.seek(second.offset + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
    j2, adds = started(tmp_path)
    assert [a[1] for a in adds] == [0]
    j2.close()


def test_hole_before_a_later_file_stops_replay_and_sets_it_aside(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=4096)
    for i in range(60):
        j.append_add_entry(1, i, entry(i, 200))
    j.close()
    files = list_journal_files(tmp_path)
    assert len(files) >= 3
    # Power-loss shape: the tail of the first file vanished, later files survived.
    first = tmp_path / journal_file_name(files[0])
    with open(first, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + 300)
        f.write(bytes(4096 - FILE_HEADER_SIZE - 300))
    j2, adds = started(tmp_path, file_size=4096)
    assert [a[1] for a in adds] == [0]  # only the record wholly before the hole
    assert sorted(p.name for p in tmp_path.glob("*.discarded")) == [
        journal_file_name(s) + ".discarded" for s in files[1:]]
    j2.append_add_entry(1, 100, entry(100))
    j2.close()
    j3, adds = started(tmp_path, file_size=4096)
    assert [a[1] for a in adds] == [0, 100]
    j3.close()


def test_remove_files_before_keeps_mark_file_and_current(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=4096)
    for i in range(40):
        j.append_add_entry(1, i, entry(i, 200))
    j.sync()
    mark = j.mark()
    before = list_journal_files(tmp_path)
    removed = j.remove_files_before(mark)
    assert removed == [s for s in before if s < mark.file_seq]
    assert list_journal_files(tmp_path) == [s for s in before if s >= mark.file_seq]
    j.close()


def test_mark_in_a_file_that_was_never_written_replays_the_rest(tmp_path: Path) -> None:
    j, _ = started(tmp_path)
    j.append_add_entry(1, 0, entry(0))
    mark = j.mark()
    j.abandon()  # the record never reached the file (buffered only)
    j2, adds = started(tmp_path, mark)
    assert adds == []
    assert j2.replay_end == mark
    j2.append_add_entry(1, 1, entry(1))
    j2.close()
    j3, adds = started(tmp_path, mark)
    assert [a[1] for a in adds] == [1]
    j3.close()


def test_sync_does_not_hold_the_append_lock_during_fsync(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    j, _ = started(tmp_path)
    in_fsync = threading.Event()
    release = threading.Event()
    real = real_sync_file

    def slow_sync(fd: int, tracker: object, name: str, length: int) -> None:
        in_fsync.set()
        assert release.wait(5)
        real(fd, None, name, length)

    monkeypatch.setattr(journal_files_module, "sync_file", slow_sync)
    j.append_add_entry(1, 0, entry(0))
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(j.sync()))
    t.start()
    assert in_fsync.wait(5)
    # While the fsync is "running": appends and volatile writes proceed.
    assert j.append_add_entry(1, 1, entry(1)) == 2
    assert j.write_buffered() == 2
    release.set()
    t.join(5)
    assert result == [1]
    monkeypatch.setattr(journal_files_module, "sync_file", real)
    assert j.sync() == 2
    j.close()


def test_concurrent_appends_and_syncs_lose_nothing(tmp_path: Path) -> None:
    j, _ = started(tmp_path, file_size=16384)
    stop = threading.Event()
    durable: list[int] = []

    def syncer() -> None:
        while not stop.is_set():
            durable.append(j.sync())

    t = threading.Thread(target=syncer)
    t.start()
    for i in range(2000):
        j.append_add_entry(3, i, entry(i, 64))
        if i % 50 == 0:
            j.write_buffered()
    stop.set()
    t.join()
    assert durable == sorted(durable)
    assert j.sync() == 2000
    j.close()
    j2, adds = started(tmp_path, file_size=16384)
    assert adds == [(3, i, entry(i, 64)) for i in range(2000)]
    j2.close()


def test_failed_fsync_poisons_the_journal(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    j, _ = started(tmp_path)

    def failing(fd: int, tracker: object, name: str, length: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal_files_module, "sync_file", failing)
    j.append_add_entry(1, 0, entry(0))
    with pytest.raises(StorageError):
        j.sync()
    monkeypatch.undo()
    # Never retried, never reported durable.
    with pytest.raises(StorageError):
        j.sync()
    with pytest.raises(StorageError):
        j.write_buffered()
    assert j.synced_seq == 0
    j.close()


def test_append_before_start_is_refused(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    with pytest.raises(StorageError):
        j.append(encode_fence(1))
    j.start()
    j.close()
    assert os.path.exists(tmp_path / journal_file_name(1))


def test_unsynced_writes_are_handed_to_writeback_and_dropped_a_mib_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BP-14 volatile writes (write_buffered, no fsync): every MiB one
    DONTNEED from the start of the previous stretch to the last whole page
    written, so each stretch is advised twice (writeback, then drop); no
    fsync comes of it and every record still replays."""
    calls = record_dontneed(monkeypatch)
    j = Journal.open(tmp_path, file_size_bytes=16 << 20, max_group_bytes=1 << 20,
                     remove_pages_from_cache=True)
    j.start()
    written = []
    for i in range(56):  # 56 x 64 KiB: 3.5 MiB
        j.append_add_entry(1, i, entry(i, 64 << 10))
        j.write_buffered()
        written.append(j.mark().offset)
    assert j.counters().fsync_count == 0 and j.synced_seq == 0
    assert len(calls) == 3
    kicked = 0
    previous_start = 0
    for offset, length in calls:
        end = offset + length
        assert offset == previous_start and end % 4096 == 0
        assert end - kicked >= 1 << 20
        assert any(end <= w < end + 4096 + (64 << 10) for w in written)
        previous_start, kicked = kicked, end
    j.close()
    monkeypatch.undo()
    _, adds = started(tmp_path, file_size=16 << 20)
    assert [a[1] for a in adds] == list(range(56))
    assert all(a[2] == entry(a[1], 64 << 10) for a in adds)


# --- reused files ------------------------------------------------------------


def reusing(directory: Path, reuse: int, file_size: int = 4096) -> Journal:
    return Journal.open(directory, file_size_bytes=file_size, max_group_bytes=1024,
                        reuse_files_max=reuse)


def free_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.jnl.free"))


def test_removed_files_are_reused_and_their_old_records_never_replay(tmp_path: Path) -> None:
    """Every record has the same size, so in a reused file an old record
    starts exactly where the new data ends: only the per-file salt in the
    crc stops replay there."""
    j = reusing(tmp_path, reuse=2)
    j.start()
    for i in range(60):  # about 20 records per 4 KiB file: 3 or more files
        j.append_add_entry(1, i, entry(i, 160))
    j.sync()
    mark = j.mark()
    removed = j.remove_files_before(mark)
    assert len(removed) >= 2
    assert free_names(tmp_path) == [journal_file_name(s) + ".free" for s in removed[:2]]
    assert j.free_files() == free_names(tmp_path)
    for i in range(60, 70):  # fills the mark's file, rolls into a reused one
        j.append_add_entry(1, i, entry(i, 160))
    j.sync()
    assert len(free_names(tmp_path)) == 1  # one of the two taken
    newest = max(list_journal_files(tmp_path))
    assert (tmp_path / journal_file_name(newest)).stat().st_size == 4096
    j.close()

    j2 = reusing(tmp_path, reuse=2)
    adds = [decode_add_entry(r.body) for r in j2.replay(mark) if r.rtype == REC_ADD_ENTRY]
    assert adds == [(1, i, entry(i, 160)) for i in range(60, 70)]
    j2.close()


@pytest.mark.parametrize("dsync", [False, True], ids=["fdatasync", "dsync"])
def test_writes_into_a_reused_file_end_on_a_page_boundary(tmp_path: Path, dsync: bool) -> None:
    """A group's write is padded with zeros to the next page boundary, so
    the kernel never reads the partly covered last page of a reused file
    back from disk first.  Seen from outside: after the write, the rest of
    that page holds zeros, not the file's old records, and the next group
    still starts right after the data (replay returns every record)."""
    page = mmap.PAGESIZE
    j = Journal.open(tmp_path, file_size_bytes=4 * page, max_group_bytes=1024,
                     reuse_files_max=1, dsync_writes=dsync)
    j.start()
    i = 0
    while len(list_journal_files(tmp_path)) < 3:  # fill file 1 and 2 with old records
        j.append_add_entry(1, i, entry(i, 300))
        j.sync()
        i += 1
    j.remove_files_before(j.mark())
    assert len(free_names(tmp_path)) == 1
    while len(free_names(tmp_path)) == 1:  # fill the current file, roll into the reused one
        j.append_add_entry(1, i, entry(i, 300))
        j.sync()
        i += 1
    reused = max(list_journal_files(tmp_path))
    mark = JournalMark(reused, 0)
    first, second = i, i + 1
    for k in (first, second):
        j.append_add_entry(1, k, entry(k, 300))
        j.sync()
        data = (tmp_path / journal_file_name(reused)).read_bytes()
        end = j.mark().offset
        assert end % page  # the data ends inside a page ...
        assert data[end:end - end % page + page] == bytes(page - end % page)  # ... zeros after it
    j.close()
    j2 = Journal.open(tmp_path, file_size_bytes=4 * page, max_group_bytes=1024)
    adds = [decode_add_entry(r.body) for r in j2.replay(mark) if r.rtype == REC_ADD_ENTRY]
    assert adds == [(1, k, entry(k, 300)) for k in (first - 1, first, second)]  # (first - 1 rolled)
    j2.close()


def test_reused_files_beyond_the_limit_are_deleted_at_open(tmp_path: Path) -> None:
    j = reusing(tmp_path, reuse=3)
    j.start()
    for i in range(100):
        j.append_add_entry(1, i, entry(i, 160))
    j.sync()
    j.remove_files_before(j.mark())
    kept = free_names(tmp_path)
    assert len(kept) == 3
    j.close()
    reusing(tmp_path, reuse=1).close()
    assert free_names(tmp_path) == kept[-1:]  # the newest one stays
    reusing(tmp_path, reuse=0).close()
    assert free_names(tmp_path) == []


def test_version_1_files_without_salt_still_replay(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_format, "FILE_VERSION", 1)
    header = journal_format.encode_file_header(1, JournalMark(0, 0))
    records = [journal_format.encode_record(REC_ADD_ENTRY, struct.pack(">QQ", 5, i) + entry(i))
               for i in range(3)]
    (tmp_path / journal_file_name(1)).write_bytes(header + b"".join(records) + bytes(64))
    monkeypatch.undo()
    j, adds = started(tmp_path)
    assert adds == [(5, i, entry(i)) for i in range(3)]
    j.append_add_entry(5, 3, entry(3))  # a new (version 2) file continues it
    j.close()
    j2, adds = started(tmp_path)
    assert adds == [(5, i, entry(i)) for i in range(4)]
    j2.close()


# --- a group's write as its own fsync --------------------------------------------


class SyncCalls:
    """Counts the journal's two ways of making a write durable."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refuse_dsync: bool = False) -> None:
        self.fsyncs = 0
        self.dsync_writes = 0
        real_write_synced = journal_files_module.write_synced

        def sync_file(fd: int, tracker: object, name: str, length: int) -> None:
            self.fsyncs += 1
            real_sync_file(fd, None, name, length)

        def write_synced(fd: int, data: memoryview, offset: int, tracker: object,
                         name: str, synced_length: int, *, pad_to_page: bool = False) -> int:
            if refuse_dsync:
                raise OSError(errno.EOPNOTSUPP, "Operation not supported")
            self.dsync_writes += 1
            return real_write_synced(fd, data, offset, None, name, synced_length,
                                     pad_to_page=pad_to_page)

        monkeypatch.setattr(journal_files_module, "sync_file", sync_file)
        monkeypatch.setattr(journal_files_module, "write_synced", write_synced)


def test_sync_writes_the_group_with_dsync_unless_earlier_writes_are_unsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = SyncCalls(monkeypatch)
    j = Journal.open(tmp_path, file_size_bytes=1 << 20, max_group_bytes=1024,
                     dsync_writes=True)
    j.start()  # the header: a dsync write (the probe), then start's own fsync
    calls.fsyncs = calls.dsync_writes = 0
    j.append_add_entry(1, 0, entry(0))
    assert j.sync() == 1
    assert (calls.dsync_writes, calls.fsyncs) == (1, 0)
    # A BP-14 volatile write leaves bytes written but unsynced: the next
    # sync must fdatasync them, so it cannot use a dsync write of its own.
    j.append_add_entry(1, 1, entry(1))
    j.write_buffered()
    j.append_add_entry(1, 2, entry(2))
    assert j.sync() == 3
    assert (calls.dsync_writes, calls.fsyncs) == (1, 1)
    j.append_add_entry(1, 3, entry(3))
    assert j.sync() == 4
    assert (calls.dsync_writes, calls.fsyncs) == (2, 1)
    j.close()
    j2, adds = started(tmp_path, file_size=1 << 20)
    assert adds == [(1, i, entry(i)) for i in range(4)]
    j2.close()


def test_a_kernel_refusing_dsync_writes_means_fdatasync(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls = SyncCalls(monkeypatch, refuse_dsync=True)
    j = Journal.open(tmp_path, file_size_bytes=1 << 20, max_group_bytes=1024,
                     dsync_writes=True)
    j.start()
    calls.fsyncs = 0
    j.append_add_entry(1, 0, entry(0))
    assert j.sync() == 1
    assert (calls.dsync_writes, calls.fsyncs) == (0, 1)
    j.close()
