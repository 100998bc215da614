"""Small helpers for the futures the segment store hands out.

A mutating request of the store is a plain method returning a future (so
requests are ordered by call, not by await); a request refused when it is
called fails its future rather than raising (:func:`call_as_future`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from quire.errors import QuireError

T = TypeVar("T")


def retrieve(future: asyncio.Future[Any]) -> None:
    """Mark ``future``'s outcome as seen (a done callback for a future
    nobody awaits, whose failure is reported elsewhere): asyncio then logs
    no "exception was never retrieved"."""
    if not future.cancelled():
        future.exception()


def failed_future(error: BaseException) -> asyncio.Future[Any]:
    """A future failed with ``error`` (on the running loop)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


def call_as_future(make: Callable[[], asyncio.Future[T]]) -> asyncio.Future[T]:
    """``make()``'s future, or a future failed with the :class:`QuireError`
    it raised."""
    try:
        return make()
    except QuireError as e:
        return failed_future(e)
