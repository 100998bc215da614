"""GroupCommitter over a fake journal whose fsync the test holds and releases."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from quire.bookie.group_commit import GroupCommitter
from quire.errors import StorageError


class HeldJournal:
    """``sync()`` blocks until the test releases it; records what it covered."""

    def __init__(self) -> None:
        self.appended = 0
        self.syncs: list[int] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.fail = False

    def append(self) -> int:
        self.appended += 1
        return self.appended

    def sync(self) -> int:
        covered = self.appended  # everything appended before the fsync starts
        self.entered.release()
        self.release.acquire()
        if self.fail:
            raise StorageError("fsync failed")
        self.syncs.append(covered)
        return covered


async def entered(journal: HeldJournal) -> None:
    assert await asyncio.to_thread(journal.entered.acquire, True, 10)


async def test_adds_during_an_fsync_share_the_next_one_in_order() -> None:
    journal = HeldJournal()
    committer = GroupCommitter(journal)
    done: list[int] = []
    try:
        committer.after_durable_with(journal.append(), lambda arg, err: done.append(arg), 1)
        await entered(journal)  # the first fsync runs, covering seq 1
        for n in range(2, 6):  # these arrive while it runs
            committer.after_durable_with(journal.append(), lambda arg, err: done.append(arg), n)
        journal.release.release()
        await entered(journal)  # one more fsync, started by the thread itself
        journal.release.release()
        await committer.wait_durable(5)
        assert done == [1, 2, 3, 4, 5]
        assert journal.syncs == [1, 5]  # two fsyncs for five adds
        assert committer.durable_seq == 5
    finally:
        committer.close()


async def test_when_durable_never_causes_an_fsync() -> None:
    journal = HeldJournal()
    committer = GroupCommitter(journal)
    lazy: list[str] = []
    try:
        committer.when_durable(journal.append(), lambda: lazy.append("cursor"))
        await asyncio.sleep(0)
        assert not journal.entered.acquire(timeout=0.2)  # nobody asked for an fsync
        committer.mark_durable(1)  # a checkpoint made it durable
        assert lazy == ["cursor"]
        assert journal.syncs == []
    finally:
        committer.close()


async def test_a_failed_fsync_fails_the_waiters_and_later_ones() -> None:
    journal = HeldJournal()
    journal.fail = True
    committer = GroupCommitter(journal)
    try:
        waiting = asyncio.ensure_future(committer.wait_durable(journal.append()))
        await entered(journal)
        journal.release.release()
        with pytest.raises(StorageError):
            await waiting
        later = asyncio.ensure_future(committer.wait_durable(journal.append()))
        await entered(journal)  # a later waiter asks again and fails the same way
        journal.release.release()
        with pytest.raises(StorageError):
            await later
        assert committer.durable_seq == -1
    finally:
        committer.close()


class TimedJournal:
    """``sync()`` takes ``seconds`` (a slow disk is the behaviour under test,
    not a synchronisation) and records the thread it ran on."""

    def __init__(self) -> None:
        self.appended = 0
        self.seconds = 0.0
        self.fail = False
        self.threads: list[int] = []

    def append(self) -> int:
        self.appended += 1
        return self.appended

    def sync(self) -> int:
        covered = self.appended
        self.threads.append(threading.get_ident())
        if self.seconds:
            time.sleep(self.seconds)
        if self.fail:
            raise StorageError("fsync failed")
        return covered


async def test_fast_syncs_run_on_the_loop_one_per_iteration() -> None:
    journal = TimedJournal()
    committer = GroupCommitter(journal, loop_sync_max_ms=2.0)
    done: list[int] = []
    try:
        for n in range(1, 4):  # one loop iteration: one sync covers all three
            committer.after_durable_with(journal.append(), lambda arg, err: done.append(arg), n)
        assert done == []  # never synced inside the caller
        await committer.wait_durable(3)
        assert done == [1, 2, 3]
        assert journal.threads == [threading.get_ident()]  # the loop's own thread
        assert committer.loop_sync_count == committer.fsync_count == 1
    finally:
        committer.close()


async def test_slow_syncs_move_to_the_thread_and_fast_ones_come_back() -> None:
    journal = TimedJournal()
    committer = GroupCommitter(journal, loop_sync_max_ms=2.0)
    loop_thread = threading.get_ident()
    try:
        journal.seconds = 0.010  # 5x the limit: the average crosses it within a few syncs
        for _ in range(30):
            await committer.wait_durable(journal.append())
        first_on_thread = next(i for i, t in enumerate(journal.threads) if t != loop_thread)
        assert 0 < first_on_thread < 30  # started on the loop, then moved
        assert set(journal.threads[first_on_thread:]) == {journal.threads[first_on_thread]}
        assert not committer.syncs_on_loop
        journal.seconds = 0.0  # the disk recovers: the average decays below the limit
        for _ in range(200):
            await committer.wait_durable(journal.append())
        assert journal.threads[-1] == loop_thread
        assert committer.syncs_on_loop
    finally:
        committer.close()


async def test_a_failed_sync_on_the_loop_fails_the_waiters_and_later_ones() -> None:
    journal = TimedJournal()
    journal.fail = True
    committer = GroupCommitter(journal, loop_sync_max_ms=2.0)
    try:
        for _ in range(2):
            with pytest.raises(StorageError):
                await committer.wait_durable(journal.append())
        assert journal.threads == [threading.get_ident()] * 2
        assert committer.durable_seq == -1
    finally:
        committer.close()


@pytest.mark.parametrize(("loop_sync_max_ms", "max_group_wait_ms"), [(0.0, 0.0), (1e6, 1.0)],
                         ids=["loop-sync-off", "group-wait"])
async def test_syncs_stay_on_the_thread(loop_sync_max_ms: float,
                                        max_group_wait_ms: float) -> None:
    journal = TimedJournal()
    committer = GroupCommitter(journal, loop_sync_max_ms=loop_sync_max_ms,
                               max_group_wait_ms=max_group_wait_ms)
    try:
        await committer.wait_durable(journal.append())
        assert journal.threads and threading.get_ident() not in journal.threads
        assert committer.loop_sync_count == 0
    finally:
        committer.close()
