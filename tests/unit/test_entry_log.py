"""EntryLogger.write_batch: every entry lands where its row says, logs roll
before max_bytes, and the per-log ledger sets are exact."""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quire.bookie.storage import entry_log
from quire.bookie.storage.entry_log import (
    LOG_HEADER_SIZE,
    RECORD_PREFIX_SIZE,
    EntryLogger,
    entry_log_name,
)
from quire.bookie.storage.ledger_storage import _sorted_keys
from tests.support.entries import filler_entry
from tests.support.page_cache import record_dontneed

batches = st.lists(st.lists(st.tuples(st.integers(1, 4), st.integers(16, 3000)),
                            min_size=0, max_size=40), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(batches=batches, max_bytes=st.integers(LOG_HEADER_SIZE + 20, 20000),
       chunk=st.integers(1, 9000), per_chunk=st.integers(1, 50), direct_io=st.booleans())
def test_rows_point_at_their_entries_and_logs_roll_in_time(
        batches: list[list[tuple[int, int]]], max_bytes: int, chunk: int,
        per_chunk: int, direct_io: bool) -> None:
    """``per_chunk``: entries per checkpoint chunk (CHUNK_ENTRIES), small here
    so that chunk boundaries fall anywhere, across log rolls too.  With
    ``direct_io`` (tmp is on a file system with O_DIRECT), every batch's
    partly filled last page is written padded and rewritten by the next
    batch: the final re-read of every entry checks those rewrites."""
    saved = entry_log.CHUNK_ENTRIES
    entry_log.CHUNK_ENTRIES = per_chunk
    try:
        check_rows_and_rolls(batches, max_bytes, chunk, direct_io)
    finally:
        entry_log.CHUNK_ENTRIES = saved


def check_rows_and_rolls(batches: list[list[tuple[int, int]]], max_bytes: int,
                         chunk: int, direct_io: bool = False) -> None:
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        directory = Path(tmp)
        logger = EntryLogger(directory, max_bytes=max_bytes, write_buffer_bytes=chunk,
                             direct_io=direct_io)
        assert logger._direct == direct_io  # this file system takes O_DIRECT
        where: dict[tuple[int, int], tuple[int, int]] = {}
        next_id = {ledger: 0 for ledger in range(1, 5)}
        written: dict[tuple[int, int], bytes] = {}
        for batch in batches:
            items = []
            for ledger_id, size in batch:
                entry_id = next_id[ledger_id]
                next_id[ledger_id] += 1
                entry = filler_entry(ledger_id, entry_id, size, b"%d/%d ")
                items.append(((ledger_id, entry_id), entry))
                written[(ledger_id, entry_id)] = entry
            rows, ledgers = logger.write_batch(items)
            assert list(zip(rows.ledger_ids, rows.entry_ids, strict=True)) == [k for k, _ in items]
            assert rows.lengths == [len(e) for _, e in items]
            assert len(rows.log_ids) == len(rows.offsets) == len(items)
            by_log: dict[int, set[int]] = {}
            for (ledger_id, entry_id), log_id, offset, length in zip(
                    zip(rows.ledger_ids, rows.entry_ids, strict=True), rows.log_ids,
                    rows.offsets, rows.lengths, strict=True):
                by_log.setdefault(log_id, set()).add(ledger_id)
                where[(ledger_id, entry_id)] = (log_id, offset)
                [(read_id, entry)] = logger.read_run(log_id, ledger_id,
                                                     [(entry_id, offset, length)])
                assert read_id == entry_id and entry == written[(ledger_id, entry_id)]
            assert ledgers == by_log
        ends: dict[int, int] = {}
        for key, (log_id, offset) in where.items():  # everything, after every batch
            entry = written[key]
            assert logger.read_run(log_id, key[0], [(key[1], offset, len(entry))]) == [
                (key[1], entry)]
            ends[log_id] = max(ends.get(log_id, 0), offset + RECORD_PREFIX_SIZE + len(entry))
        for log_id, end in ends.items():
            # Over max_bytes only for a log holding one record too big for any log.
            assert end <= max_bytes or end - LOG_HEADER_SIZE - RECORD_PREFIX_SIZE in {
                len(e) for e in written.values()}
            size = os.path.getsize(directory / entry_log_name(log_id))
            assert size == (-(-end // 4096) * 4096 if direct_io else end)  # padded page
        logger.close()


def test_checkpointed_pages_are_dropped_after_their_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a batch is written, the writeback of each piece's whole pages is
    started (DONTNEED drops nothing dirty); after the fsync, the whole pages
    written since the last drop are dropped (the partly written last page
    stays); a finished log is dropped to its end; everything reads back."""
    calls = record_dontneed(monkeypatch)
    real_sync = entry_log.sync_file

    def sync_file(fd: int, tracker: object, name: str, length: int) -> None:
        calls.append((-1, -1))  # marks the fsync among the advice
        real_sync(fd, None, name, length)

    monkeypatch.setattr(entry_log, "sync_file", sync_file)
    logger = EntryLogger(tmp_path, max_bytes=40_000, write_buffer_bytes=4096,
                         remove_pages_from_cache=True)
    first = [((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(10)]
    rows, _ = logger.write_batch(first)
    end = rows.offsets[-1] + RECORD_PREFIX_SIZE + 1000
    fsync = calls.index((-1, -1))
    kicks, after = calls[:fsync], calls[fsync + 1:]
    assert len(kicks) >= 2  # one per piece that filled a page
    assert [offset for offset, _ in kicks] == [0] + [o + n for o, n in kicks[:-1]]  # contiguous
    assert kicks[-1][0] + kicks[-1][1] == end - end % 4096  # up to the partly written page
    assert after == [(0, end - end % 4096)]  # dropped once clean
    del calls[:]
    second = [((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(10, 50)]
    rows2, _ = logger.write_batch(second)  # 50 KB: rolls past max_bytes
    first_fsync = calls.index((-1, -1))  # the first log's, when it closed
    assert calls[first_fsync + 1] == (end - end % 4096, 0)  # to its end
    assert rows2.log_ids[-1] != rows.log_ids[0]
    assert all(offset % 4096 == 0 and length % 4096 == 0
               for offset, length in calls[first_fsync + 2:] if offset >= 0)
    for (ledger_id, entry_id), entry in first + second:
        position = (rows.ledger_ids + rows2.ledger_ids, rows.entry_ids + rows2.entry_ids)
        index = list(zip(*position, strict=True)).index((ledger_id, entry_id))
        log_id = (rows.log_ids + rows2.log_ids)[index]
        offset = (rows.offsets + rows2.offsets)[index]
        assert logger.read_run(log_id, ledger_id, [(entry_id, offset, len(entry))]) == [
            (entry_id, entry)]
    logger.close()


def test_pages_stay_cached_when_removal_is_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *args: calls.append(1))
    logger = EntryLogger(tmp_path, max_bytes=40_000, write_buffer_bytes=4096)
    logger.write_batch([((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(60)])
    assert calls == []
    logger.close()


@given(keys=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 40)), unique=True,
                     max_size=60),
       per_chunk=st.integers(1, 9))
def test_checkpoint_keys_come_out_sorted_whatever_the_chunking(
        keys: list[tuple[int, int]], per_chunk: int) -> None:
    """The order check works a chunk at a time (each chunk's last key is
    compared with the next chunk's first): keys out of order anywhere, at a
    chunk edge too, get sorted; keys in order are kept as they are."""
    saved = entry_log.CHUNK_ENTRIES
    entry_log.CHUNK_ENTRIES = per_chunk
    try:
        entries = {key: b"" for key in keys}
        assert _sorted_keys(entries) == sorted(keys)
        in_order = {key: b"" for key in sorted(keys)}
        assert _sorted_keys(in_order) == sorted(keys)
    finally:
        entry_log.CHUNK_ENTRIES = saved


def test_direct_io_logs_are_opened_o_direct_and_fall_back_where_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = [((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(10)]
    direct = EntryLogger(tmp_path / "direct", max_bytes=1 << 20, write_buffer_bytes=4096,
                         direct_io=True)
    direct.write_batch(items)
    assert fcntl.fcntl(direct._cur_fd, fcntl.F_GETFL) & os.O_DIRECT
    direct.close()

    real_open = os.open

    def refusing_open(path: Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:  # as tmpfs does: the file is made, then refused
            os.close(real_open(path, flags & ~os.O_DIRECT, mode))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(entry_log.os, "open", refusing_open)
    refused = EntryLogger(tmp_path / "refused", max_bytes=1 << 20, write_buffer_bytes=4096,
                          direct_io=True)
    rows, _ = refused.write_batch(items)
    assert not fcntl.fcntl(refused._cur_fd, fcntl.F_GETFL) & os.O_DIRECT
    assert not refused._direct
    for (key, entry), offset in zip(items, rows.offsets, strict=True):
        assert refused.read_run(rows.log_ids[0], 1, [(key[1], offset, len(entry))]) == [
            (key[1], entry)]
    assert os.listdir(tmp_path / "refused") == [entry_log_name(rows.log_ids[0])]
    refused.close()


def test_a_refused_direct_write_goes_on_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system may open with O_DIRECT yet refuse the writes (EINVAL):
    the current log drops the flag, what was staged is written buffered,
    and every later write is buffered; nothing is lost."""
    real_pwrite = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    logger = EntryLogger(tmp_path, max_bytes=40_000, write_buffer_bytes=4096, direct_io=True)
    first = [((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(3)]
    rows1, _ = logger.write_batch(first)  # direct: staged, tail page padded
    monkeypatch.setattr(os, "pwrite", pwrite)
    second = [((1, i), filler_entry(1, i, 1000, b"%d %d ")) for i in range(3, 60)]
    rows2, _ = logger.write_batch(second)  # refused at once, then buffered, across rolls
    assert refused and not logger._direct
    assert not fcntl.fcntl(logger._cur_fd, fcntl.F_GETFL) & os.O_DIRECT
    for (key, entry), log_id, offset in zip(first + second, rows1.log_ids + rows2.log_ids,
                                            rows1.offsets + rows2.offsets, strict=True):
        assert logger.read_run(log_id, 1, [(key[1], offset, len(entry))]) == [(key[1], entry)]
    logger.close()


def test_pieces_grow_while_batches_fall_behind_and_shrink_once_they_keep_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is written in small pieces (a journal sharing the disk waits
    behind little) until one took more than four fifths of the time since
    the one before (checkpoints falling behind): the next is written in bulk
    pieces, and the one after that, quick again, in small ones."""
    times = iter([0.0, 0.1, 1.0, 1.9, 2.0, 2.1])  # (start, end) of three batches
    logger = EntryLogger(tmp_path, max_bytes=1 << 20, write_buffer_bytes=4096,
                         bulk_write_buffer_bytes=16384, clock=lambda: next(times))
    sizes: list[int] = []
    real = entry_log.pwrite_all

    def pwrite_all(fd: int, data: bytes, offset: int, *args: object, **kwargs: object) -> int:
        sizes.append(len(data))
        return real(fd, data, offset, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(entry_log, "pwrite_all", pwrite_all)

    def batch(base: int) -> list[tuple[tuple[int, int], bytes]]:
        return [((1, base + i), filler_entry(1, base + i, 1000, b"%d %d ")) for i in range(40)]

    assert logger.piece_bytes == 4096
    logger.write_batch(batch(0))  # nothing before it to compare with
    assert max(sizes) <= 4096 and logger.piece_bytes == 4096
    sizes.clear()
    logger.write_batch(batch(40))  # 0.9 s of the 1.0 s since the last one: behind
    assert max(sizes) <= 4096 and logger.piece_bytes == 16384
    sizes.clear()
    bulk = batch(80)
    rows, _ = logger.write_batch(bulk)  # in bulk pieces; 0.1 s of 1.0 s: caught up
    assert 4096 < max(sizes) <= 16384 and logger.piece_bytes == 4096
    for (key, entry), log_id, offset in zip(bulk, rows.log_ids, rows.offsets, strict=True):
        assert logger.read_run(log_id, key[0], [(key[1], offset, len(entry))]) == [
            (key[1], entry)]  # what bulk pieces wrote reads back
    logger.close()
