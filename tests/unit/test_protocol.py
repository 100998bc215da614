"""Property tests of the sans-IO codec: round trips, and fuzzing that accepts
only messages or ProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quire.errors import DigestMismatchError, ProtocolError, StatusCode
from quire.protocol import (
    BATCH_READ_RESPONSE_OVERHEAD_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_BARE_ERROR,
    FLAG_DO_FENCING,
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    AddRequest,
    AddResponse,
    BatchReadRequest,
    BatchReadResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    Decoder,
    DigestManager,
    ErrorResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    SyncRequest,
    SyncResponse,
    UnknownRequest,
    WriteLacRequest,
    WriteLacResponse,
    add_response_of,
    batch_read_room,
    encode_batch_read_records,
    master_key,
)
from quire.protocol.codec import encode_add_response
from quire.types import DigestType

SETTINGS = settings(deadline=None, max_examples=150,
                    suppress_health_check=[HealthCheck.too_slow])

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
key = st.binary(min_size=20, max_size=20)
status = st.sampled_from(list(StatusCode))
blob = st.binary(max_size=300)
entry_bytes = st.builds(lambda ids, rest: struct.pack(">qq", *ids) + rest,
                        st.tuples(i64, i64), blob)

requests = st.one_of(
    st.builds(AddRequest, u64, key, entry_bytes,
              st.sampled_from([0, FLAG_RECOVERY_ADD, FLAG_VOLATILE_DURABILITY,
                               FLAG_RECOVERY_ADD | FLAG_VOLATILE_DURABILITY])),
    st.builds(ReadRequest, u64, i64, i64, st.just(0), st.none()),
    st.builds(ReadRequest, u64, i64, i64, st.just(FLAG_DO_FENCING), key),
    st.builds(ReadLacRequest, u64, i64),
    st.builds(WriteLacRequest, u64, i64, i64, key),
    st.builds(BookieInfoRequest, u64),
    st.builds(BatchReadRequest, u64, i64, i64, i32, i64, st.just(0), st.none()),
    st.builds(BatchReadRequest, u64, i64, i64, i32, i64, st.just(FLAG_DO_FENCING), key),
    st.builds(SyncRequest, u64, i64),
)

responses = st.one_of(
    st.builds(AddResponse, u64, status, i64, i64, i64),
    st.builds(ReadResponse, u64, st.just(StatusCode.OK), i64, i64, st.binary(min_size=1)),
    st.builds(ReadResponse, u64, status.filter(lambda s: s != StatusCode.OK), i64, i64,
              st.none()),
    st.builds(ReadLacResponse, u64, status, i64, i64),
    st.builds(WriteLacResponse, u64, status, i64),
    st.builds(BookieInfoResponse, u64, status, i64, i64),
    st.builds(BatchReadResponse.from_entries, u64, status, i64, i64, st.lists(blob, max_size=5)),
    st.builds(SyncResponse, u64, status, i64, i64),
    st.builds(ErrorResponse, st.integers(1, 255), u64, status),
)


def decode_all(direction: str, data: bytes, chunk: int, batched: bool = False) -> list[object]:
    decoder = Decoder(direction)  # type: ignore[arg-type]
    out: list[object] = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i:i + chunk])
        out.extend(decoder.next_messages() if batched else decoder)
    assert decoder.buffered_bytes == 0
    return out


@SETTINGS
@given(st.lists(requests, min_size=1, max_size=6), st.integers(1, 64), st.booleans())
def test_requests_round_trip_in_any_chunking(messages: list[object], chunk: int,
                                             batched: bool) -> None:
    wire = b"".join(m.encode() for m in messages)  # type: ignore[attr-defined]
    assert decode_all("requests", wire, chunk, batched) == messages


@SETTINGS
@given(st.lists(responses, min_size=1, max_size=6), st.integers(1, 64), st.booleans())
def test_responses_round_trip_in_any_chunking(messages: list[object], chunk: int,
                                              batched: bool) -> None:
    wire = b"".join(m.encode() for m in messages)  # type: ignore[attr-defined]
    assert decode_all("responses", wire, chunk, batched) == messages


def decode_like_the_hot_paths(direction: str, data: bytes, chunk: int) -> list[object]:
    """The loop of bookie (requests) and client (responses): runs of ADD
    frames taken without an object each (made here to compare), anything
    else one message at a time."""
    decoder = Decoder(direction)  # type: ignore[arg-type]
    out: list[object] = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i:i + chunk])
        while True:
            if direction == "requests":
                run = decoder.take_add_requests()
                if run is not None:
                    assert len(run) > 0
                    out.extend(run.requests())
            else:
                out.extend(add_response_of(raw) for raw in decoder.take_add_answers())
            message = decoder.next_message()
            if message is None:
                break
            out.append(message)
    assert decoder.buffered_bytes == 0
    return out


add_response = st.builds(AddResponse, u64, status, i64, i64, i64)
adds_mostly = st.lists(st.one_of(responses, add_response, add_response, add_response),
                       min_size=1, max_size=12)


@SETTINGS
@given(adds_mostly, st.integers(1, 200))
def test_add_answers_taken_raw_decode_as_the_generic_path_does(messages: list[object],
                                                               chunk: int) -> None:
    wire = b"".join(m.encode() for m in messages)  # type: ignore[attr-defined]
    assert decode_like_the_hot_paths("responses", wire, chunk) == messages


def test_take_add_answers_leaves_an_unknown_status_unknown_and_stops_at_other_frames() -> None:
    strange = encode_add_response(5, 12345, 7, 1)  # a status this build does not know
    other = ReadLacResponse(6, StatusCode.OK, 7, 3).encode()
    decoder = Decoder("responses")
    decoder.feed(strange + other + strange[:10])
    (raw,) = decoder.take_add_answers()
    assert raw == (5, 12345, 7, 1, -1)
    assert add_response_of(raw).status is StatusCode.UNKNOWN  # never a negative
    assert decoder.take_add_answers() == []  # the READ_LAC answer is next
    assert decoder.next_message() == ReadLacResponse(6, StatusCode.OK, 7, 3)
    assert decoder.take_add_answers() == [] and decoder.buffered_bytes == 10  # incomplete


add_request = st.builds(AddRequest, u64, key, entry_bytes,
                        st.sampled_from([0, FLAG_RECOVERY_ADD, FLAG_VOLATILE_DURABILITY]))
adds_mostly_requests = st.lists(st.one_of(requests, add_request, add_request, add_request),
                                min_size=1, max_size=12)


@SETTINGS
@given(adds_mostly_requests, st.integers(1, 400))
def test_add_requests_taken_as_columns_decode_as_the_generic_path_does(
        messages: list[object], chunk: int) -> None:
    wire = b"".join(m.encode() for m in messages)  # type: ignore[attr-defined]
    assert decode_like_the_hot_paths("requests", wire, chunk) == messages


def test_take_add_requests_stops_before_a_malformed_frame() -> None:
    entry = struct.pack(">qq", 7, 0) + b"abc"
    adds = [AddRequest(1, b"k" * 20, entry), AddRequest(2, b"k" * 20, entry, FLAG_RECOVERY_ADD)]
    short_add = struct.pack(">IIQ", 12, (1 << 24) | (1 << 16), 3)  # no key, no entry ids
    decoder = Decoder("requests")
    decoder.feed(b"".join(m.encode() for m in adds) + short_add)
    run = decoder.take_add_requests()
    assert run is not None and run.requests() == adds
    assert run.flags == [0, FLAG_RECOVERY_ADD] and run.ledger_ids == (7, 7)
    assert decoder.take_add_requests() is None
    with pytest.raises(ProtocolError):
        decoder.next_message()


def test_next_messages_returns_what_precedes_a_malformed_frame_then_raises() -> None:
    entry = struct.pack(">qq", 7, 0) + b"abc"
    good = [AddRequest(1, b"k" * 20, entry), ReadLacRequest(2, 7), AddRequest(3, b"k" * 20, entry)]
    bad_version = struct.pack(">II", 4, (9 << 24) | (1 << 16))
    decoder = Decoder("requests")
    decoder.feed(b"".join(m.encode() for m in good) + bad_version)
    assert decoder.next_messages() == good
    assert decoder.error is not None and "version 9" in str(decoder.error)
    with pytest.raises(ProtocolError, match="version 9"):
        decoder.next_messages()
    fresh = Decoder("requests")
    fresh.feed(bad_version)
    with pytest.raises(ProtocolError, match="version 9"):
        fresh.next_messages()  # nothing before it: raised at once
    assert fresh.error is not None


def test_unknown_op_decodes_to_unknown_request_with_its_request_id() -> None:
    body = struct.pack(">Q", 77) + b"xyz"
    frame = struct.pack(">II", 4 + len(body), (1 << 24) | (42 << 16) | 3) + body
    (message,) = decode_all("requests", frame, 100)
    assert message == UnknownRequest(42, 3, 77, body)
    answer = ErrorResponse(42, 77, StatusCode.UNSUPPORTED)
    assert decode_all("responses", answer.encode(), 3) == [answer]
    assert answer.encode()[6:8] == struct.pack(">H", FLAG_BARE_ERROR)


def test_oversized_frame_is_refused_before_the_body_arrives() -> None:
    decoder = Decoder("requests", max_frame_bytes=1024)
    decoder.feed(struct.pack(">I", 1025))
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.next_message()
    with pytest.raises(ProtocolError):
        decoder.feed(b"more")


@pytest.mark.parametrize("frame", [
    struct.pack(">II", 4, (9 << 24) | (1 << 16)),                      # bad version
    struct.pack(">II", 2, 0),                                           # shorter than header
    struct.pack(">II", 4 + 3, (1 << 24) | (2 << 16)) + b"abc",          # read body too short
    struct.pack(">II", 4 + 40, (1 << 24) | (1 << 16)) + b"\0" * 40,     # add without entry ids
])
def test_malformed_frames_raise_protocol_error(frame: bytes) -> None:
    decoder = Decoder("requests")
    decoder.feed(frame)
    with pytest.raises(ProtocolError):
        decoder.next_message()


# --- BP-62 frame room ---------------------------------------------------------


MIB = 1024 * 1024


@pytest.mark.parametrize(("max_frame", "max_batch", "asked", "room"), [
    (DEFAULT_MAX_FRAME_BYTES, 4 * MIB, 0, 4 * MIB),  # defaults, no limit asked: the batch limit
    (DEFAULT_MAX_FRAME_BYTES, 4 * MIB, -1, 4 * MIB),
    (DEFAULT_MAX_FRAME_BYTES, 4 * MIB, 1000, 1000),  # what was asked
    (DEFAULT_MAX_FRAME_BYTES, 4 * MIB, 9 * MIB, 4 * MIB),
    (DEFAULT_MAX_FRAME_BYTES, 8 * MIB, 0, 5 * MIB - 64),  # the frame holds less than a batch
    (MIB, 4 * MIB, 2 * MIB, MIB - 64),
    (MIB, 4 * MIB, MIB - 64, MIB - 64),
    (MIB, 4 * MIB, MIB - 63, MIB - 64),
])
def test_batch_read_room(max_frame: int, max_batch: int, asked: int, room: int) -> None:
    assert BATCH_READ_RESPONSE_OVERHEAD_BYTES == 64
    assert batch_read_room(max_frame, max_batch, asked) == room


@pytest.mark.parametrize("max_frame", [4096, 65536, DEFAULT_MAX_FRAME_BYTES])
def test_an_answer_filled_to_the_room_fits_the_frame_limit(max_frame: int) -> None:
    room = batch_read_room(max_frame, 1 << 40, 0)
    entry = b"e" * (room - 4)  # one entry: its u32 length and its bytes fill the room
    records = [struct.pack(">I", len(entry)), entry]
    frame = encode_batch_read_records(2**63, StatusCode.OK, 2**62, 2**62, records)
    decoder = Decoder("responses", max_frame)
    decoder.feed(frame)
    answer = decoder.next_message()
    assert isinstance(answer, BatchReadResponse) and answer.entries == [entry]
    assert max_frame - (len(frame) - 4) == BATCH_READ_RESPONSE_OVERHEAD_BYTES - 32


def test_batch_response_with_lying_entry_length_is_refused() -> None:
    good = BatchReadResponse.from_entries(1, StatusCode.OK, 2, 3, [b"abcd"]).encode()
    bad = good[:-8] + struct.pack(">I", 999) + b"abcd"
    decoder = Decoder("responses")
    decoder.feed(bad)
    with pytest.raises(ProtocolError, match="past the frame"):
        decoder.next_message()


@SETTINGS
@given(st.binary(max_size=400), st.sampled_from(["requests", "responses"]))
def test_random_bytes_give_messages_or_protocol_error(data: bytes, direction: str) -> None:
    _fuzz(direction, data)


@SETTINGS
@given(st.lists(requests | responses, min_size=1, max_size=3), st.data())
def test_mutated_frames_give_messages_or_protocol_error(messages: list[object],
                                                        data: st.DataObject) -> None:
    wire = bytearray(b"".join(m.encode() for m in messages))  # type: ignore[attr-defined]
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(wire) - 1))
        op = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if op == "flip":
            wire[pos] ^= data.draw(st.integers(1, 255))
        elif op == "drop":
            del wire[pos]
        else:
            wire.insert(pos, data.draw(st.integers(0, 255)))
        if not wire:
            break
    for direction in ("requests", "responses"):
        _fuzz(direction, bytes(wire))


def _fuzz(direction: str, data: bytes) -> None:
    """Messages or ProtocolError, and next_messages() decodes exactly what
    next_message() does, failing at the same frame."""
    one_by_one: list[object] = []
    decoder = Decoder(direction, max_frame_bytes=4096)  # type: ignore[arg-type]
    try:
        decoder.feed(data)
        for message in decoder:
            assert message is not None
            one_by_one.append(message)
    except ProtocolError:
        pass
    batched = Decoder(direction, max_frame_bytes=4096)  # type: ignore[arg-type]
    batch: list[object] = []
    try:
        batched.feed(data)
        batch = list(batched.next_messages())
    except ProtocolError:
        pass
    assert batch == one_by_one
    assert (batched.error is None) == (decoder.error is None)
    assert batched.buffered_bytes == decoder.buffered_bytes


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_entry_digest_round_trip_and_tamper_detection(digest_type: DigestType) -> None:
    manager = DigestManager(7, digest_type, b"secret")
    entry = manager.encode(3, 2, 100, b"payload")
    header, payload = manager.verify(entry, 3)
    assert (header.ledger_id, header.entry_id, header.lac, header.length) == (7, 3, 2, 100)
    assert bytes(payload) == b"payload"
    with pytest.raises(DigestMismatchError):
        manager.verify(entry, 4)  # another entry id
    with pytest.raises(DigestMismatchError):
        DigestManager(8, digest_type, b"secret").verify(entry)  # another ledger
    if digest_type is not DigestType.NONE:
        tampered = entry[:-1] + bytes([entry[-1] ^ 1])
        with pytest.raises(DigestMismatchError):
            manager.verify(tampered, 3)


def test_hmac_digest_depends_on_password() -> None:
    entry = DigestManager(1, DigestType.HMAC_SHA1, b"a").encode(0, -1, 1, b"x")
    with pytest.raises(DigestMismatchError):
        DigestManager(1, DigestType.HMAC_SHA1, b"b").verify(entry, 0)


def test_master_key_is_bookkeepers_sha1_of_ledger_and_password() -> None:
    import hashlib
    assert master_key(b"pw") == hashlib.sha1(b"ledgerpw").digest()
    assert len(master_key(b"")) == 20


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verify_payload_agrees_with_verify(digest_type: DigestType) -> None:
    manager = DigestManager(7, digest_type, b"secret")
    entry = manager.encode(3, 2, 100, b"payload")
    assert manager.verify_payload(entry, 3) == b"payload"
    with pytest.raises(DigestMismatchError):
        manager.verify_payload(entry, 4)
    with pytest.raises(DigestMismatchError):
        manager.verify_payload(entry[:10], 3)
    if digest_type is not DigestType.NONE:
        with pytest.raises(DigestMismatchError):
            manager.verify_payload(entry[:-1] + bytes([entry[-1] ^ 1]), 3)


def _reference_prefix(manager: DigestManager, entries: list[bytes], first: int,
                      max_count: int) -> list[bytes]:
    out = []
    for offset, entry in enumerate(entries[:max_count]):
        try:
            out.append(manager.verify_payload(entry, first + offset))
        except DigestMismatchError:
            break
    return out


@SETTINGS
@given(digest_type=st.sampled_from(list(DigestType)),
       payloads=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6),
       max_count=st.integers(1, 8), damage=st.data())
def test_verify_records_returns_the_verified_prefix(
        digest_type: DigestType, payloads: list[bytes], max_count: int,
        damage: st.DataObject) -> None:
    """verify_records over a batch's entry list agrees, entry for entry, with
    verify_payload on each entry: the prefix up to the first failure."""
    manager = DigestManager(7, digest_type, b"secret")
    entries = [manager.encode(10 + i, 9 + i, 0, p) for i, p in enumerate(payloads)]
    victim = damage.draw(st.integers(-1, len(entries) - 1))
    if victim >= 0:
        kind = damage.draw(st.sampled_from(["flip", "other id", "short", "other ledger"]))
        entry = bytearray(entries[victim])
        if kind == "flip":
            at = damage.draw(st.integers(0, len(entry) - 1))
            entry[at] ^= 1
        elif kind == "other id":
            entry[8:16] = struct.pack(">q", 99)
        elif kind == "other ledger":
            entry[0:8] = struct.pack(">q", 8)
        else:
            del entry[damage.draw(st.integers(0, len(entry) - 1)):]
        entries[victim] = bytes(entry)
    records = BatchReadResponse.from_entries(1, StatusCode.OK, 7, 10, entries).records
    got = manager.verify_records(records, 10, max_count)
    assert got == _reference_prefix(manager, entries, 10, max_count)
    if victim < 0:
        assert got == payloads[:max_count]


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verify_records_stops_at_a_corrupt_payload(digest_type: DigestType) -> None:
    manager = DigestManager(7, digest_type, b"secret")
    entries = [manager.encode(10 + i, 9 + i, 0, b"payload %d" % i) for i in range(4)]
    entries[2] = entries[2][:-1] + bytes([entries[2][-1] ^ 1])
    records = BatchReadResponse.from_entries(1, StatusCode.OK, 7, 10, entries).records
    got = manager.verify_records(records, 10, 10)
    if digest_type is DigestType.NONE:
        assert len(got) == 4  # nothing to check the payload against
    else:
        assert got == [b"payload 0", b"payload 1"]
