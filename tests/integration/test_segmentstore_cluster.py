"""The segment store on real bookies: appends acknowledged by a segment store
process that is then killed (``kill -9``) are all there when a new process's
SegmentStore takes the containers over (fencing the old owner, replaying
tier-1), in call order, with the writers' event numbers for dedup; and a
second owner fences the first while it writes."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from quire.client import Client
from quire.log import NamedDataLog
from quire.segmentstore import (
    AppendResult,
    ContainerFencedError,
    SegmentContainer,
    SegmentStore,
)
from quire.segmentstore.names import container_log_name
from quire.segmentstore.store import LOG_PASSWORD
from tests.support.cluster import Cluster
from tests.support.segment_writer import segment_name

REPO = Path(__file__).resolve().parents[2]
SEGMENTS = 4


def read_json_line(proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            return dict(json.loads(line))
    raise AssertionError(f"no line from the segment store process (exit {proc.poll()})")


async def test_acknowledged_appends_survive_kill9_and_takeover(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.segment_writer", cluster.metadata_uri,
         str(SEGMENTS)],
        cwd=REPO, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    acked: dict[int, list[tuple[int, int]]] = {i: [] for i in range(SEGMENTS)}
    try:
        deadline = time.monotonic() + 90
        assert (await asyncio.to_thread(read_json_line, proc, deadline))["ready"]
        for _ in range(600):
            i, n, length = (await asyncio.to_thread(read_json_line, proc, deadline))["acked"]
            acked[i].append((n, length))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    client = await connect(cluster)
    store = await SegmentStore.open(client, range(2))
    try:
        for i in range(SEGMENTS):
            name = segment_name(i)
            info = await store.get_info(name)
            data = (await store.read(name, 0, info.length)).data
            assert len(data) == info.length
            events = data.decode().split(";")[:-1]
            # every append in call order, none missing or doubled
            assert events == [f"{i}:{n}" for n in range(len(events))]
            for n, length in acked[i]:
                assert n < len(events)
                assert len(";".join(events[:n + 1])) + 1 == length
            writer = await store.get_attributes(name, [i + 1])
            assert writer == {i + 1: len(events) - 1}
            # the writer resumes: its retry of the last event is a duplicate
            retry = await store.append(name, b"again", writer=(i + 1, len(events) - 1))
            assert retry.duplicate and retry.length == info.length
            assert (await store.append(name, b"new", writer=(i + 1, len(events)))).length == \
                info.length + 3
    finally:
        await store.close()


async def test_a_second_owner_fences_the_first_mid_write(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    name = "sc/st/0.#epoch.0"
    log_name = container_log_name(0)
    first = await SegmentContainer.open(
        0, NamedDataLog(await connect(cluster), log_name, password=LOG_PASSWORD))
    await first.create_segment(name)
    futures: list[asyncio.Future[AppendResult]] = []
    some_acked = asyncio.Event()

    async def write() -> None:
        """Appends with 256 outstanding until one fails."""
        window = asyncio.Semaphore(256)

        def done(future: asyncio.Future[AppendResult]) -> None:
            window.release()
            if len(futures) > 300 and futures[200].done():
                some_acked.set()

        while not any(f.done() and f.exception() is not None for f in futures[-300:]):
            await window.acquire()
            future = first.append(name, b"%06d;" % len(futures))
            future.add_done_callback(done)
            futures.append(future)

    writer = asyncio.ensure_future(write())
    await some_acked.wait()
    second = await SegmentContainer.open(
        0, NamedDataLog(await connect(cluster), log_name, password=LOG_PASSWORD))
    try:
        await writer
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        acked = [i for i, o in enumerate(outcomes) if isinstance(o, AppendResult)]
        failed = [o for o in outcomes if not isinstance(o, AppendResult)]
        assert failed and all(isinstance(o, ContainerFencedError) for o in failed)
        # acknowledged appends are a prefix of the calls (in order), all in the new owner's log
        assert acked == list(range(len(acked))) and len(acked) > 200
        info = await second.get_info(name)
        data = (await second.read(name, 0, info.length)).data
        assert data == b"".join(b"%06d;" % i for i in range(info.length // 7))
        assert info.length >= 7 * len(acked)
        with pytest.raises(ContainerFencedError):
            await first.append(name, b"late")
        assert (await second.append(name, b"next")).length == info.length + 4
    finally:
        await first.close()
        await second.close()
