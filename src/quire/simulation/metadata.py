"""The in-memory metadata store, with delays that let CAS operations race.

:class:`SimMetadataStore` is the real :class:`~quire.metadata.memory.MemoryStore`
(its compare-and-set rules, versions and watches unchanged) whose every
transaction, with the run's ``delay_probability``, waits a random virtual
time before it is applied and again before its caller hears the result: a
writer's ensemble change, a recoverer's IN_RECOVERY and CLOSED updates and
another recoverer's can then interleave in any order, each deciding on a
version that may be stale by the time its CAS lands, as with a remote store
under load.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TypeVar

from quire.metadata._embedded import Txn
from quire.metadata.memory import MemoryStore, _Instance

R = TypeVar("R")


class SimMetadataStore(MemoryStore):
    """See the module docstring (a private store: ``memory://``)."""

    def __init__(self, rng: random.Random, *, delay_probability: float,
                 max_delay_ms: float) -> None:
        super().__init__("memory://", "", _Instance(), lease_ms=1 << 40, poll_interval_ms=200)
        self.rng = rng
        self.delay_probability = delay_probability
        self.max_delay_ms = max_delay_ms

    async def _delay(self) -> None:
        if self.delay_probability and self.rng.random() < self.delay_probability:
            await asyncio.sleep(self.rng.uniform(0.0, self.max_delay_ms) / 1000.0)

    async def _write(self, fn: Callable[[Txn], R]) -> R:
        await self._delay()
        result = await super()._write(fn)
        await self._delay()
        return result

    async def _read(self, fn: Callable[[Txn], R]) -> R:
        await self._delay()
        result = await super()._read(fn)
        await self._delay()
        return result

