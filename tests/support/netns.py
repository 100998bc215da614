"""Hosts on one machine: a Linux network namespace each, on one bridge, and
the network faults between them (a link down, nftables partitions).

A :class:`Network` is one run's: every name it creates starts with its
prefix ``qn`` + 5 hex digits (namespaces ``<prefix>-<host>``, interfaces
``<prefix>r<n>`` on the bridge side of each veth pair, the bridge
``<prefix>br``, the nftables table ``inet <prefix>`` in a host's namespace)
and its addresses are one private /24 not in use here (``10.a.b.0/24``;
the bridge, that is the machine itself, is ``.1``).  A state file
``/tmp/quire-netcluster/<prefix>.json`` names the process that owns the run
and what it mounted, so :func:`sweep` removes what dead runs left behind
(their namespaces with every process in them, links, mounts) and never
touches a live run.  :meth:`Network.close` removes the run's own, and is
registered with :mod:`atexit` as well.

Partitions drop packets on the *input* side of each host involved (a
packet leaves and is lost, as on a real network: no "operation not
permitted" for the sender); a link down takes the bridge side of the
host's veth pair down (the host loses its carrier).  Each fault is a
context manager that heals on exit, however the block ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_DIR = Path("/tmp/quire-netcluster")
RUN_PREFIX = "qn"
_TABLE_CHAIN = "input"


class NetworkUnavailable(RuntimeError):
    """This machine cannot build the network (no ``ip``/``nft``, no namespaces)."""


class NetworkError(RuntimeError):
    """A command of the harness failed."""


RUN_TIMEOUT_S = 60.0
"""How long a command of the harness (``ip``, ``nft``, ``mount``) may take."""


def run(*cmd: str, check: bool = True, input_text: str | None = None) -> str:
    """Run ``cmd``; its stdout.  NetworkError (with its stderr) if it fails
    and ``check``; NetworkError whatever ``check`` says if it runs longer
    than :data:`RUN_TIMEOUT_S` (it is killed then)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, input=input_text,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(cmd)}: no end within {RUN_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def require_tools() -> None:
    """NetworkUnavailable naming what is missing: ``ip`` (iproute2), ``nft``
    (nftables; ``scripts/setup --system`` installs both), root, or a kernel
    that creates network namespaces."""
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetworkUnavailable(f"no `{tool}` on PATH: install the Debian package "
                                     f"`{package}` (scripts/setup --system)")
    if os.geteuid() != 0:
        raise NetworkUnavailable("network namespaces need root (CI runs the tests as root)")
    probe = f"{RUN_PREFIX}probe{os.getpid()}"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "netns", "exec", probe, "nft", "list", "tables")
    except NetworkError as e:
        raise NetworkUnavailable(f"cannot create a network namespace with nftables: {e}") \
            from None
    finally:
        run("ip", "netns", "del", probe, check=False)


