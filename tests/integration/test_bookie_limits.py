"""A TLS bookie process under abuse: 1,000 idle connections from 127.0.0.2
(so the cluster's own traffic is not what trips the limits: 512 are
admitted, the rest refused by ``max_connections_per_peer``, and the admitted
ones closed by ``idle_timeout_ms`` since they never finish a handshake) and
a client on 127.0.0.3 that sends 500,000 read and batch-read requests of
512 KiB entries and never reads the answers (the bookie stops reading it:
its budget and write back-pressure; it is closed once it read nothing for
``idle_timeout_ms``).  Meanwhile a served client's appends
keep a p99 under :data:`P99_BOUND_MS`, and the bookie's resident memory
grows by less than 64 MiB.  Every refusal and pause is counted on
``/metrics``.

Measured on the 2-core shared test machine (rough): the memory grows by
about 40 MiB, the idle connections about 26 MiB of it (about 50 KiB per
admitted TLS connection that has not finished its handshake); the appends'
p99 20-30 ms (10-20 ms without the abuse: it is mostly the journal's fsync)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from pathlib import Path

from quire.client import Client, ClientConfig
from quire.protocol import BatchReadRequest, ReadRequest
from tests.support.cluster import Cluster
from tests.support.repair import scrape
from tests.support.tls import Pki, secure_bookies

IDLE_CONNECTIONS = 1000
PER_PEER = 512
"""The default ``max_connections_per_peer``."""
IDLE_TIMEOUT_MS = 3000
ENTRY_BYTES = 512 * 1024
P99_BOUND_MS = 250.0
"""A served client's append p99 while the abuse lasts (the fsync is most of
it; generous for a shared machine)."""
MAX_GROWTH_MIB = 64


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def counted(cluster: Cluster) -> dict[str, float]:
    """The bookie's refusals and pauses by reason."""
    out = {}
    for name, value in scrape(cluster.bookies[0]).items():
        for family in ("connection_refusals_total", "connection_reads_paused_total"):
            prefix = f"quire_bookie_{family}{{reason=\""
            if name.startswith(prefix):
                out[name[len(prefix):-2]] = value
    return out


def open_idle(address: tuple[str, int]) -> list[socket.socket]:
    sockets = []
    for _ in range(IDLE_CONNECTIONS):
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))
        sock.connect(address)  # (a refused one is reset later, by the bookie)
        sockets.append(sock)
    return sockets


def never_read(address: tuple[str, int], context: ssl.SSLContext, ledger_id: int
               ) -> tuple[socket.socket, int, int]:
    """A client on 127.0.0.3 that sends reads of big entries and never reads
    the answers; returns its socket, the bytes it could send before the
    bookie stopped reading, and the bytes it had."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.bind(("127.0.0.3", 0))
    raw.connect(address)
    sock = context.wrap_socket(raw, server_hostname=address[0])
    sock.settimeout(2.0)
    requests = b"".join(  # ~19 MB: more than the kernel's socket buffers hold
        ReadRequest(i, ledger_id, i % 4).encode() if i % 2 else
        BatchReadRequest(i, ledger_id, 0, 4, 4 << 20).encode() for i in range(1, 1001)) * 500
    sent = 0
    with contextlib.suppress(TimeoutError, ssl.SSLError, OSError):
        while sent < len(requests):
            sent += sock.send(requests[sent:sent + 65536])
    return sock, sent, len(requests)


async def appends_p99_ms(client: Client, count: int) -> float:
    ledger = await client.create_ledger(1, 1, 1, password=b"served")
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        await ledger.append(b"y" * 1024)
        latencies.append((time.perf_counter() - started) * 1000)
    await ledger.close()
    return sorted(latencies)[int(count * 0.99)]


async def test_idle_connections_and_a_client_that_never_reads_are_contained(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster", 1, metrics_port=0, idle_timeout_ms=IDLE_TIMEOUT_MS)
    secure_bookies(cluster, Pki(tmp_path / "pki"))
    cluster.start()
    idle: list[socket.socket] = []
    abuser: socket.socket | None = None
    client = await Client.connect(cluster.metadata_uri, ClientConfig(**cluster.client_settings))
    try:
        bookie = cluster.bookies[0]
        assert bookie.proc is not None
        host, port = bookie.address.rsplit(":", 1)
        address = (host, int(port))
        big = await client.create_ledger(1, 1, 1, password=b"big")
        for _ in range(4):
            await big.append(b"x" * ENTRY_BYTES)
        await big.close()
        await appends_p99_ms(client, 50)  # warm: the served client's connection, caches
        before = resident_mib(bookie.proc.pid)

        idle = await asyncio.to_thread(open_idle, address)
        assert cluster.client_tls is not None
        abuser, sent, had = await asyncio.to_thread(never_read, address, cluster.client_tls,
                                                    big.ledger_id)
        assert sent < had  # the bookie stopped reading it
        p99 = await appends_p99_ms(client, 400)
        growth = resident_mib(bookie.proc.pid) - before

        assert growth < MAX_GROWTH_MIB, f"resident memory grew {growth:.1f} MiB"
        assert p99 < P99_BOUND_MS, f"p99 {p99:.1f} ms while the abuse lasted"
        seen = await asyncio.to_thread(counted, cluster)
        assert seen["max_connections_per_peer"] == IDLE_CONNECTIONS - PER_PEER
        assert seen["replies_unread"] >= 1 and seen["request_budget"] >= 1
        deadline = time.monotonic() + 30
        # the admitted idle ones, and the client that reads nothing, once idle too long
        while seen.get("idle_timeout", 0) < PER_PEER or "replies_unread_timeout" not in seen:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.2)
            seen = await asyncio.to_thread(counted, cluster)
        assert seen["idle_timeout"] == PER_PEER and seen["replies_unread_timeout"] == 1
    finally:
        for sock in idle:
            sock.close()
        if abuser is not None:
            abuser.close()
        await client.close()
        cluster.close()
