"""The in-memory twin of :class:`quire.clock.Clock`: time moves when told."""

from __future__ import annotations


class ManualClock:
    """A :class:`~quire.clock.Clock` that reads :attr:`now_ms`, which the
    test sets (or moves with :meth:`advance`); nothing else changes it."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def wall_ms(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        """Move the time ``ms`` milliseconds (negative: a jump back)."""
        self.now_ms += ms
