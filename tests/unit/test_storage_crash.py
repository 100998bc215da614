"""Crashes, power loss and concurrency: what was acknowledged must come back.

* ``kill -9`` of a real child process (page cache survives);
* emulated power loss (:mod:`quire.testing.power_loss`): only what an fsync
  covered survives, and the seam provably catches a missing fsync;
* a checkpoint thread and an fsync thread running against adds and reads;
* a hypothesis state machine comparing the engine with a model across
  checkpoints, clean restarts, kills and power losses.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from quire.bookie.storage import BookieStorage, StorageConfig
from quire.bookie.storage import entry_log as entry_log_module
from quire.bookie.storage import journal_files as journal_files_module
from quire.bookie.storage.files import pwrite_all
from quire.errors import (
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StorageError,
)
from quire.testing.power_loss import emulate_power_loss
from tests.support.entries import filler_entry, stored_entry

KEY = bytes(range(20))
SRC_DIR = Path(__file__).resolve().parents[2] / "src"


def make_config(root: Path, **overrides: object) -> StorageConfig:
    settings_: dict[str, object] = dict(
        journal_dirs=(root,), ledger_dirs=(root,),
        journal_file_size_bytes=16384, entry_log_max_bytes=65536,
        write_cache_max_bytes=1 << 20, read_cache_max_bytes=16384,
        index_map_size_bytes=1 << 30, power_loss_tracking=True)
    settings_.update(overrides)
    return StorageConfig(**settings_)  # type: ignore[arg-type]


def payload(ledger_id: int, entry_id: int, size: int = 64) -> bytes:
    return filler_entry(ledger_id, entry_id, 16 + size, b"<%d:%d>")


def skip_fsync(fd: int, tracker: object, name: str, length: int) -> None:
    """Stands in for ``sync_file`` when a test removes an fsync."""


def write_unsynced(fd: int, data: memoryview, offset: int, tracker: object, name: str,
                   synced_length: int, *, pad_to_page: bool = False) -> int:
    """Stands in for ``write_synced`` when a test removes an fsync: the
    write happens, without ``RWF_DSYNC``."""
    return pwrite_all(fd, data, offset, pad_to_page=pad_to_page)


# --- power loss ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fsync", "fsync-removed", "skip-flag"])
def test_power_loss_keeps_exactly_what_sync_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``fsync-removed`` patches the fsync call out of the journal (as a bug
    would); ``skip-flag`` uses the config seam that process-level tests use."""
    cfg = make_config(tmp_path, test_skip_journal_fsync=mode == "skip-flag")
    journal_fsync = mode == "fsync"
    if mode == "fsync-removed":
        monkeypatch.setattr(journal_files_module, "sync_file", skip_fsync)
        monkeypatch.setattr(journal_files_module, "write_synced", write_unsynced)
    s = BookieStorage.open(cfg)
    for eid in range(20):
        s.add_entry(1, eid, payload(1, eid), KEY)
    s.checkpoint()  # 0..19 reach an entry log (whose fsync is real)
    seqs = [s.add_entry(1, eid, payload(1, eid), KEY) for eid in range(20, 40)]
    acked = s.journal.sync()
    assert acked >= seqs[-1]  # the server would acknowledge 20..39 now
    for eid in range(40, 60):  # BP-14 volatile: written, never synced
        s.add_entry(1, eid, payload(1, eid), KEY)
    assert s.journal.write_buffered() == s.journal.append_seq
    s.abandon()
    monkeypatch.undo()

    # kill -9 alone would keep all 60 (page cache): the emulation must not.
    report = emulate_power_loss([tmp_path])
    if journal_fsync:
        assert report.zeroed  # the unsynced journal tail was wiped
    else:
        assert report.deleted  # the journal file was never synced at all

    s2 = BookieStorage.open(cfg)
    try:
        for eid in range(20):
            assert s2.read_entry(1, eid) == payload(1, eid)
        for eid in range(20, 40):
            if journal_fsync:
                assert s2.read_entry(1, eid) == payload(1, eid)
            else:
                # Acknowledged, yet gone: this is what the seam exists to catch.
                with pytest.raises(NoSuchEntryError):
                    s2.read_entry(1, eid)
        for eid in range(40, 60):
            with pytest.raises(NoSuchEntryError):
                s2.read_entry(1, eid)
    finally:
        s2.close()


