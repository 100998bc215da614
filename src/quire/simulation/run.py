"""One simulated run: a seed in, a verdict and a trace out.

:func:`run_seed` builds everything from one ``random.Random(seed)``: which
faults this run has and how often (:class:`Faults`), the network, the
bookies, the workload; runs it on a fresh :class:`~quire.simulation.loop.SimLoop`;
then checks the invariants.  The same seed, in a process with the same
``PYTHONHASHSEED``, gives the same trace line for line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import random
from dataclasses import dataclass, field
from typing import Any

from quire.simulation.bugs import seeded_bug
from quire.simulation.cluster import LimboNegatives, Losses, SimBookie
from quire.simulation.loop import SimDeadlock, SimLoop
from quire.simulation.metadata import SimMetadataStore
from quire.simulation.network import NetworkConfig, SimNetwork
from quire.simulation.trace import Trace, product_logs
from quire.simulation.workload import Violation, Workload, check

BOOKIES = 5
MAX_DOWN = 2
"""Bookies down at once, at most (so that every shape can still be written)."""
FINAL_RECOVERY_ATTEMPTS = 5


FAULT_NAMES = ("resets", "crashes", "partitions", "pauses", "checkpoints", "slow-network",
               "wipes", "no-journal", "slow-disks", "clock-jumps", "client-pauses",
               "metadata-races", "outages")
"""What ``--faults`` may name (default: all)."""
CLASSIC = frozenset(FAULT_NAMES[:6])
"""The faults of the simulator's first version: a run with only these draws
from the run's rng exactly as that version did, so its seeds replay the
schedules they were stored for."""


@dataclass(frozen=True)
class Faults:
    """This run's faults: each on with some probability per run, then how
    often the nemesis picks it (weights) and how strong it is.  The classic
    ones are drawn from the run's rng, the later ones from a second rng of
    the seed (see :data:`CLASSIC`)."""

    resets: float
    crashes: float
    partitions: float
    pauses: float
    checkpoints: float
    slow_probability: float
    max_delay_ms: float
    wipe_probability: float = 0.0
    """Chance that a crash empties the bookie's disk (it reboots empty)."""
    journal_off: int = 0
    """Bookies running without the journal (BP-46, data integrity checking on)."""
    slow_sync_ms: float = 0.0
    """A journal sync starts up to this long after it was asked for."""
    clock_jumps: float = 0.0
    client_pauses: float = 0.0
    metadata_delay_probability: float = 0.0
    metadata_max_delay_ms: float = 0.0
    outages: float = 0.0
    """Weight of a power outage: several bookies lose power at once."""

    @classmethod
    def draw(cls, rng: random.Random, extra: random.Random,
             enabled: frozenset[str] = frozenset(FAULT_NAMES)) -> Faults:
        def maybe(name: str, weight: float, chance: float, source: random.Random) -> float:
            hit = source.random() < chance
            return weight if hit and name in enabled else 0.0
        classic = cls(resets=maybe("resets", 3.0, 0.6, rng),
                      crashes=maybe("crashes", 2.0, 0.6, rng),
                      partitions=maybe("partitions", 1.0, 0.4, rng),
                      pauses=maybe("pauses", 1.0, 0.4, rng),
                      checkpoints=maybe("checkpoints", 2.0, 0.7, rng),
                      slow_probability=maybe("slow-network", rng.choice((0.01, 0.05)), 0.5, rng),
                      max_delay_ms=rng.choice((1.0, 5.0, 30.0)))
        return dataclasses.replace(
            classic,
            wipe_probability=maybe("wipes", extra.choice((0.2, 0.5)), 0.5, extra),
            journal_off=int(maybe("no-journal", extra.randint(1, BOOKIES), 0.35, extra)),
            slow_sync_ms=maybe("slow-disks", extra.choice((20.0, 100.0, 400.0)), 0.3, extra),
            clock_jumps=maybe("clock-jumps", 1.0, 0.3, extra),
            client_pauses=maybe("client-pauses", 1.0, 0.3, extra),
            metadata_delay_probability=maybe("metadata-races", extra.choice((0.2, 0.6)), 0.4,
                                             extra),
            metadata_max_delay_ms=extra.choice((20.0, 200.0)),
            outages=maybe("outages", 1.0, 0.4, extra))

    def describe(self) -> str:
        text = (f"resets={self.resets} crashes={self.crashes} partitions={self.partitions} "
                f"pauses={self.pauses} "
                f"checkpoints={self.checkpoints} slow={self.slow_probability} "
                f"max_delay_ms={self.max_delay_ms}")
        extras = [("wipes", self.wipe_probability), ("journal_off", self.journal_off),
                  ("slow_sync_ms", self.slow_sync_ms), ("clock_jumps", self.clock_jumps),
                  ("client_pauses", self.client_pauses),
                  ("metadata_delays", self.metadata_delay_probability),
                  ("outages", self.outages)]
        return " ".join([text, *(f"{name}={value}" for name, value in extras if value)])


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
                   (f.checkpoints, self._checkpoint), (f.clock_jumps, self._clock_jump),
                   (f.client_pauses, self._client_pause), (f.outages, self._outage)]
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
            wipe = bool(self._faults.wipe_probability) \
                and self._rng.random() < self._faults.wipe_probability
            self._rng.choice(up).crash(wipe=wipe)

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

    async def _clock_jump(self) -> None:
        """One node's clock jumps ahead: its timers (timeouts, retries,
        pauses between passes) fire up to that much early, before anything
        more reaches it (see :meth:`SimLoop.jump_clock`)."""
        nodes = [b.bookie_id for b in self._bookies] + list(self._clients)
        node, seconds = self._rng.choice(nodes), self._rng.uniform(0.5, 10.0)
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        moved = loop.jump_clock(node, seconds)
        self._trace.event(f"clock of {node} jumps {seconds:.3f} s ahead ({moved} timers)")

    async def _outage(self) -> None:
        """A power outage: two or more bookies lose power at the same
        moment (their unsynced writes all gone together), mostly at a
        moment some disk has writes not yet synced, and come back a
        little later (only the bookies that were up: MAX_DOWN still holds
        for the rest of the run)."""
        for _ in range(100):  # mostly at a moment a disk has writes in flight
            if any(b.unsynced for b in self._bookies) or self._rng.random() < 0.05:
                break
            await asyncio.sleep(self._rng.uniform(0.001, 0.02))
        up = [b for b in self._bookies if b.up]
        if len(up) < 2:
            return
        hit = self._rng.sample(up, self._rng.randint(2, len(up)))
        self._trace.event(f"power outage: {', '.join(b.bookie_id for b in hit)}")
        for bookie in hit:
            bookie.crash()
        await asyncio.sleep(self._rng.uniform(0.05, 1.5))
        for bookie in hit:
            await bookie.start()

    async def _client_pause(self) -> None:
        """A client hangs (BP-46's "C1 hangs"): for a long while nothing it
        sends or is sent moves and none of its timers fires; then it goes
        on where it stopped (a writer that missed a recovery, say)."""
        client, seconds = self._rng.choice(self._clients), self._rng.uniform(2.0, 15.0)
        self._network.pause(client, seconds)
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        held = loop.hold_timers(client, seconds)
        self._trace.event(f"{client} hangs ({held} timers held)")

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
                    faults: Faults, extra: random.Random, result: RunResult) -> None:
    store = SimMetadataStore(rng, delay_probability=faults.metadata_delay_probability,
                             max_delay_ms=faults.metadata_max_delay_ms)
    without_journal = set(extra.sample(range(1, BOOKIES + 1), faults.journal_off))
    losses: Losses = {}
    limbo_negatives: LimboNegatives = {}
    bookies = [SimBookie(f"b{i}", network, store, rng, trace, losses,
                         journal_write_data=i not in without_journal,
                         slow_sync_ms=faults.slow_sync_ms, limbo_negatives=limbo_negatives)
               for i in range(1, BOOKIES + 1)]
    for bookie in bookies:
        await bookie.start()
    workload = Workload(rng, trace, store, clients=3, ledgers_per_client=2,
                        max_entries=60, vd_probability=0.25)
    await workload.connect()
    nemesis = _Nemesis(rng, trace, network, bookies, list(workload.clients), faults)
    nemesis_task = asyncio.get_running_loop().create_task(nemesis.run())
    await workload.run()
    await nemesis.quiesce()
    await nemesis_task
    history = workload.history
    history.crashed = any(b.boots > 1 for b in bookies)
    trace.event("faults over: final recovery")
    await workload.finish(FINAL_RECOVERY_ATTEMPTS)
    history.losses = {lid: {b: set(ids) for b, ids in by.items()} for lid, by in losses.items()}
    history.limbo_negatives = [limbo_negatives[key] for key in sorted(limbo_negatives)]
    for lid in sorted(history.unrecovered):
        history.limbo[lid] = await _limbo_write_sets(store, bookies, lid)
    await workload.close()
    result.violations = check(history)
    result.ledgers = len(history.ledgers)
    result.acked = sum(map(len, history.acked.values()))
    await store.close()


