"""The one add pipeline and the durability chosen once per ledger, against a
real bookie node (server and storage engine) with one connection on a fake
transport."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quire.bookie.metrics import BookieMetrics
from quire.bookie.status import BookieStatus
from quire.errors import StatusCode
from quire.protocol import (
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    AddRequest,
    DigestManager,
)
from quire.types import BookieState, DigestType
from tests.support.bookie_node import KEY, AddPeer, count_add_runs, node_at, node_config

VD, RECOVERY = FLAG_VOLATILE_DURABILITY, FLAG_RECOVERY_ADD


async def test_each_ledgers_durability_is_chosen_once_at_its_first_add(tmp_path: Path) -> None:
    async with node_at(node_config(tmp_path)) as node:
        server, policy = node.server, node.server.durability
        peer = AddPeer(server)
        assert policy.of_add(9, VD) is policy.volatile  # a new ledger asking for VD
        assert policy.of_add(9, 0) is policy.persistent
        assert policy.of_add(9, VD | RECOVERY) is policy.persistent  # recovery never chooses
        peer.send((1, 9, 0, VD), (2, 7, 0, 0))
        assert [a[0] for a in await peer.durable()] == [1, 2]
        assert policy.of_stored(9) is policy.volatile and 9 in server.cursors
        assert policy.of_stored(7) is policy.persistent
        # chosen: later adds do not change it, whatever their flags
        assert policy.of_add(7, VD) is policy.persistent
        assert policy.of_add(9, 0) is policy.volatile
        assert policy.of_add(9, RECOVERY) is policy.volatile
        peer.send((3, 7, 1, VD))  # a VD add to a PD ledger waits for its fsync
        assert peer.answers() == []
        assert await peer.durable() == [(3, StatusCode.OK, 7, 1, -1)]
        assert 7 not in server.cursors
    async with node_at(node_config(tmp_path)) as node:  # the VD choice survives a restart
        policy = node.server.durability
        assert policy.of_stored(9) is policy.volatile
        assert policy.of_stored(7) is policy.persistent


async def test_a_new_ledgers_first_add_chooses_even_within_one_run(tmp_path: Path) -> None:
    """One read: a plain add to new ledger 8, then a VD add to it, then a VD
    add to new ledger 9 and a plain add to it: 8 is PD (both answered after
    the fsync), 9 is VD (its plain add still waits for the fsync)."""
    async with node_at(node_config(tmp_path)) as node:
        server, policy = node.server, node.server.durability
        peer = AddPeer(server)
        peer.send((1, 8, 0, 0), (2, 8, 1, VD), (3, 9, 0, VD), (4, 9, 1, 0))
        answers = await peer.durable()
        assert [a[0] for a in answers] == [3, 1, 2, 4]  # only 3 at the end of the read
        assert policy.of_stored(8) is policy.persistent
        assert policy.of_stored(9) is policy.volatile


async def test_a_single_add_is_a_run_of_one(tmp_path: Path) -> None:
    async with node_at(node_config(tmp_path)) as node:
        peer = AddPeer(node.server)
        entry = DigestManager(5, DigestType.CRC32C, b"pw").encode(0, -1, 1, b"one")
        node.server.take_request(peer.conn, AddRequest(11, KEY, entry, 0))
        assert peer.answers() == []  # PD: not before the fsync
        assert await peer.durable() == [(11, StatusCode.OK, 5, 0, -1)]
        assert node.server.storage.read_entry(5, 0) == entry


async def test_a_mixed_run_answers_each_add_once_in_arrival_order(tmp_path: Path) -> None:
    """One read of PD adds, VD adds of a new ledger and a recovery add to
    that VD ledger: VD adds are answered at the end of the read, the others
    after their fsync, each kind in arrival order; the VD ledger's cursor
    learned the recovery add too."""
    async with node_at(node_config(tmp_path)) as node:
        server = node.server
        peer = AddPeer(server)
        peer.send((1, 7, 0, 0), (2, 9, 0, VD), (3, 7, 1, 0), (4, 9, 1, VD), (5, 7, 2, 0),
                  (6, 9, 2, RECOVERY))
        answers = await peer.durable()
        assert [a[0] for a in answers] == [2, 4, 1, 3, 5, 6]
        assert all(a[1] is StatusCode.OK for a in answers)
        assert [(a[2], a[3]) for a in answers] == [(9, 0), (9, 1), (7, 0), (7, 1), (7, 2), (9, 2)]
        assert server.cursors.by_ledger[9].candidate == 2  # 0-2 fsynced, recovery add included
        assert server.storage.read_entry(9, 2)[:16] == (9).to_bytes(8, "big") + (2).to_bytes(
            8, "big")


async def test_runs_of_one_ledger_stay_columns_whatever_their_durability(
        tmp_path: Path) -> None:
    """Per-ledger durability: a PD ledger's run takes BookieStorage.add_run
    on a bookie that holds VD ledgers, and so does a VD ledger's run of VD
    adds, answered at the end of the read."""
    async with node_at(node_config(tmp_path)) as node:
        server = node.server
        peer = AddPeer(server)
        peer.send((1, 9, 0, VD), (2, 7, 0, 0))  # new ledgers: decided add by add
        await peer.durable()
        taken = count_add_runs(server)
        peer.send((3, 7, 1, 0), (4, 7, 2, 0))
        assert peer.answers() == []
        assert [a[:4] for a in await peer.durable()] == [(3, StatusCode.OK, 7, 1),
                                                         (4, StatusCode.OK, 7, 2)]
        peer.send((5, 9, 1, VD), (6, 9, 2, VD))
        await asyncio.sleep(0)  # the hub's flush: no fsync needed
        assert [a[:4] for a in peer.answers()] == [(5, StatusCode.OK, 9, 1),
                                                   (6, StatusCode.OK, 9, 2)]
        assert len(taken) == 2 and None not in [result for result, _ in taken]
        assert server.adds.lacs == {7: 1, 9: 1}


async def test_a_read_only_bookie_refuses_adds_but_takes_recovery_adds(tmp_path: Path) -> None:
    async with node_at(node_config(tmp_path)) as node:
        server = node.server
        peer = AddPeer(server)
        server.status.read_only = True
        peer.send((1, 7, 0, 0), (2, 7, 1, RECOVERY), (3, 7, 2, VD))
        answers = await peer.durable()
        assert sorted(a[:2] for a in answers) == [
            (1, StatusCode.READ_ONLY), (2, StatusCode.OK), (3, StatusCode.READ_ONLY)]


def test_the_read_only_state_is_published_on_each_change_and_a_failed_journal_stays() -> None:
    published: list[BookieState] = []

    class Publisher:
        def publish(self, state: BookieState) -> None:
            published.append(state)

    status = BookieStatus(BookieMetrics(), Publisher())
    status.disk_used(0.5, 0.95, 0.90)
    status.disk_used(0.97, 0.95, 0.90)
    status.disk_used(0.92, 0.95, 0.90)  # between the marks: no change
    status.disk_used(0.80, 0.95, 0.90)
    assert published == [BookieState.READ_ONLY, BookieState.WRITABLE]
    status.journal_failed(OSError("disk gone"))
    status.disk_used(0.10, 0.95, 0.90)  # the journal's durability stays unknown
    assert status.read_only and published[-1] is BookieState.READ_ONLY
