"""The real Pravega client (PyPI ``pravega`` 0.3.8) against a Quire cluster of
processes, as ``quire sandbox`` runs it: 3 bookies, 2 segment stores
(``quire segmentstore start``) sharing the containers, and the controller
(``quire controller start``).  A segment store is killed with ``kill -9``
while a writer writes; its containers move to the other (fencing the dead
one's tier-1 logs); restarted on its address (as a supervisor or Kubernetes
would), it answers WrongHost, the client asks getURI again and finds the
new owner; a reader group reads every event exactly once, in order per
routing key.  (The client keeps retrying the address it was given until
told otherwise: with the process simply gone it would retry for minutes.)"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from quire.metadata import open_store
from quire.sandbox import ControllerProcess, SegmentStoreProcess, free_port, start_all, stop_all
from quire.segmentstore.ownership import read_assignment
from tests.support.cluster import Cluster
from tests.support.pravega_reading import read_slices

REPO = Path(__file__).resolve().parents[2]
KEYS = 4
EVENTS_PER_KEY = 150
SEGMENT_STORE = {"container_count": 4, "lease_ms": 1500, "rebalance_interval_ms": 100,
                 "tail_read_wait_ms": 1000, "metrics_port": 0}


@pytest.fixture
def stack(cluster: Cluster, tmp_path: Path
          ) -> Iterator[tuple[list[SegmentStoreProcess], ControllerProcess]]:
    root = tmp_path / "stack"
    stores = [SegmentStoreProcess(root, cluster.metadata_uri, f"ss-{i}", port=free_port(),
                                  **SEGMENT_STORE) for i in (1, 2)]
    controller = ControllerProcess(root, cluster.metadata_uri)
    start_all(stores)  # type: ignore[arg-type]
    try:
        asyncio.run(wait_assigned(cluster.metadata_uri))
        controller.start()
        yield stores, controller
    finally:
        controller.stop()
        stop_all(stores)  # type: ignore[arg-type]


async def wait_assigned(metadata_uri: str) -> None:
    """Until both segment stores hold containers (a condition with a deadline)."""
    store = await open_store(metadata_uri)
    try:
        async with asyncio.timeout(30):
            while True:
                assignment, _ = await read_assignment(store)
                if len(set(assignment.values())) == 2:
                    return
                await asyncio.sleep(0.05)
    finally:
        await store.close()


def next_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
    """The writer's next JSON line, waiting until ``deadline``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "the writer process went quiet"
    line = proc.stdout.readline()
    assert line, f"the writer process ended (status {proc.wait()})"
    event: dict[str, Any] = json.loads(line)
    return event


def hosted_containers(process: SegmentStoreProcess) -> int:
    """The containers a segment store process has open, from its /metrics."""
    assert process.metrics_address is not None
    text = urllib.request.urlopen(f"http://{process.metrics_address}/metrics",
                                  timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "quire_segmentstore_containers_hosted":
            return int(family.samples[0].value)
    raise AssertionError("no quire_segmentstore_containers_hosted in /metrics")


async def assignment_of(metadata_uri: str) -> dict[int, str]:
    store = await open_store(metadata_uri)
    try:
        assignment, _ = await read_assignment(store)
        return assignment
    finally:
        await store.close()


def wait_settled(stores: list[SegmentStoreProcess], metadata_uri: str, deadline: float) -> None:
    """Until the assignment gives both stores containers and each has all of
    its own open (a condition with a deadline): the restarted store takes
    its share back, and the containers moving then answer WrongHost for a
    while, longer than the real client's reader-group state fetch retries
    before it gives up."""
    while True:
        assignment = asyncio.run(assignment_of(metadata_uri))
        shares = {s.host_id: sum(1 for h in assignment.values() if h == s.host_id)
                  for s in stores}
        if all(shares.values()) and all(hosted_containers(s) == shares[s.host_id]
                                        for s in stores):
            return
        assert time.monotonic() < deadline, f"containers not settled: {assignment}"
        time.sleep(0.05)  # polling the processes' state until settled (with the deadline)


async def owners(metadata_uri: str) -> set[str]:
    store = await open_store(metadata_uri)
    try:
        assignment, _ = await read_assignment(store)
        return set(assignment.values())
    finally:
        await store.close()


def test_a_writer_survives_kill9_of_a_segment_store_and_every_event_is_read_once(
        cluster: Cluster, stack: tuple[list[SegmentStoreProcess], ControllerProcess]) -> None:
    stores, controller = stack
    manager = pravega_client.StreamManager(controller.uri)
    assert manager.create_scope("shop")
    assert manager.create_stream("shop", "orders", 3)
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pravega_writer", controller.uri, "shop", "orders",
         str(KEYS), str(EVENTS_PER_KEY)], cwd=REPO, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    try:
        deadline = time.monotonic() + 120
        while next_line(writer, deadline).get("written", 0) < KEYS * EVENTS_PER_KEY // 3:
            pass
        stores[0].kill9()  # mid-write: its containers move to the other segment store
        while asyncio.run(owners(cluster.metadata_uri)) != {"ss-2"}:
            time.sleep(0.05)  # polling the assignment until the takeover (with the deadline)
            assert time.monotonic() < deadline, "no takeover"
        # restarted on its address, as a supervisor does: the client, still retrying
        # that address, is told WrongHost there and asks the controller again
        stores[0].start()
        while "done" not in (line := next_line(writer, deadline)):
            assert "error" not in line, line
        assert line["done"] == KEYS * EVENTS_PER_KEY
    finally:
        writer.kill()
        writer.wait()
    wait_settled(stores, cluster.metadata_uri, time.monotonic() + 60)

    total = KEYS * EVENTS_PER_KEY
    group = manager.create_reader_group("auditors", "shop", "orders")
    reader = group.create_reader("reader-1")
    got = asyncio.run(read_slices(reader, total, time.monotonic() + 60))
    by_key: dict[str, list[int]] = {}
    for data in got:
        key, number = data.split(":")
        by_key.setdefault(key, []).append(int(number))
    # every acknowledged event exactly once, in order per routing key
    assert by_key == {f"key{k}": list(range(EVENTS_PER_KEY)) for k in range(KEYS)}
