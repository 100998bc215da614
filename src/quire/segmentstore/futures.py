"""Small helpers for the futures the segment store hands out.

A mutating request of the store is a plain method returning a future (so
requests are ordered by call, not by await); a request refused when it is
called fails its future rather than raising (:func:`call_as_future`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from quire.errors import ContainerClosedError, QuireError

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


def refused_after(durable: asyncio.Future[Any], error: QuireError) -> asyncio.Future[Any]:
    """A future failing with ``error`` once ``durable`` (a probe, or the
    log's barrier) is done; with its failure instead if it failed."""
    refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def answer(done: asyncio.Future[Any]) -> None:
        if refused.done():
            return
        if done.cancelled():
            refused.set_exception(ContainerClosedError("the container closed before its "
                                                       "operations were durable"))
        else:
            refused.set_exception(done.exception() or error)
    durable.add_done_callback(answer)
    return refused


def call_as_future(make: Callable[[], asyncio.Future[T]],
                   barrier: Callable[[], asyncio.Future[Any]] | None = None
                   ) -> asyncio.Future[T]:
    """``make()``'s future, or a future failed with the :class:`QuireError`
    it raised.

    With ``barrier`` (a future done once everything accepted so far is
    durable), that refusal is answered only once the barrier is done, and
    with the log's failure if it fails: a refusal read from a container's
    accepted state (sealed, exists, no such segment, a wrong offset or
    version) may rest on an operation still in flight, which can yet fail
    (its owner fenced), and a retried request takes such a refusal for its
    first attempt's success: a seal retried heard "sealed" of a seal that
    never became durable (the stream simulation, seed 108706), a create
    "exists" (seed 104318)."""
    try:
        return make()
    except QuireError as e:
        return refused(e, barrier)


def refused(error: QuireError, barrier: Callable[[], asyncio.Future[Any]] | None = None
            ) -> asyncio.Future[Any]:
    """A future failing with ``error``: at once, or with ``barrier`` once it
    is done (see :func:`call_as_future`)."""
    if barrier is None:
        return failed_future(error)
    try:
        durable = barrier()
    except QuireError as failure:  # the container failed or closed: that is the answer
        return failed_future(failure)
    return refused_after(durable, error)
