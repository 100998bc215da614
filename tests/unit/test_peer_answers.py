"""quire.peer.answers.outcome: the one place a bookie's answer becomes a
response or a typed error.  Only NO_SUCH_LEDGER and NO_SUCH_ENTRY may come
out as explicit negatives; UNKNOWN, unknown codes and unexpected answers
never do."""

from __future__ import annotations

import pytest

from quire.errors import (
    EXPLICIT_NEGATIVES,
    BookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    StatusCode,
    UnexpectedResponseError,
    UnknownStateError,
    error_for_status,
)
from quire.peer.answers import add_refusal, outcome
from quire.protocol import (
    AddResponse,
    BatchReadResponse,
    Decoder,
    ErrorResponse,
    OpCode,
    ReadLacResponse,
    ReadResponse,
    SyncResponse,
    WriteLacResponse,
)

NOT_OK = [status for status in StatusCode if status != StatusCode.OK]


def test_an_ok_answer_of_the_expected_type_is_the_response() -> None:
    answer = ReadLacResponse(1, StatusCode.OK, 7, 41)
    assert outcome(answer, ReadLacResponse, "b1") is answer


@pytest.mark.parametrize("status", NOT_OK, ids=lambda s: s.name)
def test_each_status_becomes_its_error(status: StatusCode) -> None:
    error = outcome(ReadResponse(1, status, 7, 3), ReadResponse, "b1")
    assert type(error) is error_for_status(status)
    assert error.status == status
    assert "b1" in str(error) and status.name in str(error)


@pytest.mark.parametrize("status", NOT_OK, ids=lambda s: s.name)
def test_a_bare_error_for_the_op_becomes_its_status_error(status: StatusCode) -> None:
    error = outcome(ErrorResponse(OpCode.SYNC, 1, status), SyncResponse, "b1")
    assert type(error) is error_for_status(status)


@pytest.mark.parametrize("status", NOT_OK, ids=lambda s: s.name)
def test_only_the_two_explicit_negatives_come_out_as_a_no(status: StatusCode) -> None:
    error = outcome(ReadResponse(1, status, 7, 3), ReadResponse, "b1")
    assert isinstance(error, EXPLICIT_NEGATIVES) == (
        status in (StatusCode.NO_SUCH_LEDGER, StatusCode.NO_SUCH_ENTRY))
    assert isinstance(error, NoSuchLedgerError) == (status == StatusCode.NO_SUCH_LEDGER)
    assert isinstance(error, NoSuchEntryError) == (status == StatusCode.NO_SUCH_ENTRY)


def test_a_status_code_this_build_does_not_know_is_unknown_never_a_no() -> None:
    frame = bytearray(ReadLacResponse(1, StatusCode.NO_SUCH_LEDGER, 7).encode())
    frame[16:20] = (4242).to_bytes(4, "big")  # status: after len, header, request id
    decoder = Decoder("responses")
    decoder.feed(bytes(frame))
    answer = decoder.next_message()
    assert isinstance(answer, ReadLacResponse)
    error = outcome(answer, ReadLacResponse, "b1")
    assert isinstance(error, UnknownStateError)
    assert not isinstance(error, EXPLICIT_NEGATIVES)


@pytest.mark.parametrize("answer", [
    ReadResponse(1, StatusCode.NO_SUCH_ENTRY, 7, 3),  # a negative, but for another op
    WriteLacResponse(1, StatusCode.OK, 7),
    ErrorResponse(OpCode.READ_ENTRY, 1, StatusCode.NO_SUCH_LEDGER),  # bare error, another op
    ErrorResponse(OpCode.READ_LAC, 1, StatusCode.OK),  # a bare error saying OK
], ids=["negative-of-another-op", "ok-of-another-op", "bare-error-of-another-op", "bare-ok"])
def test_an_unexpected_answer_is_an_error_and_never_a_no(answer: object) -> None:
    error = outcome(answer, ReadLacResponse, "b1")  # type: ignore[arg-type]
    assert isinstance(error, UnexpectedResponseError)
    assert isinstance(error, BookieError) and not isinstance(error, EXPLICIT_NEGATIVES)


@pytest.mark.parametrize("expected", [AddResponse, ReadResponse, ReadLacResponse,
                                      WriteLacResponse, BatchReadResponse, SyncResponse])
def test_every_typed_call_maps_a_refusal_of_its_own_op(expected: type) -> None:
    error = outcome(ErrorResponse(expected.op, 1, StatusCode.FENCED), expected, "b1")
    assert error.status == StatusCode.FENCED  # type: ignore[union-attr]


def test_a_raw_add_refusal_becomes_its_status_error() -> None:
    error = add_refusal((1, int(StatusCode.FENCED), 7, 3, -1), "b1")
    assert error.status == StatusCode.FENCED and "ledger 7" in str(error)
    assert isinstance(add_refusal((1, 999, 7, 3, -1), "b1"), UnknownStateError)
