"""A segment store's refusals as Quire's errors: :func:`error_of` maps a
reply that is not the expected one (``NoSuchSegment``, ``SegmentIsSealed``,
``TableKeyBadVersion``, a refused delegation token, ...) to the error the
in-process :class:`~quire.segmentstore.SegmentStore` raises for the same
refusal, so code written against either works unchanged; :func:`expect`
returns the expected reply or raises that error."""

from __future__ import annotations

from typing import TypeVar

from quire.errors import (
    BadOffsetError,
    InvalidNameError,
    PermissionDeniedError,
    ProtocolError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentQuarantinedError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
    TokenExpiredError,
)
from quire.pravega_wire import (
    KEY_NO_VERSION,
    KEY_NOT_EXISTS,
    AuthTokenCheckFailed,
    ConditionalCheckFailed,
    ErrorMessage,
    NoSuchSegment,
    OperationUnsupported,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    TableKeyBadVersion,
    TableKeyDoesNotExist,
    TableSegmentNotEmpty,
    WireCommand,
)
from quire.segmentstore import NOT_EXISTS
from quire.streams.tokens import TOKEN_EXPIRED_CODE

T = TypeVar("T")


def wire_version(expected_version: int | None) -> int:
    """A store's expected table version as a wire key version."""
    if expected_version is None:
        return KEY_NO_VERSION
    if expected_version == NOT_EXISTS:
        return KEY_NOT_EXISTS
    return expected_version


def error_of(reply: WireCommand, segment: str) -> Exception:
    """The segment store error a refusal reply stands for."""
    match reply:
        case NoSuchSegment():
            return SegmentNotFoundError(f"no such segment {segment!r}")
        case SegmentIsSealed():
            return SegmentSealedError(f"segment {segment!r} is sealed")
        case SegmentIsTruncated(start_offset=start):
            return SegmentTruncatedError(f"segment {segment!r} starts at {start}", start)
        case SegmentAlreadyExists():
            return SegmentExistsError(f"segment {segment!r} exists")
        case TableKeyBadVersion():
            return TableKeyBadVersionError(f"table {segment!r}: a key's version moved")
        case TableKeyDoesNotExist():
            return TableKeyNotFoundError(f"table {segment!r}: a key does not exist")
        case TableSegmentNotEmpty():
            return SegmentStoreError(f"table {segment!r} is not empty")
        case ConditionalCheckFailed():
            return BadOffsetError(f"segment {segment!r}: conditional append refused "
                                  "(its length is not the expected offset)", -1, -1)
        case OperationUnsupported(operation_name=name):
            return SegmentStoreError(f"segment store does not support {name}")
        case ErrorMessage(message=message, error_code=0):  # ILLEGAL_ARGUMENT_EXCEPTION
            return InvalidNameError(message)
        case ErrorMessage(message=message) if "is quarantined" in message:
            return SegmentQuarantinedError(message)
        case ErrorMessage(message=message):
            return SegmentStoreError(f"segment {segment!r}: {message}")
        case AuthTokenCheckFailed(server_stack_trace=why, error_code=code):
            kind = TokenExpiredError if code == TOKEN_EXPIRED_CODE else PermissionDeniedError
            return kind(f"segment {segment!r}: the segment store refused the delegation "
                        f"token: {why}")
    return ProtocolError(f"unexpected {type(reply).__name__} for segment {segment!r}")


def expect(reply: WireCommand, kind: type[T], segment: str) -> T:
    if isinstance(reply, kind):
        return reply
    raise error_of(reply, segment)
