"""BP-46's journal bypass inside one bookie node (server and storage engine,
one connection on a fake transport): the strategy the policy chooses, what
the bypass stores and when it answers, and that SYNC reports only entries a
checkpoint made durable (with a seeded bug that reports the write cache,
which a power loss then shows)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

import pytest

from quire.bookie.config import BookieConfig, warn_if_unprotected
from quire.bookie.durability import CheckpointedDurability
from quire.errors import StatusCode
from quire.node import BookieNode
from quire.protocol import FLAG_RECOVERY_ADD, FLAG_VOLATILE_DURABILITY
from quire.testing.power_loss import emulate_power_loss
from tests.support.bookie_node import AddPeer, count_add_runs, node_at, node_config, stored

VD, RECOVERY = FLAG_VOLATILE_DURABILITY, FLAG_RECOVERY_ADD


def _config(tmp_path: Path, journal_write_data: bool) -> BookieConfig:
    return node_config(tmp_path, data_integrity_checking=True, flush_interval_ms=600_000,
                       storage={"journal_write_data": journal_write_data,
                                "power_loss_tracking": True})


async def test_the_journal_off_policy_chooses_the_bypass_for_every_ledger(
        tmp_path: Path) -> None:
    async with node_at(_config(tmp_path, journal_write_data=False)) as node:
        policy = node.server.durability
        pd, vd = policy.of_add(7, 0), policy.of_add(9, VD)
        assert isinstance(pd, CheckpointedDurability) and not pd.volatile
        assert isinstance(vd, CheckpointedDurability) and vd.volatile
        assert policy.of_add(9, VD | RECOVERY) is pd  # a recovery add never chooses VD
        peer = AddPeer(node.server)
        peer.send((1, 9, 0, VD), (2, 7, 0, 0))
        assert [a[0] for a in await peer.flushed()] == [1, 2]
        assert policy.of_stored(9) is vd and policy.of_stored(7) is pd
        assert policy.of_add(9, 0) is vd and policy.of_add(7, VD) is pd
    async with node_at(_config(tmp_path / "on", journal_write_data=True)) as node:
        policy = node.server.durability
        assert not any(isinstance(policy.of_add(lid, flags), CheckpointedDurability)
                       for lid in (1, 2) for flags in (0, VD, RECOVERY))


@pytest.mark.parametrize("flags", [0, VD], ids=["pd", "vd"])
async def test_bypass_adds_are_answered_at_once_with_no_journal_record(
        tmp_path: Path, flags: int) -> None:
    """The ledger's creation is journaled, its entries are not; a run stays
    a column-wise ``add_run``; no fsync is waited for."""
    async with node_at(_config(tmp_path, journal_write_data=False)) as node:
        server = node.server
        journal, fsyncs = server.storage.journal, server.committer.fsync_count
        peer = AddPeer(server)
        before = journal.append_seq
        peer.send((1, 5, 0, flags))
        assert [a[:4] for a in await peer.flushed()] == [(1, StatusCode.OK, 5, 0)]
        assert journal.append_seq == before + 1 + (1 if flags else 0)  # key (+ VD cursor)
        runs = count_add_runs(server)
        before = journal.append_seq
        peer.send(*((i + 2, 5, i, flags) for i in range(1, 50)))
        answers = await peer.flushed()
        assert [a[3] for a in answers] == list(range(1, 50))
        assert {a[4] for a in answers} == {-1}  # nothing synced: no checkpoint yet
        assert journal.append_seq == before
        assert runs == [(server.storage.write_epoch, {"journal": False})]
        assert server.committer.fsync_count == fsyncs
        assert server.storage.read_entry(5, 49) == stored(5, 49)


async def test_recovery_adds_still_wait_for_their_journal_fsync(tmp_path: Path) -> None:
    async with node_at(_config(tmp_path, journal_write_data=False)) as node:
        server = node.server
        peer = AddPeer(server)
        peer.send((1, 5, 0, 0))
        await peer.flushed()
        before, fsyncs = server.storage.journal.append_seq, server.committer.fsync_count
        durable_when_answered = []
        send_many = peer.conn.send_many

        def answer(frames: list[bytes], request_bytes: int = 0) -> None:
            durable_when_answered.append(server.committer.durable_seq)
            send_many(frames, request_bytes)

        peer.conn.send_many = answer  # type: ignore[method-assign]
        peer.send((2, 5, 1, RECOVERY), (3, 5, 2, RECOVERY))
        assert server.storage.journal.append_seq == before + 2  # journaled
        await server.committer.wait_durable(server.storage.journal.append_seq)
        assert [a[:4] for a in await peer.flushed()] == [(2, StatusCode.OK, 5, 1),
                                                         (3, StatusCode.OK, 5, 2)]
        assert durable_when_answered == [before + 2]  # answered once fsynced
        assert server.committer.fsync_count > fsyncs


async def test_vd_cursor_moves_only_with_a_checkpoint(tmp_path: Path) -> None:
    """Neither a piggy-backed nor an explicit LAC, nor a journal fsync,
    counts a write-cache entry as synced; a checkpoint does."""
    async with node_at(_config(tmp_path, journal_write_data=False)) as node:
        server = node.server
        peer = AddPeer(server)
        peer.send(*((i + 1, 9, i, VD) for i in range(10)))  # each piggy-backs LAC i - 1
        await peer.flushed()
        server.cursors.confirmed(9, 9)  # an explicit LAC
        await server.committer.wait_durable(server.storage.journal.append_seq)
        cursor = server.cursors.by_ledger[9]
        assert cursor.candidate == -1 and cursor.reported == -1
        await server.services.checkpoint()
        assert cursor.candidate == 9


async def sync_then_power_loss(tmp_path: Path, ledger_flags: int) -> tuple[int, list[int]]:
    """Journal off: 20 adds, SYNC's LastAddSynced, then a power loss (the
    engine abandoned as by ``kill -9``, unsynced bytes dropped) and a
    restart; returns the synced id and the entry ids still readable."""
    root = tmp_path / "node"
    node = BookieNode(_config(root, journal_write_data=False))
    await node.start()
    server = node.server
    peer = AddPeer(server)
    peer.send(*((i + 1, 3, i, ledger_flags) for i in range(20)))
    await peer.flushed()
    synced = await server.cursors.last_add_synced(3, server.durability.of_stored(3).settle)
    # The journal's own records (the ledger's creation) made durable, so that
    # the node stops without syncing its abandoned journal: the entries
    # themselves are in no journal.
    await server.committer.wait_durable(server.storage.journal.append_seq)
    server.storage.abandon()
    await asyncio.wait_for(node.stop(), 10)
    emulate_power_loss([root / "data"])
    async with node_at(_config(root, journal_write_data=False)) as node:
        readable = []
        for i in range(20):
            with contextlib.suppress(Exception):
                if node.server.storage.read_entry(3, i) == stored(3, i):
                    readable.append(i)
    return synced, readable


@pytest.mark.parametrize("flags", [0, VD], ids=["pd", "vd"])
async def test_power_loss_right_after_sync_loses_nothing_synced(tmp_path: Path,
                                                                flags: int) -> None:
    synced, readable = await sync_then_power_loss(tmp_path, flags)
    assert synced == 19
    assert readable == list(range(20))


async def test_a_sync_that_reports_the_write_cache_loses_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug: SYNC without waiting for the checkpoint reports entries
    that are in the write cache only, and the power loss takes them."""

    async def no_checkpoint(self: object, epoch: int) -> None:
        return None

    monkeypatch.setattr("quire.bookie.services.BackgroundServices.covering", no_checkpoint)
    synced, readable = await sync_then_power_loss(tmp_path, 0)
    assert synced == 19
    assert readable != list(range(synced + 1))


def test_a_journal_off_bookie_warns_and_says_whether_it_is_unsafe(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = _config(tmp_path, journal_write_data=True)
    caplog.set_level(logging.WARNING, logger="quire.bookie")
    for journal, checking, unsafe in [(True, False, False), (True, True, False),
                                      (False, True, False), (False, False, True)]:
        caplog.clear()
        config = dataclasses.replace(
            base, data_integrity_checking=checking,
            storage=dataclasses.replace(base.storage, journal_write_data=journal))
        assert warn_if_unprotected(config) is unsafe
        assert ("UNSAFE" in caplog.text) is unsafe
