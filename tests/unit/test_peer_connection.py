"""BookieClient's writes and answers: frames of one loop iteration leave
together, in pieces of FLUSH_AFTER_FRAMES when the burst is larger; each
typed call gets its OK response or the error in its place."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quire.errors import (
    EXPLICIT_NEGATIVES,
    ClientTimeoutError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyError,
    StatusCode,
    TooManyRequestsError,
    UnauthorizedError,
    UnexpectedResponseError,
    UnknownStateError,
    UnsupportedError,
)
from quire.peer.connection import (
    FLUSH_AFTER_FRAMES,
    FLUSH_FRAME_BYTES,
    BookieClient,
    _BookieProtocol,
    next_request_id,
)
from quire.protocol import (
    AddResponse,
    BatchReadResponse,
    Decoder,
    DigestManager,
    ErrorResponse,
    OpCode,
    ReadLacResponse,
    ReadResponse,
    SyncResponse,
    encode_add_request,
    master_key,
)
from quire.protocol.codec import encode_add_response
from quire.types import DigestType


class RecordingTransport:
    """The part of asyncio.Transport the connection uses; keeps each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        self.aborted = True


def frames_in(data: bytes) -> int:
    decoder = Decoder("requests", 1 << 20)
    decoder.feed(data)
    count = 0
    while decoder.next_message() is not None:
        count += 1
    return count


def attached_client() -> tuple[BookieClient, _BookieProtocol, RecordingTransport]:
    """A BookieClient whose connection is a protocol attached by hand."""
    async def resolve(_bookie: str) -> str:
        raise AssertionError("no connect: the protocol is attached by hand")

    client = BookieClient("b1", resolve, connect_timeout_s=1.0, max_frame_bytes=1 << 20)
    protocol = _BookieProtocol(client, 1 << 20)
    transport = RecordingTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return client, protocol, transport


KEY = master_key(b"pw")
DIGEST = DigestManager(7, DigestType.CRC32C, b"pw")


async def test_a_burst_is_written_in_pieces_before_the_iteration_ends() -> None:
    client, _protocol, transport = attached_client()
    key, digest = KEY, DIGEST
    burst = 2 * FLUSH_AFTER_FRAMES + 5

    def add(entry_id: int) -> None:
        request_id = next_request_id()
        client.add_frame(request_id, encode_add_request(
            request_id, key, digest.encode(entry_id, -1, entry_id + 1, b"e")), 1e12,
            lambda _token, _result: None, None)

    for entry_id in range(burst):
        add(entry_id)
    # The whole pieces are on the wire before the loop runs again ...
    assert [frames_in(w) for w in transport.writes] == [FLUSH_AFTER_FRAMES] * 2
    await asyncio.sleep(0)
    # ... and the rest leaves at the end of the iteration, in one write.
    assert [frames_in(w) for w in transport.writes] == [FLUSH_AFTER_FRAMES] * 2 + [5]
    add(burst)
    await asyncio.sleep(0)
    assert frames_in(transport.writes[-1]) == 1 and len(transport.writes) == 4


async def test_a_large_frame_leaves_at_once_with_the_small_ones_before_it() -> None:
    client, _protocol, transport = attached_client()

    def add(entry_id: int, payload: bytes) -> None:
        request_id = next_request_id()
        client.add_frame(request_id, encode_add_request(
            request_id, KEY, DIGEST.encode(entry_id, -1, entry_id + 1, payload)), 1e12,
            lambda _token, _result: None, None)

    add(0, b"s")
    add(1, b"s")
    assert transport.writes == []  # small frames wait for the end of the iteration
    add(2, b"L" * FLUSH_FRAME_BYTES)
    # the large one is on the wire before the loop runs again, behind the small ones
    assert [frames_in(w) for w in transport.writes] == [3]
    add(3, b"s")
    await asyncio.sleep(0)
    assert [frames_in(w) for w in transport.writes] == [3, 1]


