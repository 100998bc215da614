"""Quire's stream reader on events the real Pravega client (PyPI
``pravega`` 0.3.8) wrote, with routing keys, to a 3-segment stream: the
framing and key ranges agree.  The servers run in a subprocess
(``python -m tests.support.streams``): the client's blocking calls hold the
GIL."""

from __future__ import annotations

import collections
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pravega_client
import pytest

from quire.streams import ControllerClient, RemoteSegmentStore, StreamReader, controller_resolver

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def controller_uri() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.streams"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the stream servers did not start"
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_quire_reads_what_the_pravega_client_wrote(controller_uri: str) -> None:
    manager = pravega_client.StreamManager(controller_uri)
    assert manager.create_scope("sc")
    assert manager.create_stream("sc", "st", 3)
    writer = manager.create_writer("sc", "st")
    for n in range(30):
        for k in range(6):
            writer.write_event(f"key{k}:{n}", routing_key=f"key{k}")
    writer.flush()
    del writer

    controller = ControllerClient(controller_uri)
    segments = RemoteSegmentStore(controller_resolver(controller))
    try:
        per_key: dict[str, list[int]] = collections.defaultdict(list)
        segment_of: dict[str, set[int]] = collections.defaultdict(set)
        async for event in StreamReader(controller, segments, "sc", "st").events():
            key, n = event.data.decode().split(":")
            per_key[key].append(int(n))
            segment_of[key].add(event.segment_id)
        assert dict(per_key) == {f"key{k}": list(range(30)) for k in range(6)}
        assert all(len(ids) == 1 for ids in segment_of.values())
    finally:
        await segments.close()
        await controller.close()
