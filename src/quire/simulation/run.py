"""One simulated run: a seed in, a verdict and a trace out.

:func:`run_seed` builds everything from one ``random.Random(seed)``: which
faults this run has and how often (:class:`Faults`), the network, the
bookies, the workload; runs it on a fresh :class:`~quire.simulation.loop.SimLoop`;
then checks the invariants.  The same seed, in a process with the same
``PYTHONHASHSEED``, gives the same trace line for line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from quire.metadata.memory import open_memory
from quire.simulation.bugs import seeded_bug
from quire.simulation.cluster import SimBookie
from quire.simulation.loop import SimLoop
from quire.simulation.network import NetworkConfig, SimNetwork, current_node
from quire.simulation.trace import Trace
from quire.simulation.workload import Violation, Workload, check

BOOKIES = 5
MAX_DOWN = 2
"""Bookies down at once, at most (so that every shape can still be written)."""
FINAL_RECOVERY_ATTEMPTS = 5


@dataclass(frozen=True)
class Faults:
    """This run's faults: each on with some probability per run, then how
    often the nemesis picks it (weights) and how slow the network is."""

    resets: float
    crashes: float
    partitions: float
    pauses: float
    checkpoints: float
    slow_probability: float
    max_delay_ms: float

    @classmethod
    def draw(cls, rng: random.Random) -> Faults:
        def maybe(weight: float, chance: float) -> float:
            return weight if rng.random() < chance else 0.0
        return cls(resets=maybe(3.0, 0.6), crashes=maybe(2.0, 0.6),
                   partitions=maybe(1.0, 0.4), pauses=maybe(1.0, 0.4),
                   checkpoints=maybe(2.0, 0.7),
                   slow_probability=maybe(rng.choice((0.01, 0.05)), 0.5),
                   max_delay_ms=rng.choice((1.0, 5.0, 30.0)))

    def describe(self) -> str:
        return (f"resets={self.resets} crashes={self.crashes} partitions={self.partitions} "
                f"pauses={self.pauses} "
                f"checkpoints={self.checkpoints} slow={self.slow_probability} "
                f"max_delay_ms={self.max_delay_ms}")


@dataclass
class RunResult:
    seed: int
    violations: list[Violation]
    trace: list[str]
    digest: str
    ledgers: int = 0
    acked: int = 0
    virtual_s: float = 0.0
    error: str = ""
    """An exception that ended the run (a bug in the simulator or a deadlock)."""
    faults: str = field(default="")

    @property
    def ok(self) -> bool:
        return not self.violations and not self.error


class _Nemesis:
    """Injects the run's faults until told to stop."""

    def __init__(self, rng: random.Random, trace: Trace, network: SimNetwork,
                 bookies: list[SimBookie], clients: list[str], faults: Faults) -> None:
        self._rng = rng
        self._clients = clients
        self._trace = trace
        self._network = network
        self._bookies = bookies
        self._faults = faults
        self.running = True

    async def run(self) -> None:
        f = self._faults
        actions = [(f.resets, self._reset), (f.crashes, self._crash_or_restart),
                   (f.partitions, self._partition_or_heal), (f.pauses, self._pause),
                   (f.checkpoints, self._checkpoint)]
        actions = [(w, act) for w, act in actions if w > 0]
        while self.running and actions:
            await asyncio.sleep(self._rng.uniform(0.05, 0.6))
            if not self.running:
                break
            (act,) = self._rng.choices([act for _w, act in actions],
                                       weights=[w for w, _act in actions])
            await act()

    async def _reset(self) -> None:
        self._network.reset_random()

    async def _crash_or_restart(self) -> None:
        down = [b for b in self._bookies if not b.up]
        up = [b for b in self._bookies if b.up]
        if down and (len(down) >= MAX_DOWN or self._rng.random() < 0.5):
            await self._rng.choice(down).start()
        elif up:
            self._rng.choice(up).crash()

    async def _partition_or_heal(self) -> None:
        if self._rng.random() < 0.5:
            self._network.heal()
            return
        nodes = [b.bookie_id for b in self._bookies] + list(self._clients)
        self._network.partition(frozenset(self._rng.sample(nodes, self._rng.randint(1, 3))))

    async def _pause(self) -> None:
        nodes = [b.bookie_id for b in self._bookies] + list(self._clients)
        self._network.pause(self._rng.choice(nodes), self._rng.uniform(0.5, 8.0))

    async def _checkpoint(self) -> None:
        up = [b for b in self._bookies if b.up]
        if up:
            await self._rng.choice(up).checkpoint()

    async def quiesce(self) -> None:
        """Faults over: heal, every bookie up, the network fast again."""
        self.running = False
        self._network.heal()
        self._network.end_pauses()
        self._network.config = NetworkConfig()
        for bookie in self._bookies:
            if not bookie.up:
                await bookie.start()


