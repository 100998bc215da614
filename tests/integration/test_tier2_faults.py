"""Tier-2 failing for real, under appends, on 3 bookie processes (fresh ones each time).

* S3 down for 20 s: the test's own moto server process is stopped
  (SIGSTOP) while appends go on, then continued (SIGCONT);
* S3 answering 503 and then hanging past the driver's timeout, through
  :class:`~tests.support.fault_proxy.FaultProxy` between the driver and moto;
* a full ``file://`` tier-2: a segment store process flushing to a small
  tmpfs the test mounts and fills.

Each time appends keep being acknowledged (up to the tier-1 ceiling, past
which their acks wait, never failing), the containers show ``degraded:
tier-2 unavailable since ...`` (in the store's health, in ``quire
segmentstore status``), flushing resumes by itself once tier-2 is back,
PDP-40's check over tier-2 is clean and tier-2 alone holds every byte
acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from quire.client import Client
from quire.metadata import open_store
from quire.sandbox import SegmentStoreProcess, tier1_quorums
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.health import store_health
from quire.segmentstore.ownership import owner_address, read_assignment
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import read_layout
from quire.streams import RemoteSegmentStore
from quire.streams.resolvers import metadata_resolver
from quire.tier2 import Tier2Config, open_chunk_storage, read_segment
from tests.support.cluster import Cluster
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import CREDENTIALS, MotoS3Server, S3Endpoint

WRITER = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                             iteration_interval_ms=50, retry_initial_ms=50, retry_max_ms=500)
SEGMENTS = [f"sc/faults/{i}.#epoch.0" for i in range(4)]


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3Server]:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    server = MotoS3Server()
    server.start()
    yield server
    server.send_signal(signal.SIGCONT)
    server.stop()


async def until(condition: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # polling the store's state, with a deadline


def degraded(store: SegmentStore) -> bool:
    """Whether every container holding one of :data:`SEGMENTS` is degraded."""
    written = {store.container_for(name) for name in SEGMENTS}
    return all(c["status"].startswith("degraded: tier-2 unavailable since ")
               for c in store_health(store)["containers"] if c["container"] in written)


def flushed(store: SegmentStore) -> bool:
    return all(w.backlog_bytes() == 0 and w.health.degraded is None
               for w in store.writers.values())


async def until_flushed(store: SegmentStore, what: str) -> None:
    """Until every byte is in tier-2 and recorded there (two whole
    iterations of every writer after that)."""
    await until(lambda: flushed(store), what)
    start = {cid: w.iterations for cid, w in store.writers.items()}
    await until(lambda: all(w.iterations >= start[cid] + 2
                            for cid, w in store.writers.items()), what)


async def tier2_holds(tier2: Tier2Config, expected: dict[str, bytes]) -> None:
    """PDP-40's check is clean and tier-2 alone holds every byte acknowledged."""
    assert await check(tier2) == []
    storage = await open_chunk_storage(tier2)
    try:
        for name, data in expected.items():
            layout = await read_layout(storage, name)
            assert layout is not None and layout.length == len(data), name
            assert await read_segment(storage, layout, 0, layout.length) == data, name
    finally:
        await storage.close()


async def appending(store: SegmentStore, expected: dict[str, bytes], seconds: float) -> int:
    """Append to every segment, each acknowledged, for ``seconds``; how many."""
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pieces = {name: b"%s:%d;" % (name.encode(), count) * 20 for name in expected}
        await asyncio.gather(*(store.append(n, p) for n, p in pieces.items()))
        for name, piece in pieces.items():
            expected[name] += piece
        count += 1
        await asyncio.sleep(0.05)  # a steady rate of appends, not a synchronisation
    return count


async def test_s3_down_for_20_s_under_appends(cluster: Cluster, moto: MotoS3Server) -> None:
    endpoint = moto.create_bucket("quire")
    tier2 = Tier2Config(uri=endpoint.uri(f"down-{uuid.uuid4().hex[:8]}"), s3_timeout_ms=1000,
                        s3_max_attempts=1, s3_request_deadline_ms=3000)
    client = await Client.connect(cluster.metadata_uri)
    store = await SegmentStore.open(client, range(2), tier2, config=SegmentStoreConfig(
        container_count=2, storage_writer=WRITER))
    expected = {name: b"" for name in SEGMENTS}
    try:
        for name in SEGMENTS:
            await store.create_segment(name)
        await appending(store, expected, 1)
        await until_flushed(store, "a first flush")
        moto.send_signal(signal.SIGSTOP)
        try:
            rounds = await appending(store, expected, 20)
            assert rounds > 50  # acknowledged all along, from tier-1
            await until(lambda: degraded(store), "the containers degraded")
        finally:
            moto.send_signal(signal.SIGCONT)
        await until_flushed(store, "flushing to resume by itself")
        assert sum(store.flush_failures.values()) >= 2
    finally:
        await store.close()
        await client.close()
    await tier2_holds(tier2, expected)


