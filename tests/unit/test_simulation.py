"""quire.simulation: the virtual-time loop, the simulated network and disk,
and whole seeded runs through ``python -m quire.simulation`` (each seed in
its own forked process under PYTHONHASHSEED=0, as CI runs them)."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quire.bookie.storage import BookieStorage
from quire.client import Client
from quire.client.context import ClientContext
from quire.client.placement import RandomPlacement
from quire.errors import LedgerFencedError, NoSuchEntryError, StatusCode
from quire.peer import BookiePool
from quire.protocol import (
    ErrorResponse,
    OpCode,
    ReadLacResponse,
    ReadResponse,
    encode_batch_read_records,
)
from quire.protocol.codec import encode_add_response
from quire.simulation.bugs import seeded_bug
from quire.simulation.cluster import (
    REPAIR_CLIENT_CONFIG,
    LimboNegatives,
    Losses,
    SimBookie,
    bookie_config,
    negative_answer,
)
from quire.simulation.disk import SimDisk, SimJournal, SimLedgerStorage
from quire.simulation.loop import SimDeadlock, SimLoop
from quire.simulation.metadata import SimMetadataStore
from quire.simulation.network import NetworkConfig, SimNetwork, current_node
from quire.simulation.run import cancel_all
from quire.simulation.trace import Trace
from quire.simulation.workload import History, LacWatch, check, payload
from quire.types import LedgerType
from tests.support.simulation import digest, simulate, without_cpu

CI_SEEDS = 500
"""Seeds CI runs (test_the_ci_seeds_hold_every_invariant); a seeded bug must
be caught within them."""


# --- the loop -------------------------------------------------------------------------

def test_time_is_virtual_and_jumps_to_the_next_timer() -> None:
    loop = SimLoop()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((name, loop.time()))

    async def main() -> None:
        await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 0.25),
                             asyncio.to_thread(lambda: woke.append(("inline", loop.time()))))

    started = time.monotonic()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert woke == [("inline", 0.0), ("early", 0.25), ("late", 3600.0)]
    assert time.monotonic() - started < 1.0


def test_a_run_that_can_never_progress_is_a_deadlock() -> None:
    loop = SimLoop()

    async def wait_forever() -> None:
        await loop.create_future()

    try:
        with pytest.raises(SimDeadlock):
            loop.run_until_complete(wait_forever())
    finally:
        loop.close()


def test_cancel_all_names_the_tasks_that_do_not_end_when_cancelled() -> None:
    """A task that swallows its cancellation and waits on what nobody will
    do is the run's failure, named with where it waits (the soak stopped on
    it before: seed 105252); a task that ends when cancelled is not."""
    loop = SimLoop()
    release = loop.create_future()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600.0)
        except asyncio.CancelledError:
            await release  # cleanup waiting on something nobody will do

    async def polite() -> None:
        await asyncio.sleep(3600.0)

    async def main() -> asyncio.Task[None]:
        loop.create_task(polite())
        task = loop.create_task(stubborn())
        await asyncio.sleep(1.0)
        return task

    try:
        task = loop.run_until_complete(main())
        stuck = cancel_all(loop)
        assert not task.done()
        release.set_result(None)
        loop.run_until_complete(task)
    finally:
        loop.close()
    assert len(stuck) == 1
    assert re.fullmatch(r"test_cancel_all_names_the_tasks_that_do_not_end_when_cancelled"
                        r"\.<locals>\.stubborn:\d+ -> a future", stuck[0]), stuck


def test_an_alarm_stops_a_run_that_never_ends_and_leaves_the_timers_order_alone() -> None:
    """A livelocked run (its clock goes on forever) is stopped at the alarm;
    a run that ends before it fires its timers in the order it would
    without the alarm (equal deadlines leave the heap in an order its
    contents decide, so an extra timer would reorder them)."""
    def run(alarm: bool, until_s: float) -> tuple[str, list[int]]:
        loop = SimLoop(exact_timers=True)
        order: list[int] = []

        async def spinning() -> None:
            for i in range(8):
                loop.call_at(1.0 + i % 2, order.append, i)
            while loop.time() < until_s:
                await asyncio.sleep(5.0)

        async def main() -> str:
            this = asyncio.current_task()
            assert this is not None
            if alarm:
                loop.alarm_at(100.0, this.cancel)
            try:
                await spinning()
            except asyncio.CancelledError:
                return f"stopped at {loop.time():.0f}"
            return "ended"

        try:
            return loop.run_until_complete(main()), order
        finally:
            loop.close()

    assert run(alarm=True, until_s=math.inf)[0] == "stopped at 100"
    ended, order = run(alarm=True, until_s=50.0)
    assert ended == "ended" and sorted(order) == list(range(8))
    assert order == run(alarm=False, until_s=50.0)[1]


# --- the network ----------------------------------------------------------------------

class _Collector(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.lost: list[Exception | None] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def _network(rng: random.Random) -> tuple[SimLoop, SimNetwork, Trace]:
    trace = Trace()
    network = SimNetwork(rng, trace, NetworkConfig(max_delay_ms=20.0, split_probability=0.5))
    return SimLoop(network), network, trace


def test_a_stream_arrives_whole_and_in_order_and_a_partition_resets_it() -> None:
    loop, network, trace = _network(random.Random(7))
    server = _Collector()
    network.listen("b1", "b1:3181", lambda: server)

    async def main() -> _Collector:
        current_node.set("c1")
        _transport, client = await loop.create_connection(_Collector, "b1", 3181)
        assert client.transport is not None
        for i in range(200):
            client.transport.write(b"%d," % i)
        await asyncio.sleep(1.0)
        network.partition(frozenset({"b1"}))
        await asyncio.sleep(0)
        with pytest.raises(ConnectionRefusedError):
            await loop.create_connection(_Collector, "b1", 3181)
        return client

    try:
        client = loop.run_until_complete(main())
    finally:
        loop.close()
    assert server.data == b"".join(b"%d," % i for i in range(200))
    assert len(server.lost) == 1 and isinstance(server.lost[0], ConnectionResetError)
    assert len(client.lost) == 1
    assert any("partition ['b1']" in line for line in trace.lines)


# --- the disk twins under the real storage engine -------------------------------------

def _open(disk: SimDisk) -> BookieStorage:
    config = bookie_config("b1", journal_write_data=True).storage
    return BookieStorage.open_over(config, SimJournal(disk), SimLedgerStorage(disk, config), [])


def _entry(ledger_id: int, entry_id: int) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + b"payload"


class _Keeps(random.Random):
    """A power loss that keeps ``kept`` of the unsynced journal records."""

    def __init__(self, kept: int) -> None:
        super().__init__(0)
        self.kept = kept

    def randint(self, a: int, b: int) -> int:
        return min(a + self.kept, b)


KEY = b"k" * 20


def test_a_power_loss_keeps_what_was_synced_or_checkpointed() -> None:
    disk = SimDisk()
    storage = _open(disk)
    for entry_id in range(3):
        storage.add_entry(1, entry_id, _entry(1, entry_id), KEY)
    storage.journal.sync()
    storage.add_entry(2, 0, _entry(2, 0), KEY)
    storage.checkpoint()  # ledger 2's first entry is in the "entry logs" now
    storage.fence(1, KEY)
    storage.journal.sync()
    storage.add_entry(2, 1, _entry(2, 1), KEY)  # neither synced nor checkpointed
    storage.journal.write_buffered()
    storage.abandon()
    assert disk.power_loss(_Keeps(0)) == 1
    reopened = _open(disk)
    assert [reopened.read_entry(1, e) for e in range(3)] == [_entry(1, e) for e in range(3)]
    assert reopened.read_entry(2, 0) == _entry(2, 0)
    with pytest.raises(NoSuchEntryError):
        reopened.read_entry(2, 1)
    assert reopened.is_fenced(1)
    with pytest.raises(LedgerFencedError):
        reopened.add_entry(1, 3, _entry(1, 3), KEY)
    assert reopened.last_shutdown.unclean


@pytest.mark.parametrize("kept", [0, 1, 2])
def test_a_power_loss_keeps_a_prefix_of_the_unsynced_records(kept: int) -> None:
    disk = SimDisk()
    storage = _open(disk)
    storage.add_entry(1, 0, _entry(1, 0), KEY)  # two records: the ledger's key, the add
    storage.journal.write_buffered()
    storage.abandon()
    assert disk.power_loss(_Keeps(kept)) == 2 - kept
    reopened = _open(disk)
    assert reopened.ledger_exists(1) == (kept >= 1)
    if kept == 2:
        assert reopened.read_entry(1, 0) == _entry(1, 0)
    elif kept == 1:
        with pytest.raises(NoSuchEntryError):
            reopened.read_entry(1, 0)


# --- BP-46 in the simulated cluster ---------------------------------------------------

def _emptied_bookie_run(bug: str, limbo_negatives: LimboNegatives | None = None
                        ) -> tuple[bool, bool, set[int], str]:
    """b1 of a ledger E3 W3 A2 with three entries reboots with an empty disk
    while the writer is alive; returns (in limbo right after the boot,
    in limbo at the end, the entries b1 stores at the end, the ledger's state).
    The bookies' negative answers about limbo ledgers go to ``limbo_negatives``."""
    rng = random.Random(3)
    trace = Trace()
    network = SimNetwork(rng, trace, NetworkConfig())
    loop = SimLoop(network)

    async def main() -> tuple[bool, bool, set[int], str]:
        store = SimMetadataStore(rng, delay_probability=0.0, max_delay_ms=0.0)
        losses: Losses = {}
        bookies = [SimBookie(f"b{i}", network, store, rng, trace, losses,
                             limbo_negatives=limbo_negatives) for i in (1, 2, 3)]
        for bookie in bookies:
            await bookie.start()
        current_node.set("c1")
        pool = await BookiePool.open(store, REPAIR_CLIENT_CONFIG.peer_config())
        client = Client(ClientContext(store, pool, REPAIR_CLIENT_CONFIG, RandomPlacement(rng)),
                        owns_store=False)
        handle = await client.create_ledger(3, 3, 2, password=b"p")
        for entry_id in range(3):
            await handle.append(payload(handle.ledger_id, entry_id))
        b1 = bookies[0]
        b1.crash(wipe=True)
        await b1.start()
        assert b1.server is not None
        storage = b1.server.storage
        limbo_at_boot = storage.is_limbo(handle.ledger_id)
        await asyncio.sleep(30.0)  # phase two: recovery, then copies from b2 and b3
        stored = storage.stored_entry_ids(handle.ledger_id, 0, 10)
        state = (await store.read_ledger(handle.ledger_id)).value.state.name
        result = limbo_at_boot, storage.is_limbo(handle.ledger_id), stored, state
        await client.close()
        return result

    try:
        with seeded_bug(bug):
            return loop.run_until_complete(main())
    finally:
        cancel_all(loop)
        loop.close()


def test_an_emptied_bookie_holds_its_open_ledger_in_limbo_until_phase_two_repaired_it() -> None:
    negatives: LimboNegatives = {}
    assert _emptied_bookie_run("", negatives) == (True, False, {0, 1, 2}, "CLOSED")
    assert negatives == {}  # its recovery read it too: UNKNOWN, not a negative
    assert _emptied_bookie_run("forget-limbo", negatives) == (False, False, set(), "OPEN")
    assert negatives == {}  # (no limbo at all: the other invariants catch this bug)


def test_a_negative_answer_about_a_limbo_ledger_is_recorded() -> None:
    """With the limbo rule off in the handlers, the emptied bookie answers
    its own recovery's reads "no such entry" while in limbo: the watched
    connection records it (the ledger may then close short, which is
    what the rule prevents)."""
    negatives: LimboNegatives = {}
    _emptied_bookie_run("limbo-answers-no", negatives)
    assert list(negatives) == [("b1", 1)], negatives
    assert re.fullmatch(r"b1 answered NO_SUCH_(ENTRY|LEDGER) to (a read of (entry \d+|the last "
                        r"entry)|a batch read from entry \d+|READ_LAC) of L1 while holding it "
                        r"in limbo",
                        negatives["b1", 1]), negatives


@pytest.mark.parametrize(("frame", "expected"), [
    (ReadResponse(7, StatusCode.NO_SUCH_ENTRY, 4, 9).encode(),
     (4, "answered NO_SUCH_ENTRY to a read of entry 9")),
    (ReadResponse(7, StatusCode.UNKNOWN, 4, 9).encode(), None),
    (ReadResponse(7, StatusCode.OK, 4, 9, b"x").encode(), None),
    (ReadResponse(7, StatusCode.NO_SUCH_LEDGER, 4, -1).encode(),
     (4, "answered NO_SUCH_LEDGER to a read of the last entry")),
    (ReadLacResponse(7, StatusCode.OK, 4, -1).encode(),
     (4, "answered READ_LAC with no LAC (OK, -1)")),
    (ReadLacResponse(7, StatusCode.NO_SUCH_LEDGER, 4).encode(),
     (4, "answered NO_SUCH_LEDGER to READ_LAC")),
    (ReadLacResponse(7, StatusCode.OK, 4, 3).encode(), None),
    (encode_batch_read_records(7, StatusCode.NO_SUCH_ENTRY, 4, 2, []),
     (4, "answered NO_SUCH_ENTRY to a batch read from entry 2")),
    (ErrorResponse(OpCode.READ_ENTRY, 7, StatusCode.NO_SUCH_ENTRY).encode(), None),
    (encode_add_response(7, StatusCode.NO_SUCH_LEDGER, 4, 1, 0), None),
])
def test_the_limbo_watch_tells_negative_answers_from_the_rest(
        frame: bytes, expected: tuple[int, str] | None) -> None:
    assert negative_answer(frame) == expected


# --- whole runs -----------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_the_same_seed_gives_the_same_run_byte_for_byte() -> None:
    first, second = simulate("--seed", "11"), simulate("--seed", "11")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert digest(first.stdout) == digest(second.stdout)
    assert without_cpu(first.stdout) == without_cpu(second.stdout)  # the trace, all of it
    assert first.stdout.count("\n") > 50  # a real run, with its trace
    many = simulate("--seeds", "3", "--first", "10", "--workers", "2", "--digests")
    assert f"seed 11: trace sha256 {digest(first.stdout)}" in many.stdout  # any worker
    assert digest(simulate("--seed", "12").stdout) != digest(first.stdout)


@pytest.mark.timeout(900)  # (about 100 CPU s on 2 cores; the machine may be shared)
def test_the_ci_seeds_hold_every_invariant() -> None:
    """CI's seeds, every fault on (each drawn per run).  Its CPU time is in
    the summary line; docs/performance.md has the figures."""
    result = simulate("--seeds", str(CI_SEEDS), timeout_s=850)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert f"{CI_SEEDS} seeds from 0: {CI_SEEDS} ok, 0 failed" in result.stdout
    assert re.search(r"\(\d+\.\d CPU s in the runs\)", result.stdout)


def test_the_soak_script_runs_its_seeds_with_progress() -> None:
    """Both layers by default, each with its summary and progress."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([str(root / "scripts" / "soak-simulation"), "2", "7", "--workers", "1"],
                            capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 seeds from 7: 2 ok, 0 failed" in result.stdout  # both layers, in turn
    assert "2 seeds from 7 (streams): 2 ok, 0 failed" in result.stdout
    assert result.stdout.index("(streams)") > result.stdout.index("2 seeds from 7: 2 ok")
    # (the progress lines, off a terminal: one per layer)
    assert result.stderr.count("2/2 seeds, 0 failed") == 2


@pytest.mark.parametrize("seed", ["5702", "188", "581", "927"])
def test_seeds_that_found_a_recovery_closing_a_ledger_short_hold(seed: str) -> None:
    """Regression: a recovery's ensemble change was written to the metadata
    before the recovery closed the ledger; when that recovery failed, the
    next one read the entries from bookies that never had them and closed
    below acknowledged entries (seed 5702: a VD ledger closed at -1 with
    entries 0 and 1 acknowledged).  The change is now recorded with the
    close (quire.client.ensemble_change, EnsembleChange.replace).
    Replayed with the faults of the simulator's version that found them
    (``--faults classic``), which draws exactly the schedules it drew."""
    result = simulate("--seed", seed, "--faults", "classic")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_the_seed_that_found_a_pool_closing_over_a_new_client_holds() -> None:
    """Regression, found by the 10,000-seed soak (seeds 200000-209999):
    closing a client failed a request whose callback at once asked the
    pool for another bookie; ``BookiePool.close`` was iterating its clients
    and raised "dictionary changed size during iteration" in a task nobody
    awaited.  The pool now closes a snapshot and hands out closed clients
    once closing, and the simulator fails a run on any unobserved exception."""
    result = simulate("--seed", "208435")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "seed 208435: ok" in result.stdout


@pytest.mark.parametrize(("bug", "invariants"), [
    ("skip-fencing", {"acknowledged-entry-lost"}),
    ("unknown-as-no", {"acknowledged-entry-lost"}),
    ("ack-before-fsync", {"acknowledged-entry-lost", "entry-unreadable", "liveness"}),
    ("forget-limbo", {"acknowledged-entry-lost", "dirty-read", "close-divergence",
                      "entry-unreadable"}),
    ("lac-backwards", {"lac-moved-back"}),
    ("limbo-answers-no", {"limbo-negative"}),
])
@pytest.mark.timeout(900)
def test_a_seeded_bug_is_caught_within_the_ci_seeds(bug: str, invariants: set[str]) -> None:
    """The run stops at the first failing seed; the failure names one of
    the invariants the bug breaks, and replaying that seed fails the same
    way (and holds with the bug off)."""
    result = simulate("--seeds", str(CI_SEEDS), "--bug", bug, "--until-failure", timeout_s=850)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    failed = re.search(r"FAILED seed (\d+)", result.stdout)
    assert failed, result.stdout[-3000:]
    found = set(re.findall(r"violated: ([a-z-]+)", result.stdout))
    assert found & invariants, result.stdout[-3000:]
    seed = failed.group(1)
    assert f"replay: python -m quire.simulation --seed {seed} --bug {bug}" in result.stdout
    replay = simulate("--seed", seed, "--bug", bug)
    assert replay.returncode == 1
    assert set(re.findall(r"violated: ([a-z-]+)", replay.stdout)) == found
    assert simulate("--seed", seed).returncode == 0


# --- the invariants, each shown failing on a history that breaks it -------------------

def _history() -> History:
    """Ledger 1 (PD): entries 0..2 acknowledged, closed and read back at 2."""
    history = History()
    history.ledgers[1] = (3, 3, 2, LedgerType.PD_JOURNAL)
    history.acked[1] = {0, 1, 2}
    history.closes.append(("c1 writer", 1, 2))
    history.final[1] = 2
    history.final_reads[1] = {e: payload(1, e) for e in range(3)}
    return history


def test_a_consistent_history_holds_every_invariant() -> None:
    assert check(_history()) == []


def _broken(change: str) -> History:
    history = _history()
    if change == "closed-short":  # (no client was told of a close)
        history.closes = []
        history.final[1] = 1
        history.final_reads[1] = {e: payload(1, e) for e in range(2)}
    elif change == "unreadable":
        history.final_reads[1][1] = "EntryNotAvailableError('...')"
    elif change == "divergent-close":
        history.closes.append(("c2 recovery", 1, 3))
    elif change == "dirty-read":
        history.confirmed_reads.append(("c3", 1, 3, payload(1, 3)))
    elif change == "lac-back":
        watch = LacWatch("c2 reader of L1", history)
        watch.saw(2)
        watch.saw(1)
    elif change == "unrecovered":
        del history.final[1]
        history.unrecovered[1] = "recovery kept failing"
    elif change == "limbo-no":
        history.limbo_negatives.append("b1 answered NO_SUCH_ENTRY to a read of entry 2 of L1 "
                                       "while holding it in limbo")
    return history


@pytest.mark.parametrize(("change", "invariant"), [
    ("closed-short", "acknowledged-entry-lost"),
    ("unreadable", "entry-unreadable"),
    ("divergent-close", "close-divergence"),
    ("dirty-read", "dirty-read"),
    ("lac-back", "lac-moved-back"),
    ("unrecovered", "liveness"),
    ("limbo-no", "limbo-negative"),
])
def test_each_invariant_catches_what_it_names(change: str, invariant: str) -> None:
    assert [v.invariant for v in check(_broken(change))] == [invariant]


def test_an_unsynced_vd_entry_may_be_lost_after_a_crash_but_not_without_one() -> None:
    history = _history()
    history.ledgers[1] = (3, 3, 2, LedgerType.VD_JOURNAL)
    history.synced[1] = 1
    history.final[1] = 1
    history.final_reads[1] = {e: payload(1, e) for e in range(2)}
    history.closes = []
    assert [v.invariant for v in check(history)] == ["acknowledged-entry-lost"]
    history.crashed = True
    assert check(history) == []


def test_losses_an_ack_quorum_shared_excuse_an_unreadable_entry_never_a_short_close() -> None:
    history = _history()
    history.final_reads[1][1] = "EntryNotAvailableError('...')"
    history.losses[1] = {"b1": {1}}
    assert [v.invariant for v in check(history)] == ["entry-unreadable"]
    history.losses[1]["b2"] = {0, 1}  # an ack quorum (2) lost entry 1: it may be gone
    assert check(history) == []
    short = _broken("closed-short")
    short.losses[1] = {"b1": {2}, "b2": {2}, "b3": {2}}
    assert [v.invariant for v in check(short)] == ["acknowledged-entry-lost"]


def test_a_ledger_stays_unrecovered_only_while_an_ack_quorum_of_a_write_set_is_in_limbo() -> None:
    history = _broken("unrecovered")
    history.limbo[1] = 1
    assert [v.invariant for v in check(history)] == ["liveness"]
    history.limbo[1] = 2  # A = 2 of the write set answer UNKNOWN: reported, not a violation
    assert check(history) == []
