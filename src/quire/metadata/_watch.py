"""The driver side of a watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from quire.metadata.store import Watch

T = TypeVar("T")

_UNSEEN = object()


class Subscription(Generic[T]):
    """Delivers values to one watch callback on the loop that created it,
    skipping a value whose fingerprint equals the last one delivered.

    Create and :meth:`offer` on the event loop thread.
    """

    def __init__(self, callback: Callable[[T], None],
                 on_cancel: Callable[[Subscription[T]], None]) -> None:
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._seen: object = _UNSEEN
        self.watch = Watch(lambda: on_cancel(self))

    def offer(self, value: T, fingerprint: object) -> None:
        """Schedule ``callback(value)`` unless ``fingerprint`` was the last seen."""
        if self.watch.cancelled or fingerprint == self._seen:
            return
        self._seen = fingerprint
        self._loop.call_soon(self._deliver, value)

    def _deliver(self, value: T) -> None:
        if not self.watch.cancelled:
            self._callback(value)
