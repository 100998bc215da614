"""A real, throw-away ZooKeeper server for tests (Debian's ``zookeeper`` package).

The server listens on a free loopback port with its data in a temporary
directory, ticks every 500 ms (so sessions from 1 s to 10 s work), and runs
without the admin server or four-letter-word commands.  For the network
harness it may instead listen on a given address and port, be run through a
command prefix (``ip netns exec NS``), and be one member of an ensemble
(``peers``: every member's address, ``my_id`` its own 1-based place there);
such a member can be killed and restarted on its data, or paused.

With ``tls`` (:class:`ZooKeeperTls`: PEM files, e.g. from
``quire.security.certificates``) it also serves TLS on
:attr:`ZooKeeperServer.secure_connect_string` (Netty's connection factory,
PEM key and trust stores, client certificates required), besides the
plaintext port it is watched on.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

from quire.sandbox import free_port, parent_death_prefix
from quire.security import write_secret

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ENVIRONMENT = Path("/etc/zookeeper/conf/environment")
# A logging backend for slf4j (Debian's libslf4j-java, a zookeeper dependency).
SLF4J_SIMPLE = Path("/usr/share/java/slf4j-simple.jar")
# What Netty's connection factory (TLS) needs beyond the jar's manifest.
NETTY_EXTRA = (Path("/usr/share/java/netty-codec.jar"), Path("/usr/share/java/netty-resolver.jar"))
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 500
CLIENT_PORT = 2181


class ZooKeeperUnavailable(RuntimeError):
    """The ZooKeeper server cannot be run here; the message says why."""


@dataclass(frozen=True)
class ZooKeeperTls:
    """The server's certificate and key, and the CA its clients' certificates
    must chain to (PEM files)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


class ZooKeeperServer:
    """One standalone ZooKeeper server: :meth:`start`, use
    :attr:`connect_string`, :meth:`stop`."""

    def __init__(self, start_timeout: float = 60.0, host: str = "127.0.0.1", port: int = 0,
                 command_prefix: Sequence[str] = (), peers: Sequence[str] = (),
                 my_id: int = 1, tls: ZooKeeperTls | None = None) -> None:
        self._start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self.host = host
        self._port = port
        self._command_prefix = list(command_prefix)
        self._peers = list(peers)
        self._my_id = my_id
        self._tls = tls
        self._secure_port = 0

    @property
    def connect_string(self) -> str:
        """``host:port`` for kazoo (and ``zk://`` URIs)."""
        if self._process is None:
            raise RuntimeError("ZooKeeper server is not running")
        return f"{self.host}:{self._port}"

    @property
    def secure_connect_string(self) -> str:
        """``host:port`` of the TLS port (a server started with ``tls``)."""
        if self._process is None or not self._secure_port:
            raise RuntimeError("ZooKeeper server is not serving TLS")
        return f"{self.host}:{self._secure_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self, wait: bool = True) -> None:
        """Start the server and (with ``wait``) return once it accepts
        sessions; an ensemble member serves once a quorum is up, so start
        every member without waiting, then :meth:`wait_serving` on each."""
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable(
                "no `java` on PATH: install a Java runtime (apt-get install default-jre-headless)")
        if not ZOOKEEPER_JAR.exists():
            raise ZooKeeperUnavailable(
                f"{ZOOKEEPER_JAR} is missing: install the Debian package `zookeeper` "
                "(apt-get install zookeeper)")
        self._workdir = Path(tempfile.mkdtemp(prefix="quire-zookeeper-"))
        (self._workdir / "data").mkdir()
        self._port = self._port or free_port()
        config = self._workdir / "zoo.cfg"
        config.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={self._workdir / 'data'}\n"
            f"clientPort={self._port}\n"
            f"clientPortAddress={self.host}\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=\n" + self._ensemble_config() + self._tls_config())
        self._launch()
        if wait:
            self.wait_serving()

    def _ensemble_config(self) -> str:
        if not self._peers:
            return ""
        assert self._workdir is not None
        (self._workdir / "data" / "myid").write_text(f"{self._my_id}\n")
        # a follower that loses its leader gives up after syncLimit ticks (2 s)
        return "initLimit=20\nsyncLimit=4\n" + "".join(
            f"server.{i}={peer}:2888:3888\n" for i, peer in enumerate(self._peers, 1))

    def _tls_config(self) -> str:
        if self._tls is None:
            return ""
        assert self._workdir is not None
        keystore = write_secret(self._workdir / "keystore.pem",  # key and chain in one file
                                self._tls.key_file.read_bytes() + self._tls.cert_file.read_bytes())
        self._secure_port = self._secure_port or free_port()
        return ("serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
                f"secureClientPort={self._secure_port}\n"
                f"secureClientPortAddress={self.host}\n"
                f"ssl.keyStore.location={keystore}\n"
                "ssl.keyStore.type=PEM\n"
                f"ssl.trustStore.location={self._tls.ca_file}\n"
                "ssl.trustStore.type=PEM\n")

    def _launch(self) -> None:
        assert self._workdir is not None
        java = shutil.which("java") or "java"
        main = QUORUM_MAIN_CLASS if self._peers else MAIN_CLASS
        command = [*self._command_prefix,  # (SIGKILL when the test process dies: no JVM lingers)
                   *parent_death_prefix(signal.SIGKILL), java, "-Xmx256m", "-XX:+UseSerialGC",
                   "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                   "-cp", _classpath(), main, str(self._workdir / "zoo.cfg")]
        with open(self._workdir / "server.log", "ab") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT)

    def wait_serving(self) -> None:
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """``kill -9``, keeping the data for :meth:`restart`."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def restart(self) -> None:
        """Start again on the same data (after :meth:`kill`), without waiting."""
        self.kill()
        self._launch()

    def pause(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + self._start_timeout
        client = KazooClient(hosts=self.connect_string, timeout=2.0,
                             connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 1})
        client.start_async()
        try:
            while not client.connected:
                if self._process is not None and self._process.poll() is not None:
                    raise ZooKeeperUnavailable(
                        f"ZooKeeper exited with status {self._process.returncode}:\n"
                        f"{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise ZooKeeperUnavailable(
                        f"ZooKeeper did not serve within {self._start_timeout} s:\n"
                        f"{self.log_tail()}")
                time.sleep(0.05)
        finally:
            client.stop()
            client.close()

    def log_tail(self, lines: int = 20) -> str:
        if self._workdir is None or not (self._workdir / "server.log").exists():
            return ""
        text = (self._workdir / "server.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server and delete its data."""
        if self._process is not None:
            self.resume()
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


def _classpath() -> str:
    """The server classpath: Debian's (its jar's manifest names the other
    jars it needs) plus a slf4j backend so warnings reach the log."""
    entries = [str(ZOOKEEPER_JAR)]
    if ENVIRONMENT.exists():
        for line in ENVIRONMENT.read_text().splitlines():
            if line.startswith("CLASSPATH="):
                entries = shlex.split(line.partition("=")[2])[0].split(":")
    entries += [str(jar) for jar in (SLF4J_SIMPLE, *NETTY_EXTRA) if jar.exists()]
    return ":".join(entries)
