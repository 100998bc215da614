"""The sandbox's child processes: one ``quire <service> start`` each, ports, start and stop."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from quire.errors import QuireError

_ARMED_UNDER_PARENT = 'test "$PPID" = "$0" || exit 0; exec "$@"'
"""The shell between ``setpriv`` and the command: exit if the process's
parent is no longer the process that started it (``$0``), else exec the
command in place."""


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


def parent_death_prefix(signum: int = signal.SIGTERM) -> list[str]:
    """A command prefix that has the process it starts get ``signum`` when
    the thread that started it dies, and exit at once (status 0) if its
    parent is already gone; empty where there is no ``setpriv``.

    ``setpriv --pdeathsig`` (util-linux) arms Linux's
    ``prctl(PR_SET_PDEATHSIG)``, then a shell checks that its parent is
    still the process that started it (no signal comes for a parent that
    died before the arming) and execs the command in place: the process
    keeps its pid and gets its signals.  A prefix run after exec, never a
    ``preexec_fn``: Python code between fork and exec in a process with
    threads (kazoo's, event loops') can deadlock on a lock another thread
    held at the fork (issue #39).

    As with ``prctl``, the signal follows the *thread* that started the
    process: start it from a thread that lives as long as the process
    (the sandbox's main thread).  The arming happens in the child after
    ``Popen`` returned: should that thread end first, the kernel hands
    the child to another thread of the process, whose end then signals it.
    ``setpriv`` must come right before the program (after ``ip netns exec
    NS``, which execs in place): running a set-user-ID or file-capability
    program clears the setting."""
    setpriv = _setpriv()
    if setpriv is None:
        return []
    name = signal.Signals(signum).name.removeprefix("SIG")
    return [setpriv, f"--pdeathsig={name}", "/bin/sh", "-c", _ARMED_UNDER_PARENT,
            str(os.getpid())]


class LineReader:
    """The lines a child process prints on a pipe, read without ever waiting
    past a deadline: bytes are taken as they come (``os.read``), never with
    a buffered ``readline``, which waits for the end of a line the writer
    may never finish; a line is handed out once its newline came (what is
    left when the output ends, as a last line)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._buffer = b""
        self._eof = False

    @property
    def ended(self) -> bool:
        """No more lines: the writer closed its end (or :meth:`close` was
        called) and every line was handed out."""
        return (self._eof or self._pipe.closed) and not self._buffer

    def line(self, wait_s: float = 0.0) -> bytes | None:
        """The next line (with its newline), waiting up to ``wait_s`` for
        it; None if none came in time or the output ended (:attr:`ended`)."""
        deadline = time.monotonic() + wait_s
        while True:
            end = self._buffer.find(b"\n") + 1
            if end or (self._eof and self._buffer):
                end = end or len(self._buffer)
                line, self._buffer = self._buffer[:end], self._buffer[end:]
                return line
            if self._eof or self._pipe.closed:  # (closed: no more is read)
                return None
            left_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            if not self._poll.poll(left_ms):
                return None
            chunk = os.read(self._fd, 1 << 16)
            self._buffer += chunk
            self._eof = not chunk

    def close(self) -> None:
        self._pipe.close()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


NO_JOURNAL_SETTINGS: dict[str, Any] = {"journal_write_data": False,
                                       "data_integrity_checking": True}
"""BP-46's protected journal-less mode, as bookie settings: adds skip the
journal, and what a crash loses is detected and repaired (``quire sandbox
--no-journal`` gives them to every bookie)."""


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


class ServiceProcess:
    """One Quire service child process (``quire <service> start --config
    <toml>``) that prints a JSON ready line ``{"event": "ready", "address":
    ..., "metrics": ...}`` on stdout once it serves; ``settings`` are its
    config's flat keys (see :func:`quire.config.settings_of`)."""

    service = "service"
    """The CLI group that starts it (``quire <service> start``)."""

    def __init__(self, root: Path, name: str, settings: dict[str, Any]) -> None:
        self.root = root
        self.name = name
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self._stdout: LineReader | None = None
        self.address = ""
        self.metrics_address: str | None = None
        self.ready_event: dict[str, Any] = {}
        """The whole ready line, for what a service reports besides its address."""
        self.log_path = root / f"{name}.log"
        self.ends_with_parent = False
        """SIGTERM the process when the process that started it dies (see
        :func:`parent_death_prefix`); the sandbox sets it."""
        self.command_prefix: list[str] = []
        """Run the command through this one, which must exec it in place
        (e.g. ``ip netns exec NS``: the process keeps its pid and gets its
        signals)."""
        self.entry_module = "quire.cli.main"
        """The module ``python -m`` runs, given the CLI's arguments."""
        self.extra_env: dict[str, str] = {}
        """Environment variables set for the process besides the caller's."""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{self.name}.toml"
        path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in self.settings.items()))
        return path

    def start(self, timeout_s: float = 60.0, expect_ready: bool = True) -> None:
        self.address = ""
        config = self.write_config()
        dies_with_parent = parent_death_prefix() if self.ends_with_parent else []
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.command_prefix, *dies_with_parent, sys.executable, "-m",
                 self.entry_module, self.service, "start", "--config", str(config)],
                stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env})
        assert self.proc.stdout is not None
        self._stdout = LineReader(self.proc.stdout)
        if expect_ready:
            self._wait_ready(timeout_s)

    def check_ready(self, wait_s: float = 0.0) -> bool:
        """True once the process printed its ready line (waiting up to
        ``wait_s`` for it), False while it is still starting; QuireError if
        it exited before it was ready."""
        assert self.proc is not None and self._stdout is not None
        if self.address:
            return True
        line = self._stdout.line(wait_s)
        if line is not None:
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict) and event.get("event") == "ready":
                self.ready_event = event
                self.address = str(event["address"])
                self.metrics_address = event.get("metrics")
                return True
            return False
        if self.proc.poll() is not None or self._stdout.ended:  # exited, or closed its stdout
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            raise QuireError(f"{self.service} {self.name} exited before it was ready (status "
                             f"{self.proc.returncode}): {self.last_log_line()} "
                             f"(log: {self.log_path})")
        return False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.check_ready(0.2):
                return
        raise QuireError(f"{self.service} {self.name} did not become ready in {timeout_s:g} s: "
                         f"{self.last_log_line()} (log: {self.log_path})")

    def last_log_line(self) -> str:
        lines = [line for line in self.log().splitlines() if line.strip()]
        return lines[-1].strip() if lines else "(its log is empty)"

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> None:
        """Clean shutdown (SIGTERM)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._forget()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._forget()

    def _forget(self) -> None:
        if self._stdout is not None:
            self._stdout.close()
        self.proc = self._stdout = None

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.address.rsplit(":", 1)
        return host, int(port)


LOCAL_BOOKIE_SETTINGS: dict[str, Any] = {
    "disk_usage_threshold": 0.999,
    "disk_usage_lwm_threshold": 0.99,
    "journal_file_size_bytes": 16 * 1024 * 1024,
}
"""What a local bookie (the sandbox's, a test's) changes from BookieConfig's
production defaults.  It turns read-only only when its disk is really full:
a laptop's or a build machine's disk is shared with everything else on it and
is often fuller than the 95% at which a production bookie, on a disk of its
own, stops taking writes.  And its journal files are preallocated at 16 MiB,
not 64 MiB: several bookies share one disk, and the sandbox is for trying."""


class BookieProcess(ServiceProcess):
    """One bookie child process; ``settings`` are BookieConfig's flat keys
    (over :data:`LOCAL_BOOKIE_SETTINGS`)."""

    service = "bookie"

    def __init__(self, root: Path, metadata_uri: str, bookie_id: str, **settings: Any) -> None:
        self.bookie_id = bookie_id
        self.data_dir = root / bookie_id
        super().__init__(root, bookie_id, {
            "metadata_uri": metadata_uri,
            "bookie_id": bookie_id,
            "port": 0,
            "journal_dirs": [str(self.data_dir / "journal")],
            "ledger_dirs": [str(self.data_dir / "ledgers")],
            **LOCAL_BOOKIE_SETTINGS,
            **settings,
        })

    @property
    def dirs(self) -> list[Path]:
        return [Path(d) for d in (*self.settings["journal_dirs"], *self.settings["ledger_dirs"])]

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return super().write_config()


class SegmentStoreProcess(ServiceProcess):
    """One segment store child process (``quire segmentstore start``);
    ``settings`` are SegmentStoreHostConfig's keys."""

    service = "segmentstore"

    def __init__(self, root: Path, metadata_uri: str, host_id: str, **settings: Any) -> None:
        self.host_id = host_id
        super().__init__(root, host_id, {"metadata_uri": metadata_uri, "host_id": host_id,
                                         "port": 0, **settings})


