"""BP-46 in the storage engine: the unclean-shutdown running mark and the
limbo state of ledgers, both read back after reopening the directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.bookie.storage import BookieStorage, LastShutdown, ShutdownKind, StorageConfig
from quire.errors import LedgerFencedError, StorageError, UnauthorizedError
from quire.testing.power_loss import emulate_power_loss
from tests.support.entries import stored_entry

KEY = bytes(range(20))
OTHER_KEY = bytes(20)


def make_config(root: Path, *, journal_write_data: bool = True) -> StorageConfig:
    return StorageConfig(journal_dirs=(root / "journal",), ledger_dirs=(root / "ledgers",),
                         journal_write_data=journal_write_data,
                         journal_file_size_bytes=16384, write_cache_max_bytes=1 << 20,
                         index_map_size_bytes=1 << 26, power_loss_tracking=True)


def add(storage: BookieStorage, ledger_id: int, entry_id: int) -> None:
    storage.add_entry(ledger_id, entry_id, stored_entry(ledger_id, entry_id, b"x"), KEY)


# --- the running mark ------------------------------------------------------------


def test_first_start_then_clean_close_reads_clean(tmp_path: Path) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    assert storage.last_shutdown == LastShutdown(ShutdownKind.FIRST_START)
    add(storage, 1, 0)
    storage.close()
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.last_shutdown == LastShutdown(ShutdownKind.CLEAN)
        assert not storage.last_shutdown.unclean
    finally:
        storage.close()


@pytest.mark.parametrize("journal_write_data", [True, False])
def test_crash_reads_unclean_with_the_crashed_runs_mode(tmp_path: Path,
                                                        journal_write_data: bool) -> None:
    storage = BookieStorage.open(make_config(tmp_path, journal_write_data=journal_write_data))
    add(storage, 1, 0)
    storage.abandon()  # kill -9
    emulate_power_loss([tmp_path])
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        last = storage.last_shutdown
        assert last.kind is ShutdownKind.UNCLEAN
        assert last.crashed_run_journal_write_data is journal_write_data
        assert last.may_have_lost_acknowledged_entries is (not journal_write_data)
    finally:
        storage.close()
    # ... and the clean close of the run after it clears the mark
    storage = BookieStorage.open(make_config(tmp_path))
    assert storage.last_shutdown.kind is ShutdownKind.CLEAN
    storage.close()


def test_crash_after_the_final_checkpoint_still_reads_unclean(tmp_path: Path) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    add(storage, 1, 0)
    storage.checkpoint()
    storage.journal.sync()
    storage.abandon()  # everything of a clean close but clearing the mark
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.last_shutdown.kind is ShutdownKind.UNCLEAN
    finally:
        storage.close()


def test_close_whose_checkpoint_fails_leaves_the_mark(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    add(storage, 1, 0)

    def failing_flush(*_args: object) -> int:
        raise StorageError("disk gone")

    monkeypatch.setattr(storage.ledger_storage, "flush", failing_flush)
    with pytest.raises(StorageError):
        storage.close()
    monkeypatch.undo()
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.last_shutdown.kind is ShutdownKind.UNCLEAN
    finally:
        storage.close()


def test_a_crashed_journal_less_run_stays_flagged_until_handled(tmp_path: Path) -> None:
    """Turning the journal back on after a journal-less crash still protects:
    a second crash before the boot sequence handled the first one reads as
    the journal-less crash it still is."""
    storage = BookieStorage.open(make_config(tmp_path, journal_write_data=False))
    storage.abandon()
    storage = BookieStorage.open(make_config(tmp_path))  # journal on now
    assert storage.last_shutdown.may_have_lost_acknowledged_entries
    storage.abandon()  # crash before phase one
    storage = BookieStorage.open(make_config(tmp_path))
    assert storage.last_shutdown.may_have_lost_acknowledged_entries
    storage.unclean_shutdown_handled()
    storage.abandon()  # a crash after it: this run had the journal on
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.last_shutdown.kind is ShutdownKind.UNCLEAN
        assert not storage.last_shutdown.may_have_lost_acknowledged_entries
    finally:
        storage.close()


# --- limbo -----------------------------------------------------------------------


def test_mark_limbo_is_durable_without_close_including_unknown_ledgers(tmp_path: Path) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    add(storage, 1, 0)
    add(storage, 2, 0)
    storage.mark_limbo([1, 7])
    assert storage.is_limbo(1) and storage.is_limbo(7) and not storage.is_limbo(2)
    storage.abandon()
    emulate_power_loss([tmp_path])
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.limbo_ledgers() == [1, 7]
        assert storage.is_fenced(1) and storage.is_fenced(7) and not storage.is_fenced(2)
        assert storage.read_entry(1, 0) == stored_entry(1, 0, b"x")  # held entries kept
        assert storage.get_ledger_state(1).master_key == KEY
        assert storage.get_ledger_state(7).master_key == b""
    finally:
        storage.close()


def test_limbo_ledger_refuses_adds_as_fenced_and_adopts_the_first_fence_key(
        tmp_path: Path) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    storage.mark_limbo([1, 7])
    with pytest.raises(LedgerFencedError):
        add(storage, 7, 0)
    with pytest.raises(UnauthorizedError):  # a recovery add must fence first
        storage.add_entry(7, 0, stored_entry(7, 0, b"x"), KEY, recovery=True)
    storage.fence(7, KEY)
    with pytest.raises(UnauthorizedError):
        storage.fence(7, OTHER_KEY)
    storage.add_entry(7, 0, stored_entry(7, 0, b"x"), KEY, recovery=True)
    storage.journal.sync()
    storage.abandon()
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.get_ledger_state(7).master_key == KEY
        assert storage.is_limbo(7)
        assert storage.read_entry(7, 0) == stored_entry(7, 0, b"x")
    finally:
        storage.close()


def test_clear_limbo_is_durable_once_synced(tmp_path: Path) -> None:
    storage = BookieStorage.open(make_config(tmp_path))
    add(storage, 1, 0)
    storage.mark_limbo([1, 2])
    storage.clear_limbo(1)
    storage.journal.sync()
    storage.abandon()
    emulate_power_loss([tmp_path])
    storage = BookieStorage.open(make_config(tmp_path))
    try:
        assert storage.limbo_ledgers() == [2]
        assert storage.is_fenced(1)  # limbo cleared, fence kept
    finally:
        storage.close()
