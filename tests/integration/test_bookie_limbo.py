"""BP-46 on a real bookie process: a limbo ledger never answers a negative,
and a restart reports how the previous run ended.

The boot sequence that puts ledgers in limbo is later work: these tests put
them there through the storage API, on the directories of a stopped bookie.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quire.errors import StatusCode
from quire.protocol import AddRequest, BatchReadRequest, ReadLacRequest, ReadRequest
from tests.integration.test_bookie_server import KEY, entry
from tests.support.bookies import BookieProcess, RawBookieClient, put_in_limbo

HELD = 7       # stored entries 0..2, then put in limbo
NEVER_SEEN = 8  # put in limbo without this bookie ever storing it
PLAIN = 9      # stored entries 0..2, not in limbo (the negatives it answers)


@pytest.fixture
async def limbo_bookie(tmp_path: Path) -> AsyncIterator[tuple[BookieProcess, RawBookieClient]]:
    process = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "bookie-1")
    process.start()
    conn = await RawBookieClient.connect(process.address)
    try:
        for ledger_id in (HELD, PLAIN):
            for entry_id in range(3):
                request = AddRequest(conn.next_id(), KEY, entry(ledger_id, entry_id))
                assert (await conn.call(request)).status == StatusCode.OK
    finally:
        conn.close()
    process.stop()
    put_in_limbo(process, [HELD, NEVER_SEEN])
    process.start()
    conn = await RawBookieClient.connect(process.address)
    try:
        yield process, conn
    finally:
        conn.close()
        process.kill9()


async def status_of_read(conn: RawBookieClient, ledger_id: int, entry_id: int) -> StatusCode:
    response = await conn.call(ReadRequest(conn.next_id(), ledger_id, entry_id, 0, None))
    return response.status  # type: ignore[union-attr]


async def status_of_batch(conn: RawBookieClient, ledger_id: int, start: int) -> StatusCode:
    response = await conn.call(BatchReadRequest(conn.next_id(), ledger_id, start, 10, 1 << 20,
                                                0, None))
    return response.status  # type: ignore[union-attr]


async def test_limbo_ledgers_answer_unknown_where_others_answer_a_negative(
        limbo_bookie: tuple[BookieProcess, RawBookieClient]) -> None:
    _process, conn = limbo_bookie
    # the same questions to a plain ledger answer negatives ...
    assert await status_of_read(conn, PLAIN, 5) == StatusCode.NO_SUCH_ENTRY
    assert await status_of_batch(conn, PLAIN, 5) == StatusCode.NO_SUCH_ENTRY
    assert await status_of_read(conn, 404, 0) == StatusCode.NO_SUCH_LEDGER
    assert await status_of_read(conn, 404, -1) == StatusCode.NO_SUCH_LEDGER
    assert (await conn.call(ReadLacRequest(conn.next_id(), 404))).status \
        == StatusCode.NO_SUCH_LEDGER
    # ... and UNKNOWN from limbo ledgers
    assert await status_of_read(conn, HELD, 5) == StatusCode.UNKNOWN
    assert await status_of_batch(conn, HELD, 5) == StatusCode.UNKNOWN
    assert await status_of_read(conn, NEVER_SEEN, 0) == StatusCode.UNKNOWN
    assert await status_of_batch(conn, NEVER_SEEN, 0) == StatusCode.UNKNOWN
    assert await status_of_read(conn, NEVER_SEEN, -1) == StatusCode.UNKNOWN
    lac = await conn.call(ReadLacRequest(conn.next_id(), NEVER_SEEN))
    assert lac.status == StatusCode.UNKNOWN  # type: ignore[union-attr]


async def test_limbo_ledgers_serve_what_they_hold_and_refuse_adds_as_fenced(
        limbo_bookie: tuple[BookieProcess, RawBookieClient]) -> None:
    _process, conn = limbo_bookie
    response = await conn.call(ReadRequest(conn.next_id(), HELD, 1, 0, None))
    assert (response.status, response.entry) == (StatusCode.OK, entry(HELD, 1))  # type: ignore[union-attr]
    response = await conn.call(ReadRequest(conn.next_id(), HELD, -1, 0, None))
    assert (response.status, response.entry) == (StatusCode.OK, entry(HELD, 2))  # type: ignore[union-attr]
    batch = await conn.call(BatchReadRequest(conn.next_id(), HELD, 0, 10, 1 << 20, 0, None))
    assert batch.entries == [entry(HELD, i) for i in range(3)]  # type: ignore[union-attr]
    for ledger_id, entry_id in ((HELD, 3), (NEVER_SEEN, 0)):
        added = await conn.call(AddRequest(conn.next_id(), KEY, entry(ledger_id, entry_id)))
        assert added.status == StatusCode.FENCED  # type: ignore[union-attr]
    assert (await conn.call(AddRequest(conn.next_id(), KEY, entry(PLAIN, 3)))).status \
        == StatusCode.OK  # type: ignore[union-attr]


def test_restart_reports_kill9_as_unclean_and_sigterm_as_clean(tmp_path: Path) -> None:
    process = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "bookie-1")
    process.start()
    try:
        assert "last shutdown first-start" in process.log()
        process.kill9()
        process.start()
        assert process.log().count("last shutdown unclean (the run that crashed had "
                                   "journal_write_data on)") == 1
        process.stop()
        process.start()
        assert process.log().count("last shutdown clean") == 1
        process.stop()
        process.start()
        assert process.log().count("last shutdown clean") == 2
        assert process.log().count("last shutdown unclean") == 1
    finally:
        process.kill9()
