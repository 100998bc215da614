"""A bookie's answer to a request, made a response or a typed error: the one
place that decides what an answer means.

:func:`outcome` takes the decoded answer and the response type the request
calls for.  An answer of that type with status OK is the response.  Any
other answer becomes a :class:`~quire.errors.BookieError`:

* a non-OK status, in the expected response or in a bare error
  (:class:`~quire.protocol.ErrorResponse`) for the request's op, becomes the
  status's error class (:func:`~quire.errors.error_for_status`): only
  NO_SUCH_LEDGER and NO_SUCH_ENTRY become the explicit negatives
  :class:`~quire.errors.NoSuchLedgerError` and
  :class:`~quire.errors.NoSuchEntryError`; a status this build does not know
  was decoded as UNKNOWN and becomes
  :class:`~quire.errors.UnknownStateError`;
* anything else (another op's response, a bare error for another op or
  saying OK) becomes :class:`~quire.errors.UnexpectedResponseError`, an
  unknown like a timeout: never a no, whatever status it carries.

Failures without an answer (timeouts, lost connections, a closed client) are
the connection's: they never reach this module.
"""

from __future__ import annotations

from typing import TypeVar

from quire.errors import BookieError, StatusCode, UnexpectedResponseError, error_for_status
from quire.protocol import (
    AddResponse,
    BatchReadResponse,
    ErrorResponse,
    RawAddAnswer,
    ReadLacResponse,
    ReadResponse,
    Response,
    SyncResponse,
    WriteLacResponse,
    add_response_of,
)

Expected = TypeVar("Expected", AddResponse, ReadResponse, ReadLacResponse, WriteLacResponse,
                   BatchReadResponse, SyncResponse)
"""The response types a typed call waits for."""

_OK = StatusCode.OK


def outcome(answer: Response, expected: type[Expected], bookie_id: str) -> Expected | BookieError:
    """``answer`` itself when it is an ``expected`` with status OK, else the
    error it stands for (see the module docstring)."""
    if type(answer) is expected and answer.status == _OK:
        return answer
    return refusal(answer, expected, bookie_id)


def refusal(answer: Response, expected: type[Expected], bookie_id: str) -> BookieError:
    """The error of an answer that is not an OK ``expected``."""
    op = expected.op
    if type(answer) is expected or (type(answer) is ErrorResponse and answer.op_code == op):
        status = answer.status
        if status != _OK:
            return error_for_status(status)(f"bookie {bookie_id} answered {status.name} to "
                                            f"{op.name}{_of_ledger(answer)}")
    return UnexpectedResponseError(f"bookie {bookie_id} answered {op.name} with {answer!r}")


def add_refusal(answer: RawAddAnswer, bookie_id: str) -> BookieError:
    """The error of a raw ADD_ENTRY answer whose status is not OK."""
    return refusal(add_response_of(answer), AddResponse, bookie_id)


def _of_ledger(answer: Response) -> str:
    ledger_id = getattr(answer, "ledger_id", None)
    return "" if ledger_id is None else f" of ledger {ledger_id}"
