"""Seeded fault rounds on a :class:`~tests.support.netcluster.NetCluster`,
each checked by the history checker (:mod:`quire.testing.history`).

A round starts its clients (each on a host of its own, recording its
history), lets them run, applies one fault for a bounded time while they
go on, heals it, lets them finish (readers until they have read every
acknowledged event, or a deadline), and checks the merged history.  The
seed picks the victim, the timings and the workload's shape, so a failing
round can be run again.  Every round returns a :class:`RoundResult`: the
report, the anomalies, and facts the scenario's test asserts besides
(``facts``).  The tests (``tests/integration/test_network_*.py``) and
``scripts/soak-network`` run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.errors import QuireError
from quire.metadata import MetadataStore
from quire.segmentstore.names import container_of
from quire.streams import ControllerClient, segment_name
from quire.testing.history import Anomaly, Operation, Recorder, load, report
from quire.testing.history_checks import check
from quire.types import BookieState
from tests.support.metadata import with_metadata
from tests.support.netcluster import ClientProcess, NetCluster, NetClusterSpec
from tests.support.netns import NetworkUnavailable
from tests.support.zookeeper import ZooKeeperUnavailable


@contextlib.contextmanager
def started_cluster(root: Path, spec: NetClusterSpec) -> Iterator[NetCluster]:
    """A started cluster, removed at the end; a machine that cannot build
    one (no ``ip``/``nft``, no namespaces, no ZooKeeper) fails the caller's
    test with the reason, never skips it."""
    import pytest

    cluster = NetCluster(root, spec)
    try:
        cluster.start()
    except (NetworkUnavailable, ZooKeeperUnavailable) as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


def assert_clean(result: RoundResult) -> None:
    """No anomaly and no client error (the report says which)."""
    assert not result.anomalies, result.summary()
    assert not result.facts.get("client_errors"), (result.facts["client_errors"],
                                                   result.summary())


@dataclass
class RoundResult:
    name: str
    seed: int
    ops: list[Operation]
    anomalies: list[Anomaly]
    report: str
    seconds: float
    facts: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        return f"round {self.name} seed {self.seed} ({self.seconds:.1f} s)\n{self.report}"


class Round:
    """One round's directory, seeded randomness, and the harness's own
    history (faults, group completions)."""

    def __init__(self, cluster: NetCluster, name: str, seed: int, root: Path) -> None:
        self.cluster = cluster
        self.name = name
        self.seed = seed
        self.rng = random.Random(seed)
        self.dir = root / f"{name}-{seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.harness = Recorder(self.dir / "harness.jsonl", "harness")
        self.clients: list[ClientProcess] = []
        self.facts: dict[str, Any] = {}
        self.started = time.monotonic()

    def client(self, role: str, name: str, wait: bool = True, **spec: Any) -> ClientProcess:
        """A client on a host of its own (``c-<name>``); with ``wait``, ready."""
        process = self.cluster.client(f"c-{name}", {
            "role": role, "name": name, "history": str(self.dir / f"{name}.jsonl"), **spec},
            wait)
        self.clients.append(process)
        return process

    def mark(self, phase: str) -> None:
        """Note when a phase ended (``facts["timeline"]``, seconds into the round)."""
        self.facts.setdefault("timeline", []).append(
            (phase, round(time.monotonic() - self.started, 1)))

    def pause(self, low_s: float, high_s: float) -> None:
        """Let the clients run for a seeded while (the workload's pace)."""
        time.sleep(self.rng.uniform(low_s, high_s))

    def fault(self, name: str, targets: list[str],
              apply: contextlib.AbstractContextManager[Any]
              ) -> contextlib.AbstractContextManager[None]:
        return self.cluster.fault(self.harness, name, targets, apply)

    def ops(self) -> list[Operation]:
        return load(sorted(self.dir.glob("*.jsonl")))

    def finish(self) -> RoundResult:
        for client in self.clients:
            client.kill()
            client.poll_lines()
        self.facts["client_errors"] = {
            c.name: line["error"] for c in self.clients for line in c.lines
            if line.get("event") == "error"}
        self.harness.close()
        ops = self.ops()
        anomalies = check(ops)
        return RoundResult(self.name, self.seed, ops, anomalies, report(ops, anomalies),
                           time.monotonic() - self.started, self.facts)

    @contextlib.contextmanager
    def running(self) -> Iterator[Round]:
        """The round; its clients are killed however it ends."""
        try:
            yield self
        finally:
            for client in self.clients:
                client.kill()


def settled(cluster: NetCluster, timeout_s: float = 60.0) -> None:
    """Until the cluster is whole again after a round: every bookie
    registered writable and every container assigned and open
    (AssertionError naming what is not, at ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        writable = _writable_bookies(cluster.metadata_uri)
        missing = sorted({b.bookie_id for b in cluster.bookies} - writable)
        if not missing:
            break
        assert time.monotonic() < deadline, f"bookies not writable again: {missing}"
        time.sleep(0.5)  # polling the cluster's state, with a deadline
    cluster.wait_assigned(max(1.0, deadline - time.monotonic()))


def _writable_bookies(metadata_uri: str) -> set[str]:
    async def use(store: MetadataStore) -> set[str]:
        return {b.bookie_id for b in await store.list_bookies()
                if b.state is BookieState.WRITABLE}
    return with_metadata(metadata_uri, use)


def _ensembles(metadata_uri: str, ledger: int) -> list[tuple[int, tuple[str, ...]]]:
    async def use(store: MetadataStore) -> list[tuple[int, tuple[str, ...]]]:
        return list((await store.read_ledger(ledger)).value.ensembles)
    return with_metadata(metadata_uri, use)


def _finish_deleting(r: Round, ledgers: list[int]) -> RoundResult:
    """The round's result, its ledgers then deleted so that the soak's own
    data stays bounded on the bookies' small disks (their GC reclaims it);
    a deletion that fails is a fact of the result, not a lost round."""
    result = r.finish()

    async def use(store: MetadataStore) -> None:
        for ledger in ledgers:
            await store.delete_ledger(ledger)
    try:
        with_metadata(r.cluster.metadata_uri, use)
    except QuireError as e:
        result.facts["ledgers_not_deleted"] = f"{ledgers}: {type(e).__name__}: {e}"
    return result


def _ledger_round(r: Round, fault: Callable[[Round, list[str]], tuple[str, list[str],
                                                                   Any]],
                  recover_mid_way: bool = False) -> RoundResult:
    """A ledger writer (E3 W3 A2) and a reader following it; ``fault`` is
    given the ledger's first ensemble and returns what to apply (name,
    targets, context manager), held for 3 to 5 s while the writer adds."""
    with r.running():
        writer = r.client("ledger-writer", "lw", quorum=[3, 3, 2], interval_ms=15,
                          in_flight=8, add_timeout_ms=2000, ledgers=1)
        ledger = int(writer.wait_line(lambda line: "ledger" in line)["ledger"])
        reader = r.client("ledger-reader", "lr", ledger=ledger, poll_ms=100)
        ensemble = list(_ensembles(r.cluster.metadata_uri, ledger)[0][1])
        r.facts["first_ensemble"] = ensemble
        r.pause(0.5, 1.0)
        name, targets, apply = fault(r, ensemble)
        with r.fault(name, targets, apply):
            if recover_mid_way:
                r.pause(0.5, 1.0)
                reader.send("recover")
                reader.wait_line(lambda line: "recovered" in line)
            r.pause(3.0, 5.0)
        r.pause(0.5, 1.0)
        writer.finish()
        closed = writer.wait_line(lambda line: "closed" in line)
        r.facts["ensembles"] = closed["ensembles"]
        reader.finish(verify=[ledger])
        return _finish_deleting(r, [ledger])


def writer_partitioned_from_bookie(cluster: NetCluster, seed: int, root: Path) -> RoundResult:
    """The ledger's writer loses one bookie of its ensemble (nftables) for
    longer than its add timeout: it changes ensemble and loses nothing."""
    r = Round(cluster, "writer-bookie-partition", seed, root)

    def fault(r: Round, ensemble: list[str]) -> tuple[str, list[str], Any]:
        victim = r.rng.choice(ensemble)
        r.facts["victim"] = victim
        return "partition", ["c-lw", victim], cluster.partition(["c-lw"], [victim])

    return _ledger_round(r, fault)


def bookie_cut_off(cluster: NetCluster, seed: int, root: Path) -> RoundResult:
    """A bookie of the writer's ensemble is cut off from everyone for a
    while: its link goes down (an even seed), or nftables isolates it (an
    odd one)."""
    r = Round(cluster, "bookie-cut-off", seed, root)

    def fault(r: Round, ensemble: list[str]) -> tuple[str, list[str], Any]:
        victim = r.rng.choice(ensemble)
        r.facts["victim"] = victim
        if seed % 2 == 0:
            return "link-down", [victim], cluster.net.link_down(cluster.host(victim))
        return "isolated", [victim], cluster.isolated(victim)

    return _ledger_round(r, fault)


def bookie_disk_full(cluster: NetCluster, seed: int, root: Path) -> RoundResult:
    """A bookie of the ensemble fills its disk: it turns read-only and the
    writer moves on to another; freed, it turns writable again."""
    r = Round(cluster, "bookie-disk-full", seed, root)

    def fault(r: Round, ensemble: list[str]) -> tuple[str, list[str], Any]:
        victim = r.rng.choice(ensemble)
        r.facts["victim"] = victim
        return "disk-full", [victim], cluster.disk_filled(victim, 0.95)

    return _ledger_round(r, fault)


def recovery_while_writing(cluster: NetCluster, seed: int, root: Path,
                           name: str = "recovery-while-writing") -> RoundResult:
    """Another client recovers (fences and closes) the ledger while its
    writer, cut off from ZooKeeper, keeps adding: nothing the writer is
    told after the fence may count, nothing above the close may be read."""
    r = Round(cluster, name, seed, root)

    def fault(r: Round, _ensemble: list[str]) -> tuple[str, list[str], Any]:
        zookeepers = cluster.zookeeper_hosts()
        return "partition", ["c-lw", *zookeepers], cluster.partition(["c-lw"], zookeepers)

    return _ledger_round(r, fault, recover_mid_way=True)


def recovery_while_fencing_is_off(cluster: NetCluster, seed: int, root: Path) -> RoundResult:
    """:func:`recovery_while_writing` with every bookie's fencing switched
    off (the planted bug ``bookie-skip-fencing``): the checker must find the
    writer acknowledged past the close."""
    with cluster.planted("bookie-skip-fencing", [b.name for b in cluster.bookies]):
        return recovery_while_writing(cluster, seed, root, name="planted-fencing-off")


# --- streams ----------------------------------------------------------------------------


SCOPE = "net"


async def _create_stream(controller_uri: str, stream: str, segments: int) -> None:
    async with ControllerClient(controller_uri) as controller:
        await controller.create_scope(SCOPE)
        await controller.create_stream(SCOPE, stream, segments)


class StreamWorkload:
    """Writers (Quire's and the real Pravega client's, both exactly once),
    Quire's stream reader reading through the fault, and optionally a probe
    asking every segment store for the segments' lengths; once the writers
    stopped and the cluster settled, a reader group of the real Pravega
    client (two readers, one of which may fail mid-slice) reads it all.

    (The real client's readers are started only then: a reader of version
    0.3.8 whose segments' containers move, as they do in every segment
    store fault, stops reading for good; its ``reader_offline`` then
    panics with "Fetch updates failed after all retries".  Its writer
    rides through the faults.)"""

    def __init__(self, r: Round, probe: bool = True) -> None:
        self.r = r
        self.stream = f"s{r.seed}"
        self.segments = r.rng.choice((2, 3))
        asyncio.run(_create_stream(r.cluster.controller_uri, self.stream, self.segments))
        self.common = {"scope": SCOPE, "stream": self.stream, "wait": False}
        self.writers = [
            r.client("stream-writer", "qw", keys=4, interval_ms=25, in_flight=20,
                     **self.common),
            r.client("pravega-writer", "pw", keys=3, interval_ms=40, **self.common)]
        self.readers = {"qr": [r.client("stream-reader", "qr", group="qr", **self.common)]}
        self.prober: ClientProcess | None = None
        if probe:
            self.prober = r.client(
                "segment-prober", "probe", interval_ms=250, wait=False,
                hosts=[s.address for s in r.cluster.stores],
                segments=[segment_name(SCOPE, self.stream, i) for i in range(self.segments)])
        for client in r.clients:
            client.ready()

    def finish(self, deadline_s: float = 45.0) -> None:
        """Stop the writers; read with a Pravega reader group too; wait
        until each group read every acknowledged event (or the deadline),
        record the groups done, stop the readers."""
        for writer in self.writers:
            writer.finish()
        r = self.r
        r.mark("written")
        group = f"rg{r.seed}"  # a group is per scope: one per round's stream
        if r.rng.random() < 0.5:  # r1 fails mid-slice; r2 must read its unreleased events
            first = r.client("pravega-reader", "r1", group=group, reader="r1",
                             fail_after=r.rng.randint(1, 60), **self.common)
            first.ready()
            first.wait_line(lambda line: "failed" in line or line.get("event") == "done")
            self.readers[group] = [first, r.client("pravega-reader", "r2", group=group,
                                                   reader="r2", **self.common)]
        else:
            self.readers[group] = [
                r.client("pravega-reader", name, group=group, reader=name, **self.common)
                for name in ("r1", "r2")]
        for reader in self.readers[group]:
            reader.ready()
        r.mark("group started")
        stream = f"{SCOPE}/{self.stream}"
        deadline = time.monotonic() + deadline_s
        for group, readers in self.readers.items():
            while not self._covered(group, readers) and time.monotonic() < deadline:
                time.sleep(0.5)  # polling the readers' histories, with a deadline
            done = r.harness.invoke("group.done", stream, {"group": group})
            r.harness.ok(done)
            for reader in readers:
                reader.poll_lines()
                if not any("failed" in line for line in reader.lines):
                    reader.finish()
        if self.prober is not None:
            self.prober.finish()

    def _covered(self, group: str, readers: list[ClientProcess]) -> bool:
        ops = load([w.history for w in self.writers] + [r.history for r in readers])
        wanted = {o.arg("payload") for o in ops if o.f == "event.write" and o.ok}
        read = {o.res("payload") for o in ops if o.f == "event.read" and o.arg("group") == group}
        return wanted <= read


def _stream_round(r: Round, fault: Callable[[Round, str], tuple[str, list[str], Any]],
                  hold: Callable[[Round, str], None], probe: bool = True) -> RoundResult:
    """The stream workload; a segment store chosen by the seed suffers
    ``fault`` while ``hold`` runs (it waits for what the scenario expects);
    then the cluster must settle with every store back."""
    with r.running():
        victim = r.rng.choice([s.name for s in r.cluster.stores])
        r.facts["victim"] = victim
        workload = StreamWorkload(r, probe)
        r.mark("clients")
        r.pause(0.5, 1.5)
        log_start = len(r.cluster.service(victim).log())
        name, targets, apply = fault(r, victim)
        with r.fault(name, targets, apply):
            hold(r, victim)
        r.mark("healed")
        r.facts["victim_log"] = r.cluster.service(victim).log()[log_start:]
        r.cluster.wait_assigned(timeout_s=60)
        r.mark("settled")
        r.pause(0.5, 1.5)
        workload.finish()
        r.mark("read")
        return r.finish()


def _wait_taken_over(r: Round, victim: str, timeout_s: float) -> None:
    """Until the assignment gives the victim no container (a fact: whether it did)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assignment = r.cluster.assignment()
        if assignment and victim not in assignment.values():
            r.facts["taken_over_after_s"] = round(time.monotonic() - r.started, 2)
            return
        time.sleep(0.2)  # polling the assignment, with a deadline
    r.facts["taken_over_after_s"] = None