async def _limbo_write_sets(store: SimMetadataStore, bookies: list[SimBookie],
                            ledger_id: int) -> int:
    """The most bookies of one write set of the ledger that keep it in
    limbo (BP-46: they answer UNKNOWN for what they lack)."""
    metadata = (await store.read_ledger(ledger_id)).value
    in_limbo = {b.bookie_id for b in bookies
                if b.server is not None and b.server.storage.is_limbo(ledger_id)}
    size, quorum = metadata.ensemble_size, metadata.write_quorum_size
    most = 0
    for _first, ensemble in metadata.ensembles:
        for start in range(size):
            members = {ensemble[(start + k) % size] for k in range(quorum)}
            most = max(most, len(members & in_limbo))
    return most


def run_seed(seed: int, *, bug: str = "",
             faults_enabled: frozenset[str] = frozenset(FAULT_NAMES)) -> RunResult:
    """Run one seed (with ``bug`` switched on, see :mod:`quire.simulation.bugs`;
    with only the faults named in ``faults_enabled``)."""
    rng = random.Random(seed)
    extra = random.Random(f"faults of seed {seed}")
    trace = Trace()
    faults = Faults.draw(rng, extra, faults_enabled)
    network = SimNetwork(rng, trace, NetworkConfig(max_delay_ms=faults.max_delay_ms,
                                                   slow_probability=faults.slow_probability))
    result = RunResult(seed, [], [], "", faults=faults.describe())
    trace.event(f"seed {seed}: {faults.describe()}" + (f" bug={bug}" if bug else ""))
    loop = SimLoop(network)
    stray: list[str] = []
    loop.set_exception_handler(lambda _loop, context: stray.append(_stray(context)))
    try:
        with product_logs(trace, "quire.client", "client"), seeded_bug(bug):
            try:
                loop.run_until_complete(_simulate(rng, trace, network, faults, extra, result))
            except Exception as e:  # reported as the run's failure, with its trace
                result.error = f"{type(e).__name__}: {e}"
                trace.event(f"run ended by {result.error}")
            result.virtual_s = loop.time()
            stuck = cancel_all(loop)
            if stuck and not result.error:
                result.error = stuck_error(stuck)
            gc.collect()  # a task that failed unobserved reports it when collected
    finally:
        loop.close()
    if stray and not result.error:
        # not in the trace (when a cycle is collected is not the seed's to
        # decide), but a failure: product code let an exception go unobserved
        result.error = f"unobserved exception: {stray[0]}"
    result.trace = trace.lines
    result.digest = trace.digest()
    return result


