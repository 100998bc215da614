"""BP-46 on the client side: every quorum rule treats a limbo bookie's
UNKNOWN as neither yes nor no.

A limbo bookie (put there through the storage API while stopped, as in
test_bookie_limbo) answers UNKNOWN where an empty bookie answers
NO_SUCH_ENTRY/NO_SUCH_LEDGER.  Each test first shows the client's answer
against empty bookies (a definite no) and then against limbo ones, so a
client that took UNKNOWN for a no would fail it.  The ledgers' writers are
gone; a ledger in limbo on a bookie that never stored it stands for the data
a journal-less bookie may have lost, one in limbo on a bookie that holds
entries 0..4 for a bookie that cannot say whether there were more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from quire.client import Client
from quire.errors import (
    BookieUnavailableError,
    EntryNotAvailableError,
    LedgerRecoveryError,
    NoSuchEntryError,
)
from quire.types import NO_ENTRY, LedgerState
from tests.support.bookies import put_in_limbo, wait_until_stored
from tests.support.cluster import Cluster

Connect = Callable[..., Awaitable[Client]]
PW = b"pw"


def limbo(cluster: Cluster, indexes: list[int], ledger_ids: list[int]) -> None:
    """Stop the bookies, put the ledgers in limbo on them, start them again."""
    for index in indexes:
        cluster.stop(index)
        put_in_limbo(cluster.bookies[index], ledger_ids)
    cluster.start()


async def test_single_and_batch_reads_do_not_take_one_unknown_for_a_no(
        cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await client.create_ledger(3, 3, 2, password=PW)  # its entries never stored
    reader = await client.open_ledger(ledger.ledger_id, password=PW, recovery=False)
    # every replica says no: a definite no, for a single and a batch read
    with pytest.raises(NoSuchEntryError):
        await reader.read_unconfirmed(0, 0)
    with pytest.raises(NoSuchEntryError):
        await reader.read_unconfirmed(0, 3)
    limbo(cluster, [0], [ledger.ledger_id])
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=PW,
                                                       recovery=False)
    # two noes and one UNKNOWN: not a no
    with pytest.raises(EntryNotAvailableError) as single:
        await reader.read_unconfirmed(0, 0)
    assert not isinstance(single.value, NoSuchEntryError)
    with pytest.raises(EntryNotAvailableError) as batch:
        await reader.read_unconfirmed(0, 3)
    assert not isinstance(batch.value, NoSuchEntryError)


async def test_lac_read_does_not_take_unknown_for_no_entries(
        cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await client.create_ledger(3, 3, 2, password=PW)
    reader = await client.open_ledger(ledger.ledger_id, password=PW, recovery=False)
    assert await reader.read_last_add_confirmed() == NO_ENTRY  # empty bookies: nothing yet
    limbo(cluster, [0, 1, 2], [ledger.ledger_id])
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=PW,
                                                       recovery=False)
    with pytest.raises(BookieUnavailableError):  # not -1: nobody knows
        await reader.read_last_add_confirmed()


async def test_recovery_does_not_close_a_ledger_short_on_unknown_answers(
        cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster)
    empty = await client.create_ledger(3, 3, 2, password=PW)
    lost = await client.create_ledger(3, 3, 2, password=PW)
    # empty bookies: recovery fences them and closes the ledger empty
    recovered = await (await connect(cluster)).open_ledger(empty.ledger_id, password=PW,
                                                          recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == NO_ENTRY
    # limbo bookies (that may have lost acknowledged entries) must not end it at -1
    limbo(cluster, [0, 1, 2], [lost.ledger_id])
    recoverer = await connect(cluster)
    with pytest.raises(LedgerRecoveryError):
        await recoverer.open_ledger(lost.ledger_id, password=PW, recovery=True)
    stored = (await recoverer.metadata_store.read_ledger(lost.ledger_id)).value
    assert stored.state is not LedgerState.CLOSED


async def written_and_abandoned(cluster: Cluster, client: Client, count: int) -> int:
    """A ledger E3 W3 A2 with entries 0..count-1 on all three bookies, left
    OPEN (its writer is gone); its id."""
    ledger = await client.create_ledger(3, 3, 2, password=PW)
    for i in range(count):
        assert await ledger.append(b"entry-%d" % i) == i
    for bookie in cluster.bookies:
        await wait_until_stored(bookie.address, ledger.ledger_id, count - 1)
    return ledger.ledger_id


async def test_recovery_reads_stop_at_unknown_instead_of_closing_short(
        cluster: Cluster, connect: Connect) -> None:
    writer = await connect(cluster)
    plain = await written_and_abandoned(cluster, writer, 5)
    held = await written_and_abandoned(cluster, writer, 5)
    # bookies that say "no entry 5": recovery closes at the last entry written
    recovered = await (await connect(cluster)).open_ledger(plain, password=PW, recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == 4
    # limbo bookies hold 0..4 (fencing succeeds) but cannot say whether an
    # entry 5 existed: recovery must not decide the end
    limbo(cluster, [0, 1, 2], [held])
    recoverer = await connect(cluster)
    with pytest.raises(LedgerRecoveryError):
        await recoverer.open_ledger(held, password=PW, recovery=True)
    stored = (await recoverer.metadata_store.read_ledger(held)).value
    assert stored.state is not LedgerState.CLOSED


async def test_recovery_closes_when_enough_definite_noes_outweigh_one_unknown(
        cluster: Cluster, connect: Connect) -> None:
    writer = await connect(cluster)
    held = await written_and_abandoned(cluster, writer, 5)
    limbo(cluster, [0], [held])
    # W - A + 1 = 2 bookies say "no entry 5": it cannot have been acknowledged,
    # whatever the limbo bookie's UNKNOWN; nothing acknowledged is cut off
    recovered = await (await connect(cluster)).open_ledger(held, password=PW, recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == 4
    assert [e.data for e in await recovered.read(0, 4)] == [b"entry-%d" % i for i in range(5)]