def _takeover_then_write(r: Round, victim: str) -> None:
    """Hold the fault until the victim's containers moved, then 1-3 s more
    of writes to their new owner."""
    _wait_taken_over(r, victim, r.cluster.spec.session_ms / 1000 + 20)
    r.pause(0.5, 2.0)


def segment_store_partitioned_from_zookeeper(cluster: NetCluster, seed: int, root: Path,
                                             probe: bool = False) -> RoundResult:
    """A segment store loses ZooKeeper but not the bookies nor its clients:
    its session expires, its containers are taken over (fencing it through
    tier-1), and healed, it rejoins without serving stale data."""
    r = Round(cluster, "store-zookeeper-partition", seed, root)

    def fault(r: Round, victim: str) -> tuple[str, list[str], Any]:
        zookeepers = cluster.zookeeper_hosts()
        return "partition", [victim, *zookeepers], cluster.partition([victim], zookeepers)

    return _stream_round(r, fault, _takeover_then_write, probe)


def quiet_store_partitioned_from_zookeeper(cluster: NetCluster, seed: int,
                                           root: Path) -> RoundResult:
    """A one-segment stream is written, then left alone; its owner is cut
    off from ZooKeeper and, once its container was taken over, a new
    writer appends through the new owner while a probe asks both stores
    for the segment's length.  Nothing the quiet old owner writes tells it
    that it lost the container (no write of its own is fenced): its reads
    must confirm ownership through tier-1 while its lease is uncertain, or
    it answers the length it had, a stale read, until it sees its session
    expire after the partition heals (``facts["victim_during_fault"]``:
    its answers while cut off, by outcome)."""
    r = Round(cluster, "quiet-store-zookeeper-partition", seed, root)
    with r.running():
        stream = f"q{seed}"
        asyncio.run(_create_stream(cluster.controller_uri, stream, 1))
        common = {"scope": SCOPE, "stream": stream, "keys": 1, "interval_ms": 10}
        probe = r.client("segment-prober", "probe", interval_ms=100,
                         hosts=[s.address for s in cluster.stores],
                         segments=[segment_name(SCOPE, stream, 0)])
        r.client("stream-writer", "w1", events=30, **common).wait_done()
        assignment = cluster.wait_assigned()
        victim = assignment[container_of(segment_name(SCOPE, stream, 0),
                                         cluster.spec.container_count)]
        r.facts["victim"] = victim
        zookeepers = cluster.zookeeper_hosts()
        with r.fault("partition", [victim, *zookeepers],
                     cluster.partition([victim], zookeepers)):
            _wait_taken_over(r, victim, cluster.spec.session_ms / 1000 + 20)
            r.client("stream-writer", "w2", events=30, **common).wait_done()
            r.pause(1.0, 1.5)  # the probe asks both stores meanwhile
        cluster.wait_assigned(timeout_s=60)
        probe.finish()
        start, end = _fault_window(r)
        address = cluster.service(victim).address
        answers = [o for o in r.ops() if o.f == "segment.length" and o.arg("host") == address
                   and start < o.invoked and o.completed is not None and o.completed < end]
        r.facts["victim_during_fault"] = {
            outcome: sum(1 for o in answers if (o.error or "ok") == outcome)
            for outcome in {o.error or "ok" for o in answers}}
        reader = r.client("stream-reader", "qr", group="qr", scope=SCOPE, stream=stream)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(
                [o for o in load([reader.history]) if o.f == "event.read"]) < 60:
            time.sleep(0.2)  # polling the reader's history, with a deadline
        r.harness.ok(r.harness.invoke("group.done", f"{SCOPE}/{stream}", {"group": "qr"}))
        reader.finish()
        return r.finish()


