"""The end of a stream-layer run: liveness once the faults stopped, the
final reads, and the checks that look at the stores themselves.

In order (:func:`finish`):

1. **liveness**: every container is open on a live segment store, a new
   writer's event is acknowledged, every transaction ends (committed or
   aborted: a lease that ran out is the controller's to abort), no stream
   keeps a scale or a roll half done, and every storage writer has flushed
   everything to tier-2 (none stopped);
2. the **final reads**: each stream from its head, the conditional
   segment, the table's keys;
3. ``quire tier2 check``'s PDP-40 rules on tier-2 as it is now (the same
   check runs at every crash point during the run);
4. **one owner per epoch** in tier-1: each container's log, read from its
   first record still there, holds the records of one owner after another,
   never an older owner's after a newer one's (a fenced owner's writes
   never took effect);
5. **disaster recovery from tier-2 alone**: every segment store killed,
   :func:`~quire.segmentstore.disaster_recovery.recover` rebuilds every
   container onto fresh tier-1 logs (it fails if a recorded segment does
   not come back), a segment store started on them, and everything read
   again must be what the final reads found.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from quire.client import Client
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.errors import QuireError
from quire.log import LogCatalog, LogReader
from quire.peer import BookiePool
from quire.segmentstore import tier2_check
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import container_log_name
from quire.simulation.streams.history import ABORTED, COMMITTED, UNKNOWN, StreamHistory
from quire.simulation.streams.nodes import TIER1_CLIENT, Cluster, LogBook, SimSegmentStore
from quire.simulation.streams.workload import (
    CONDITIONAL,
    KEYS,
    SCOPE,
    SEALED,
    STREAM,
    TABLE,
    TABLE_KEYS,
    StreamClient,
)
from quire.streams import StreamReader, StreamWriter, TxnState

T = TypeVar("T")
SETTLE_S = 60.0
"""Virtual seconds the cluster has to settle once the faults stopped."""


class Eventually:
    """Tries something until it gives a result; :attr:`last` says why it
    did not, if it never did."""

    def __init__(self) -> None:
        self.last = "it never answered"

    async def __call__(self, what: Callable[[], Awaitable[T | None]],
                       deadline_s: float = SETTLE_S, every_s: float = 0.5) -> T | None:
        """``what()``'s first result that is not None, tried every ``every_s``
        until ``deadline_s`` (errors count as not yet); None if it never came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while True:
            try:
                found = await asyncio.wait_for(what(), max(0.1, deadline - loop.time()))
            except (QuireError, TimeoutError) as e:
                self.last = repr(e)
            else:
                if found is not None:
                    return found
                self.last = "not yet"
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(every_s)


async def eventually(what: Callable[[], Awaitable[T | None]], deadline_s: float = SETTLE_S,
                     every_s: float = 0.5) -> T | None:
    """:class:`Eventually`, when why it failed does not matter."""
    return await Eventually()(what, deadline_s, every_s)


async def open_client(cluster: Cluster) -> Client:
    """A ledger client of the running node (its own metadata session)."""
    metadata = cluster.session()
    pool = await BookiePool.open(metadata, TIER1_CLIENT.peer_config())
    return Client(ClientContext(metadata, pool, TIER1_CLIENT, RandomPlacement(cluster.rng)),
                  owns_store=False)


def hosted(stores: list[SimSegmentStore]) -> set[int]:
    return {c for s in stores if s.up for c in s.hosted()}


