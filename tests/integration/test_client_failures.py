"""The ledger client when processes die: bookies killed mid-write and
mid-read, a writer killed with adds in flight."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quire.client import Client
from quire.types import LedgerState
from tests.support.bookies import wait_until_stored
from tests.support.cluster import Cluster

Connect = Callable[..., Awaitable[Client]]
REPO = Path(__file__).resolve().parents[2]


def payload(i: int) -> bytes:
    return b"entry-%d" % i


@pytest.mark.parametrize("cluster", [4], indirect=True)
async def test_killed_bookie_is_replaced_mid_write(cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    first = await asyncio.gather(*[ledger.append(payload(i)) for i in range(50)])
    victim = ledger.ensemble[1]
    in_flight = [ledger.append(payload(i)) for i in range(50, 100)]
    cluster.kill9(cluster.index_of(victim))
    later = [ledger.append(payload(i)) for i in range(100, 150)]
    ids = await asyncio.gather(*in_flight, *later)  # no error reaches the writer
    assert first + ids == list(range(150))
    md = ledger.metadata
    assert len(md.ensembles) == 2
    (_, old), (start, new) = md.ensembles
    assert victim in old and victim not in new and 50 <= start <= 150
    assert len(set(new)) == 3
    await ledger.close()
    stored = (await client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert stored.state is LedgerState.CLOSED and stored.last_entry_id == 149
    assert stored.ensembles == md.ensembles
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                       recovery=False)
    assert [e.data for e in await reader.read(0, 149)] == [payload(i) for i in range(150)]


async def test_reads_survive_losing_all_but_one_replica(cluster: Cluster,
                                                         connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*[ledger.append(payload(i)) for i in range(40)])
    await ledger.close()
    survivor = cluster.bookies[cluster.index_of(ledger.ensemble[2])]
    await wait_until_stored(survivor.address, ledger.ledger_id, 39)
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                       recovery=False)
    for bookie_id in ledger.ensemble[:2]:  # W - 1 = 2 replicas of every entry gone
        cluster.kill9(cluster.index_of(bookie_id))
    assert [e.data for e in await reader.read(0, 39)] == [payload(i) for i in range(40)]


def read_json_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, int]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            return dict(json.loads(line))
        if proc.poll() is not None:
            break
    raise AssertionError(f"writer process said nothing (exit code {proc.poll()})")


async def test_recovery_after_the_writer_is_killed_keeps_every_acked_entry(
        cluster: Cluster, connect: Connect) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.client_writer", cluster.metadata_uri],
        cwd=REPO, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    try:
        deadline = time.monotonic() + 60
        ledger_id = (await asyncio.to_thread(read_json_line, proc, deadline))["ledger_id"]
        acked: list[int] = []
        while len(acked) < 300:
            acked.append((await asyncio.to_thread(read_json_line, proc, deadline))["acked"])
    finally:
        proc.kill()  # -9, with adds in flight
        proc.wait(10)
    assert proc.stdout is not None
    acked.extend(json.loads(line)["acked"] for line in proc.stdout.read().splitlines())
    proc.stdout.close()
    assert acked == list(range(len(acked)))  # completions in entry order
    client = await connect(cluster)
    before = (await client.metadata_store.read_ledger(ledger_id)).value
    assert before.state is LedgerState.OPEN
    recovered = await client.open_ledger(ledger_id, password=b"pw", recovery=True)
    end = recovered.metadata.last_entry_id
    assert end >= acked[-1]
    entries = await recovered.read(0, end)
    assert [e.data for e in entries] == [payload(i) for i in range(end + 1)]
    assert recovered.metadata.length == sum(len(payload(i)) for i in range(end + 1))
    again = await (await connect(cluster)).open_ledger(ledger_id, password=b"pw", recovery=True)
    assert again.metadata.last_entry_id == end  # recovery of a closed ledger changes nothing


@pytest.mark.parametrize("cluster", [4], indirect=True)
async def test_recovery_replaces_a_dead_bookie_while_writing_back(
        cluster: Cluster, connect: Connect) -> None:
    writer_client = await connect(cluster)
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    # all in flight at once: every header carries LAC -1, so recovery must
    # read and write back all of them
    await asyncio.gather(*[ledger.append(payload(i)) for i in range(30)])
    survivor = cluster.bookies[cluster.index_of(ledger.ensemble[1])]
    await wait_until_stored(survivor.address, ledger.ledger_id, 29)
    dead = ledger.ensemble[0]
    cluster.kill9(cluster.index_of(dead))
    client = await connect(cluster)
    recovered = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=True)
    md = recovered.metadata
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 29
    assert dead not in md.ensembles[-1][1]  # the write-back replaced it
    assert [e.data for e in await recovered.read(0, 29)] == [payload(i) for i in range(30)]
