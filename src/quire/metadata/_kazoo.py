"""The ``zk://`` driver's bridge from kazoo to asyncio.

kazoo completes requests and fires watches on its own threads; both are
handed to the event loop with ``call_soon_threadsafe``.  A request with no
answer within twice the session timeout raises MetadataError (outcome
unknown); kazoo's errors become the store's (NoAuth:
MetadataAccessDeniedError, with a hint at the fix).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)

from quire.errors import (
    MetadataAccessDeniedError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
)

Trigger = Callable[[Any], None]
"""A kazoo watch function (called once, on a kazoo thread)."""


class KazooBridge:
    """Requests to one kazoo client, awaited on the event loop that
    creates this (see the module docstring)."""

    def __init__(self, uri: str, client: KazooClient, *, session_timeout_ms: int,
                 denied_hint: str = "") -> None:
        self.uri = uri
        self.client = client
        self.denied_hint = denied_hint
        """What a NoAuth's error says to do."""
        self.loop = asyncio.get_running_loop()
        self.timeout_s = 2 * session_timeout_ms / 1000
        """How long a request may go unanswered."""

    def hand_over(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the event loop (called from kazoo threads)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(fn, *args)

    async def call(self, what: str, request: Callable[..., Any], *args: Any,
                   **kwargs: Any) -> Any:
        """Await a kazoo ``*_async`` request; kazoo errors become MetadataErrors
        naming ``what``."""
        future: asyncio.Future[Any] = self.loop.create_future()
        try:
            request(*args, **kwargs).rawlink(
                lambda result: self.hand_over(_settle, future, result))
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            raise MetadataError(f"{self.uri}: {what}: no answer within {self.timeout_s:g} s, "
                                "outcome unknown") from None
        except KazooException as e:
            raise self.error(what, e) from e

    def error(self, what: str, e: Exception) -> MetadataError:
        """The store's error for kazoo's ``e`` about ``what``."""
        if isinstance(e, NoNodeError):
            return MetadataNotFoundError(f"{what} does not exist")
        if isinstance(e, NodeExistsError):
            return MetadataExistsError(f"{what} already exists")
        if isinstance(e, BadVersionError):
            return MetadataVersionError(f"{what}: version mismatch")
        if isinstance(e, NoAuthError):
            return MetadataAccessDeniedError(
                f"{self.uri}: {what}: ZooKeeper refused access (NoAuth): {self.denied_hint}"
                .rstrip(": "))
        return MetadataError(f"{self.uri}: {what}: {type(e).__name__} {e}".rstrip())

    def session(self) -> int | None:
        """The id of the client's current session (None: none yet)."""
        client_id = self.client.client_id
        return None if client_id is None else int(client_id[0])


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    """Copy a finished kazoo result into ``future`` (on the event loop)."""
    if future.done():
        return
    try:
        future.set_result(result.get(block=False))
    except Exception as e:
        future.set_exception(e)


def shutdown(client: KazooClient) -> None:
    """Stop and close ``client`` (blocking: run it in a thread)."""
    client.stop()
    client.close()
