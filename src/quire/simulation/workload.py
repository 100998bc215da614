"""The workload of one simulated run, the history it records, and the
invariants checked against that history at the end.

Clients (each its own :class:`~quire.client.Client` with its own
connections) write ledgers of several E/W/A shapes (striping included, PD
and VD), close most of them and leave some open (a writer that died);
meanwhile they recover each other's ledgers (open with recovery) and read
them.  A nemesis injects the run's faults.  When the writers are done the
faults stop, every bookie comes back, and each ledger is recovered and read
in full.

What the clients were told is the history (:class:`History`); the
invariants (:func:`check`) compare it with the ledgers' final state.  Only
what a client was *told* counts: an append that failed or timed out is
unknown, neither acknowledged nor refused.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client, ClientConfig, ReadHandle, WriteHandle
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.errors import QuireError
from quire.metadata import MetadataStore
from quire.peer import BookiePool
from quire.simulation.network import current_node
from quire.simulation.trace import Trace
from quire.types import LedgerType

PASSWORD = b"sim"
SHAPES: tuple[tuple[int, int, int], ...] = ((3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 3, 3),
                                             (3, 3, 3), (2, 2, 1))
"""(E, W, A) the writers draw from; E > W is striping (PD only)."""
OP_TIMEOUT_S = 120.0
"""Virtual seconds after which a client operation counts as unknown."""


def payload(ledger_id: int, entry_id: int) -> bytes:
    """The one payload entry ``entry_id`` of ``ledger_id`` may have."""
    return f"ledger {ledger_id} entry {entry_id} ".encode() * 3


@dataclass
class History:
    """What the clients were told (see the module docstring)."""

    ledgers: dict[int, tuple[int, int, int, LedgerType]] = field(default_factory=dict)
    """ledger id -> (E, W, A, type)."""
    acked: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    """Entries whose append completed (PD: durable; VD: see ``synced``)."""
    synced: dict[int, int] = field(default_factory=dict)
    """VD ledgers: the highest entry a ``sync()`` reported persistent."""
    closes: list[tuple[str, int, int]] = field(default_factory=list)
    """(who, ledger id, last entry id) of every close or recovery that succeeded."""
    confirmed_reads: list[tuple[str, int, int, bytes]] = field(default_factory=list)
    """(who, ledger, entry, data) read at or below a LAC during the run."""
    lac_backwards: list[str] = field(default_factory=list)
    """Handles whose LastAddConfirmed was seen to move back."""
    final: dict[int, int] = field(default_factory=dict)
    """ledger id -> last entry id after the final recovery."""
    unrecovered: dict[int, str] = field(default_factory=dict)
    """ledger id -> why the final recovery failed."""
    final_reads: dict[int, dict[int, bytes | str]] = field(default_factory=dict)
    """ledger id -> entry id -> its data, or the read's error."""
    crashed: bool = False
    """Whether any bookie lost unsynced data (VD acknowledgements may be lost then)."""
    losses: dict[int, dict[str, set[int]]] = field(default_factory=dict)
    """ledger id -> bookie -> entries a crash took that the protocol lets it
    lose: all of a disk that came back empty, the write cache of a bookie
    without the journal."""
    limbo: dict[int, int] = field(default_factory=dict)
    """Unrecovered ledgers: the most bookies of one write set keeping it in
    limbo at the end."""
    limbo_negatives: list[str] = field(default_factory=list)
    """Negative answers bookies gave about ledgers they held in limbo
    (the first per bookie and ledger; BP-46 allows none)."""

    def lost_everywhere(self, ledger_id: int, entry_id: int) -> bool:
        """Whether at least an ack quorum of bookies lost the entry in
        crashes that may lose it (so every bookie that acknowledged it may
        have: it may be gone without any bug)."""
        ack_quorum = self.ledgers[ledger_id][2]
        by_bookie = self.losses.get(ledger_id, {})
        return sum(entry_id in lost for lost in by_bookie.values()) >= ack_quorum


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


class LacWatch:
    """Samples of one handle's LAC; a decrease is recorded in the history."""

    def __init__(self, name: str, history: History) -> None:
        self._name = name
        self._history = history
        self._last = -1

    def saw(self, lac: int) -> None:
        if lac < self._last:
            self._history.lac_backwards.append(f"{self._name}: {self._last} then {lac}")
        self._last = max(self._last, lac)


