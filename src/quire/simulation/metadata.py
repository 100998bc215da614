"""The metadata store of a simulated cluster: the real in-memory store, with
delays that let CAS operations race, and (for the stream layer) one view
per node that can be cut off from the store.

:class:`SimMetadataStore` is the real :class:`~quire.metadata.memory.MemoryStore`
(its compare-and-set rules, versions and watches unchanged) whose every
transaction, with the run's ``delay_probability``, waits a random virtual
time before it is applied and again before its caller hears the result: a
writer's ensemble change, a recoverer's IN_RECOVERY and CLOSED updates and
another recoverer's can then interleave in any order, each deciding on a
version that may be stale by the time its CAS lands, as with a remote store
under load.  Its lease never expires: the ledger layer's bookies and
clients keep theirs for the whole run.

:class:`NodeMetadataStore` is one process's session with the store (a
segment store's, a controller's): the same real store over the same shared
data, whose lease (the session behind its leased records: host records,
controller members, elections) expires on the loop's virtual wall clock.
Every transaction is an exchange with the store's node :data:`METADATA`
over the simulated network (:meth:`~quire.simulation.network.SimNetwork.exchange`):
it waits the network's delays, fails when the node is cut off from the
store (after a while, as a client library's timeout would, leaving the
outcome unknown if it was sent), and dies with the process's life.  Cut
off for longer than its lease, a node's session expires for everyone
else while the node itself, once it cannot renew, turns its lease
UNCERTAIN and then EXPIRED, exactly as the store's contract says.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import MetadataError
from quire.metadata._embedded import Txn
from quire.metadata.memory import MemoryStore, _Instance
from quire.simulation.network import AnswerLost, SimNetwork, Unreachable

R = TypeVar("R")
METADATA = "zk"
"""The node the metadata store runs on (a partition can cut any node off it)."""
NEVER_MS = 1 << 40
"""A lease that outlives every run."""


class SimMetadataStore(MemoryStore):
    """See the module docstring (a private store: ``memory://``, unless
    ``instance`` shares one)."""

    def __init__(self, rng: random.Random, *, delay_probability: float,
                 max_delay_ms: float, instance: _Instance | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__("memory://", "", instance or _Instance(), lease_ms=NEVER_MS,
                         poll_interval_ms=200, clock=clock)
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


def _at_once(coro: Coroutine[Any, Any, R]) -> R:
    """The result of a coroutine that never suspends (the in-memory store's
    transactions), run here and now."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: R = done.value
        return result
    coro.close()
    raise RuntimeError("an in-memory metadata transaction suspended")


class NodeMetadataStore(MemoryStore):
    """One node's session with the shared store (module docstring).
    ``timeout_ms``: how long a transaction that cannot reach the store takes
    to fail."""

    def __init__(self, network: SimNetwork, instance: _Instance, clock: Clock, *,
                 lease_ms: int, poll_interval_ms: int = 250, timeout_ms: int = 500) -> None:
        super().__init__("memory://sim", "", instance, lease_ms=lease_ms,
                         poll_interval_ms=poll_interval_ms, clock=clock)
        self._network = network
        self._timeout_s = timeout_ms / 1000

    async def _exchange(self, serve: Callable[[], Coroutine[Any, Any, R]]) -> R:
        try:
            return await self._network.call(METADATA, lambda: _at_once(serve()), "metadata")
        except Unreachable as e:
            await asyncio.sleep(self._timeout_s)  # a client library's timeout
            raise MetadataError(f"metadata store unreachable: {e}") from None
        except AnswerLost as e:
            raise MetadataError(f"metadata store: {e} (outcome unknown)") from None

    async def _write(self, fn: Callable[[Txn], R]) -> R:
        return await self._exchange(lambda: MemoryStore._write(self, fn))

    async def _read(self, fn: Callable[[Txn], R]) -> R:
        return await self._exchange(lambda: MemoryStore._read(self, fn))