def segment_store_paused(cluster: NetCluster, seed: int, root: Path,
                         probe: bool = False) -> RoundResult:
    """A segment store stops (SIGSTOP, a long GC pause) past its session:
    its containers are taken over, and it wakes up fenced."""
    r = Round(cluster, "store-paused", seed, root)

    def fault(r: Round, victim: str) -> tuple[str, list[str], Any]:
        return "pause", [victim], cluster.paused(victim)

    return _stream_round(r, fault, _takeover_then_write, probe)


def segment_store_killed(cluster: NetCluster, seed: int, root: Path,
                         probe: bool = False) -> RoundResult:
    """``kill -9`` of a segment store, restarted on its address 2-4 s later."""
    r = Round(cluster, "store-killed", seed, root)

    def fault(r: Round, victim: str) -> tuple[str, list[str], Any]:
        return "kill-9", [victim], cluster.killed(victim)

    return _stream_round(r, fault, lambda r, _victim: r.pause(1.0, 3.0), probe)


def _fault_window(r: Round) -> tuple[float, float]:
    fault = next(o for o in r.ops() if o.f == "fault")
    assert fault.completed is not None
    return fault.invoked, fault.completed


def zookeeper_quorum_loss(cluster: NetCluster, seed: int, root: Path) -> RoundResult:
    """Two of three ZooKeeper members die while a ledger writer (a new
    ledger every 40 entries) and the stream writers go on: no new ledger
    and no ownership change until the members are back, no acknowledged
    data lost, and service resumes by itself."""
    r = Round(cluster, "zookeeper-quorum-loss", seed, root)
    with r.running():
        before = cluster.wait_assigned()
        workload = StreamWorkload(r, probe=False)
        writer = r.client("ledger-writer", "lw", quorum=[3, 3, 2], interval_ms=15,
                          in_flight=8, add_timeout_ms=2000, per_ledger=40)
        # its session is open and it writes (else the fault could come first
        # and it would ask for nothing while the quorum is lost)
        writer.wait_line(lambda line: "ledger" in line)
        r.pause(1.0, 2.0)
        victims = r.rng.sample(cluster.zookeeper_hosts(), 2)
        with r.fault("quorum-loss", victims, cluster.quorum_lost(victims)):
            r.pause(5.0, 7.0)
            healing = time.time()  # (the members restart from here on)
        r.pause(2.0, 3.0)
        writer.finish()
        ledgers = [line["ledger"] for line in writer.lines if "ledger" in line]
        r.facts["ledgers"] = len(ledgers)
        reader = r.client("ledger-reader", "lr", ledger=ledgers[0], poll_ms=200)
        reader.finish(verify=ledgers)
        workload.finish()
        r.facts["assignment_kept"] = cluster.wait_assigned() == before
        start, end = _fault_window(r)
        ops = r.ops()
        metadata_ops = [o for o in ops if o.f in ("ledger.create", "ledger.close")]
        r.facts["metadata_changed_during_fault"] = [
            o.describe() for o in metadata_ops if o.ok and o.invoked > start + 0.5
            and o.completed is not None and o.completed < healing]
        r.facts["metadata_ops_held"] = sum(
            1 for o in metadata_ops if start < o.invoked < healing
            and (o.completed is None or o.completed > healing))
        r.facts["resumed"] = {
            f: any(o.ok and o.invoked > end for o in ops if o.f == f)
            for f in ("ledger.create", "event.write")}
        return _finish_deleting(r, ledgers)


ROUNDS: dict[str, Callable[..., RoundResult]] = {
    "writer-bookie-partition": writer_partitioned_from_bookie,
    "bookie-cut-off": bookie_cut_off,
    "bookie-disk-full": bookie_disk_full,
    "recovery-while-writing": recovery_while_writing,
    "planted-fencing-off": recovery_while_fencing_is_off,
    "store-zookeeper-partition": segment_store_partitioned_from_zookeeper,
    "quiet-store-zookeeper-partition": quiet_store_partitioned_from_zookeeper,
    "store-paused": segment_store_paused,
    "store-killed": segment_store_killed,
    "zookeeper-quorum-loss": zookeeper_quorum_loss,
}