async def liveness(cluster: Cluster, stores: list[SimSegmentStore], client: StreamClient,
                   history: StreamHistory, lease_skew_s: float = 0.0) -> None:
    """Step 1 (module docstring); what does not happen in time is a violation.

    ``lease_skew_s``: how far the controllers' wall clocks stand apart.  A
    transaction's lease ends at a wall-clock time stamped by the controller
    that began (or pinged) it, and the leader aborts it by its own clock, so
    a lease stamped on a clock that jumped ahead lasts that much longer
    (seed 105161); the wait for each transaction to end allows for it."""
    containers = set(range(cluster.settings.containers))

    async def all_open() -> bool | None:
        return True if hosted(stores) == containers else None
    if await eventually(all_open) is None:
        history.liveness.append(f"containers {sorted(containers - hosted(stores))} are not "
                                f"open {SETTLE_S:.0f} s after the faults stopped")
        return

    async def probe() -> bool:
        writer = StreamWriter(client.controller, client.segments, SCOPE, STREAM)
        await writer.start()
        await writer.write_event(b"probe", KEYS[0])
        await writer.close()
        return True
    if await eventually(probe) is None:
        history.liveness.append("a new writer's event was not acknowledged")
    for name, txn in sorted(history.txns.items()):
        if txn.fate != UNKNOWN:
            continue
        txn.fate = await eventually(_txn_ended(client, history, name),
                                    SETTLE_S + lease_skew_s) or UNKNOWN
        if txn.fate == UNKNOWN:
            history.liveness.append(f"transaction {name} never ended")
    await _flushed(cluster, stores, history)


def _txn_ended(client: StreamClient, history: StreamHistory, name: str
               ) -> Callable[[], Awaitable[str | None]]:
    async def ended() -> str | None:
        txn_id = history.txn_ids.get(name)
        if txn_id is None:
            return ABORTED  # never known to the client: nothing of it was committed
        state = await client.controller.transaction_state(SCOPE, STREAM, txn_id)
        return {TxnState.COMMITTED: COMMITTED, TxnState.ABORTED: ABORTED}.get(state)
    return ended


async def _flushed(cluster: Cluster, stores: list[SimSegmentStore],
                   history: StreamHistory) -> None:
    """Every storage writer flushed everything.  A writer retries tier-2
    failures for as long as its container serves (its health says it is
    degraded meanwhile); one that stopped all the same (:attr:`failure`)
    gets its store restarted, as an operator following ``/health`` would,
    at most twice."""
    restarts: dict[str, int] = {}
    caught_up: dict[object, int] = {}
    """Writer -> its iteration count when it was first seen with nothing
    left to flush: once two more have ended, what it flushed is recorded too."""

    async def done() -> bool | None:
        finished = True
        for s in stores:
            segments = s.store
            if segments is None:
                continue
            for cid, writer in sorted(segments.writers.items()):
                if writer.failure is not None and restarts.get(s.name, 0) < 2:
                    restarts[s.name] = restarts.get(s.name, 0) + 1
                    cluster.trace.event(f"operator restarts {s.name}: the storage writer of "
                                        f"container {cid} stopped ({writer.failure!r})")
                    s.crash()
                    await s.start()
                    return None
                if writer.failure is not None or writer.backlog_bytes() > 0:
                    caught_up.pop(writer, None)
                    return None
                since = caught_up.setdefault(writer, writer.iterations)
                finished = finished and writer.iterations >= since + 2
        if not finished or hosted(stores) != set(range(cluster.settings.containers)):
            return None
        return True
    if await eventually(done) is None:
        for s in stores:
            if s.store is None:
                continue
            for cid, writer in sorted(s.store.writers.items()):
                if writer.failure is not None:
                    history.liveness.append(f"the storage writer of container {cid} on "
                                            f"{s.name} stopped: {writer.failure!r}")
                elif writer.backlog_bytes():
                    history.liveness.append(f"container {cid} on {s.name} keeps "
                                            f"{writer.backlog_bytes()} bytes out of tier-2 "
                                            f"({writer.health.status()})")


async def final_reads(client: StreamClient) -> tuple[dict[str, list[bytes]], bytes,
                                                       dict[bytes, tuple[bytes, int]]]:
    """Step 2: the streams from their heads, the conditional segment, the table."""
    streams: dict[str, list[bytes]] = {}
    for stream in (STREAM, SEALED):
        reader = StreamReader(client.controller, client.segments, SCOPE, stream)
        streams[stream] = [e.data async for e in reader.events() if e.data != b"probe"]
    info = await client.segments.get_info(CONDITIONAL)
    content = bytearray()
    while info.start_offset + len(content) < info.length:
        r = await client.segments.read(CONDITIONAL, info.start_offset + len(content),
                                       info.length - len(content))
        content += r.data
    client.segments.done_reading(CONDITIONAL)
    entries = await client.segments.table_get(TABLE, list(TABLE_KEYS))
    table = {key: (e.value or b"", e.version) for key, e in zip(TABLE_KEYS, entries, strict=True)
             if e is not None}
    return streams, bytes(content), table


