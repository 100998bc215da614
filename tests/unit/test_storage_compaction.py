"""Entry-log compaction (quire.bookie.storage.compaction) in the storage engine:
what it copies, what it frees, what it skips, usage bookkeeping, locking,
reads racing it, crashes at each step (kill -9 and power loss)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quire.bookie.storage import BookieStorage, StorageConfig
from quire.bookie.storage.compaction import LogUse
from quire.bookie.storage.entry_log import RECORD_PREFIX_SIZE, IndexRows, list_entry_logs
from quire.bookie.storage.index import LedgerUse, usage_of_rows
from quire.errors import NoSuchLedgerError, StorageError
from quire.testing.power_loss import emulate_power_loss
from tests.support.entries import filler_entry

KEY = bytes(range(20))
LEDGERS = range(1, 7)
ENTRIES = 30


def make_config(root: Path, **overrides: object) -> StorageConfig:
    settings_: dict[str, object] = dict(
        journal_dirs=(root,), ledger_dirs=(root,), journal_file_size_bytes=1 << 20,
        entry_log_max_bytes=16384, write_cache_max_bytes=1 << 20, read_cache_max_bytes=0,
        index_map_size_bytes=1 << 28, compaction_chunk_bytes=4096, power_loss_tracking=True)
    settings_.update(overrides)
    return StorageConfig(**settings_)  # type: ignore[arg-type]


def entry(ledger_id: int, entry_id: int) -> bytes:
    return filler_entry(ledger_id, entry_id, 100 + 37 * ((ledger_id * 7 + entry_id) % 11),
                        b"L%dE%d;")


def fill(s: BookieStorage, ledgers: range = LEDGERS, entries: int = ENTRIES,
         per_checkpoint: int = 5) -> None:
    """Every ledger's entries interleaved, a checkpoint every
    ``per_checkpoint`` rounds: each log holds several ledgers."""
    for start in range(0, entries, per_checkpoint):
        for eid in range(start, min(entries, start + per_checkpoint)):
            for lid in ledgers:
                s.add_entry(lid, eid, entry(lid, eid), KEY)
        s.checkpoint()


def log_bytes(s: BookieStorage) -> int:
    directory = s.config.entry_log_dir
    return sum(os.path.getsize(directory / name) for name in os.listdir(directory)
               if name.endswith(".log"))


def check_reads(s: BookieStorage, live: set[int], dead: frozenset[int] | set[int] = frozenset(),
                entries: int = ENTRIES) -> None:
    for lid in live:
        for eid in range(entries):
            assert s.read_entry(lid, eid) == entry(lid, eid), (lid, eid)
        count, chunks = s.read_records(lid, 0, entries, 1 << 20)
        assert count == entries
        assert b"".join(chunks) == b"".join(
            len(entry(lid, e)).to_bytes(4, "big") + entry(lid, e) for e in range(entries))
    for lid in dead:
        with pytest.raises(NoSuchLedgerError):
            s.read_entry(lid, 0)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[BookieStorage]:
    s = BookieStorage.open(make_config(tmp_path))
    yield s
    if not s.closed:
        s.close()


def reopen(s: BookieStorage) -> BookieStorage:
    s.close()
    return BookieStorage.open(s.config)


@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(deleted=st.sets(st.sampled_from(list(LEDGERS))),
       threshold=st.sampled_from([0.2, 0.5, 0.8, 1.0]))
def test_compaction_keeps_every_live_entry_and_frees_dead_bytes(
        tmp_path_factory: pytest.TempPathFactory, deleted: set[int], threshold: float) -> None:
    s = BookieStorage.open(make_config(tmp_path_factory.mktemp("c")))
    try:
        fill(s)
        s = reopen(s)  # the logs written are now all closed, none current
        for lid in deleted:
            s.delete_ledger(lid)
        usage = s.ledger_storage.compactor.usage(lambda lid: lid not in deleted)
        s.gc_entry_logs()
        before = log_bytes(s)
        logs_before = set(list_entry_logs(s.config.entry_log_dir))
        stats = s.compact_entry_logs(threshold)
        live = set(LEDGERS) - deleted
        check_reads(s, live, deleted)
        after = log_bytes(s)
        below = [u for u in usage if 0 < u.live_fraction < threshold]
        assert stats.logs_compacted == len(below)
        remaining = list_entry_logs(s.config.entry_log_dir)
        assert not {u.log_id for u in below} & set(remaining)
        # Disk bytes go down by the dead bytes of the compacted logs, less
        # what each new log may waste (a header, the room a record did not
        # fit in, O_DIRECT's zero padding of the last page).
        dead = sum(u.size_bytes - u.live_bytes for u in below)
        slack = len(set(remaining) - logs_before) * (32 + 600 + 4096)
        assert after <= before - dead + slack
        if dead > slack:
            assert after < before
        if not live:
            assert after == 0 or remaining == [s.ledger_storage.entry_logger.current_log_id]
        # What the compaction left (the copies) is all live, and stays so.
        s = reopen(s)
        check_reads(s, live, deleted)
        for use in s.ledger_storage.compactor.usage(lambda lid: lid not in deleted):
            assert use.live_fraction > 0.99 or use.log_id not in {u.log_id for u in below}
    finally:
        s.close()


def test_live_log_usage_is_recorded_at_checkpoint_and_moved_by_compaction(
        storage: BookieStorage) -> None:
    fill(storage, ledgers=range(1, 3), entries=10, per_checkpoint=10)
    s = reopen(storage)
    try:
        index = s.ledger_storage.index
        (log_id,) = index.log_ledgers()
        expected = {lid: sum(RECORD_PREFIX_SIZE + len(entry(lid, e)) for e in range(10))
                    for lid in (1, 2)}
        assert index.log_usage([log_id]) == {log_id: {
            lid: LedgerUse(nbytes, 0, 9) for lid, nbytes in expected.items()}}
        s.delete_ledger(1)
        stats = s.compact_entry_logs(0.8)
        assert stats.logs_compacted == 1 and stats.entries_moved == 10
        assert stats.bytes_moved == expected[2]
        (new_log,) = index.log_ledgers()
        assert new_log != log_id
        assert index.log_usage([new_log]) == {new_log: {2: LedgerUse(expected[2], 0, 9)}}
        assert index.log_ledgers() == {new_log: {2}}
    finally:
        s.close()


def test_an_index_without_usage_rows_counts_them_from_its_entries(tmp_path: Path) -> None:
    """An index written before the usage database (format 1 as it was)
    works: usage is counted from the entry rows, and compaction runs."""
    s = BookieStorage.open(make_config(tmp_path))
    fill(s, ledgers=range(1, 4), entries=10)
    s.close()
    env = lmdb.open(str(s.config.index_dir), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"usage", txn=txn), delete=True)
    env.close()
    s = BookieStorage.open(s.config)
    try:
        index = s.ledger_storage.index
        logs = sorted(index.log_ledgers())
        counted = index.log_usage(logs)
        for log_id in logs:
            assert counted[log_id]  # every log got its figures back
        walks: list[object] = []
        real_count = index._count_usage
        index._count_usage = lambda ids: walks.append(ids) or real_count(ids)  # type: ignore[method-assign]
        assert index.log_usage(logs) == counted and walks == []  # stored: counted once
        assert sum(u.record_bytes for v in counted.values() for u in v.values()) == sum(
            RECORD_PREFIX_SIZE + len(entry(lid, e)) for lid in range(1, 4) for e in range(10))
        s.delete_ledger(2)
        assert s.compact_entry_logs(1.0).logs_compacted == len(logs)
        check_reads(s, {1, 3}, {2}, entries=10)
    finally:
        s.close()


def test_usage_of_rows_sums_each_log_and_ledger_with_its_entry_range() -> None:
    rows = IndexRows([1, 1, 2, 2, 2], [0, 1, 0, 1, 2], [5, 5, 5, 6, 6], [0, 0, 0, 0, 0],
                     [10, 20, 30, 40, 50])
    assert usage_of_rows(rows) == {(5, 1): LedgerUse(38, 0, 1), (5, 2): LedgerUse(34, 0, 0),
                                   (6, 2): LedgerUse(98, 1, 2)}


@pytest.mark.parametrize("step", ["copied", "committed"])
@pytest.mark.parametrize("power_loss", [False, True])
def test_a_crash_at_any_step_loses_nothing(tmp_path: Path, step: str,
                                           power_loss: bool) -> None:
    s = BookieStorage.open(make_config(tmp_path))
    fill(s)
    s = reopen(s)
    for lid in (2, 4, 5):
        s.delete_ledger(lid)
    s.checkpoint()

    class Crash(Exception):
        pass

    def crash(reached: str) -> None:
        if reached == step:
            raise Crash

    s.ledger_storage.compactor.on_step = crash
    with pytest.raises(Crash):
        s.compact_entry_logs(1.0)
    s.abandon()  # kill -9
    if power_loss:
        emulate_power_loss([tmp_path])
    s = BookieStorage.open(s.config)
    try:
        check_reads(s, {1, 3, 6}, {2, 4, 5})
        stats = s.compact_entry_logs(1.0)  # finishes the work (or finds it done)
        assert stats.logs_failed == 0
        s.gc_entry_logs()  # a log whose records were committed away is an orphan
        check_reads(s, {1, 3, 6}, {2, 4, 5})
        s = reopen(s)
        check_reads(s, {1, 3, 6}, {2, 4, 5})
    finally:
        s.close()


def test_rows_deleted_or_rewritten_during_the_copy_are_left_alone(
        storage: BookieStorage) -> None:
    fill(storage, ledgers=range(1, 4), entries=10)
    s = reopen(storage)
    try:
        rewritten = entry(3, 4)  # (recovery re-adds identical bytes)

        def meanwhile(reached: str) -> None:
            if reached == "copied":
                s.delete_ledger(1)
                s.add_entry(3, 4, rewritten, KEY, recovery=True)
                s.checkpoint()

        s.ledger_storage.compactor.on_step = meanwhile
        stats = s.compact_entry_logs(1.0)
        assert stats.entries_moved == 10 + 9  # ledger 2's, and ledger 3's but entry 4
        index = s.ledger_storage.index
        assert index.entry_count(1) == 0
        (log_id, _offset, _length) = index.get(3, 4)  # type: ignore[misc]
        assert log_id in index.log_ledgers()
        s.ledger_storage.compactor.on_step = None
        check_reads(s, {2, 3}, {1}, entries=10)
        s = reopen(s)
        check_reads(s, {2, 3}, {1}, entries=10)
    finally:
        s.close()


def test_a_read_that_loses_the_race_reads_the_new_copy(storage: BookieStorage,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    fill(storage, ledgers=range(1, 3), entries=10, per_checkpoint=10)
    s = reopen(storage)
    try:
        index = s.ledger_storage.index
        stale = index.locate_run(2, 3, 1 << 20)  # looked up before the compaction
        stale_batch = index.locate_run(2, 0, 1 << 20, 10)
        s.delete_ledger(1)
        assert s.compact_entry_logs(1.0).logs_compacted == 1
        real = index.locate_run
        lookups: list[tuple[int, int]] = []

        def stale_first(ledger_id: int, entry_id: int, max_bytes: int,
                        max_count: int = 1 << 62) -> tuple[int, list[tuple[int, int, int]]]:
            lookups.append((ledger_id, entry_id))
            if len(lookups) == 1:  # the lookup done before the old log was removed
                return stale if entry_id == 3 else stale_batch
            return real(ledger_id, entry_id, max_bytes, max_count)

        monkeypatch.setattr(index, "locate_run", stale_first)
        assert s.read_entry(2, 3) == entry(2, 3)
        assert len(lookups) == 2
        lookups.clear()
        count, chunks = s.read_records(2, 0, 10, 1 << 20)
        assert count == 10 and len(lookups) == 2
        assert chunks[0][4:].startswith(entry(2, 0))
    finally:
        s.close()


def test_adds_and_checkpoints_go_on_while_a_compaction_reads(
        storage: BookieStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction reads outside every lock, and takes the checkpoint lock
    only for a piece's write: adds and checkpoints are never held up by its
    reading."""
    fill(storage, ledgers=range(1, 3), entries=10)
    s = reopen(storage)
    compactor = s.ledger_storage.compactor
    reading, release = threading.Event(), threading.Event()
    real_read = compactor._read

    def slow_read(log_id: int, piece: list[tuple[int, int, bytes, int, int]]
                  ) -> list[tuple[tuple[int, int], bytes]]:
        reading.set()
        assert release.wait(30)
        return real_read(log_id, piece)

    monkeypatch.setattr(compactor, "_read", slow_read)
    s.delete_ledger(1)
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(s.compact_entry_logs(1.0)))
    worker.start()
    try:
        assert reading.wait(30)
        for eid in range(10, 20):
            s.add_entry(2, eid, entry(2, eid), KEY)
        s.checkpoint()  # would deadlock here if the compaction held the lock
        assert s.read_entry(2, 15) == entry(2, 15)
    finally:
        release.set()
        worker.join(60)
    assert result and result[0].logs_compacted >= 1  # type: ignore[attr-defined]
    try:
        check_reads(s, {2}, {1}, entries=20)
    finally:
        s.close()


