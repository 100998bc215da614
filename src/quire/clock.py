"""Wall-clock time, one seam: :class:`Clock`.

What stamps records and decides leases, epochs, retention and ages asks a
:class:`Clock` for wall time in whole milliseconds since the Unix epoch.
The product uses :data:`SYSTEM_CLOCK`; the controller and the segment
containers take a clock as a constructor argument so that a test (or a
deterministic simulation) can hand them a clock of its own, such as
:class:`quire.testing.clock.ManualClock`.

Durations and timeouts are not measured here: they use the event loop's
monotonic clock (``loop.time()``), which the simulation already replaces
with virtual time (:mod:`quire.simulation.loop`).

This module imports nothing from the rest of Quire: every layer may use it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A wall clock.

    Contract: :meth:`wall_ms` is the current wall time in whole
    milliseconds since the Unix epoch.  It may stand still between calls and,
    like any wall clock (NTP, an operator), it may jump in either direction:
    callers that compare two readings must tolerate a negative difference.
    """

    def wall_ms(self) -> int:
        """The wall time now, in milliseconds since the Unix epoch."""
        ...


class SystemClock:
    """The host's wall clock (``time.time_ns``)."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK: Clock = SystemClock()
"""The one system clock the product uses by default."""
