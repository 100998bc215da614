"""BP-46 on the client side: every quorum rule treats a limbo bookie's
UNKNOWN as neither yes nor no.

A limbo bookie (put there through the storage API while stopped, as in
test_bookie_limbo) answers UNKNOWN where an empty bookie answers
NO_SUCH_ENTRY/NO_SUCH_LEDGER.  Each test first shows the client's answer
against empty bookies (a definite no) and then against limbo ones, so a
client that took UNKNOWN for a no would fail it.  The ledgers' writers are
"gone" with nothing stored: the data a journal-less bookie may have lost.
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
from tests.integration.test_bookie_limbo import put_in_limbo
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