async def test_answers_before_a_malformed_frame_are_delivered_then_the_connection_closes(
        ) -> None:
    client, protocol, transport = attached_client()
    key, digest = KEY, DIGEST
    answered: list[tuple[int, object]] = []
    for entry_id in range(2):
        request_id = next_request_id()
        client.add_frame(request_id, encode_add_request(
            request_id, key, digest.encode(entry_id, -1, entry_id + 1, b"e")), 1e12,
            lambda token, result: answered.append((token, result)), entry_id)
    sent = Decoder("requests", 1 << 20)
    sent.feed(b"".join(transport.writes) + b"".join(client._outbox))
    request_ids = [int(m.request_id or 0) for m in sent.next_messages()]
    protocol.data_received(
        b"".join(encode_add_response(rid, StatusCode.OK, 7, i) for i, rid in enumerate(request_ids))
        + b"\xff" * 16)
    # an add's handler gets the raw answer: (request id, status, ledger, entry, LAS)
    assert answered == [(i, (rid, 0, 7, i, -1)) for i, rid in enumerate(request_ids)]
    assert transport.aborted


# --- typed calls: each gets its OK response or the error in its place --------


def sent_requests(client: BookieClient, transport: RecordingTransport) -> list[Any]:
    decoder = Decoder("requests", 1 << 20)
    decoder.feed(b"".join(transport.writes) + b"".join(client._outbox))
    return decoder.next_messages()


async def test_read_entry_hands_over_the_ok_response_and_errors_by_status() -> None:
    client, protocol, transport = attached_client()
    got: dict[str, object] = {}
    for token in ("ok", "missing", "fenced", "bare", "other_op"):
        client.read_entry(7, 3, 60.0, got.__setitem__, token)
    ok, missing, fenced, bare, other_op = (r.request_id for r in sent_requests(client, transport))
    stored = DIGEST.encode(3, 2, 4, b"x")
    protocol.data_received(b"".join((
        ReadResponse(ok, StatusCode.OK, 7, 3, stored).encode(),
        ReadResponse(missing, StatusCode.NO_SUCH_ENTRY, 7, 3).encode(),
        ReadResponse(fenced, StatusCode.FENCED, 7, 3).encode(),
        ErrorResponse(OpCode.READ_ENTRY, bare, StatusCode.TOO_MANY_REQUESTS).encode(),
        ReadLacResponse(other_op, StatusCode.OK, 7, 2).encode())))
    assert isinstance(got["ok"], ReadResponse) and got["ok"].entry == stored
    assert isinstance(got["missing"], NoSuchEntryError)
    assert isinstance(got["fenced"], LedgerFencedError)
    assert isinstance(got["bare"], TooManyRequestsError)
    assert isinstance(got["other_op"], UnexpectedResponseError)
    assert not isinstance(got["other_op"], EXPLICIT_NEGATIVES)
    assert client.outstanding == 0 and not transport.aborted


async def test_a_status_this_build_does_not_know_is_unknown_never_a_no() -> None:
    client, protocol, transport = attached_client()
    got: list[object] = []
    client.fence_read(7, KEY, 60.0, lambda _token, result: got.append(result), None)
    (request,) = sent_requests(client, transport)
    assert request.is_fencing and request.entry_id == -1 and request.master_key == KEY
    frame = bytearray(ReadResponse(request.request_id, StatusCode.NO_SUCH_LEDGER, 7, -1).encode())
    frame[16:20] = (999).to_bytes(4, "big")  # the status field, after len, header, request id
    protocol.data_received(bytes(frame))
    assert len(got) == 1 and isinstance(got[0], UnknownStateError)
    assert not isinstance(got[0], EXPLICIT_NEGATIVES)


