"""A Quire cluster of hosts on one machine: every process in a network
namespace of its own, with its own address on one bridge (see
:mod:`tests.support.netns`), metadata in a real ZooKeeper (one server, or
a three-member ensemble), five bookies, segment stores flushing to tier-2
on a moto S3 server, one controller, and clients on hosts of their own.

Each server listens on its host's address and advertises it, so fixed
ports serve: ZooKeeper 2181, bookies 3181, segment stores 12345
(``/metrics`` 9100), the controller 9090, S3 5000.  The bookies and the
segment stores listen on every interface of their namespace
(``listen_host = "0.0.0.0"``) and advertise their host's address
(``advertised_host``), as behind a load balancer or in a container; the
controller's ``host`` is both.  Timeouts are set explicitly: ZooKeeper sessions (the
bookies' registrations, the segment stores' and controller's leases) last
:attr:`NetClusterSpec.session_ms`, long enough that a starved process on a
busy 2-core machine keeps its session, short enough for a fault round.

:meth:`NetCluster.close` (also run at exit) removes every process,
namespace, link and mount of the run, however the run ends; ``down``
removes what runs that died left behind.

``python -m tests.support.netcluster up [--bookies N] [--segment-stores N]
[--zookeepers 1|3]`` runs one until Ctrl-C, printing where everything is;
``status`` lists the runs on this machine; ``down [--all]`` removes dead
runs' leftovers (``--all``: live runs too).  ``scripts/netcluster`` wraps it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.metadata import MetadataStore
from quire.sandbox import (
    ControllerProcess,
    LineReader,
    SegmentStoreProcess,
    ServiceProcess,
    parent_death_prefix,
    start_all,
    stop_all,
)
from quire.segmentstore.ownership import read_assignment
from quire.testing import planted
from quire.testing.history import Recorder
from tests.support import netns
from tests.support.bookies import BookieProcess
from tests.support.metadata import with_metadata
from tests.support.s3_server import CREDENTIALS, MotoS3Server, S3Endpoint
from tests.support.zookeeper import CLIENT_PORT, ZooKeeperServer

REPO = Path(__file__).resolve().parents[2]
BOOKIE_PORT, STORE_PORT, METRICS_PORT, CONTROLLER_PORT, S3_PORT = 3181, 12345, 9100, 9090, 5000
BUCKET = "quire-tier2"


@dataclass(frozen=True)
class NetClusterSpec:
    bookies: int = 5
    segment_stores: int = 2
    controller: bool = True
    zookeepers: int = 1
    """1, or 3 for an ensemble that can lose its quorum."""
    s3: bool = True
    """Tier-2 on a moto S3 server (else the segment stores have no tier-2)."""
    container_count: int = 4
    session_ms: int = 4000
    """ZooKeeper session timeout of every server (bookie registration,
    segment store and controller leases)."""
    bookie_disk_mib: int = 0
    """A tmpfs of this size per bookie for its journal and ledgers (0: the
    run's directory), so that a round can fill one up."""
    bookie_settings: dict[str, Any] = field(default_factory=dict)
    store_settings: dict[str, Any] = field(default_factory=dict)


def _service_env() -> dict[str, str]:
    return {"PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", **CREDENTIALS}


class ClientProcess:
    """A :mod:`tests.support.net_client` process on a host: its stdout's
    JSON lines (:attr:`lines`, read as they come) and its stdin commands.
    It gets SIGKILL when the thread that started it (the harness's main
    thread) ends (:func:`~quire.sandbox.parent_death_prefix`, after ``ip
    netns exec``)."""

    def __init__(self, host: netns.Host, spec: dict[str, Any], log: Path) -> None:
        self.name = spec["name"]
        self.history = Path(spec["history"])
        self.lines: list[dict[str, Any]] = []
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [*host.exec_prefix, *parent_death_prefix(signal.SIGKILL), sys.executable, "-m",
                 "tests.support.net_client", json.dumps(spec)],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, env={**os.environ, **_service_env(), "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        self._stdout = LineReader(self.proc.stdout)
        self.log = log

    @property
    def closed(self) -> bool:
        """:meth:`kill` was called: it ended, its lines were read, its pipes closed."""
        assert self.proc.stdin is not None
        return self.proc.stdin.closed

    def poll_lines(self, wait_s: float = 0.0) -> None:
        """Read the lines printed so far (waiting up to ``wait_s`` for one)."""
        while (line := self._stdout.line(wait_s)) is not None:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))
            wait_s = 0.0

    def wait_line(self, predicate: Callable[[dict[str, Any]], bool],
                  timeout_s: float = 60.0) -> dict[str, Any]:
        """The first line (seen or to come) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if line.get("event") == "error":
                    raise AssertionError(f"client {self.name} failed: {line['error']} "
                                         f"(log: {self.log})")
                if predicate(line):
                    return line
            seen = len(self.lines)
            if self.proc.poll() is not None:
                self.poll_lines()
                if len(self.lines) == seen:
                    raise AssertionError(f"client {self.name} exited ({self.proc.returncode}) "
                                         f"(log: {self.log})")
            assert time.monotonic() < deadline, f"client {self.name}: no such line in time"
            self.poll_lines(min(0.2, max(0.0, deadline - time.monotonic())))

    def ready(self) -> None:
        self.wait_line(lambda line: line.get("event") == "ready")

    def send(self, cmd: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
            self.proc.stdin.flush()

    def finish(self, timeout_s: float = 90.0, **stop_args: Any) -> None:
        """Stop it and wait for its end; AssertionError if it failed."""
        self.send("stop", **stop_args)
        self.wait_done(timeout_s)

    def wait_done(self, timeout_s: float = 90.0) -> None:
        """Wait for its end (it ends by itself); AssertionError if it failed."""
        self.wait_line(lambda line: line.get("event") == "done", timeout_s)
        self.proc.wait(10)

    def kill(self, timeout_s: float = 10.0) -> None:
        """``kill -9`` (if it still runs), wait for its end, read what it
        printed into :attr:`lines` and close its pipes (idempotent).
        AssertionError if it did not end within ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"client {self.name} (pid {self.proc.pid}) still runs "
                                 f"{timeout_s:g} s after SIGKILL (log: {self.log})") from None
        self.poll_lines()  # what is left (a process of its own may hold the pipe: no wait)
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        self._stdout.close()