@pytest.mark.parametrize("log_fsync", [True, False], ids=["fsync", "fsync-removed"])
def test_power_loss_catches_a_missing_entry_log_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_fsync: bool) -> None:
    cfg = make_config(tmp_path)
    if not log_fsync:
        monkeypatch.setattr(entry_log_module, "sync_file", skip_fsync)
    s = BookieStorage.open(cfg)
    for eid in range(30):
        s.add_entry(1, eid, payload(1, eid), KEY)
    s.journal.sync()
    s.checkpoint()  # index commit + mark past every journal record above
    s.abandon()
    monkeypatch.undo()
    emulate_power_loss([tmp_path])
    s2 = BookieStorage.open(cfg)
    try:
        if log_fsync:
            assert [s2.read_entry(1, e) for e in range(30)] == [
                payload(1, e) for e in range(30)]
        else:
            with pytest.raises(StorageError):  # index points into a lost log
                s2.read_entry(1, 0)
    finally:
        s2.close()


def test_power_loss_after_a_kill_keeps_replayed_records(tmp_path: Path) -> None:
    """Records only in the page cache when the process died are replayed at
    the next open; they must be made durable then, or a later power loss
    would lose them (and cut the chain to newer, acknowledged files)."""
    cfg = make_config(tmp_path)
    s = BookieStorage.open(cfg)
    for eid in range(10):
        s.add_entry(1, eid, payload(1, eid), KEY)
    s.journal.write_buffered()  # page cache only
    s.abandon()  # kill -9
    s = BookieStorage.open(cfg)
    assert s.read_entry(1, 9) == payload(1, 9)
    seq = s.add_entry(1, 10, payload(1, 10), KEY)
    assert s.journal.sync() >= seq
    s.abandon()
    emulate_power_loss([tmp_path])
    s = BookieStorage.open(cfg)
    try:
        assert [s.read_entry(1, e) for e in range(11)] == [payload(1, e) for e in range(11)]
    finally:
        s.close()


# --- kill -9 of a real process ---------------------------------------------------

CHILD = r"""
import json, sys, threading, time
from pathlib import Path
import struct
from quire.bookie.storage import BookieStorage, StorageConfig

root = Path(sys.argv[1])
cfg = StorageConfig(journal_dirs=(root,), ledger_dirs=(root,),
                    journal_file_size_bytes=65536, entry_log_max_bytes=262144,
                    write_cache_max_bytes=65536, index_map_size_bytes=1 << 30,
                    power_loss_tracking=True)
s = BookieStorage.open(cfg)
key = bytes(range(20))
durable = [0]
checkpoints = [0]

def payload(i):  # a stored entry begins with its ledger and entry id
    return struct.pack(">QQ", 1 + i % 3, i // 3) + (b"<%d>" % i * 40)[:100]

def syncer():
    while True:
        durable[0] = s.journal.sync()
        time.sleep(0.001)

def checkpointer():
    while True:
        time.sleep(0.01)
        s.checkpoint()
        checkpoints[0] += 1

threading.Thread(target=syncer, daemon=True).start()
threading.Thread(target=checkpointer, daemon=True).start()
seqs = []
i = 0
while True:
    for _ in range(100):
        seqs.append(s.add_entry(1 + i % 3, i // 3, payload(i), key))
        i += 1
    s.journal.write_buffered()
    d = durable[0]
    acked = 0
    while acked < len(seqs) and seqs[acked] <= d:
        acked += 1
    print(json.dumps({"acked": acked, "checkpoints": checkpoints[0]}), flush=True)
    time.sleep(0.002)
"""


