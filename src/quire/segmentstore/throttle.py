"""The tier-1 ceiling: appends slowed, never refused, when tier-1 holds too much.

A container's tier-1 log keeps every frame from its last truncation point
(a checkpoint whose every byte tier-2 holds) on: while tier-2 is
unavailable it only grows.  :class:`Tier1Throttle` bounds it at
``tier1_ceiling_bytes`` (the container's setting), with tier-2 only (without
tier-2 nothing is ever truncated and there is nothing to wait for):

* at half the ceiling it is under **pressure**: the storage writer flushes
  every unflushed byte at once, whatever its thresholds, so the log can be
  truncated;
* past the ceiling it is **throttled**: an append is still taken, logged and
  made durable in order, but its acknowledgement is held until the log is
  back under the ceiling (:meth:`Tier1Throttle.hold`).  A client sees slower
  acks, never an error; its own window of appends in flight (the segment
  server stops reading a connection with too many outstanding) then stops
  it, so the log goes past the ceiling by at most what clients have in
  flight.  Table updates are not held: the storage writer records its
  layouts with them.

The throttle is checked once per committed frame and once per truncation
(:meth:`Tier1Throttle.update`), never per append; an append pays one
attribute test while it is off.  Throttling is logged when it starts and
ends and shown in ``quire segmentstore status`` and on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("quire.segmentstore.throttle")


class Tier1Throttle:
    """See the module docstring.  ``used()`` is the log's bytes now; the
    throttle is off until :attr:`active` is set (the container has tier-2)."""

    def __init__(self, container_id: int, ceiling_bytes: int, used: Callable[[], int],
                 now_ms: Callable[[], int]) -> None:
        self.container_id = container_id
        self.ceiling_bytes = ceiling_bytes
        self._used = used
        self._now_ms = now_ms
        self.active = False
        self.throttled = False
        """Past the ceiling: acknowledgements are held."""
        self.throttled_since_ms: int | None = None
        self.held_total = 0
        """Appends whose acknowledgement was held, since the container opened."""
        self._held: collections.deque[tuple[asyncio.Future[Any], asyncio.Future[Any]]] = \
            collections.deque()

    @property
    def pressure(self) -> bool:
        """At half the ceiling or more: flush everything now."""
        return self.active and 2 * self._used() >= self.ceiling_bytes

    def update(self) -> None:
        """Throttle or release by the log's bytes now."""
        over = self.active and self._used() > self.ceiling_bytes
        if over == self.throttled:
            return
        self.throttled = over
        if over:
            self.throttled_since_ms = self._now_ms()
            log.warning("container %d: tier-1 holds %d bytes, over its ceiling of %d: "
                        "appends are acknowledged once tier-2 takes the backlog",
                        self.container_id, self._used(), self.ceiling_bytes)
            return
        log.warning("container %d: tier-1 back under its ceiling (%d bytes): appends "
                    "acknowledged at once again", self.container_id, self._used())
        self.throttled_since_ms = None
        self._release()

    def hold(self, durable: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """A future completing as ``durable`` does, once the throttle is off too."""
        held: asyncio.Future[Any] = durable.get_loop().create_future()
        self.held_total += 1

        def arrived(_done: asyncio.Future[Any]) -> None:
            if self.throttled:
                self._held.append((durable, held))
            else:
                _settle(durable, held)
        durable.add_done_callback(arrived)
        return held

    def _release(self) -> None:
        held = self._held
        while held and not self.throttled:
            durable, out = held.popleft()
            _settle(durable, out)

    def release_all(self) -> None:
        """The container closes: nothing is held any longer."""
        self.throttled = False
        self._release()


def _settle(durable: asyncio.Future[Any], out: asyncio.Future[Any]) -> None:
    if out.done():
        return
    if durable.cancelled():
        out.cancel()
    elif durable.exception() is not None:
        out.set_exception(durable.exception())  # type: ignore[arg-type]
    else:
        out.set_result(durable.result())