class Workload:
    """Clients, writers, recoverers, readers of one run (module docstring)."""

    def __init__(self, rng: random.Random, trace: Trace, store: MetadataStore, *,
                 clients: int, ledgers_per_client: int, max_entries: int,
                 vd_probability: float) -> None:
        self.rng = rng
        self.trace = trace
        self.history = History()
        self._store = store
        self._client_count = clients
        self._ledgers_per_client = ledgers_per_client
        self._max_entries = max_entries
        self._vd_probability = vd_probability
        self.clients: dict[str, Client] = {}
        self.writing = True
        self._active: set[int] = set()
        """Ledgers whose writer is still appending."""

    async def connect(self) -> None:
        config = ClientConfig(add_entry_timeout_ms=4000, read_timeout_ms=3000,
                              speculative_read_timeout_ms=500, explicit_lac_interval_ms=300,
                              connect_timeout_ms=2000)
        for i in range(1, self._client_count + 1):
            name = f"c{i}"
            token = current_node.set(name)
            try:
                pool = await BookiePool.open(self._store, config.peer_config())
                ctx = ClientContext(self._store, pool, config, RandomPlacement(self.rng))
                self.clients[name] = Client(ctx, owns_store=False)
            finally:
                current_node.reset(token)

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of client ``name`` (its connections come from that node)."""
        token = current_node.set(name)
        try:
            return asyncio.get_running_loop().create_task(coro)
        finally:
            current_node.reset(token)

    async def run(self) -> None:
        """Writers to the end; recoverers and readers while they write."""
        writers = [self._spawn(name, self._writer(name)) for name in self.clients]
        others = [self._spawn(name, self._recoverer(name)) for name in self.clients]
        others += [self._spawn(name, self._reader(name)) for name in self.clients]
        await asyncio.gather(*writers)
        self.writing = False
        await asyncio.gather(*others)

    # --- writers -------------------------------------------------------------

    async def _writer(self, name: str) -> None:
        ledgers = [self._spawn(name, self._write_ledger(name, n))
                   for n in range(self._ledgers_per_client)]
        await asyncio.gather(*ledgers)

    async def _write_ledger(self, name: str, n: int) -> None:
        rng, trace, history = self.rng, self.trace, self.history
        await asyncio.sleep(rng.uniform(0, 0.5) * n)
        e, w, a = rng.choice(SHAPES)
        vd = e == w and rng.random() < self._vd_probability
        kind = LedgerType.VD_JOURNAL if vd else LedgerType.PD_JOURNAL
        client = self.clients[name]
        try:
            handle = await asyncio.wait_for(client.create_ledger(
                e, w, a, ledger_type=kind, password=PASSWORD), OP_TIMEOUT_S)
        except (QuireError, TimeoutError) as err:
            trace.event(f"{name} create E{e} W{w} A{a} failed: {err!r}")
            return
        lid = handle.ledger_id
        history.ledgers[lid] = (e, w, a, kind)
        trace.event(f"{name} created L{lid} E{e} W{w} A{a} {kind.name} on "
                    f"{','.join(handle.ensemble)}")
        lac = LacWatch(f"{name} writer of L{lid}", history)
        count = rng.randint(1, self._max_entries)
        window = rng.randint(1, 8)
        self._active.add(lid)
        try:
            await self._append_all(name, handle, count, window, lac)
        except (QuireError, TimeoutError) as err:
            trace.event(f"{name} L{lid} appends stopped: {err!r}")
            return
        finally:
            self._active.discard(lid)
        if rng.random() < 0.25:
            trace.event(f"{name} L{lid} writer walks away at {handle.last_add_completed}")
            return
        try:
            await asyncio.wait_for(handle.close(), OP_TIMEOUT_S)
        except (QuireError, TimeoutError) as err:
            trace.event(f"{name} L{lid} close failed: {err!r}")
            return
        last = handle.metadata.last_entry_id
        history.closes.append((f"{name} writer", lid, last))
        trace.event(f"{name} closed L{lid} at {last}")

    async def _append_all(self, name: str, handle: WriteHandle, count: int, window: int,
                          lac: LacWatch) -> None:
        rng, history, lid = self.rng, self.history, handle.ledger_id
        vd = lid in history.ledgers and history.ledgers[lid][3] is LedgerType.VD_JOURNAL
        pending: list[asyncio.Future[int]] = []
        for entry_id in range(count):
            pending.append(handle.append(payload(lid, entry_id)))
            if len(pending) >= window or entry_id == count - 1:
                try:
                    for future in pending:
                        acked = await asyncio.wait_for(future, OP_TIMEOUT_S)
                        history.acked[lid].add(acked)
                        lac.saw(handle.last_add_confirmed)
                finally:  # (also when an append failed: what was acknowledged before it)
                    self.trace.event(f"{name} L{lid} acked up to "
                                     f"{max(history.acked[lid], default=-1)}")
                pending = []
                if vd and rng.random() < 0.5:
                    synced = await asyncio.wait_for(handle.sync(), OP_TIMEOUT_S)
                    history.synced[lid] = max(history.synced.get(lid, -1), synced)
                    self.trace.event(f"{name} L{lid} synced up to {synced}")
                if rng.random() < 0.5:
                    await asyncio.sleep(rng.uniform(0, 0.3))

    # --- recoverers and readers ---------------------------------------------------

    def _pick_ledger(self, *, prefer_active: bool = False) -> int | None:
        """A ledger to read or recover; to recover, mostly one still being
        written (the races recovery exists for)."""
        active = sorted(self._active)
        if prefer_active and active and self.rng.random() < 0.7:
            return self.rng.choice(active)
        ids = sorted(self.history.ledgers)
        return self.rng.choice(ids) if ids else None

    async def _recoverer(self, name: str) -> None:
        while self.writing:
            await asyncio.sleep(self.rng.uniform(0.1, 1.0))
            lid = self._pick_ledger(prefer_active=True)
            if lid is None or not self.writing:
                continue
            await self.recover(name, lid)

    async def recover(self, name: str, lid: int) -> int | None:
        """Open with recovery; record the close; read every entry as confirmed."""
        client = self.clients[name]
        try:
            handle = await asyncio.wait_for(
                client.open_ledger(lid, password=PASSWORD, recovery=True), OP_TIMEOUT_S)
        except (QuireError, TimeoutError) as err:
            self.trace.event(f"{name} recovery of L{lid}: unknown ({err!r})")
            return None
        last = handle.metadata.last_entry_id
        self.history.closes.append((f"{name} recovery", lid, last))
        self.trace.event(f"{name} recovered L{lid}: closed at {last}")
        await self._read_confirmed(name, handle, last)
        return last

    async def _reader(self, name: str) -> None:
        while self.writing:
            await asyncio.sleep(self.rng.uniform(0.1, 1.0))
            lid = self._pick_ledger()
            if lid is None or not self.writing:
                continue
            client = self.clients[name]
            try:
                handle = await asyncio.wait_for(
                    client.open_ledger(lid, password=PASSWORD, recovery=False), OP_TIMEOUT_S)
                watch = LacWatch(f"{name} reader of L{lid}", self.history)
                for _ in range(self.rng.randint(1, 3)):
                    lac = await asyncio.wait_for(handle.read_last_add_confirmed(), OP_TIMEOUT_S)
                    watch.saw(lac)
                    await self._read_confirmed(name, handle, lac)
                await handle.close()
            except (QuireError, TimeoutError) as err:
                self.trace.event(f"{name} read of L{lid}: unknown ({err!r})")

    async def _read_confirmed(self, name: str, handle: ReadHandle, lac: int) -> None:
        if lac < 0:
            return
        lid = handle.ledger_id
        first = max(0, lac - self.rng.randint(0, 5))
        try:
            entries = await asyncio.wait_for(handle.read(first, lac), OP_TIMEOUT_S)
        except (QuireError, TimeoutError) as err:
            self.trace.event(f"{name} read L{lid} {first}..{lac}: unknown ({err!r})")
            return
        for entry in entries:
            self.history.confirmed_reads.append((name, lid, entry.entry_id, entry.data))
        self.trace.event(f"{name} read L{lid} {first}..{lac}")

    # --- the end -------------------------------------------------------------------

    async def finish(self, attempts: int) -> None:
        """Recover and read every ledger, faults over (see the module docstring)."""
        name = next(iter(self.clients))
        token = current_node.set(name)
        try:
            for lid in sorted(self.history.ledgers):
                last = None
                for _ in range(attempts):
                    last = await self.recover(name, lid)
                    if last is not None:
                        break
                    await asyncio.sleep(2.0)
                if last is None:
                    self.history.unrecovered[lid] = "recovery kept failing"
                    continue
                self.history.final[lid] = last
                await self._read_all(name, lid, last, attempts)
        finally:
            current_node.reset(token)

    async def _read_all(self, name: str, lid: int, last: int, attempts: int) -> None:
        """Read every entry of the closed ledger; a failed read is tried
        again (``attempts`` in all: an unknown answer, such as a timeout on
        a reply that was still held up when the faults stopped, is not a no)
        and only then recorded as its error."""
        reads: dict[int, bytes | str] = {}
        self.history.final_reads[lid] = reads
        if last < 0:
            return
        handle = await self.clients[name].open_ledger(lid, password=PASSWORD, recovery=False)
        for entry_id in range(last + 1):
            for attempt in range(attempts):
                try:
                    (entry,) = await asyncio.wait_for(handle.read(entry_id, entry_id),
                                                      OP_TIMEOUT_S)
                except (QuireError, TimeoutError) as err:
                    reads[entry_id] = repr(err)
                    if attempt + 1 < attempts:
                        await asyncio.sleep(2.0)
                else:
                    reads[entry_id] = entry.data
                    break

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


def check(history: History) -> list[Violation]:
    """Every invariant against the history (see the module docstring).

    What the protocol may lose is excused: a VD entry acknowledged but not
    synced, once any bookie crashed; and in a closed ledger, an entry that
    at least an ack quorum of bookies lost with an emptied disk or a
    journal-less write cache (:meth:`History.lost_everywhere`) may be
    unreadable.  Such losses never excuse a close below an acknowledged
    entry: BP-46's limbo exists so that a ledger whose end cannot be known
    stays open instead.  A ledger may stay unrecovered once faults stop
    only if an ack quorum of some write set keeps it in limbo (they answer
    UNKNOWN, so no recovery can decide where it ends); it is then reported
    (:attr:`History.limbo`)."""
    found: list[Violation] = []
    add = found.append
    for lid, (e, w, a, kind) in sorted(history.ledgers.items()):
        if lid not in history.final:
            limbo = history.limbo.get(lid, 0)
            if limbo < a:
                add(Violation("liveness", f"L{lid} ({kind.name[:2]} E{e} W{w} A{a}) could not "
                                          f"be recovered "
                                          f"once faults stopped ({limbo} bookies of a write set "
                                          f"in limbo): {history.unrecovered[lid]}"))
            continue
        last = history.final[lid]
        acked = history.acked.get(lid, set())
        durable = acked if kind is LedgerType.PD_JOURNAL or not history.crashed else {
            x for x in acked if x <= history.synced.get(lid, -1)}
        above = sorted(x for x in durable if x > last)
        if above:
            add(Violation("acknowledged-entry-lost",
                          f"L{lid} closed at {last} but entries {above[:5]} were acknowledged"))
        reads = history.final_reads.get(lid, {})
        for entry_id in range(last + 1):
            got = reads.get(entry_id)
            if got != payload(lid, entry_id) and not history.lost_everywhere(lid, entry_id):
                which = "acknowledged " if entry_id in durable else ""
                add(Violation("entry-unreadable",
                              f"L{lid} closed at {last}: {which}entry {entry_id} read back "
                              f"as {got!r}"))
                break
    for who, lid, last in history.closes:
        final = history.final.get(lid)
        if final is not None and last != final:
            add(Violation("close-divergence",
                          f"{who} was told L{lid} closed at {last}; it ended at {final}"))
    for who, lid, entry_id, data in history.confirmed_reads:
        final = history.final.get(lid)
        if data != payload(lid, entry_id) or (final is not None and entry_id > final):
            add(Violation("dirty-read", f"{who} read L{lid} entry {entry_id} as confirmed "
                                        f"({data[:24]!r}); the ledger ended at {final}"))
    for text in history.lac_backwards:
        add(Violation("lac-moved-back", text))
    for text in history.limbo_negatives:
        add(Violation("limbo-negative", text))
    return found
