"""BookieClient's writes: frames of one loop iteration leave together, in
pieces of FLUSH_AFTER_FRAMES when the burst is larger."""

from __future__ import annotations

import asyncio

from quire.client.connection import FLUSH_AFTER_FRAMES, BookieClient, _BookieProtocol
from quire.errors import StatusCode
from quire.protocol import Decoder, DigestManager, master_key
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
        client.add(key, digest.encode(entry_id, -1, entry_id + 1, b"e"), 0, 60.0,
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


async def test_answers_before_a_malformed_frame_are_delivered_then_the_connection_closes(
        ) -> None:
    client, protocol, transport = attached_client()
    key, digest = KEY, DIGEST
    answered: list[tuple[int, object]] = []
    for entry_id in range(2):
        client.add(key, digest.encode(entry_id, -1, entry_id + 1, b"e"), 0, 60.0,
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
