"""A storage writer's health: its failures, said once, counted, and its retries.

The storage writer (:mod:`~quire.segmentstore.storage_writer`) never gives
up on tier-2 while its container is owned: a failed flush iteration is
tried again after a capped exponential backoff.  :class:`FlushHealth`
keeps what that needs and what an operator sees of it:

* each failure is **logged once per distinct cause** (the error's type,
  the segment and the flush step it failed at: :func:`mark_step` names
  them as the error passes through a step), with its message, so a
  tier-2 down for an hour is a handful of lines, not one per retry; a
  new cause after a recovery is logged again;
* every failure is **counted** by cause (the error's type) in
  :attr:`FlushHealth.counts`, the segment store's
  ``quire_segmentstore_tier2_flush_failures_total{cause}``;
* the container is **degraded** from the first failure of a streak until
  an iteration succeeds: ``degraded: tier-2 unavailable since <UTC>
  (<cause>)`` in ``quire segmentstore status`` and the
  ``quire_segmentstore_container_degraded`` gauge;
* :meth:`FlushHealth.failed` gives the pause before the next attempt:
  ``retry_initial_ms``, doubling, at most ``retry_max_ms``.
"""

from __future__ import annotations

import collections
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quire.errors import QuireError

log = logging.getLogger("quire.segmentstore.storage_writer")

_STEP_ATTRIBUTE = "quire_flush_step"


def mark_step(error: BaseException, step: str, segment: str) -> None:
    """Say that ``error`` failed flush step ``step`` of ``segment`` (the
    innermost step it passes through names it)."""
    if not hasattr(error, _STEP_ATTRIBUTE):
        setattr(error, _STEP_ATTRIBUTE, (step, segment))


def step_of(error: BaseException) -> tuple[str, str]:
    """``(step, segment)`` that :func:`mark_step` gave ``error`` (``("iteration", "")``
    if none did)."""
    found = getattr(error, _STEP_ATTRIBUTE, None)
    return found if isinstance(found, tuple) else ("iteration", "")


def utc(ms: int) -> str:
    """A wall-clock time in milliseconds as ISO 8601 UTC, to the second."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Degraded:
    """Since when an iteration last succeeded, and the latest failure."""

    since_ms: int
    cause: str
    """The error's type."""
    message: str
    step: str
    segment: str
    failures: int
    """Failed attempts since the last success."""


class FlushHealth:
    """One container's storage-writer health (see the module docstring).
    ``counts`` is shared by every writer of a segment store (its metric)."""

    def __init__(self, container_id: int, now_ms: Callable[[], int], retry_initial_ms: int,
                 retry_max_ms: int, counts: collections.Counter[str] | None = None) -> None:
        self.container_id = container_id
        self._now_ms = now_ms
        self._initial_ms = retry_initial_ms
        self._max_ms = retry_max_ms
        self.counts: collections.Counter[str] = counts if counts is not None \
            else collections.Counter()
        self.degraded: Degraded | None = None
        self._said: set[tuple[str, str, str]] = set()

    def failed(self, error: BaseException) -> float:
        """Note a failed attempt (logged once per cause, counted); the pause
        before the next one, in seconds."""
        cause = type(error).__name__
        step, segment = step_of(error)
        self.counts[cause] += 1
        previous = self.degraded
        failures = 1 if previous is None else previous.failures + 1
        since = self._now_ms() if previous is None else previous.since_ms
        message = str(error)[:500]
        self.degraded = Degraded(since, cause, message, step, segment, failures)
        key = (cause, segment, step)
        if key not in self._said:
            self._said.add(key)
            expected = isinstance(error, QuireError)
            log.log(logging.WARNING if expected else logging.ERROR,
                    "container %d: tier-2 flush failed at %s%s: %s: %s (retrying with backoff; "
                    "said once per cause)", self.container_id, step,
                    f" of {segment!r}" if segment else "", cause, message,
                    exc_info=None if expected else error)
        return float(min(self._initial_ms * 2 ** min(failures - 1, 30), self._max_ms)) / 1000

    def recovered(self) -> None:
        """An iteration succeeded: healthy again."""
        degraded = self.degraded
        if degraded is not None:
            log.warning("container %d: tier-2 flushing resumed after %d failed attempt(s) "
                        "since %s", self.container_id, degraded.failures, utc(degraded.since_ms))
            self.degraded = None
            self._said.clear()

    def status(self) -> str:
        """``ok``, or ``degraded: tier-2 unavailable since <UTC> (<cause>)``."""
        degraded = self.degraded
        if degraded is None:
            return "ok"
        return (f"degraded: tier-2 unavailable since {utc(degraded.since_ms)} "
                f"({degraded.cause} at {degraded.step}: {degraded.message[:200]})")

    def as_json(self) -> dict[str, Any]:
        degraded = self.degraded
        if degraded is None:
            return {"status": "ok"}
        return {"status": self.status(), "degraded_since": utc(degraded.since_ms),
                "cause": degraded.cause, "message": degraded.message, "step": degraded.step,
                "segment": degraded.segment, "failures": degraded.failures}