async def _simulate(rng: random.Random, trace: Trace, network: SimNetwork,
                    faults: Faults, result: RunResult) -> None:
    store = await open_memory("memory://", lease_ms=1 << 40, poll_interval_ms=200)
    bookies = [SimBookie(f"b{i}", network, store, rng, trace) for i in range(1, BOOKIES + 1)]
    for bookie in bookies:
        token = current_node.set(bookie.bookie_id)
        try:
            await bookie.start()
        finally:
            current_node.reset(token)
    workload = Workload(rng, trace, store, clients=3, ledgers_per_client=2,
                        max_entries=60, vd_probability=0.25)
    await workload.connect()
    nemesis = _Nemesis(rng, trace, network, bookies, list(workload.clients), faults)
    nemesis_task = asyncio.get_running_loop().create_task(nemesis.run())
    await workload.run()
    await nemesis.quiesce()
    await nemesis_task
    workload.history.crashed = any(b.boots > 1 for b in bookies)
    trace.event("faults over: final recovery")
    await workload.finish(FINAL_RECOVERY_ATTEMPTS)
    await workload.close()
    result.violations = check(workload.history)
    result.ledgers = len(workload.history.ledgers)
    result.acked = sum(map(len, workload.history.acked.values()))
    await store.close()


class _ToTrace(logging.Handler):
    """Puts the client's log lines (recovery steps, ensemble changes, writer
    failures: deterministic text) into the trace, as ``[client] ...``."""

    def __init__(self, trace: Trace) -> None:
        super().__init__(logging.INFO)
        self._trace = trace

    def emit(self, record: logging.LogRecord) -> None:
        self._trace.event(f"[client] {record.getMessage()}")


@contextlib.contextmanager
def _product_logs(trace: Trace) -> Iterator[None]:
    """The client's INFO lines go to the trace; every other product log
    line is dropped (bookies warn about each malformed or reset connection)."""
    root, client = logging.getLogger("quire"), logging.getLogger("quire.client")
    saved = root.level, client.level, client.propagate
    handler = _ToTrace(trace)
    root.setLevel(logging.CRITICAL + 1)
    client.setLevel(logging.INFO)
    client.propagate = False
    client.addHandler(handler)
    try:
        yield
    finally:
        client.removeHandler(handler)
        root.setLevel(saved[0])
        client.setLevel(saved[1])
        client.propagate = saved[2]


def run_seed(seed: int, *, bug: str = "") -> RunResult:
    """Run one seed (with ``bug`` switched on, see :mod:`quire.simulation.bugs`)."""
    rng = random.Random(seed)
    trace = Trace()
    faults = Faults.draw(rng)
    network = SimNetwork(rng, trace, NetworkConfig(max_delay_ms=faults.max_delay_ms,
                                                   slow_probability=faults.slow_probability))
    result = RunResult(seed, [], [], "", faults=faults.describe())
    trace.event(f"seed {seed}: {faults.describe()}" + (f" bug={bug}" if bug else ""))
    loop = SimLoop(network)
    try:
        with _product_logs(trace), seeded_bug(bug):
            try:
                loop.run_until_complete(_simulate(rng, trace, network, faults, result))
            except Exception as e:  # reported as the run's failure, with its trace
                result.error = f"{type(e).__name__}: {e}"
                trace.event(f"run ended by {result.error}")
            result.virtual_s = loop.time()
            _cancel_all(loop)
    finally:
        loop.close()
    result.trace = trace.lines
    result.digest = trace.digest()
    return result


def _cancel_all(loop: SimLoop) -> None:
    """Cancel what is still scheduled (pollers, watches, stuck tasks)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