@dataclass(frozen=True)
class Host:
    """A namespace with one address on the bridge."""

    name: str
    ns: str
    address: str
    link: str
    """The bridge side of its veth pair."""

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix of a command run on this host (it execs in place)."""
        return ["ip", "netns", "exec", self.ns]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _used_networks() -> list[ipaddress.IPv4Network]:
    found = []
    for line in run("ip", "-4", "-o", "addr", "show").splitlines() + \
            run("ip", "-4", "route", "show").splitlines():
        for word in line.split():
            if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
                found.append(ipaddress.ip_network(word, strict=False))
    for state in STATE_DIR.glob(f"{RUN_PREFIX}*.json"):
        with contextlib.suppress(ValueError, KeyError, OSError):
            found.append(ipaddress.ip_network(json.loads(state.read_text())["subnet"]))
    return found


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    rng = random.SystemRandom()
    for _ in range(200):
        candidate = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(256)}.0/24")
        if not any(candidate.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise NetworkUnavailable("no free private /24 in 10.64.0.0/10")


class Network:
    """One run's bridge and hosts (module docstring)."""

    def __init__(self) -> None:
        self.prefix = f"{RUN_PREFIX}{random.SystemRandom().getrandbits(20):05x}"
        self.subnet = _free_subnet()
        self.bridge = f"{self.prefix}br"
        self.hosts: dict[str, Host] = {}
        self.mounts: list[str] = []
        self._tables: set[str] = set()
        self._closed = False
        self.gateway = str(self.subnet.network_address + 1)
        """The machine's own address on the bridge (the harness's, in rules)."""

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.prefix}.json"

    def _save(self, **extra: Any) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"prefix": self.prefix, "owner": os.getpid(), "subnet": str(self.subnet),
                 "mounts": self.mounts, "hosts": {h.name: h.address for h in self.hosts.values()},
                 **extra}
        self.state_file.write_text(json.dumps(state, indent=2))

    def start(self) -> Network:
        self._save()
        atexit.register(self.close)
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev",
                self.bridge)
            run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        address = str(self.subnet.network_address + 1 + index)
        host = Host(name, f"{self.prefix}-{name}", address, f"{self.prefix}r{index}")
        inner = f"{self.prefix}n{index}"
        self.hosts[name] = host
        self._save()
        run("ip", "netns", "add", host.ns)
        run("ip", "link", "add", host.link, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", host.ns)
        in_ns = host.exec_prefix
        run(*in_ns, "ip", "link", "set", inner, "name", "eth0")
        run(*in_ns, "ip", "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        run(*in_ns, "ip", "link", "set", "eth0", "up")
        run(*in_ns, "ip", "link", "set", "lo", "up")
        run("ip", "link", "set", host.link, "master", self.bridge, "up")
        return host

    def mount_tmpfs(self, path: Path, size_mib: int) -> None:
        """A small file system of its own at ``path`` (a bookie's disk)."""
        path.mkdir(parents=True, exist_ok=True)
        self.mounts.append(str(path))
        self._save()
        run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path))

    # --- faults -------------------------------------------------------------------------

    def _nft(self, host: Host, *words: str) -> str:
        return run(*host.exec_prefix, "nft", *words)

    def _table(self, host: Host) -> None:
        if host.ns in self._tables:
            return
        self._nft(host, "add", "table", "inet", self.prefix)
        self._nft(host, "add", "chain", "inet", self.prefix, _TABLE_CHAIN,
                  "{ type filter hook input priority -10 ; policy accept ; }")
        self._tables.add(host.ns)

    def _drop_from(self, host: Host, addresses: Sequence[str]) -> int:
        """A rule dropping what ``host`` receives from ``addresses``; its handle."""
        self._table(host)
        echoed = self._nft(host, "--echo", "--handle", "add", "rule", "inet", self.prefix,
                           _TABLE_CHAIN, "ip", "saddr", "{", ", ".join(addresses), "}", "drop")
        found = re.search(r"# handle (\d+)", echoed)
        if found is None:
            raise NetworkError(f"nft gave no handle for a rule: {echoed!r}")
        return int(found.group(1))

    @contextlib.contextmanager
    def partition(self, side_a: Sequence[Host], side_b: Sequence[Host | str]
                  ) -> Iterator[None]:
        """Nothing passes between the two sides while the block runs (each
        host of ``side_a`` drops what comes from ``side_b``, and the other
        way round).  ``side_b`` may name bare addresses (the machine's own,
        :attr:`gateway`), which get no rule of their own."""
        rules: list[tuple[Host, int]] = []
        try:
            b_addresses = [h if isinstance(h, str) else h.address for h in side_b]
            for host in side_a:
                rules.append((host, self._drop_from(host, b_addresses)))
            for other in side_b:
                if not isinstance(other, str):
                    rules.append((other, self._drop_from(other, [h.address for h in side_a])))
            yield
        finally:
            for host, handle in rules:
                self._nft(host, "delete", "rule", "inet", self.prefix, _TABLE_CHAIN,
                          "handle", str(handle))

    @contextlib.contextmanager
    def link_down(self, host: Host) -> Iterator[None]:
        """``host`` loses its link (its bridge side goes down) while the block runs."""
        run("ip", "link", "set", host.link, "down")
        try:
            yield
        finally:
            run("ip", "link", "set", host.link, "up")

    # --- teardown -----------------------------------------------------------------------

    def close(self) -> None:
        """Remove everything of this run (idempotent): processes in its
        namespaces, namespaces, links, mounts, the state file."""
        if self._closed:
            return
        self._closed = True
        _remove_run(self.prefix, self.mounts)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)


def _kill_namespace_processes(ns: str) -> None:
    for pid in run("ip", "netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _remove_run(prefix: str, mounts: Sequence[str] = ()) -> None:
    for ns in _namespaces(prefix):
        _kill_namespace_processes(ns)
        run("ip", "netns", "del", ns, check=False)
    for link in _links(prefix):
        run("ip", "link", "del", link, check=False)
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in [*mounts, *(m for m in mounted if f"/{prefix}-" in m)]:
        if mount in mounted:
            run("umount", "-l", mount, check=False)
    (STATE_DIR / f"{prefix}.json").unlink(missing_ok=True)


def _namespaces(prefix: str) -> list[str]:
    return [line.split()[0] for line in run("ip", "netns", "list", check=False).splitlines()
            if line.startswith(prefix)]


def _links(prefix: str) -> list[str]:
    names = re.findall(r"^\d+: ([^:@]+)", run("ip", "-o", "link", "show", check=False),
                       re.MULTILINE)
    return [n for n in names if n.startswith(prefix)]


def runs() -> dict[str, dict[str, Any]]:
    """Every run known here, by prefix: its state (``owner``, ``subnet``,
    ...) and ``alive`` (its owner lives); a run with namespaces or links
    but no state file is a dead leftover."""
    found: dict[str, dict[str, Any]] = {}
    for state_file in STATE_DIR.glob(f"{RUN_PREFIX}*.json"):
        try:
            state = json.loads(state_file.read_text())
        except (ValueError, OSError):
            state = {}
        state["alive"] = isinstance(state.get("owner"), int) and _pid_alive(state["owner"])
        found[state_file.stem] = state
    for name in [*_namespaces(RUN_PREFIX), *_links(RUN_PREFIX)]:
        match = re.match(rf"({RUN_PREFIX}[0-9a-f]{{5}})", name)
        if match and match.group(1) not in found:
            found[match.group(1)] = {"alive": False}
    return found


def sweep(everything: bool = False) -> list[str]:
    """Remove the runs whose owner died (or every run, live ones too, with
    ``everything``); the prefixes removed."""
    removed = []
    for prefix, state in runs().items():
        if everything or not state["alive"]:
            _remove_run(prefix, state.get("mounts", []))
            removed.append(prefix)
    return removed
