"""The two data-loss scenarios of the BP-46 spec
(``../shared/spec/bp-46-running-without-journal.md``) on three real,
journal-less bookie processes: each is run with the protection off
(``data_integrity_checking = false``), where it must lose an acknowledged
entry as the spec says, and on, where nothing acknowledged is lost.

Bookies are named as in the spec, B1 B2 B3 in the ledger's ensemble order.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from quire.client import Client, ClientConfig
from quire.errors import LedgerRecoveryError, StatusCode
from quire.types import NO_ENTRY, LedgerState
from tests.support.bookies import BookieProcess, wait_until_stored
from tests.support.bp46 import (
    PASSWORD,
    add_everywhere,
    add_to,
    fence_on,
    journal_less_cluster,
    read_from,
    recover_until_closed,
    stored_entry,
)
from tests.support.cluster import Cluster
from tests.support.repair import wait_for_repair

PROTECTION = pytest.mark.parametrize("protected", [False, True],
                                     ids=["protection-off", "protection-on"])


@pytest.fixture
async def bp46_cluster(request: pytest.FixtureRequest,
                       tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = journal_less_cluster(tmp_path / "cluster",
                                   protected=request.node.callspec.params["protected"])
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def in_ensemble_order(cluster: Cluster, ensemble: tuple[str, ...]) -> list[BookieProcess]:
    return [cluster.bookies[cluster.index_of(bookie_id)] for bookie_id in ensemble]


async def recovered_by_c2_with_b3_fence_lost(cluster: Cluster, c1: Client, c2: Client,
                                             ) -> tuple[int, int, list[BookieProcess]]:
    """Steps 1-9 of scenario 1: C1 writes E1 to all three bookies; C2's
    fence reaches B1 and B2 only (B3's is lost), B1 and B2 have nothing
    after E1, and C2 commits the end of the ledger at E1.  Returns (ledger
    id, E1's id, [B1, B2, B3])."""
    ledger = await c1.create_ledger(3, 3, 2, password=PASSWORD)
    b1, b2, b3 = in_ensemble_order(cluster, ledger.ensemble)
    e1 = await ledger.append(b"E1")
    for bookie in (b1, b2, b3):
        await wait_until_stored(bookie.address, ledger.ledger_id, e1)
    # the fencing reads (of the last entry) reach B1 and B2: E - A + 1 = 2 of 3
    assert await fence_on(b1, ledger.ledger_id) == StatusCode.OK
    assert await fence_on(b2, ledger.ledger_id) == StatusCode.OK
    # no E2 on B1 and B2 (W - A + 1 = 2 definite noes): E1 is the last entry
    for bookie in (b1, b2):
        assert (await read_from(bookie, ledger.ledger_id, e1 + 1))[0] == \
            StatusCode.NO_SUCH_ENTRY
    store = c2.metadata_store
    versioned = await store.read_ledger(ledger.ledger_id)
    await store.write_ledger(ledger.ledger_id, versioned.value.with_(
        state=LedgerState.CLOSED, last_entry_id=e1, length=2), versioned.version)
    closed = await c2.open_ledger(ledger.ledger_id, password=PASSWORD, recovery=True)
    assert closed.is_closed and closed.last_add_confirmed == e1
    return ledger.ledger_id, e1, [b1, b2, b3]


@PROTECTION
async def test_scenario_1_crash_keeps_the_fence(bp46_cluster: Cluster, protected: bool) -> None:
    """Scenario 1 as the spec tells it: B2 crashes and reboots with every
    unflushed operation lost, then C1 (waking up) writes E2.  Quire journals
    and fsyncs fences even with ``journal_write_data = false``, so B2 keeps
    its fence through the power loss and E2 is refused with or without the
    protection: a crash alone cannot lose a fence here (the emptied-disk
    test below is how B2 does lose it)."""
    cluster = bp46_cluster
    async with await Client.connect(cluster.metadata_uri) as c1, \
            await Client.connect(cluster.metadata_uri) as c2:
        ledger_id, e1, (b1, b2, b3) = await recovered_by_c2_with_b3_fence_lost(cluster, c1, c2)
        b2.reboot_after_power_loss()
        if protected:
            await wait_for_repair(b2)
        e2 = stored_entry(ledger_id, e1 + 1, b"E2", lac=e1, length=4)
        answers = await add_everywhere([b1, b2, b3], e2)
    assert answers == [StatusCode.FENCED, StatusCode.FENCED, StatusCode.OK]  # not acknowledged


@PROTECTION
async def test_scenario_1_emptied_disk_loses_the_fence(bp46_cluster: Cluster,
                                                       protected: bool) -> None:
    """Scenario 1 where B2 loses its fence for real: its disk is replaced
    (directories emptied) after C2 closed the ledger.  Without the
    protection the operator clears B2's cookie to let it start, and E2 is
    acknowledged by B2 and B3 in a ledger closed at E1: lost.  With it, the
    missing cookie makes phase one fence the ledger on B2 first (stamping
    the cookies itself): E2 is refused."""
    cluster = bp46_cluster
    async with await Client.connect(cluster.metadata_uri) as c1, \
            await Client.connect(cluster.metadata_uri) as c2:
        ledger_id, e1, (b1, b2, b3) = await recovered_by_c2_with_b3_fence_lost(cluster, c1, c2)
        b2.kill9()
        shutil.rmtree(b2.data_dir)
        if protected:
            b2.settings["data_integrity_stamp_missing_cookies"] = True
        else:
            await c2.metadata_store.delete_cookie(b2.bookie_id)  # `quire cookie delete`
        b2.start()
        e2 = stored_entry(ledger_id, e1 + 1, b"E2", lac=e1, length=4)
        answers = await add_everywhere([b1, b2, b3], e2)
    if protected:
        assert answers == [StatusCode.FENCED, StatusCode.FENCED, StatusCode.OK]
    else:  # the loss: acknowledged (A = 2) past the end the ledger was closed at
        assert answers == [StatusCode.FENCED, StatusCode.OK, StatusCode.OK]


@PROTECTION
async def test_scenario_2_recovery_truncates_an_acknowledged_entry(
        bp46_cluster: Cluster, protected: bool) -> None:
    """C1's E0 reaches B1 and B3 only (acknowledged: A = 2); B1 crashes and
    reboots with E0 lost; C2 recovers while B3 does not answer (stopped).
    Without the protection B1 and B2 say NO_SUCH_ENTRY (W - A + 1 = 2
    definite noes) and the ledger is closed empty: E0 lost.  With it B1's
    limbo answers UNKNOWN, so recovery cannot decide until B3 answers; the
    ledger then closes at 0, E0 reads back, and B1's phase two copies E0
    back onto B1."""
    cluster = bp46_cluster
    async with await Client.connect(cluster.metadata_uri) as c1, \
            await Client.connect(cluster.metadata_uri, ClientConfig(read_timeout_ms=1000)) as c2:
        writer = await c1.create_ledger(3, 3, 2, password=PASSWORD)
        ledger_id = writer.ledger_id
        b1, b2, b3 = in_ensemble_order(cluster, writer.ensemble)
        e0 = stored_entry(ledger_id, 0, b"E0", lac=-1, length=2)
        assert [await add_to(b, e0) for b in (b1, b3)] == [StatusCode.OK, StatusCode.OK]
        assert (await read_from(b2, ledger_id, 0))[0].is_explicit_negative  # B2 never got it
        with paused(b3):  # from before B1's reboot: B1's phase two cannot recover it either
            b1.reboot_after_power_loss()
            # B1 lost E0: a definite no, unless its limbo makes it "unknown"
            status = (await read_from(b1, ledger_id, 0))[0]
            assert status == StatusCode.UNKNOWN if protected else status.is_explicit_negative
            if protected:
                with pytest.raises(LedgerRecoveryError):
                    await c2.open_ledger(ledger_id, password=PASSWORD, recovery=True)
                stored = (await c2.metadata_store.read_ledger(ledger_id)).value
                assert stored.state is not LedgerState.CLOSED
            else:
                recovered = await c2.open_ledger(ledger_id, password=PASSWORD, recovery=True)
                # the loss: closed empty although E0 was acknowledged
                assert recovered.is_closed and recovered.last_add_confirmed == NO_ENTRY
                return
        recovered = await recover_until_closed(c2, ledger_id)
        assert recovered.last_add_confirmed == 0
        assert [e.data for e in await recovered.read(0, 0)] == [b"E0"]
        await wait_for_repair(b1)
        assert await read_from(b1, ledger_id, 0) == (StatusCode.OK, e0)


@contextlib.contextmanager
def paused(bookie: BookieProcess) -> Iterator[None]:
    """SIGSTOP the bookie process for the block (it answers nothing), then
    SIGCONT."""
    assert bookie.proc is not None
    bookie.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        bookie.proc.send_signal(signal.SIGCONT)

