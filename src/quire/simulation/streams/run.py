"""One stream-layer run: a seed in, a verdict and a trace out.

:func:`run_stream_seed` builds everything from one ``random.Random(seed)``:
the run's faults, the network, four bookies, three segment stores, two
controllers, three clients; sets the streams up, runs the workload under
the nemesis for :data:`FAULT_S` virtual seconds, stops the faults, then
:func:`~quire.simulation.streams.final` checks liveness, reads everything,
checks tier-2, the owners of tier-1 and recovery from tier-2, and the
history's invariants (:func:`~quire.simulation.streams.history.check`).

The ids the product draws at random (writer ids, transaction ids, metadata
sessions, controller member names) come from the seed too: ``uuid.uuid4``,
``secrets.randbits`` and the ``random`` module are seeded for the run (a
run is a forked process of its own), so the same seed gives the same
trace line for line.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import secrets
import uuid
from collections.abc import Iterator

from quire.controller.base import ControllerConfig
from quire.metadata.memory import _Instance
from quire.simulation.bugs import seeded_bug
from quire.simulation.cluster import SimBookie
from quire.simulation.loop import SimLoop, VirtualClock
from quire.simulation.metadata import SimMetadataStore
from quire.simulation.network import NetworkConfig, SimNetwork
from quire.simulation.run import RunResult, _stray, cancel_all, stuck_error
from quire.simulation.streams import final
from quire.simulation.streams.controllers import SimController
from quire.simulation.streams.history import StreamHistory, check
from quire.simulation.streams.nemesis import STREAM_FAULTS, StreamFaults, StreamNemesis
from quire.simulation.streams.nodes import Cluster, SimSegmentStore, StreamSettings
from quire.simulation.streams.workload import StreamWorkload
from quire.simulation.tier2 import SimTier2
from quire.simulation.trace import Trace, product_logs

BOOKIES = 4
STORES = 3
CONTROLLERS = 2
CLIENTS = 3
FAULT_S = 12.0
"""Virtual seconds of workload under faults."""
RUN_LIMIT_S = 400.0
"""Virtual seconds a whole run may take (its longest ok runs take about 100:
set-up, faults, settling, the final checks).  A run still going then is
stuck (a set-up step refused forever, two owners fencing each other): it
fails as a liveness violation instead of running on without end."""
CONTROLLER_CONFIG = ControllerConfig(txn_sweep_interval_ms=1000, retention_interval_ms=60_000,
                                     stale_workflow_ms=10_000, completed_txn_retention_ms=600_000)


@contextlib.contextmanager
def seeded_entropy(seed: int) -> Iterator[None]:
    """``uuid.uuid4``, ``secrets.randbits`` and ``random`` drawn from ``seed``
    inside the block (see the module docstring)."""
    ids = random.Random(f"ids of seed {seed}")
    saved = uuid.uuid4, secrets.randbits, random.getstate()
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    secrets.randbits = lambda k: ids.getrandbits(k)
    random.seed(seed)
    try:
        yield
    finally:
        uuid.uuid4, secrets.randbits = saved[0], saved[1]
        random.setstate(saved[2])


async def _simulate(cluster: Cluster, faults: StreamFaults, result: RunResult) -> None:
    """:func:`_run_checked`, stopped after :data:`RUN_LIMIT_S` virtual seconds."""
    history = StreamHistory()
    this = asyncio.current_task()
    assert this is not None
    stopped: list[bool] = []

    def stop() -> None:
        stopped.append(True)
        this.cancel()
    loop = cluster.loop
    loop.alarm_at(RUN_LIMIT_S, stop)
    try:
        await _run_checked(cluster, faults, history)
    except asyncio.CancelledError:
        if not stopped:
            raise
        this.uncancel()
        history.liveness.append(f"the run did not end within {RUN_LIMIT_S:.0f} virtual s")
        cluster.trace.event(f"run stopped: not ended within {RUN_LIMIT_S:.0f} virtual s")
    finally:
        loop.cancel_alarm()
    result.violations = check(history)
    result.ledgers = len(history.final.get("s0", []))
    result.acked = sum(1 for _ in history.acked_events())


async def _run_checked(cluster: Cluster, faults: StreamFaults, history: StreamHistory) -> None:
    network, rng, trace = cluster.network, cluster.rng, cluster.trace
    shared = SimMetadataStore(rng, delay_probability=0.0, max_delay_ms=0.0,
                              instance=cluster.metadata, clock=cluster.clock)
    bookies = [SimBookie(f"b{i}", network, shared, rng, trace, {})
               for i in range(1, BOOKIES + 1)]
    for bookie in bookies:
        await bookie.start()
    stores = [SimSegmentStore(f"s{i}", cluster) for i in range(1, STORES + 1)]
    for store in stores:
        await store.start()
    controllers = {f"k{i}": SimController(f"k{i}", cluster, CONTROLLER_CONFIG)
                   for i in range(1, CONTROLLERS + 1)}
    for controller in controllers.values():
        await controller.start()
    workload = StreamWorkload(network, controllers, rng, trace, history, clients=CLIENTS)
    setup = workload.spawn(workload.clients[0], workload.setup())
    await setup
    nemesis = StreamNemesis(cluster, faults, stores, list(controllers.values()), bookies,
                            [c.name for c in workload.clients], history)
    nemesis_task = asyncio.get_running_loop().create_task(nemesis.run())
    async def faults_over() -> None:
        await nemesis.quiesce()
        await nemesis_task
        trace.event("faults over")
    await workload.run(FAULT_S, faults_over)
    trace.event("clients done")
    checker = workload.clients[0]

    async def finish() -> None:
        offsets = [c.clock.offset_ms for c in controllers.values()]
        await final.liveness(cluster, stores, checker, history,
                             lease_skew_s=(max(offsets) - min(offsets)) / 1000)
        reads = final.Eventually()
        found = await reads(lambda: final.final_reads(checker))
        if found is None:
            history.liveness.append(f"the final reads did not complete: {reads.last}")
            return
        history.final, history.final_conditional, history.final_table = found
        await final.check_tier2(cluster, history, "at the end")
        await final.check_owners(cluster, history)
        if not history.liveness:  # (recovery gives back what tier-2 holds: everything by now)
            await final.disaster_recovery(cluster, stores, checker, history, found)
    await workload.spawn(checker, finish())


def run_stream_seed(seed: int, *, bug: str = "",
                    faults_enabled: frozenset[str] = frozenset(STREAM_FAULTS)) -> RunResult:
    """Run one seed of the stream layer (module docstring)."""
    rng = random.Random(seed)
    trace = Trace()
    faults = StreamFaults.draw(rng, faults_enabled)
    network = SimNetwork(rng, trace, NetworkConfig(max_delay_ms=faults.max_delay_ms,
                                                   slow_probability=faults.slow_probability))
    result = RunResult(seed, [], [], "", faults=faults.describe())
    trace.event(f"seed {seed} (streams): {faults.describe()}" + (f" bug={bug}" if bug else ""))
    loop = SimLoop(network, exact_timers=True)
    loop.track_tasks()
    clock = VirtualClock(loop)
    settings = StreamSettings()
    tier2 = SimTier2(network, rng, trace, max_chunk_bytes=settings.max_chunk_bytes)
    cluster = Cluster(network, loop, _Instance(), tier2, clock, rng, trace, settings)
    stray: list[str] = []

    def unobserved(_loop: object, context: dict[str, object]) -> None:
        if not loop.of_dead_life(context.get("task", context.get("future"))):
            stray.append(_stray(context))  # (a crashed process's leftovers are not)
    loop.set_exception_handler(unobserved)
    try:
        with product_logs(trace, "quire.controller"), seeded_entropy(seed), seeded_bug(bug):
            try:
                loop.run_until_complete(_simulate(cluster, faults, result))
            except Exception as e:  # reported as the run's failure, with its trace
                result.error = f"{type(e).__name__}: {e}"
                trace.event(f"run ended by {result.error}")
            result.virtual_s = loop.time()
            stuck = cancel_all(loop)
            if stuck and not result.error:
                result.error = stuck_error(stuck)
            gc.collect()
    finally:
        loop.close()
    if stray and not result.error:
        result.error = f"unobserved exception: {stray[0]}"
    result.trace = trace.lines
    result.digest = trace.digest()
    return result