async def test_s3_answering_503_and_hanging_through_a_proxy(cluster: Cluster,
                                                            moto: MotoS3Server) -> None:
    endpoint = moto.create_bucket("quire")
    proxy = FaultProxy("127.0.0.1", moto.port).start()
    prefix = f"proxy-{uuid.uuid4().hex[:8]}"
    via_proxy = S3Endpoint(proxy.endpoint_url, endpoint.bucket)
    tier2 = Tier2Config(uri=via_proxy.uri(prefix), s3_timeout_ms=1000, s3_max_attempts=2,
                        s3_request_deadline_ms=3000)
    client = await Client.connect(cluster.metadata_uri)
    store = await SegmentStore.open(client, range(2), tier2, config=SegmentStoreConfig(
        container_count=2, storage_writer=WRITER))
    expected = {name: b"" for name in SEGMENTS}
    try:
        for name in SEGMENTS:
            await store.create_segment(name)
        await appending(store, expected, 1)
        await until_flushed(store, "a first flush")
        for mode in ("error", "slow"):
            proxy.mode = mode
            await appending(store, expected, 3)
            await until(lambda: degraded(store), f"the containers degraded ({mode})")
            written = {store.container_for(name) for name in SEGMENTS}
            causes = {c["cause"] for c in store_health(store)["containers"]
                      if c["container"] in written}
            assert causes == {"Tier2Error"}, causes
            proxy.mode = "pass"
            await until_flushed(store, f"flushing to resume after {mode}")
        assert proxy.faulted > 0
    finally:
        await store.close()
        await client.close()
        proxy.stop()
    await tier2_holds(Tier2Config(uri=endpoint.uri(prefix)), expected)


def quire_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quire.cli.main", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def fill(directory: Path) -> Path:
    """A file taking every free byte of ``directory``'s file system."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 512):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


class Appender:
    """Appends over the wire, one writer id per segment, each acknowledged in order."""

    def __init__(self, segments: RemoteSegmentStore, expected: dict[str, bytes]) -> None:
        self.segments = segments
        self.expected = expected
        self.events = dict.fromkeys(expected, 0)

    def append(self, name: str, data: bytes) -> asyncio.Future[object]:
        self.events[name] += 1
        self.expected[name] += data
        writer = 1 + list(self.expected).index(name)
        return asyncio.ensure_future(self.segments.append(name, data, writer, self.events[name]))


def cli_status(metadata_uri: str) -> tuple[int, dict[str, object]]:
    answer = quire_cli("segmentstore", "status", "--json", "--metadata", metadata_uri)
    return answer.returncode, json.loads(answer.stdout)


async def until_healthy(metadata_uri: str, what: str) -> None:
    """Until ``quire segmentstore status`` says all is ok and flushed, and
    every writer ran two more iterations (the records are in tier-2 too)."""
    deadline = time.monotonic() + 60
    flushed_at: dict[int, int] | None = None
    while True:
        code, body = await asyncio.to_thread(cli_status, metadata_uri)
        containers: list[dict[str, int]] = body["containers"]  # type: ignore[assignment]
        if code == 0 and all(c["tier2_backlog_bytes"] == 0 for c in containers):
            if flushed_at is None:
                flushed_at = {c["container"]: c["flush_iterations"] for c in containers}
            elif all(c["flush_iterations"] >= flushed_at[c["container"]] + 2
                     for c in containers):
                return
        else:
            flushed_at = None
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {body}"
        await asyncio.sleep(0.1)  # polling the status, with a deadline


async def test_a_full_file_tier2_under_appends(cluster: Cluster, tmpfs: Path) -> None:
    tier2_uri = (tmpfs / "tier2").as_uri()
    metadata_uri = cluster.metadata_uri
    process = SegmentStoreProcess(tmpfs.parent, metadata_uri, f"ss-full-{uuid.uuid4().hex[:6]}",
                                  tier2_uri=tier2_uri, container_count=2, metrics_port=0,
                                  rebalance_interval_ms=100, tier2_flush_threshold_bytes=1,
                                  tier2_flush_threshold_ms=0, tier2_flush_interval_ms=50,
                                  tier1_ceiling_bytes=1 << 20, **tier1_quorums(3))
    process.start()
    metadata = await open_store(metadata_uri)
    segments = RemoteSegmentStore(metadata_resolver(metadata, owner_address))
    names = SEGMENTS[:2]
    appender = Appender(segments, {name: b"" for name in names})
    try:
        deadline = time.monotonic() + 60
        while len((await read_assignment(metadata))[0]) < 2:
            assert time.monotonic() < deadline, "containers never assigned"
            await asyncio.sleep(0.05)  # polling the assignment, with a deadline
        for name in names:
            await segments.create_segment(name)
            await appender.append(name, b"before;" * 100)
        await until_healthy(metadata_uri, "a first flush")
        filler = fill(tmpfs)
        acked = 0
        held: list[asyncio.Future[object]] = []
        while acked < 5000:  # acknowledged at once while under the ceiling
            appended = appender.append(names[acked % 2], b"full %d;" % acked * 64)
            done, _pending = await asyncio.wait([appended], timeout=1.0)
            if not done:  # its ack waits: tier-1 is past its ceiling
                held.append(appended)
                break
            acked += 1
        assert held and acked > 1000, acked  # about 1 MiB of appends at once
        code, body = await asyncio.to_thread(cli_status, metadata_uri)
        assert code == 1, body
        containers = body["containers"]
        assert any(c["throttled_since"] for c in containers), body  # type: ignore[attr-defined]
        states = [str(c["status"]) for c in containers]  # type: ignore[attr-defined]
        assert any(s.startswith("degraded: tier-2 unavailable since ") for s in states), states
        held += [appender.append(names[i % 2], b"held %d;" % i) for i in range(20)]
        filler.unlink()  # tier-2 has room again: flushing resumes by itself
        await asyncio.gather(*held)  # acknowledged late, none refused
        await until_healthy(metadata_uri, "flushing to resume")
    finally:
        await segments.close()
        await metadata.close()
        process.stop()
    checked = await asyncio.to_thread(quire_cli, "tier2", "check", tier2_uri)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    await tier2_holds(Tier2Config(uri=tier2_uri), appender.expected)