class NetCluster:
    """One run's network and processes (module docstring)."""

    def __init__(self, root: Path, spec: NetClusterSpec | None = None) -> None:
        self.root = root
        self.spec = spec or NetClusterSpec()
        self.net = netns.Network()
        self.zookeepers: list[ZooKeeperServer] = []
        self.bookies: list[BookieProcess] = []
        self.stores: list[SegmentStoreProcess] = []
        self.controller: ControllerProcess | None = None
        self.s3: MotoS3Server | None = None
        self.clients: list[ClientProcess] = []
        self.metadata_uri = ""

    # --- start and stop -----------------------------------------------------------------

    def start(self) -> NetCluster:
        netns.require_tools()
        netns.sweep()
        self.root.mkdir(parents=True, exist_ok=True)
        self.net.start()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        spec = self.spec
        zk_hosts = [self.net.add_host(f"zk-{i}") for i in range(1, spec.zookeepers + 1)]
        peers = [h.address for h in zk_hosts] if spec.zookeepers > 1 else []
        self.zookeepers = [ZooKeeperServer(host=h.address, port=CLIENT_PORT,
                                           command_prefix=h.exec_prefix, peers=peers, my_id=i)
                           for i, h in enumerate(zk_hosts, 1)]
        for server in self.zookeepers:
            server.start(wait=False)
        for server in self.zookeepers:
            server.wait_serving()
        connect = ",".join(f"{h.address}:{CLIENT_PORT}" for h in zk_hosts)
        self.metadata_uri = f"zk://{connect}/quire-{self.net.prefix}"
        for i in range(1, spec.bookies + 1):
            self.bookies.append(self._bookie(i))
        for bookie in self.bookies:
            bookie.start(expect_ready=False)
        if spec.s3:
            s3_host = self.net.add_host("s3")
            self.s3 = MotoS3Server(host=s3_host.address, port=S3_PORT,
                                   command_prefix=s3_host.exec_prefix)
            self.s3.start()
            with _credentials():
                self.s3.create_bucket(BUCKET)
        _await_ready(self.bookies)
        self.stores = [self._store(i) for i in range(1, spec.segment_stores + 1)]
        start_all(self.stores)
        if self.stores:
            self.wait_assigned()
        if spec.controller:
            host = self.net.add_host("controller")
            self.controller = ControllerProcess(self.root, self.metadata_uri, host=host.address,
                                                port=CONTROLLER_PORT, lease_ms=spec.session_ms)
            self._place(self.controller, host)
            self.controller.start()

    def _place(self, process: ServiceProcess, host: netns.Host) -> None:
        process.command_prefix = host.exec_prefix
        process.extra_env = _service_env()
        process.ends_with_parent = True

    def _bookie(self, i: int) -> BookieProcess:
        host = self.net.add_host(f"bookie-{i}")
        settings: dict[str, Any] = {
            "listen_host": "0.0.0.0", "advertised_host": host.address, "port": BOOKIE_PORT,
            "registration_lease_ms": self.spec.session_ms, "power_loss_tracking": False,
            "write_cache_max_bytes": 16 << 20, "read_cache_max_bytes": 4 << 20}
        if self.spec.bookie_disk_mib:
            disk = self.disk_of(f"bookie-{i}")
            self.net.mount_tmpfs(disk, self.spec.bookie_disk_mib)
            settings.update({"journal_dirs": [str(disk / "journal")],
                             "ledger_dirs": [str(disk / "ledgers")],
                             "journal_file_size_bytes": 1 << 20, "journal_reuse_files_max": 2,
                             "entry_log_max_bytes": 2 << 20, "entry_log_direct_io": False,
                             "disk_usage_threshold": 0.90, "disk_usage_lwm_threshold": 0.80,
                             # what rounds delete comes back within a round or two
                             "gc_interval_ms": 10_000, "minor_compaction_interval_ms": 60_000,
                             "major_compaction_interval_ms": 300_000})
        bookie = BookieProcess(self.root, self.metadata_uri, f"bookie-{i}",
                               **{**settings, **self.spec.bookie_settings})
        self._place(bookie, host)
        return bookie

    def disk_of(self, bookie: str) -> Path:
        """The mount point of a bookie's own file system."""
        return self.root / f"{self.net.prefix}-{bookie}-disk"

    def _store(self, i: int) -> SegmentStoreProcess:
        host = self.net.add_host(f"ss-{i}")
        settings: dict[str, Any] = {
            "listen_host": "0.0.0.0", "advertised_host": host.address, "port": STORE_PORT,
            "metrics_port": METRICS_PORT,
            "lease_ms": self.spec.session_ms, "container_count": self.spec.container_count,
            "rebalance_interval_ms": 250, "tail_read_wait_ms": 500,
            "tier1_ensemble_size": 3, "tier1_write_quorum_size": 3, "tier1_ack_quorum_size": 2,
            "tier2_flush_threshold_bytes": 64 << 10, "tier2_flush_threshold_ms": 2000,
            "read_index_budget_bytes": 32 << 20}
        if self.s3 is not None:
            settings["tier2_uri"] = S3Endpoint(self.s3.endpoint_url, BUCKET).uri("tier2")
        store = SegmentStoreProcess(self.root, self.metadata_uri, f"ss-{i}",
                                    **{**settings, **self.spec.store_settings})
        self._place(store, host)
        return store

    def close(self) -> None:
        """Stop everything and remove the network (idempotent);
        AssertionError at the end if a client would not die."""
        stuck = []
        for client in self.clients:
            try:
                client.kill()
            except AssertionError as e:
                stuck.append(str(e))
        services: list[ServiceProcess] = [*self.stores, *self.bookies]
        if self.controller is not None:
            services.append(self.controller)
        for process in services:  # a paused process cannot stop
            if process.proc is not None and process.proc.poll() is None:
                os.kill(process.proc.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            if self.controller is not None:
                self.controller.stop(10)
            stop_all(self.stores)
            stop_all(self.bookies)
        for process in services:
            process.kill9()
        if self.s3 is not None:
            self.s3.stop()
        for server in self.zookeepers:
            server.stop()
        self.net.close()
        assert not stuck, "; ".join(stuck)

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- looking at it ------------------------------------------------------------------

    @property
    def controller_uri(self) -> str:
        assert self.controller is not None
        return self.controller.uri

    def host(self, name: str) -> netns.Host:
        """A host by name, made on first use (clients' hosts)."""
        return self.net.hosts.get(name) or self.net.add_host(name)

    def service(self, name: str) -> ServiceProcess:
        everything: list[ServiceProcess] = [*self.bookies, *self.stores]
        if self.controller is not None:
            everything.append(self.controller)
        return next(p for p in everything if p.name == name)

    def assignment(self) -> dict[int, str]:
        """Container -> the segment store the metadata store assigns it to."""
        async def read(store: MetadataStore) -> dict[int, str]:
            return (await read_assignment(store))[0]
        return with_metadata(self.metadata_uri, read)

    def wait_assigned(self, timeout_s: float = 60.0,
                      hosts: set[str] | None = None) -> dict[int, str]:
        """Until every container is assigned, to exactly ``hosts`` (default:
        every running segment store), and each store has its own open; the
        assignment."""
        deadline = time.monotonic() + timeout_s
        wanted = hosts if hosts is not None else {s.name for s in self.stores if s.running}
        while True:
            assignment = self.assignment()
            hosted = {s.name: self.hosted(s) for s in self.stores if s.name in wanted}
            if len(assignment) == self.spec.container_count and \
                    set(assignment.values()) == wanted and \
                    all(n == sum(h == s for h in assignment.values()) for s, n in hosted.items()):
                return assignment
            assert time.monotonic() < deadline, \
                f"containers not settled: {assignment}, open per store {hosted}"
            time.sleep(0.2)  # polling the cluster's state, with a deadline

    def hosted(self, store: SegmentStoreProcess) -> int:
        """Containers a segment store has open (its ``/metrics``), -1 if it does not answer."""
        import urllib.request

        try:
            text = urllib.request.urlopen(f"http://{store.metrics_address}/metrics",
                                          timeout=5).read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith("quire_segmentstore_containers_hosted "):
                return int(float(line.split()[1]))
        return -1

    def describe(self) -> dict[str, Any]:
        hosts = self.net.hosts
        return {
            "prefix": self.net.prefix, "subnet": str(self.net.subnet),
            "metadata": self.metadata_uri, "dir": str(self.root),
            "zookeepers": [z.connect_string for z in self.zookeepers],
            "bookies": {b.name: b.address for b in self.bookies},
            "segment_stores": {s.name: s.address for s in self.stores},
            "controller": self.controller.uri if self.controller else None,
            "s3": self.s3.endpoint_url if self.s3 else None,
            "namespaces": {h.name: h.ns for h in hosts.values()}}

    # --- clients ------------------------------------------------------------------------

    def client(self, host: str, spec: dict[str, Any], wait: bool = True) -> ClientProcess:
        """Start a client (:mod:`tests.support.net_client`) on ``host``;
        with ``wait``, wait until it is ready (:meth:`ClientProcess.ready`)."""
        process = ClientProcess(self.host(host), {
            "metadata_uri": self.metadata_uri,
            "controller_uri": self.controller.uri if self.controller else "", **spec},
            self.root / f"client-{spec['name']}.log")
        self.clients = [c for c in self.clients if not c.closed]  # (earlier rounds')
        self.clients.append(process)
        if wait:
            process.ready()
        return process

    # --- faults -------------------------------------------------------------------------

    @contextlib.contextmanager
    def fault(self, rec: Recorder, name: str, targets: list[str],
              apply: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
        """Record fault ``name`` on ``targets`` while ``apply`` holds it."""
        op = rec.invoke("fault", name, {"targets": targets})
        with apply:
            yield
        rec.ok(op)

    def partition(self, side_a: list[str], side_b: list[str]
                  ) -> contextlib.AbstractContextManager[None]:
        """Nothing passes between the named hosts of the two sides
        (``"harness"`` in ``side_b`` is this machine's own address)."""
        b: list[netns.Host | str] = [self.net.gateway if n == "harness" else self.host(n)
                                     for n in side_b]
        return self.net.partition([self.host(n) for n in side_a], b)

    def isolated(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The named host exchanges nothing with any other (this machine included)."""
        return self.partition([name], [n for n in self.net.hosts if n != name] + ["harness"])

    def zookeeper_hosts(self) -> list[str]:
        return [f"zk-{i}" for i in range(1, len(self.zookeepers) + 1)]

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """SIGSTOP the service (a long GC pause), SIGCONT at the end."""
        process = self.service(name)
        assert process.proc is not None
        os.kill(process.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(process.proc.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def killed(self, name: str) -> Iterator[None]:
        """``kill -9`` the service; start it again (same address and data) at the end."""
        process = self.service(name)
        process.kill9()
        try:
            yield
        finally:
            process.start()

    @contextlib.contextmanager
    def disk_filled(self, bookie: str, fraction: float = 0.95) -> Iterator[None]:
        """Fill the bookie's file system to ``fraction`` of its size; free it at the end."""
        disk = self.disk_of(bookie)
        usage = os.statvfs(disk)
        total = usage.f_blocks * usage.f_frsize
        used = total - usage.f_bfree * usage.f_frsize
        filler = disk / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(4096, int(total * fraction) - used))
        try:
            yield
        finally:
            filler.unlink(missing_ok=True)

    @contextlib.contextmanager
    def planted(self, bug: str, names: list[str]) -> Iterator[None]:
        """Restart the named services with a product bug planted
        (:mod:`quire.testing.planted`); restart them as they were at the end."""
        processes = [self.service(n) for n in names]

        def restart(entry: str, env: dict[str, str]) -> None:
            stop_all(processes)
            for process in processes:
                process.entry_module = entry
                process.extra_env = {**_service_env(), **env}
            start_all(processes)

        restart("quire.testing.planted", {planted.ENV: bug})
        try:
            yield
        finally:
            restart("quire.cli.main", {})

    @contextlib.contextmanager
    def quorum_lost(self, names: list[str]) -> Iterator[None]:
        """``kill -9`` the named ZooKeeper members (``zk-<n>``); restart them
        at the end (on their data) and wait until the ensemble serves again."""
        victims = [self.zookeepers[int(n.rpartition("-")[2]) - 1] for n in names]
        for server in victims:
            server.kill()
        try:
            yield
        finally:
            for server in victims:
                server.restart()
            for server in victims:
                server._wait_until_serving()


def _await_ready(processes: list[BookieProcess], timeout_s: float = 60.0) -> None:
    """Wait until each started process serves."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        while not process.check_ready(0.2):
            assert time.monotonic() < deadline, f"{process.name} not ready: " \
                f"{process.last_log_line()}"


@contextlib.contextmanager
def _credentials() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- command line -----------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("kazoo").setLevel(logging.ERROR)  # (its start-up polling)
    root = Path(tempfile.mkdtemp(prefix="quire-netcluster-"))
    spec = NetClusterSpec(bookies=args.bookies, segment_stores=args.segment_stores,
                          zookeepers=args.zookeepers)
    cluster = NetCluster(root, spec)

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        cluster.start()
        print(json.dumps(cluster.describe(), indent=2), flush=True)
        print("netcluster: up; Ctrl-C (or scripts/netcluster down --all) removes it",
              flush=True)
        while True:
            time.sleep(3600)  # serving until interrupted
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
        print("netcluster: removed", flush=True)
    return 0


def _status(_args: argparse.Namespace) -> int:
    known = netns.runs()
    if not known:
        print("netcluster: no runs on this machine")
    for prefix, state in sorted(known.items()):
        life = "live" if state["alive"] else "dead (leftovers: scripts/netcluster down)"
        print(f"{prefix}: {life}, owner {state.get('owner')}, subnet {state.get('subnet')}")
        for host, address in sorted(state.get("hosts", {}).items()):
            print(f"  {host:<14} {address:<15} netns {prefix}-{host}")
    return 0


def _down(args: argparse.Namespace) -> int:
    removed = netns.sweep(everything=args.all)
    print("netcluster: removed " + (", ".join(removed) if removed else "nothing"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netcluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run a cluster of hosts until Ctrl-C")
    up.add_argument("--bookies", type=int, default=5)
    up.add_argument("--segment-stores", type=int, default=2)
    up.add_argument("--zookeepers", type=int, choices=(1, 3), default=1)
    commands.add_parser("status", help="the runs on this machine")
    down = commands.add_parser("down", help="remove dead runs' leftovers")
    down.add_argument("--all", action="store_true", help="live runs too")
    args = parser.parse_args(argv)
    return {"up": _up, "status": _status, "down": _down}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
