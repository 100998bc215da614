"""The ``tests.support.pravega_stack`` process, driven from a test that uses
the real Pravega client, and reading with that client's reader groups."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pravega_client

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    """The controller and segment server process."""

    proc: subprocess.Popen[bytes]
    uri: str

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready, "no answer from the controller and segment server process"
        return dict(json.loads(self.proc.stdout.readline()))

    def drop_connections(self) -> int:
        """Make the segment server drop every connection now."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"drop\n")
        self.proc.stdin.flush()
        return int(self.line()["dropped"])


@contextmanager
def pravega_stack(*args: str) -> Iterator[Stack]:
    """``python -m tests.support.pravega_stack ARGS`` until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pravega_stack", *args], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert proc.stdin is not None
    try:
        started = Stack(proc, "")
        started.uri = f"tcp://127.0.0.1:{started.line()['controller']}"
        yield started
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def read_slices(reader: pravega_client.StreamReader, at_least: int,
                      deadline: float, go_offline: bool = True) -> list[str]:
    """Whole slices' events until at least ``at_least`` were read; then, unless
    ``go_offline`` is false, the reader goes offline (while the event loop
    still runs: outside it, the binding can wait out its 30 s timeout), also
    when the reading fails."""
    got: list[str] = []
    try:
        while len(got) < at_least:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"read {len(got)} of {at_least} events"
            piece = await asyncio.wait_for(reader.get_segment_slice_async(), remaining)
            got += [event.data().decode() for event in piece]
            reader.release_segment(piece)
    finally:
        if go_offline:
            reader.reader_offline()
    return got


def by_routing_key(events: list[str]) -> dict[str, list[int]]:
    """Events ``key:number`` as each key's numbers in the order read."""
    out: dict[str, list[int]] = {}
    for data in events:
        key, number = data.split(":")
        out.setdefault(key, []).append(int(number))
    return out
