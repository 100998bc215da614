"""The real Pravega client (PyPI ``pravega`` 0.3.8, module ``pravega_client``,
unmodified) against Quire's controller and segment server, both in one
process (``tests.support.pravega_stack``; the client's blocking calls hold
the GIL, so the servers cannot live in the test's process): scope and stream
with 3 segments, a writer with routing keys, and a reader group whose first
reader reads a slice and goes offline and whose second takes over from the
positions kept in the group's table segment: every event read exactly once,
in order per routing key; then seal and delete."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pravega_client
import pytest

REPO = Path(__file__).resolve().parents[2]
KEYS = 6
EVENTS_PER_KEY = 50


@pytest.fixture
def controller_uri() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pravega_stack", "1000"], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert proc.stdout is not None and proc.stdin is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the controller and segment server did not start"
        ports = json.loads(proc.stdout.readline())
        yield f"tcp://127.0.0.1:{ports['controller']}"
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def read_slices(reader: pravega_client.StreamReader, at_least: int,
                      deadline: float) -> list[str]:
    """Whole slices' events until at least ``at_least`` were read."""
    got: list[str] = []
    while len(got) < at_least:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"read {len(got)} of {at_least} events"
        piece = await asyncio.wait_for(reader.get_segment_slice_async(), remaining)
        got += [event.data().decode() for event in piece]
        reader.release_segment(piece)
    return got


def test_real_client_writes_and_a_reader_group_reads_each_event_once(
        controller_uri: str) -> None:
    manager = pravega_client.StreamManager(controller_uri)
    assert manager.create_scope("shop")
    assert not manager.create_scope("shop")
    assert manager.create_stream("shop", "orders", 3)
    writer = manager.create_writer("shop", "orders")
    for n in range(EVENTS_PER_KEY):
        for k in range(KEYS):
            writer.write_event(f"key{k}:{n}", routing_key=f"key{k}")
    writer.flush()
    del writer

    total = KEYS * EVENTS_PER_KEY
    deadline = time.monotonic() + 60
    group = manager.create_reader_group("auditors", "shop", "orders")
    # the first reader takes every segment (it is alone when it joins), reads
    # one slice and leaves; the second takes over from the positions it left
    first = group.create_reader("reader-1")
    read_first = asyncio.run(read_slices(first, 1, deadline))
    first.reader_offline()
    assert 0 < len(read_first) < total
    second = group.create_reader("reader-2")
    read_second = asyncio.run(read_slices(second, total - len(read_first), deadline))
    second.reader_offline()
    by_key: dict[str, list[int]] = {}
    for data in read_first + read_second:
        key, number = data.split(":")
        by_key.setdefault(key, []).append(int(number))
    # exactly once, and in order per routing key (one key lives in one segment)
    assert by_key == {f"key{k}": list(range(EVENTS_PER_KEY)) for k in range(KEYS)}
    assert manager.seal_stream("shop", "orders")
    assert manager.delete_stream("shop", "orders")
