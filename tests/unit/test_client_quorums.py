"""Quorum and coverage rules of reads and recovery, with scripted answers.

Nothing here opens a socket: a scripted pool records every typed call and
the test answers them one by one (an answer goes through quire.peer's
answer mapping, as on a connection), so each rule is checked answer by
answer.
The rule under test throughout: an unknown answer (error, UNKNOWN, timeout,
lost connection, bad digest) is never counted as a "no".
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quire.client.config import ClientConfig
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.client.reads import EntryReadOp
from quire.client.recovery import LedgerRecoveryOp
from quire.errors import (
    BookieUnavailableError,
    ClientTimeoutError,
    DigestMismatchError,
    EntryNotAvailableError,
    LedgerRecoveryError,
    NoSuchEntryError,
    StatusCode,
    UnauthorizedError,
)
from quire.metadata import LedgerMetadata, Versioned
from quire.peer import outcome
from quire.protocol import (
    FLAG_DO_FENCING,
    LAST_ENTRY_ID,
    DigestManager,
    ErrorResponse,
    LedgerKeys,
    OpCode,
    ReadRequest,
    ReadResponse,
    WriteLacResponse,
)
from quire.types import DigestType, LedgerState

LEDGER = 9
DIGEST = DigestManager(LEDGER, DigestType.CRC32C, b"pw")


class ScriptedClient:
    """The typed read calls of quire.peer.BookieClient, recorded as the
    requests they stand for."""

    def __init__(self, pool: ScriptedPool, bookie: str) -> None:
        self.pool = pool
        self.bookie = bookie

    def read_entry(self, ledger_id: int, entry_id: int, timeout_s: float, handler: Any,
                   token: Any) -> None:
        self.pool.sent.append((self.bookie, ReadRequest(len(self.pool.sent), ledger_id, entry_id),
                               handler, token))

    def fence_read(self, ledger_id: int, master_key: bytes, timeout_s: float, handler: Any,
                   token: Any) -> None:
        request = ReadRequest(len(self.pool.sent), ledger_id, LAST_ENTRY_ID, FLAG_DO_FENCING,
                              master_key)
        self.pool.sent.append((self.bookie, request, handler, token))


class ScriptedPool:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any, Any]] = []

    def client(self, bookie: str) -> ScriptedClient:
        return ScriptedClient(self, bookie)

    def order_for_reads(self, bookies: tuple[str, ...]) -> tuple[str, ...]:
        return bookies

    def bookies_asked(self) -> list[str]:
        return [bookie for bookie, *_ in self.sent]

    def answer(self, bookie: str, result: Any) -> None:
        for i, (b, request, handler, token) in enumerate(self.sent):
            if b == bookie:
                del self.sent[i]
                if isinstance(result, StatusCode):
                    result = ReadResponse(request.request_id, result, request.ledger_id,
                                          request.entry_id)
                elif isinstance(result, bytes):
                    result = ReadResponse(request.request_id, StatusCode.OK, request.ledger_id,
                                          request.entry_id, result)
                if not isinstance(result, Exception):  # an answer: made what the call gets
                    result = outcome(result, ReadResponse, bookie)
                handler(token, result)
                return
        raise AssertionError(f"no request outstanding to {bookie}")


def make_ctx(**config: Any) -> tuple[ClientContext, ScriptedPool]:
    pool = ScriptedPool()
    settings = {"speculative_read_timeout_ms": 0, **config}
    ctx = ClientContext(store=None, pool=pool, config=ClientConfig(**settings),  # type: ignore[arg-type]
                        placement=RandomPlacement())
    return ctx, pool


def entry(entry_id: int, lac: int = -1, payload: bytes = b"x") -> bytes:
    return DIGEST.encode(entry_id, lac, entry_id + 1, payload)


def corrupt(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


REPLICAS = ("a", "b", "c")


def start_read(ctx: ClientContext, *, recovery: bool, threshold: int = 0) -> list[EntryReadOp]:
    done: list[EntryReadOp] = []
    EntryReadOp(ctx, DIGEST, 5, REPLICAS, done.append, recovery=recovery,
                gone_threshold=threshold).start()
    return done


# --- normal reads -----------------------------------------------------------


async def test_normal_read_asks_one_replica_at_a_time_and_fails_over() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    assert pool.bookies_asked() == ["a"]
    pool.answer("a", ClientTimeoutError("slow"))
    assert pool.bookies_asked() == ["b"]
    pool.answer("b", corrupt(entry(5)))
    assert pool.bookies_asked() == ["c"]
    pool.answer("c", entry(5, payload=b"hello"))
    assert len(done) == 1 and done[0].error is None
    assert bytes(done[0].payload or b"") == b"hello"


async def test_all_replicas_saying_no_is_no_such_entry() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    for bookie, status in zip(REPLICAS, (StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER,
                                         StatusCode.NO_SUCH_ENTRY), strict=True):
        pool.answer(bookie, status)
    assert isinstance(done[0].error, NoSuchEntryError)


@pytest.mark.parametrize("unknown", [
    StatusCode.UNKNOWN, StatusCode.IO_ERROR, StatusCode.TOO_MANY_REQUESTS,
    ClientTimeoutError("t"), BookieUnavailableError("gone"),
    WriteLacResponse(0, StatusCode.OK, LEDGER),  # an answer for another op
    ErrorResponse(OpCode.READ_LAC, 0, StatusCode.NO_SUCH_ENTRY),  # another op's negative
])
async def test_one_unknown_among_noes_is_not_a_no(unknown: Any) -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", unknown)
    pool.answer("c", StatusCode.NO_SUCH_ENTRY)
    assert isinstance(done[0].error, EntryNotAvailableError)
    assert not isinstance(done[0].error, NoSuchEntryError)


async def test_bare_error_answer_is_unknown() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", StatusCode.NO_SUCH_ENTRY)
    request = pool.sent[0][1]
    pool.answer("c", ErrorResponse(2, request.request_id, StatusCode.UNSUPPORTED))
    assert isinstance(done[0].error, EntryNotAvailableError)


async def test_digest_mismatch_everywhere() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    for bookie in REPLICAS:
        pool.answer(bookie, corrupt(entry(5)))
    assert isinstance(done[0].error, DigestMismatchError)


async def test_entry_of_another_id_is_a_digest_failure() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=False)
    pool.answer("a", entry(4))
    pool.answer("b", StatusCode.NO_SUCH_ENTRY)
    pool.answer("c", StatusCode.NO_SUCH_ENTRY)
    assert isinstance(done[0].error, DigestMismatchError)


async def test_speculative_read_asks_the_next_replica_of_a_slow_one() -> None:
    ctx, pool = make_ctx(speculative_read_timeout_ms=20)
    done = start_read(ctx, recovery=False)
    assert pool.bookies_asked() == ["a"]
    deadline = asyncio.get_running_loop().time() + 5
    while len(pool.sent) < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert pool.bookies_asked() == ["a", "b"]
    pool.answer("b", entry(5))
    assert done and done[0].error is None
    pool.answer("a", entry(5))  # late answer: ignored
    assert len(done) == 1


# --- recovery reads ---------------------------------------------------------


async def test_recovery_read_asks_every_replica_at_once() -> None:
    ctx, pool = make_ctx()
    start_read(ctx, recovery=True, threshold=2)
    assert sorted(pool.bookies_asked()) == list(REPLICAS)


async def test_one_good_copy_makes_an_entry_recoverable() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=True, threshold=2)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", entry(5))
    assert done[0].stored == entry(5) and not done[0].gone


@pytest.mark.parametrize("last", [ClientTimeoutError("t"), StatusCode.UNKNOWN,
                                  StatusCode.NO_SUCH_ENTRY])
async def test_write_quorum_minus_ack_quorum_plus_one_noes_make_it_gone(last: Any) -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=True, threshold=2)  # W=3, A=2
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("c", StatusCode.NO_SUCH_LEDGER)
    assert not done  # the last replica may still hold a copy
    pool.answer("b", last)
    assert done[0].gone and done[0].error is None


async def test_a_late_good_copy_beats_the_noes() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=True, threshold=2)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("c", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", entry(5))
    assert not done[0].gone and done[0].stored == entry(5)


@pytest.mark.parametrize("unknown", [
    StatusCode.UNKNOWN, StatusCode.IO_ERROR, ClientTimeoutError("t"),
    BookieUnavailableError("down"),
])
async def test_recovery_never_counts_an_unknown_as_a_no(unknown: Any) -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=True, threshold=2)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", unknown)
    pool.answer("c", unknown if not isinstance(unknown, StatusCode) else StatusCode.UNKNOWN)
    assert not done[0].gone
    assert isinstance(done[0].error, EntryNotAvailableError)


async def test_recovery_bad_digest_is_not_a_no() -> None:
    ctx, pool = make_ctx()
    done = start_read(ctx, recovery=True, threshold=2)
    pool.answer("a", StatusCode.NO_SUCH_ENTRY)
    pool.answer("b", corrupt(entry(5)))
    pool.answer("c", corrupt(entry(5)))
    assert not done[0].gone and done[0].error is not None


# --- fencing coverage -------------------------------------------------------


def recovery_op(ctx: ClientContext, ensemble_size: int, ack_quorum: int) -> LedgerRecoveryOp:
    ensemble = tuple(f"b{i}" for i in range(ensemble_size))
    md = LedgerMetadata(ensemble_size, min(ensemble_size, 3), ack_quorum,
                        keys=LedgerKeys.of_password(b"pw"), state=LedgerState.IN_RECOVERY,
                        ensembles=((0, ensemble),))
    return LedgerRecoveryOp(ctx, LEDGER, Versioned(md, 1), md.keys)


async def test_fencing_completes_at_ensemble_coverage() -> None:
    ctx, pool = make_ctx()
    op = recovery_op(ctx, 3, 2)  # coverage: 3 - 2 + 1 = 2 fenced answers
    task = asyncio.ensure_future(op._fence(("b0", "b1", "b2")))
    await asyncio.sleep(0)
    assert all(isinstance(r, ReadRequest) and r.is_fencing and r.entry_id == -1
               for _, r, *_ in pool.sent)
    pool.answer("b0", entry(7, lac=5))
    await asyncio.sleep(0)
    assert not task.done()
    pool.answer("b2", StatusCode.NO_SUCH_ENTRY)  # fenced, holds nothing: counts
    lac, lengths = await task
    assert lac == 5 and lengths == {7: 8}


async def test_fencing_fails_once_ack_quorum_answers_are_unknown() -> None:
    ctx, pool = make_ctx()
    op = recovery_op(ctx, 3, 2)
    task = asyncio.ensure_future(op._fence(("b0", "b1", "b2")))
    await asyncio.sleep(0)
    pool.answer("b0", ClientTimeoutError("t"))
    await asyncio.sleep(0)
    assert not task.done()
    pool.answer("b1", StatusCode.IO_ERROR)
    with pytest.raises(LedgerRecoveryError):
        await task


async def test_fencing_striped_needs_e_minus_a_plus_one() -> None:
    ctx, pool = make_ctx()
    op = recovery_op(ctx, 5, 2)  # needs 4 of 5
    task = asyncio.ensure_future(op._fence(tuple(f"b{i}" for i in range(5))))
    await asyncio.sleep(0)
    for bookie in ("b0", "b1", "b2"):
        pool.answer(bookie, StatusCode.NO_SUCH_ENTRY)
    await asyncio.sleep(0)
    assert not task.done()
    pool.answer("b3", StatusCode.UNKNOWN)
    await asyncio.sleep(0)
    assert not task.done()  # one unknown of A=2 allowed
    pool.answer("b4", entry(3, lac=2))
    assert (await task)[0] == 2


async def test_fencing_with_a_wrong_key_is_unauthorized() -> None:
    ctx, pool = make_ctx()
    op = recovery_op(ctx, 3, 2)
    task = asyncio.ensure_future(op._fence(("b0", "b1", "b2")))
    await asyncio.sleep(0)
    pool.answer("b1", StatusCode.UNAUTHORIZED)
    with pytest.raises(UnauthorizedError):
        await task
