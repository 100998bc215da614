"""Behaviour of the embedded drivers only (memory://, sqlite://): a store
that cannot renew its lease."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quire.errors import MetadataError
from quire.metadata import ElectionView, Leadership, LeaseState
from tests.support.metadata import LEASE_MS, next_matching, target_for


@pytest.mark.parametrize("driver", ["memory", "sqlite"])
async def test_a_leader_that_cannot_renew_steps_down_before_another_leads(
        driver: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = target_for(driver, tmp_path, None)
    cut_off, other = await target.open(), await target.open()
    try:
        first = cut_off.elect("auditor", "a")
        await first.wait_leader()
        second = other.elect("auditor", "b")
        loop = asyncio.get_running_loop()
        changes: list[tuple[float, str, ElectionView]] = []
        first.watch(lambda view: changes.append((loop.time(), "a", view)))
        second.watch(lambda view: changes.append((loop.time(), "b", view)))

        async def unreachable(*_args: object) -> None:
            raise MetadataError("injected: the store cannot be reached")

        # Every transaction of this store fails from now on (the driver's seam).
        monkeypatch.setattr(cut_off, "_write", unreachable)
        monkeypatch.setattr(cut_off, "_read", unreachable)
        await asyncio.wait_for(second.wait_leader(), LEASE_MS / 1000 + 10)
        doubted = next(t for t, who, v in changes if who == "a"
                       and v.state is Leadership.UNCERTAIN)
        taken_over = next(t for t, who, v in changes if who == "b"
                          and v.state is Leadership.LEADER)
        assert doubted < taken_over
        assert cut_off.lease is LeaseState.UNCERTAIN and not first.is_leader

        # Reachable again: its next renewal finds the lease expired, and it
        # campaigns again, as a follower.
        views: asyncio.Queue[ElectionView] = asyncio.Queue()
        first.watch(views.put_nowait)
        leases: asyncio.Queue[LeaseState] = asyncio.Queue()
        cut_off.watch_lease(leases.put_nowait)
        monkeypatch.undo()
        await next_matching(leases, lambda state: state is LeaseState.EXPIRED)
        await next_matching(views, lambda v: v == ElectionView(Leadership.FOLLOWER, "b"))
        assert second.is_leader
        await second.resign()
        await first.wait_leader()  # a new lease
        assert cut_off.lease is LeaseState.LIVE
    finally:
        await cut_off.close()
        await other.close()
