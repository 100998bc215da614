"""The segment store on real bookies: appends acknowledged by a segment store
process that is then killed (``kill -9``) are all there when a new process's
SegmentStore takes the containers over (fencing the old owner, replaying
tier-1), in call order, with the writers' event numbers for dedup; a
second owner fences the first while it writes; and many writers keep their
order and dedup across a container restart."""

from __future__ import annotations

import asyncio
import contextlib
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
    ContainerConfig,
    ContainerFencedError,
    ContainerNotOwnedError,
    SegmentContainer,
    SegmentStore,
    SegmentStoreConfig,
)
from quire.segmentstore.names import container_log_name
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
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
        0, NamedDataLog(await connect(cluster), log_name, password=LEGACY_LOG_PASSWORD))
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
        0, NamedDataLog(await connect(cluster), log_name, password=LEGACY_LOG_PASSWORD))
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


async def test_an_8_mib_append_spans_ledger_entries_and_comes_back_whole(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    """A ledger entry is at most 5 MiB; an append of a Pravega client's
    largest block is written as part frames of about 1 MiB and read back
    whole, from the read index, after eviction, and after a reopen."""
    name = "sc/big/0.#epoch.0"
    log_name = container_log_name(3)
    config = ContainerConfig(read_index_budget_bytes=1 << 20)
    big = os.urandom(8 << 20)
    first = await SegmentContainer.open(
        3, NamedDataLog(await connect(cluster), log_name, password=LEGACY_LOG_PASSWORD), config)
    try:
        await first.create_segment(name)
        results = await asyncio.gather(first.append(name, b"<"), first.append(name, big),
                                       first.append(name, b">"))
        assert [r.length for r in results] == [1, 1 + len(big), 2 + len(big)]
        assert (await first.read(name, 0, 1 << 24)).data == b"<" + big + b">"
    finally:
        await first.close()
    second = await SegmentContainer.open(
        3, NamedDataLog(await connect(cluster), log_name, password=LEGACY_LOG_PASSWORD), config)
    try:
        assert (await second.read(name, 1, 1 << 24)).data == big + b">"
    finally:
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


class OwnerGone(Exception):
    """The owner process died before answering."""


class OwnerProcess:
    """A segment store process (``tests/support/segment_driver.py store:N``)
    hosting every container; :meth:`call` sends it a request."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, uri: str, containers: int) -> OwnerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.segment_driver", uri, f"store:{containers}",
            "{}", cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 90)
            assert json.loads(line) == {"ready": True}, line
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                answer = json.loads(line)
                future = self.pending.pop(answer["id"])
                if "ok" in answer:
                    future.set_result(answer["ok"])
                else:
                    future.set_exception(AssertionError(f"refused: {answer['err']}"))
        finally:
            for future in self.pending.values():
                future.set_exception(OwnerGone())
            self.pending.clear()

    def call(self, request: dict[str, Any]) -> asyncio.Future[Any]:
        assert self.proc.stdin is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.reader.done():
            future.set_exception(OwnerGone())
            return future
        self.next_id += 1
        self.pending[self.next_id] = future
        self.proc.stdin.write(json.dumps({"id": self.next_id, **request}).encode() + b"\n")
        return future

    async def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self.reader

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(OwnerGone):
                await asyncio.wait_for(self.call({"op": "close"}), 30)
        await self.kill9()


async def test_many_writers_keep_order_and_dedup_across_kill9_of_the_owner(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    """100 writers in this process, 10 segments in a segment store process,
    100 B events, each block sent twice (a retry racing the original): the
    owner process is killed with ``kill -9`` twice under the writes and a new
    one takes the containers over; writers resend what was not answered
    (Pravega's reconnect): every writer's events land once each, in order."""
    owner = await OwnerProcess.start(cluster.metadata_uri, 2)
    segments = [f"sc/many/{i}.#epoch.0" for i in range(10)]
    for name in segments:
        assert await owner.call({"op": "create", "name": name}) is None
    available = asyncio.Event()
    available.set()
    progress = [0]
    events = 20
    kills_at = [100 * events // 3, 2 * 100 * events // 3]
    reached = [asyncio.Event() for _ in kills_at]
    resent = [0]
    landed_before = [0]

    def event(writer: int, n: int) -> bytes:
        return (b"w%03de%03d;" % (writer, n)).ljust(100, b".")

    async def write(writer: int) -> None:
        name = segments[writer % 10]
        for n in range(events):
            again = False
            while True:
                await available.wait()
                request = {"op": "append", "name": name, "data": event(writer, n).hex(),
                           "writer": [writer + 1, n]}
                outcomes = await asyncio.gather(owner.call(request), owner.call(request),
                                                return_exceptions=True)
                answers = [o for o in outcomes if not isinstance(o, BaseException)]
                if len(answers) == 2:
                    duplicates = [o[3] for o in answers]
                    # resent after a kill: the first may have landed before it
                    assert duplicates == [False, True] or (again and duplicates == [True, True])
                    landed_before[0] += duplicates[0]
                    break
                assert all(isinstance(o, list | OwnerGone) for o in outcomes), outcomes
                again = True
                resent[0] += 1
                await asyncio.sleep(0)
            progress[0] += 1
            for at, event_reached in zip(kills_at, reached, strict=True):
                if progress[0] == at:
                    event_reached.set()

    async def kill_and_take_over() -> None:
        nonlocal owner
        for event_reached in reached:
            await event_reached.wait()
            available.clear()
            await owner.kill9()
            owner = await OwnerProcess.start(cluster.metadata_uri, 2)
            available.set()

    try:
        await asyncio.gather(kill_and_take_over(), *(write(w) for w in range(100)))
    finally:
        await owner.close()
    print(f"\nblocks resent after a kill: {resent[0]}, of which had landed before it: "
          f"{landed_before[0]}")
    assert resent[0] > 0  # the kills did cut writes in flight
    store = await SegmentStore.open(await connect(cluster), range(2),
                                    config=SegmentStoreConfig(container_count=2))
    try:
        for i, name in enumerate(segments):
            info = await store.get_info(name)
            data = (await store.read(name, 0, info.length)).data
            blocks = [data[k:k + 100] for k in range(0, len(data), 100)]
            for writer in range(i, 100, 10):
                mine = [b for b in blocks if b.startswith(b"w%03de" % writer)]
                assert mine == [event(writer, n) for n in range(events)]
                assert await store.get_attributes(name, [writer + 1]) == \
                    {writer + 1: events - 1}
            assert len(blocks) == 10 * events
    finally:
        await store.close()
