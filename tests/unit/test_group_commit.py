"""GroupCommitter over a fake journal whose fsync the test holds and releases."""

from __future__ import annotations

import asyncio
import threading

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
