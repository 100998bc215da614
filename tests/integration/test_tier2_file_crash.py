"""The file driver under ``kill -9`` of a real writer process, with and
without an emulated power loss after it: every chunk whose write returned
is there, whole; no chunk is ever seen partly written (a chunk listed is
whole, whatever the moment of the kill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quire.testing.tier2_power_loss import emulate_tier2_power_loss
from quire.tier2 import open_chunk_storage
from tests.support.tier2_writer import chunk_bytes, index_of

REPO = Path(__file__).resolve().parents[2]


def run_and_kill(root: Path, returned_before_kill: int, tracking: bool) -> list[str]:
    """Start the writer, read the names it reports until ``returned_before_kill``
    of them, kill it with SIGKILL at once; the names whose write returned."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}:{REPO}")
    command = [sys.executable, "-m", "tests.support.tier2_writer", str(root)]
    process = subprocess.Popen(command + (["--tracking"] if tracking else []),
                               stdout=subprocess.PIPE, env=env, cwd=REPO)
    assert process.stdout is not None
    returned = []
    try:
        while len(returned) < returned_before_kill:
            line = process.stdout.readline()
            assert line, f"the writer exited with {process.wait()}"
            returned.append(line.decode().strip())
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    return returned


@pytest.mark.parametrize("power_loss", [False, True])
@pytest.mark.parametrize("returned_before_kill", [7, 40])
async def test_returned_chunks_survive_and_none_is_seen_partly_written(
        tmp_path: Path, returned_before_kill: int, power_loss: bool) -> None:
    returned = run_and_kill(tmp_path, returned_before_kill, tracking=power_loss)
    if power_loss:
        report = emulate_tier2_power_loss(tmp_path)
        assert not set(report.lost_chunks) & set(returned)
        assert report.truncated_chunks == {}
    storage = await open_chunk_storage(f"file://{tmp_path}")
    try:
        listed = {c.name: c.length for c in await storage.list_chunks()}
        assert set(returned) <= set(listed)
        for name, length in listed.items():
            assert await storage.read(name, 0, length) == chunk_bytes(index_of(name)), name
    finally:
        await storage.close()
