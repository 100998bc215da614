"""How requests are answered: the connection as its request handlers see it,
and the reply Pravega's client understands for each store error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from quire.errors import (
    ContainerClosedError,
    ContainerFencedError,
    ContainerNotOwnedError,
    CorruptRecordError,
    InvalidNameError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentQuarantinedError,
    SegmentSealedError,
    SegmentTruncatedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.pravega_wire import (
    ErrorMessage,
    NoSuchSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    TableKeyBadVersion,
    TableKeyDoesNotExist,
    WireCommand,
    WrongHost,
)

log = logging.getLogger("quire.segmentserver")

Reply = WireCommand | None
"""What a request is answered with; None: close the connection instead."""
Formatter = Callable[["asyncio.Future[Any]"], Reply]
"""Turns a request's finished future into its reply."""
ILLEGAL_ARGUMENT = 0
"""ErrorMessage's code for an illegal argument (Pravega's
``ILLEGAL_ARGUMENT_EXCEPTION``): a name the naming rule refuses."""
UNSPECIFIED = -1
"""ErrorMessage's code for any other refusal (a quarantined segment)."""
MAX_MESSAGE_CHARS = 1000
"""An error's text sent as a reply's ``server_stack_trace`` is cut to this."""


class ClientConnection(Protocol):
    """One client connection as its request handlers see it
    (:class:`~quire.segmentserver.connection.WireConnection`).

    :meth:`reply` calls ``request`` now (so the store orders it by arrival)
    and, when its turn comes (replies leave in arrival order), answers
    ``ok(result)``, or the reply ``on_error(error)`` gives, or else
    :func:`error_reply`'s; a :class:`~quire.errors.QuireError` raised by
    ``request`` itself is answered the same way.  ``request`` may return a
    future or a coroutine (run as a task).  ``cost`` is what the request
    holds until answered, in bytes (data appended, the most a read may
    answer), charged to the connection's budget.  :meth:`answer` sends a
    reply known at once (still after those before it); :meth:`close`
    closes the connection once what is written is sent; :meth:`abort`
    drops it now."""

    def reply(self, request: Callable[[], Any], ok: Callable[[Any], WireCommand],
              request_id: int, segment: str, offset: int = -1,
              on_error: Callable[[BaseException], Reply] | None = None,
              cost: int = 0, reads_only: bool = False) -> None: ...

    def answer(self, reply: WireCommand) -> None: ...

    def close(self, why: str) -> None: ...

    def abort(self) -> None: ...


def error_reply(error: BaseException, request_id: int, segment: str, offset: int) -> Reply:
    """The reply Pravega's client understands for a store error (None: close)."""
    message = str(error)[:MAX_MESSAGE_CHARS]
    if isinstance(error, ContainerNotOwnedError | ContainerFencedError | ContainerClosedError):
        return WrongHost(request_id, segment, "", message)
    if isinstance(error, InvalidNameError):
        return ErrorMessage(request_id, segment, message, ILLEGAL_ARGUMENT)
    if isinstance(error, SegmentQuarantinedError):
        return ErrorMessage(request_id, segment, message, UNSPECIFIED)
    if isinstance(error, SegmentNotFoundError):
        return NoSuchSegment(request_id, segment, message, offset)
    if isinstance(error, SegmentSealedError):
        return SegmentIsSealed(request_id, segment, message, offset)
    if isinstance(error, SegmentTruncatedError):
        return SegmentIsTruncated(request_id, segment, error.start_offset, message, offset)
    if isinstance(error, SegmentExistsError):
        return SegmentAlreadyExists(request_id, segment, message)
    if isinstance(error, TableKeyBadVersionError):
        return TableKeyBadVersion(request_id, segment, message)
    if isinstance(error, TableKeyNotFoundError):
        return TableKeyDoesNotExist(request_id, segment, message)
    if isinstance(error, QuireError) and not isinstance(error, CorruptRecordError):
        log.warning("request %d on %r refused: %s; closing the connection",
                    request_id, segment, error)
    else:  # a defect, or corrupt data: worth its traceback
        log.error("request %d on %r failed; closing the connection", request_id, segment,
                  exc_info=error)
    return None
