"""The segment store on real bookies: appends acknowledged by a segment store
process that is then killed (``kill -9``) are all there when a new process's
SegmentStore takes the containers over (fencing the old owner, replaying
tier-1), in call order, with the writers' event numbers for dedup; a
second owner fences the first while it writes; and many writers keep their
order and dedup across a container restart."""

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
    ContainerNotOwnedError,
    SegmentContainer,
    SegmentStore,
    SegmentStoreConfig,
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


async def test_many_writers_keep_order_and_dedup_across_a_container_restart(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    """100 writers, 10 segments, 100 B events: every writer's events land once
    each and in order, although each block is sent twice (a retry racing
    the original) and the containers restart mid-write."""
    store = await SegmentStore.open(await connect(cluster), range(2),
                                    config=SegmentStoreConfig(container_count=2))
    segments = [f"sc/many/{i}.#epoch.0" for i in range(10)]
    for name in segments:
        await store.create_segment(name)
    available = asyncio.Event()
    available.set()
    halfway = asyncio.Event()
    progress = [0]
    events = 20

    def event(writer: int, n: int) -> bytes:
        return (b"w%03de%03d;" % (writer, n)).ljust(100, b".")

    async def write(writer: int) -> None:
        name = segments[writer % 10]
        for n in range(events):
            while True:
                await available.wait()
                first = store.append(name, event(writer, n), writer=(writer + 1, n))
                retry = store.append(name, event(writer, n), writer=(writer + 1, n))
                outcomes = await asyncio.gather(first, retry, return_exceptions=True)
                if all(isinstance(o, AppendResult) for o in outcomes):
                    assert [o.duplicate for o in outcomes if isinstance(o, AppendResult)] \
                        == [False, True]
                    break
                # refused while the containers restart: send the block again after
                assert all(isinstance(o, AppendResult | ContainerNotOwnedError)
                           for o in outcomes)
            progress[0] += 1
            if progress[0] == 100 * events // 2:
                halfway.set()

    async def restart() -> None:
        await halfway.wait()
        available.clear()
        for container in (0, 1):
            await store.stop_container(container)
        for container in (0, 1):
            await store.start_container(container)
        available.set()

    try:
        await asyncio.gather(restart(), *(write(w) for w in range(100)))
        for i, name in enumerate(segments):
            info = await store.get_info(name)
            data = (await store.read(name, 0, info.length)).data
            blocks = [data[k:k + 100] for k in range(0, len(data), 100)]
            for writer in range(i, 100, 10):
                mine = [b for b in blocks if b.startswith(b"w%03de" % writer)]
                assert mine == [event(writer, n) for n in range(events)]
            assert len(blocks) == 10 * events
            assert await store.get_attributes(name, [i + 1]) == {i + 1: events - 1}
    finally:
        await store.close()
