"""The faults of a stream-layer run: which ones it has (:class:`StreamFaults`)
and the nemesis that injects them (:class:`StreamNemesis`).

Each fault is on with a probability per run, then picked by weight:

* ``store-crashes``, ``controller-crashes``: a process killed (``kill -9``)
  and restarted later (at most two segment stores and one controller down
  at once); every segment store crash is a crash point where ``quire tier2
  check`` runs on tier-2 as it is at that instant;
* ``bookie-crashes``: a bookie loses power (its unsynced journal records)
  and comes back later (one at a time: the containers' logs are E3 W3 A2
  over four bookies);
* ``partitions``: the link between any two parties cut (segment stores,
  controllers, clients, bookies, the metadata store, tier-2), or one node
  cut off from all the others, until healed;
* ``pauses``: a segment store or controller hangs (its traffic and timers
  held) for up to eight seconds, past its lease;
* ``lease-expiry``: a segment store or controller cut off from the metadata
  store for one to two leases (its session expires, its host record or
  membership goes, its containers or leadership move);
* ``tier2-slow``, ``tier2-errors``, ``tier2-outages``, ``tier2-power``:
  tier-2 slow for a while, failing some calls after doing them (outcome
  unknown), refusing every call for a while, losing power (calls in flight
  lost, recent deletes undone);
* ``resets``: one open connection reset; ``slow-network``: slow messages;
* ``clock-jumps``: a process's wall clock jumps (forward or back) and its
  timers fall due early.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from quire.simulation.cluster import SimBookie
from quire.simulation.loop import SimLoop
from quire.simulation.metadata import METADATA
from quire.simulation.streams.controllers import SimController
from quire.simulation.streams.final import check_tier2
from quire.simulation.streams.history import StreamHistory
from quire.simulation.streams.nodes import Cluster, SimProcess, SimSegmentStore
from quire.simulation.tier2 import TIER2, Tier2Faults

STREAM_FAULTS = ("store-crashes", "controller-crashes", "bookie-crashes", "partitions",
                 "pauses", "lease-expiry", "tier2-slow", "tier2-errors", "tier2-outages",
                 "tier2-power", "resets", "slow-network", "clock-jumps")
"""What ``--faults`` may name for ``--layer streams`` (default: all)."""


@dataclass(frozen=True)
class StreamFaults:
    """This run's faults: each one's weight (0: off)."""

    weights: tuple[tuple[str, float], ...]
    slow_probability: float
    max_delay_ms: float

    @classmethod
    def draw(cls, rng: random.Random, enabled: frozenset[str]) -> StreamFaults:
        chances = {"store-crashes": (3.0, 0.7), "controller-crashes": (1.5, 0.5),
                   "bookie-crashes": (1.5, 0.4), "partitions": (2.0, 0.5),
                   "pauses": (1.0, 0.4), "lease-expiry": (1.0, 0.4), "tier2-slow": (1.0, 0.4),
                   "tier2-errors": (1.0, 0.3), "tier2-outages": (1.0, 0.3),
                   "tier2-power": (1.0, 0.3), "resets": (2.0, 0.6), "clock-jumps": (1.0, 0.3)}
        weights = []
        for name in STREAM_FAULTS:
            if name == "slow-network":
                continue
            weight, chance = chances[name]
            if rng.random() < chance and name in enabled:
                weights.append((name, weight))
        slow = rng.choice((0.002, 0.01)) if rng.random() < 0.4 \
            and "slow-network" in enabled else 0.0
        return cls(tuple(weights), slow, rng.choice((1.0, 5.0, 20.0)))

    def describe(self) -> str:
        parts = [f"{name}={weight}" for name, weight in self.weights]
        if self.slow_probability:
            parts.append(f"slow={self.slow_probability}")
        return " ".join([*parts, f"max_delay_ms={self.max_delay_ms}"])


class StreamNemesis:
    """Injects the run's faults until :meth:`quiesce` (module docstring)."""

    def __init__(self, cluster: Cluster, faults: StreamFaults, stores: list[SimSegmentStore],
                 controllers: list[SimController], bookies: list[SimBookie],
                 clients: list[str], history: StreamHistory) -> None:
        self.cluster = cluster
        self.rng = cluster.rng
        self.faults = faults
        self.stores = stores
        self.controllers = controllers
        self.bookies = bookies
        self.clients = clients
        self.history = history
        self.running = True
        self._processes: list[SimProcess] = [*stores, *controllers]
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def _loop(self) -> SimLoop:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        return loop

    async def run(self) -> None:
        actions = {"store-crashes": self._store, "controller-crashes": self._controller,
                   "bookie-crashes": self._bookie, "partitions": self._partition,
                   "pauses": self._pause, "lease-expiry": self._lease,
                   "tier2-slow": self._tier2_slow, "tier2-errors": self._tier2_errors,
                   "tier2-outages": self._tier2_outage, "tier2-power": self._tier2_power,
                   "resets": self._reset, "clock-jumps": self._clock_jump}
        weighted = [(weight, actions[name]) for name, weight in self.faults.weights]
        self._tasks.append(self._loop.create_task(self._watch_tier2()))
        while self.running and weighted:
            await asyncio.sleep(self.rng.uniform(0.2, 1.2))
            if not self.running:
                break
            (act,) = self.rng.choices([a for _w, a in weighted], weights=[w for w, _a in weighted])
            await act()

    async def _watch_tier2(self) -> None:
        """``quire tier2 check`` at instants the seed picks, besides the crash
        points (PDP-40: tier-2 is consistent whenever it is read)."""
        while self.running:
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
            await check_tier2(self.cluster, self.history,
                              f"at {self._loop.time():.3f} s")

    def _later(self, seconds: float, then: object) -> None:
        async def wait() -> None:
            await asyncio.sleep(seconds)
            if callable(then):
                result = then()
                if asyncio.iscoroutine(result):
                    await result
        self._tasks.append(self._loop.create_task(wait()))

    # --- processes -------------------------------------------------------------------

    async def _crash_or_restart(self, processes: list[SimProcess], most_down: int) -> None:
        down = [p for p in processes if not p.wanted]
        up = [p for p in processes if p.wanted]
        if down and (len(down) >= most_down or self.rng.random() < 0.5):
            await self.rng.choice(down).start()
        elif up:
            victim = self.rng.choice(up)
            victim.crash()
            if isinstance(victim, SimSegmentStore):
                await check_tier2(self.cluster, self.history, f"when {victim.name} crashed")

    async def _store(self) -> None:
        await self._crash_or_restart(list(self.stores), 2)

    async def _controller(self) -> None:
        await self._crash_or_restart(list(self.controllers), 1)

    async def _bookie(self) -> None:
        down = [b for b in self.bookies if not b.up]
        if down:
            await down[0].start()
        else:
            self.rng.choice(self.bookies).crash()

    # --- the network -------------------------------------------------------------------

    def _parties(self) -> list[str]:
        return [*(p.name for p in self._processes), *(b.bookie_id for b in self.bookies),
                *self.clients, METADATA, TIER2]

    async def _partition(self) -> None:
        network, rng = self.cluster.network, self.rng
        if rng.random() < 0.4:
            network.heal()
        elif rng.random() < 0.7:
            a, b = rng.sample(self._parties(), 2)
            network.cut_link(a, b)
        else:
            network.partition(frozenset({rng.choice(self._parties())}))

    async def _pause(self) -> None:
        p = self.rng.choice(self._processes)
        seconds = self.rng.uniform(1.0, 8.0)
        self.cluster.network.pause(p.name, seconds)
        held = self._loop.hold_timers(p.name, seconds)
        self.cluster.trace.event(f"{p.name} hangs ({held} timers held)")

    async def _lease(self) -> None:
        p = self.rng.choice(self._processes)
        network = self.cluster.network
        network.cut_link(p.name, METADATA)
        lease_s = self.cluster.settings.lease_ms / 1000
        self._later(self.rng.uniform(lease_s, 2 * lease_s),
                    lambda: network.heal_link(p.name, METADATA))

    async def _reset(self) -> None:
        self.cluster.network.reset_random()

    async def _clock_jump(self) -> None:
        p = self.rng.choice(self._processes)
        jump_ms = self.rng.randint(-5_000, 30_000)
        clock = getattr(p, "clock", None)
        if clock is not None:
            clock.offset_ms += jump_ms
        moved = self._loop.jump_clock(p.name, max(0, jump_ms) / 1000)
        self.cluster.trace.event(f"clock of {p.name} jumps {jump_ms} ms ({moved} timers)")

    # --- tier-2 ----------------------------------------------------------------------

    def _tier2_for(self, seconds: float, faults: Tier2Faults, what: str) -> None:
        tier2 = self.cluster.tier2
        tier2.faults = faults
        self.cluster.trace.event(f"tier-2 {what} for {seconds:.1f} s")

        def restore() -> None:
            if tier2.faults is faults:
                tier2.faults = Tier2Faults()
        self._later(seconds, restore)

    async def _tier2_slow(self) -> None:
        self._tier2_for(self.rng.uniform(1.0, 6.0),
                        Tier2Faults(slow_ms=self.rng.choice((50.0, 300.0, 1500.0))), "slow")

    async def _tier2_errors(self) -> None:
        self._tier2_for(self.rng.uniform(1.0, 6.0),
                        Tier2Faults(error_probability=self.rng.choice((0.05, 0.3))), "failing")

    async def _tier2_outage(self) -> None:
        self._tier2_for(self.rng.uniform(0.5, 5.0), Tier2Faults(unavailable=True), "unavailable")

    async def _tier2_power(self) -> None:
        self.cluster.tier2.power_loss()
        await check_tier2(self.cluster, self.history, "after tier-2 lost power")

    # --- the end -----------------------------------------------------------------------

    async def quiesce(self) -> None:
        """Faults over: heal, every process up, tier-2 healthy, the network fast."""
        from quire.simulation.network import NetworkConfig

        self.running = False
        for task in self._tasks:
            task.cancel()
        network = self.cluster.network
        network.heal()
        network.end_pauses()
        network.config = NetworkConfig()
        self.cluster.tier2.faults = Tier2Faults()
        for bookie in self.bookies:
            if not bookie.up:
                await bookie.start()
        for p in self._processes:
            if not p.wanted:
                await p.start()