def test_kill_9_then_power_loss_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    root = tmp_path / "bookie"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC_DIR), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    acked = 0
    try:
        assert child.stdout is not None
        for line in child.stdout:
            progress = json.loads(line)
            acked = progress["acked"]
            if acked >= 3000 and progress["checkpoints"] >= 3:
                break
        else:
            assert child.stderr is not None
            pytest.fail("child died: " + child.stderr.read().decode())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert acked >= 3000

    def check(directory: Path) -> None:
        s = BookieStorage.open(make_config(directory, journal_file_size_bytes=65536))
        try:
            for i in range(acked):
                assert s.read_entry(1 + i % 3, i // 3) == stored_entry(
                    1 + i % 3, i // 3, (b"<%d>" % i * 40)[:100]), i
        finally:
            s.close()

    killed_only = tmp_path / "killed-only"
    shutil.copytree(root, killed_only)
    check(killed_only)  # page cache kept
    emulate_power_loss([root])
    check(root)  # only fsynced bytes kept


# --- concurrency -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_checkpoint_and_sync_threads_with_adds_and_reads(tmp_path: Path, seed: int) -> None:
    cfg = make_config(tmp_path, write_cache_max_bytes=32768, entry_log_max_bytes=32768,
                      read_cache_max_bytes=4096)
    s = BookieStorage.open(cfg)
    rng = random.Random(seed)
    stop = threading.Event()
    errors: list[BaseException] = []
    durable = [0]

    def loop(action: object) -> None:
        try:
            while not stop.is_set():
                action()  # type: ignore[operator]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def do_sync() -> None:
        durable[0] = s.journal.sync()

    threads = [threading.Thread(target=loop, args=(s.checkpoint,)),
               threading.Thread(target=loop, args=(do_sync,))]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # many more thread interleavings
    for t in threads:
        t.start()
    model: dict[int, dict[int, bytes]] = {}  # ledgers the engine knows
    seq_of: dict[tuple[int, int], int] = {}
    fenced: set[int] = set()
    deleted: set[int] = set()
    active: list[int] = []  # not deleted (fenced ones stay readable)
    next_ledger = 1
    try:
        # At least 6000 steps, and on until the checkpoint thread ran often
        # enough to interleave with them (a loaded machine runs it less).
        deadline = time.monotonic() + 60
        step = 0
        while step < 6000 or (s.stats.checkpoints <= 10 and time.monotonic() < deadline):
            step += 1
            if len(active) < 6:
                active.append(next_ledger)
                next_ledger += 1
            lid = rng.choice(active)
            op = rng.random()
            if op < 0.6:
                entries = model.get(lid, {})
                eid = len(entries)
                data = payload(lid, eid, rng.randrange(1, 300))
                if lid in fenced:
                    with pytest.raises(LedgerFencedError):
                        s.add_entry(lid, eid, data, KEY)
                    continue
                seq_of[(lid, eid)] = s.add_entry(lid, eid, data, KEY)
                model.setdefault(lid, {})[eid] = data
                if rng.random() < 0.2:
                    s.journal.write_buffered()
            elif op < 0.93:
                if lid not in model:
                    with pytest.raises(NoSuchLedgerError):
                        s.read_entry(lid, 0)
                elif not model[lid]:
                    with pytest.raises(NoSuchEntryError):
                        s.read_entry(lid, -1)
                else:
                    eid = rng.randrange(len(model[lid]))
                    assert s.read_entry(lid, eid) == model[lid][eid]
                    assert s.read_entry(lid, -1) == model[lid][len(model[lid]) - 1]
            elif op < 0.96:
                s.fence(lid, KEY)
                fenced.add(lid)
                model.setdefault(lid, {})
            elif lid in model:
                s.delete_ledger(lid)
                deleted.add(lid)
                active.remove(lid)
                with pytest.raises(NoSuchLedgerError):
                    s.read_entry(lid, 0)
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(switch_interval)
    assert not errors, errors
    assert s.stats.checkpoints > 10 and len(deleted) > 10 and len(seq_of) > 2000
    durable_seq = s.journal.sync()
    s.abandon()
    emulate_power_loss([tmp_path])
    s = BookieStorage.open(cfg)
    try:
        assert sorted(s.list_ledgers()) == sorted(set(model) - deleted)
        for lid, entries in model.items():
            if lid in deleted:
                continue
            assert s.is_fenced(lid) == (lid in fenced)
            for eid, data in entries.items():
                assert seq_of[(lid, eid)] <= durable_seq
                assert s.read_entry(lid, eid) == data
    finally:
        s.close()


# --- model-based -------------------------------------------------------------------


@dataclass
class LedgerModel:
    fenced: bool = False
    entries: dict[int, bytes] = field(default_factory=dict)


Event = tuple[str, int, int, bytes]  # (kind, ledger, entry, data)


def apply_events(state: dict[int, LedgerModel], events: list[Event]) -> None:
    for kind, lid, eid, data in events:
        if kind == "create":
            state.setdefault(lid, LedgerModel())
        elif kind == "add":
            state[lid].entries[eid] = data
        elif kind == "fence":
            state[lid].fenced = True
        elif kind == "delete":
            state.pop(lid, None)


def copy_state(state: dict[int, LedgerModel]) -> dict[int, LedgerModel]:
    return {lid: LedgerModel(m.fenced, dict(m.entries)) for lid, m in state.items()}


class StorageMachine(RuleBasedStateMachine):
    """The engine against a model: ``base`` is what any crash must bring
    back; ``events`` (with journal seqs) what was journaled since.  A kill
    keeps events up to the written seq, a power loss up to the synced seq; a
    checkpoint folds every event into ``base``."""

    root: Path
    instances = 0

    def __init__(self) -> None:
        super().__init__()
        StorageMachine.instances += 1
        self.dir = Path(self.root) / f"machine-{StorageMachine.instances}"
        self.config = make_config(self.dir, journal_file_size_bytes=4096,
                                  entry_log_max_bytes=8192, read_cache_max_bytes=2048)
        self.s = BookieStorage.open(self.config)
        self.base: dict[int, LedgerModel] = {}
        self.events: list[tuple[int, Event]] = []
        self.written = 0
        self.synced = 0
        self.retired: set[int] = set()  # deleted once: never written again

    def live(self) -> dict[int, LedgerModel]:
        state = copy_state(self.base)
        apply_events(state, [e for _seq, e in self.events])
        return state

    def journaled(self, *events: Event) -> None:
        seq = self.s.journal.append_seq
        first = seq - len(events) + 1
        self.events.extend((first + i, e) for i, e in enumerate(events))

    @rule(lid=st.integers(1, 4), eid=st.integers(0, 6), size=st.integers(1, 700),
          recovery=st.booleans())
    def add(self, lid: int, eid: int, size: int, recovery: bool) -> None:
        if lid in self.retired:
            return
        state = self.live()
        data = payload(lid, eid, size)
        if lid in state and state[lid].fenced and not recovery:
            with pytest.raises(LedgerFencedError):
                self.s.add_entry(lid, eid, data, KEY, recovery=recovery)
            return
        self.s.add_entry(lid, eid, data, KEY, recovery=recovery)
        if lid in state:
            self.journaled(("add", lid, eid, data))
        else:
            self.journaled(("create", lid, 0, b""), ("add", lid, eid, data))

    @rule(lid=st.integers(1, 4))
    def fence(self, lid: int) -> None:
        if lid in self.retired:
            return
        state = self.live()
        before = self.s.journal.append_seq
        self.s.fence(lid, KEY)
        if lid not in state:
            self.journaled(("create", lid, 0, b""), ("fence", lid, 0, b""))
        elif not state[lid].fenced:
            self.journaled(("fence", lid, 0, b""))
        else:
            assert self.s.journal.append_seq == before

    @rule(lid=st.integers(1, 4))
    def delete(self, lid: int) -> None:
        if lid in self.live():
            self.s.delete_ledger(lid)
            self.journaled(("delete", lid, 0, b""))
        self.retired.add(lid)

    @rule()
    def write_buffered(self) -> None:
        self.written = self.s.journal.write_buffered()

    @rule()
    def sync(self) -> None:
        self.synced = self.written = self.s.journal.sync()

    @rule()
    def checkpoint(self) -> None:
        self.s.checkpoint()
        self.base = self.live()
        self.events = []

    @rule(power_loss=st.booleans())
    def crash(self, power_loss: bool) -> None:
        keep = self.synced if power_loss else self.written
        self.s.abandon()
        if power_loss:
            emulate_power_loss([self.dir])
        apply_events(self.base, [e for seq, e in self.events if seq <= keep])
        self.events = []
        self.written = self.synced = 0
        self.s = BookieStorage.open(self.config)

    @rule()
    def clean_restart(self) -> None:
        self.s.close()
        self.base = self.live()
        self.events = []
        self.written = self.synced = 0
        self.s = BookieStorage.open(self.config)

    @rule()
    def gc(self) -> None:
        self.s.gc_entry_logs()
        if any(e[0] == "delete" for _seq, e in self.events):
            # gc first checkpoints pending deletions (and so everything else)
            self.base = self.live()
            self.events = []

    def _fold_if_deleting(self) -> None:
        if any(e[0] == "delete" for _seq, e in self.events):
            # compaction, like gc, first checkpoints pending deletions
            self.base = self.live()
            self.events = []

    @rule(threshold=st.sampled_from([0.2, 0.8, 1.0]))
    def compact(self, threshold: float) -> None:
        self.s.compact_entry_logs(threshold)
        self._fold_if_deleting()

    @rule(step=st.sampled_from(["copied", "committed"]), power_loss=st.booleans())
    def crash_in_compaction(self, step: str, power_loss: bool) -> None:
        """kill -9 (and maybe power loss) at a step of a compaction: every
        entry still reads back, from the old copy or the new one."""
        class Crash(Exception):
            pass

        def crash_at(reached: str) -> None:
            if reached == step:
                raise Crash(step)

        self.s.ledger_storage.compactor.on_step = crash_at
        with contextlib.suppress(Crash):
            self.s.compact_entry_logs(1.0)
        self._fold_if_deleting()
        self.crash(power_loss)

    @invariant()
    def reads_match_the_model(self) -> None:
        state = self.live()
        assert self.s.list_ledgers() == sorted(state)
        for lid in range(1, 5):
            model = state.get(lid)
            if model is None:
                with pytest.raises(NoSuchLedgerError):
                    self.s.read_entry(lid, 0)
                continue
            assert self.s.is_fenced(lid) == model.fenced
            for eid in range(7):
                if eid in model.entries:
                    assert self.s.read_entry(lid, eid) == model.entries[eid], (lid, eid)
                else:
                    with pytest.raises(NoSuchEntryError):
                        self.s.read_entry(lid, eid)
            if model.entries:
                assert self.s.read_entry(lid, -1) == model.entries[max(model.entries)]

    def teardown(self) -> None:
        if not self.s.closed:
            self.s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_engine_matches_model(tmp_path: Path) -> None:
    StorageMachine.root = tmp_path
    machine = StorageMachine.TestCase
    machine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])
    machine().runTest()