def _stray(context: dict[str, object]) -> str:
    """One line for what the loop's exception handler got (a task's
    exception nobody retrieved, a callback that raised)."""
    error = context.get("exception")
    what = f"{type(error).__name__}: {error}" if error is not None else ""
    task = context.get("task", context.get("future"))
    coro = getattr(task, "get_coro", lambda: None)()
    where = f" (in {coro.__qualname__})" if coro is not None else ""
    return f"{context.get('message', '')} {what}".strip() + where


def cancel_all(loop: SimLoop) -> list[str]:
    """Cancel what is still scheduled (pollers, watches, stuck tasks); the
    tasks of live processes that then wait for ever instead of ending (a
    cancellation swallowed, or waiting on something only a cancelled task
    would have done), each as its coroutine chain: a failure of the run.  A
    crashed process's leftovers may wait for ever (its timers were dropped
    when it was killed): they are no process's any more (seed 105252)."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    stuck: list[str] = []
    if tasks:
        try:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        except SimDeadlock:
            stuck = [_waiting_at(t) for t in tasks
                     if not t.done() and not loop.of_dead_life(t)]
    loop.run_until_complete(loop.shutdown_asyncgens())
    return stuck


def _waiting_at(task: asyncio.Task[Any]) -> str:
    """The task's coroutine chain, outermost first, each with its line."""
    hops = []
    awaited: Any = task.get_coro()
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        frame = awaited.cr_frame
        hops.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        awaited = awaited.cr_await
    if awaited is not None:  # (a future's iterator, when it waits on one)
        name = type(awaited).__name__
        hops.append("a future" if name == "FutureIter" else name)
    return " -> ".join(hops) or repr(task)


def stuck_error(stuck: list[str]) -> str:
    """The run's error for :func:`cancel_all`'s stuck tasks."""
    return f"cancelled tasks did not end ({len(stuck)}): " + "; ".join(stuck[:3])