def test_compaction_after_close_is_refused_and_a_closing_engine_stops_it(
        storage: BookieStorage) -> None:
    fill(storage, ledgers=range(1, 3), entries=10)
    s = reopen(storage)
    s.delete_ledger(1)

    def close_meanwhile(reached: str) -> None:
        if reached == "copied":  # (no lock is held here)
            s.close()

    s.ledger_storage.compactor.on_step = close_meanwhile
    with pytest.raises(StorageError, match="closed"):
        s.compact_entry_logs(1.0)
    s = BookieStorage.open(s.config)
    try:
        check_reads(s, {2}, {1}, entries=10)
    finally:
        s.close()


def test_a_log_that_became_current_since_it_was_chosen_is_left_alone(
        storage: BookieStorage) -> None:
    """Logs are chosen without the lock; one a checkpoint started meanwhile
    is the log being written, and compacting it would copy into itself."""
    fill(storage, ledgers=range(1, 3), entries=10)
    s = storage
    logger = s.ledger_storage.entry_logger
    current = logger.current_log_id
    chosen = LogUse(current, 4096, 0, ((1, 0, 9), (2, 0, 9)))
    stats = s.ledger_storage.compactor._compact_log(chosen, lambda lid: True, s._exclusive)
    assert stats.logs_compacted == 0
    assert current in list_entry_logs(s.config.entry_log_dir)
    check_reads(s, {1, 2}, entries=10)


def test_a_copy_that_fails_leaves_the_log_as_it_was(storage: BookieStorage,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fill(storage, ledgers=range(1, 3), entries=10)
    s = reopen(storage)
    try:
        s.delete_ledger(1)
        s.checkpoint()
        logger = s.ledger_storage.entry_logger

        def full(*args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(logger, "write_batch", full)
        before = list_entry_logs(s.config.entry_log_dir)
        stats = s.compact_entry_logs(1.0)
        assert stats.logs_failed == len(before) and stats.logs_compacted == 0
        assert list_entry_logs(s.config.entry_log_dir) == before
        monkeypatch.undo()
        check_reads(s, {2}, {1}, entries=10)
        assert s.compact_entry_logs(1.0).logs_compacted == len(before)
        check_reads(s, {2}, {1}, entries=10)
    finally:
        s.close()