async def check_tier2(cluster: Cluster, history: StreamHistory, where: str) -> None:
    """``quire tier2 check`` on tier-2 as it is at this instant (step 3)."""
    violations = await tier2_check.check(await cluster.tier2.snapshot())
    for v in violations:
        text = f"{where}: {v}"
        if text not in history.tier2:
            history.tier2.append(text)


async def check_owners(cluster: Cluster, history: StreamHistory) -> None:
    """Step 4 (module docstring), read as the node running it."""
    client = await open_client(cluster)
    catalog = LogCatalog(client.metadata_store)
    book: LogBook = cluster.logs
    password = cluster.settings.store_config().tier1_passwords
    try:
        for cid in range(cluster.settings.containers):
            name = container_log_name(cid)
            head = (await catalog.read_head(name)).value
            reader = LogReader(catalog, client, name, head.truncated_before, password=password,
                               follow=False, skip_truncated=True)
            appended = book.appended.get(cid, {})
            last = 0
            try:
                async for found in reader:
                    epochs = appended.get(LogBook.digest(found.payload))
                    if not epochs:
                        history.owners.append(f"container {cid}: a record at {found.position} "
                                              "no owner appended")
                        continue
                    # the earliest owner that may have written it and keeps the order
                    # (choosing the least leaves the most room for the records after it)
                    fits = [e for e in epochs if e >= last]
                    if not fits:
                        history.owners.append(f"container {cid}: a record of epoch "
                                              f"{max(epochs)} at {found.position}, after "
                                              f"epoch {last}'s")
                    last = min(fits, default=last)
            finally:
                await reader.close()
    finally:
        await client.close()


async def disaster_recovery(cluster: Cluster, stores: list[SimSegmentStore],
                            client: StreamClient, history: StreamHistory,
                            expected: tuple[dict[str, list[bytes]], bytes,
                                            dict[bytes, tuple[bytes, int]]]) -> None:
    """Step 5 (module docstring)."""
    for s in stores:
        s.crash()
    ledger_client = await open_client(cluster)
    try:
        report = await recover(ledger_client, cluster.tier2.storage(), replace_logs=True,
                               config=cluster.settings.store_config(), clock=cluster.clock)
    except QuireError as e:
        history.recovery.append(f"recovery from tier-2 failed: {e!r}")
        return
    finally:
        await ledger_client.close()
    cluster.trace.event(f"recovered {report.segments} segments, {report.bytes} bytes from "
                        f"tier-2 ({len(report.orphans)} orphans)")
    await stores[0].start()  # (it takes every container once the others' leases ended)
    containers = set(range(cluster.settings.containers))

    async def all_open() -> bool | None:
        return True if hosted(stores) == containers else None
    if await eventually(all_open) is None:
        history.recovery.append("the recovered containers did not open")
        return
    found = await eventually(lambda: final_reads(client))
    if found is None:
        history.recovery.append("the recovered segments could not be read")
        return
    streams, content, table = found
    for stream, events in sorted(expected[0].items()):
        got = streams.get(stream, [])
        if sorted(got) != sorted(events):  # (segments interleave anyhow)
            missing = sorted(set(events) - set(got))[:3]
            extra = sorted(set(got) - set(events))[:3]
            history.recovery.append(f"{stream} came back with {len(got)} events, not the "
                                    f"{len(events)} it had (missing {missing}, new {extra})")
    if content != expected[1]:
        history.recovery.append(f"{CONDITIONAL} came back with {len(content)} bytes, not "
                                f"{len(expected[1])}")
    if {k: v for k, (v, _version) in table.items()} != \
            {k: v for k, (v, _version) in expected[2].items()}:
        history.recovery.append("the table came back with other values")