async def test_awaited_calls_return_the_payload_or_raise_the_error() -> None:
    client, protocol, transport = attached_client()
    lac = asyncio.ensure_future(client.read_lac(7, 60.0))
    synced = asyncio.ensure_future(client.sync(7, 60.0))
    batch = asyncio.ensure_future(client.batch_read(7, 0, 10, 1 << 16, 60.0))
    no_ledger = asyncio.ensure_future(client.read_lac(8, 60.0))
    await asyncio.sleep(0)
    rid = [r.request_id for r in sent_requests(client, transport)]
    records = BatchReadResponse.from_entries(rid[2], StatusCode.OK, 7, 0, [b"e0", b"e1"])
    protocol.data_received(b"".join((
        ReadLacResponse(rid[0], StatusCode.OK, 7, 41).encode(),
        SyncResponse(rid[1], StatusCode.OK, 7, 40).encode(),
        records.encode(),
        ReadLacResponse(rid[3], StatusCode.NO_SUCH_LEDGER, 8).encode())))
    assert await lac == 41 and await synced == 40
    assert (await batch).entries == [b"e0", b"e1"]
    with pytest.raises(NoSuchLedgerError):
        await no_ledger


async def test_batch_read_refused_by_an_old_bookie_raises_unsupported() -> None:
    client, protocol, transport = attached_client()
    batch = asyncio.ensure_future(client.batch_read(7, 0, 10, 1 << 16, 60.0))
    await asyncio.sleep(0)
    (request,) = sent_requests(client, transport)
    protocol.data_received(
        ErrorResponse(OpCode.BATCH_READ_ENTRY, request.request_id, StatusCode.UNSUPPORTED).encode())
    with pytest.raises(UnsupportedError):
        await batch


async def test_a_raw_add_gets_its_ok_tuple_and_the_error_of_a_refusal() -> None:
    client, protocol, _transport = attached_client()
    got: dict[int, object] = {}
    rids = []
    for entry_id in range(3):
        request_id = next_request_id()
        rids.append(request_id)
        client.add_frame(request_id, encode_add_request(
            request_id, KEY, DIGEST.encode(entry_id, -1, entry_id + 1, b"e")), 1e12,
            got.__setitem__, entry_id)
    protocol.data_received(b"".join((
        encode_add_response(rids[0], StatusCode.OK, 7, 0, 0),
        encode_add_response(rids[1], StatusCode.FENCED, 7, 1),
        ErrorResponse(OpCode.ADD_ENTRY, rids[2], StatusCode.UNAUTHORIZED).encode())))
    assert got[0] == (rids[0], 0, 7, 0, 0)
    assert isinstance(got[1], LedgerFencedError)
    assert isinstance(got[2], UnauthorizedError)


async def test_typed_add_returns_the_response_or_raises() -> None:
    client, protocol, transport = attached_client()
    stored = DIGEST.encode(0, -1, 1, b"e")
    first = asyncio.ensure_future(client.add(KEY, stored, 0, 60.0))
    second = asyncio.ensure_future(client.add(KEY, stored, 0, 60.0))
    await asyncio.sleep(0)
    rid = [r.request_id for r in sent_requests(client, transport)]
    protocol.data_received(encode_add_response(rid[0], StatusCode.OK, 7, 0, -1)
                           + encode_add_response(rid[1], StatusCode.READ_ONLY, 7, 0))
    assert await first == AddResponse(rid[0], StatusCode.OK, 7, 0, -1)
    with pytest.raises(ReadOnlyError):
        await second


async def test_a_request_past_its_deadline_times_out_and_its_late_answer_is_dropped() -> None:
    client, protocol, transport = attached_client()
    got: list[object] = []
    client.read_entry(7, 3, 5.0, lambda _token, result: got.append(result), None)
    (request,) = sent_requests(client, transport)
    client.expire(asyncio.get_running_loop().time() + 10.0)
    assert len(got) == 1 and isinstance(got[0], ClientTimeoutError)
    protocol.data_received(ReadResponse(request.request_id, StatusCode.OK, 7, 3,
                                        DIGEST.encode(3, 2, 4, b"x")).encode())
    assert len(got) == 1