class ControllerProcess(ServiceProcess):
    """A controller child process (``quire controller start``); ``settings``
    are ControllerHostConfig's keys."""

    service = "controller"

    def __init__(self, root: Path, metadata_uri: str, name: str = "controller",
                 **settings: Any) -> None:
        super().__init__(root, name, {"metadata_uri": metadata_uri, "port": 0, **settings})

    @property
    def uri(self) -> str:
        """``tcp://host:port`` (``tls://`` under TLS), what a Pravega client is given."""
        return str(self.ready_event.get("uri") or f"tcp://{self.address}")


_LOWEST_PORT = 10_000
_handed_out: set[int] = set()


def _ephemeral_ports() -> range:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A loopback port free right now, for a bookie's stable port.

    Taken below the kernel's ephemeral range, never from it: a port the
    kernel can give an outgoing connection (any process's) could be taken
    between this check and the bookie's bind, or while a stopped bookie is
    restarted on it.  Never the same port twice in one process."""
    ephemeral = _ephemeral_ports()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(_LOWEST_PORT, max(ephemeral.start, _LOWEST_PORT + 1))
        if port in _handed_out or port in ephemeral:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # nothing free below the range: take what the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


P = TypeVar("P", bound=ServiceProcess)


def tier1_quorums(bookies: int) -> dict[str, int]:
    """Segment store settings for tier-1 ledgers on ``bookies`` bookies:
    E3 W3 A2, or as many as there are (a sandbox of 1 or 2 bookies)."""
    ensemble = min(3, max(1, bookies))
    return {"tier1_ensemble_size": ensemble, "tier1_write_quorum_size": ensemble,
            "tier1_ack_quorum_size": min(2, ensemble)}

CONTROLLER_PORT = 9090
"""Pravega's default controller port, which the sandbox takes when it is free."""
CONTROLLER_HTTP_PORT = 9091
"""Pravega's default controller REST port: the sandbox's first controller
serves its REST API, cluster page and ``/metrics`` there when it is free."""
CONTROLLERS_HOST = "quire-controllers"
"""A name for all the sandbox's controllers (127.0.0.1 .. 127.0.0.9 in
``/etc/hosts``, which ``scripts/setup --system`` writes): the Pravega
client, which takes one ``host:port``, fails over through its addresses."""


def resolves_to(name: str, count: int) -> bool:
    """Whether ``name`` resolves to 127.0.0.1 .. 127.0.0.``count``."""
    try:
        found = {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}
    except OSError:
        return False
    return all(f"127.0.0.{i}" in found for i in range(1, count + 1))


def autoscale_settings(interval_s: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Segment store and controller settings that scale streams within
    seconds: windows, cooldown and mute of ``interval_s`` (0: Pravega's)."""
    if interval_s <= 0:
        return {}, {}
    return ({"autoscale_windows_s": [interval_s] * 4, "autoscale_cooldown_s": interval_s,
             "autoscale_mute_s": interval_s, "autoscale_tick_ms": max(100, interval_s * 200)},
            {"autoscale_interval_ms": min(1000, max(100, interval_s * 200))})


def preferred_port(port: int) -> int:
    """``port`` if it is free on loopback now, else :func:`free_port`."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def start_all(processes: Sequence[P], timeout_s: float = 60.0,
              on_ready: Callable[[P], None] | None = None) -> None:
    """Start the processes in parallel, then wait until each serves; on any
    failure stop them all and re-raise."""
    for process in processes:
        process.start(expect_ready=False)
    try:
        for process in processes:
            process._wait_ready(timeout_s)
            if on_ready is not None:
                on_ready(process)
    except BaseException:
        stop_all(processes)
        raise


def stop_all(processes: Sequence[ServiceProcess]) -> None:
    """Clean shutdown of every process, SIGTERM to all first so they stop in parallel."""
    for process in processes:
        if process.running and process.proc is not None:
            process.proc.send_signal(signal.SIGTERM)
    for process in processes:
        process.stop()


