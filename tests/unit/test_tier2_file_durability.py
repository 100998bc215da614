"""A chunk that ``write_chunk`` returned survives power loss on the file
driver, and each of its fsyncs is needed for that.

``kill -9`` keeps the page cache, so these tests use the emulation of
:mod:`quire.testing.tier2_power_loss`: the driver records what each fsync
made durable, the emulation removes the rest.  Turning off the chunk's
fsync or its directory's fsync (test seams in ``Tier2Config``) makes the
emulation lose chunks the driver had returned: the emulation has teeth,
and the fsyncs are what keep them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from quire.errors import ChunkNotFoundError, Tier2Error
from quire.testing.tier2_power_loss import emulate_tier2_power_loss
from quire.tier2 import ChunkInfo, ChunkStorage, Tier2Config, open_chunk_storage
from quire.tier2 import file as file_driver

CHUNKS = {f"scope/stream-{i % 3}/seg.E1.{i}": os.urandom(4096 + i) for i in range(12)}
CHUNKS["top-level.E1.0"] = b"in the root directory"


async def open_tracked(root: Path, **seams: bool) -> ChunkStorage:
    return await open_chunk_storage(
        Tier2Config(uri=f"file://{root}", power_loss_tracking=True, **seams))


async def write_all(storage: ChunkStorage) -> None:
    await asyncio.gather(*(storage.write_chunk(n, d) for n, d in CHUNKS.items()))


async def surviving(root: Path) -> dict[str, bytes]:
    """After the power cut: a new process opens the directory and reads."""
    storage = await open_chunk_storage(f"file://{root}")
    try:
        return {c.name: await storage.read(c.name, 0, c.length)
                for c in await storage.list_chunks()}
    finally:
        await storage.close()


async def test_every_returned_chunk_survives_power_loss(tmp_path: Path) -> None:
    storage = await open_tracked(tmp_path)
    await write_all(storage)
    await storage.close()
    report = emulate_tier2_power_loss(tmp_path)
    assert (report.lost_chunks, report.truncated_chunks, report.lost_directories) == ([], {}, [])
    assert await surviving(tmp_path) == CHUNKS


@pytest.mark.parametrize("seam", ["test_skip_file_fsync", "test_skip_directory_fsync"])
async def test_without_an_fsync_power_loss_loses_returned_chunks(
        tmp_path: Path, seam: str) -> None:
    storage = await open_tracked(tmp_path, **{seam: True})
    await write_all(storage)
    await storage.close()
    assert await surviving(tmp_path) == CHUNKS  # a kill -9 would keep them all
    report = emulate_tier2_power_loss(tmp_path)
    assert await surviving(tmp_path) == {}
    assert report.lost_chunks == sorted(CHUNKS)
    # without directory fsyncs the new directories' names were not durable either
    assert report.lost_directories == ([] if seam == "test_skip_file_fsync" else ["scope"])


async def test_a_write_that_failed_before_its_directory_fsync_is_lost_then_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = await open_tracked(tmp_path)
    await storage.write_chunk("seg.E1.0", b"durable")

    def failing_fsync(path: Path) -> None:
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(file_driver, "_fsync_directory", failing_fsync)
    with pytest.raises(Tier2Error, match="injected"):
        await storage.write_chunk("seg.E1.1", b"outcome unknown")
    await storage.close()
    monkeypatch.undo()
    assert emulate_tier2_power_loss(tmp_path).lost_chunks == ["seg.E1.1"]
    assert await surviving(tmp_path) == {"seg.E1.0": b"durable"}
    # the writer retries its write whose outcome it did not know
    storage = await open_tracked(tmp_path)
    await storage.write_chunk("seg.E1.1", b"outcome unknown")
    await storage.close()
    assert emulate_tier2_power_loss(tmp_path).lost_chunks == []
    assert await surviving(tmp_path) == {"seg.E1.0": b"durable", "seg.E1.1": b"outcome unknown"}


async def test_a_retry_after_an_unknown_outcome_that_had_landed_succeeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No power cut: the failed write's chunk is there, and the retry with the
    same bytes returns normally (and makes its name durable)."""
    storage = await open_tracked(tmp_path)
    calls = []

    def failing_once(path: Path) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise OSError(5, "Input/output error (injected)")
        real_fsync_directory(path)

    real_fsync_directory = file_driver._fsync_directory
    monkeypatch.setattr(file_driver, "_fsync_directory", failing_once)
    with pytest.raises(Tier2Error):
        await storage.write_chunk("seg.E1.0", b"bytes")
    await storage.write_chunk("seg.E1.0", b"bytes")
    await storage.close()
    assert len(calls) == 2
    assert emulate_tier2_power_loss(tmp_path).lost_chunks == []
    assert await surviving(tmp_path) == {"seg.E1.0": b"bytes"}


async def test_the_emulation_cuts_unsynced_bytes_and_removes_temporaries(tmp_path: Path) -> None:
    untracked = await open_chunk_storage(f"file://{tmp_path}")
    await untracked.write_chunk("old.E0.0", b"written before tracking")
    await untracked.close()
    storage = await open_tracked(tmp_path)
    await storage.write_chunk("seg.E1.0", b"synced")
    await storage.close()
    with open(tmp_path / "seg.E1.0", "ab") as chunk:
        chunk.write(b" and never synced")
    (tmp_path / ".tmp-left-by-a-crash").write_bytes(b"partial")
    report = emulate_tier2_power_loss(tmp_path)
    assert report.truncated_chunks == {"seg.E1.0": len(b" and never synced")}
    assert report.temporaries == [".tmp-left-by-a-crash"]
    assert await surviving(tmp_path) == {"old.E0.0": b"written before tracking",
                                         "seg.E1.0": b"synced"}
    # the sidecar was emptied: what is left counts as durable
    assert emulate_tier2_power_loss(tmp_path).lost_chunks == []


async def test_a_deleted_chunk_stays_deleted_and_a_listing_skips_driver_files(
        tmp_path: Path) -> None:
    storage = await open_tracked(tmp_path)
    await storage.write_chunk("seg.E1.0", b"a")
    await storage.write_chunk("seg.E1.1", b"b")
    await storage.delete("seg.E1.0")
    assert await storage.list_chunks() == [ChunkInfo("seg.E1.1", 1)]  # not the sidecar
    await storage.close()
    emulate_tier2_power_loss(tmp_path)
    with pytest.raises(ChunkNotFoundError):
        storage = await open_tracked(tmp_path)
        try:
            await storage.read("seg.E1.0", 0, 1)
        finally:
            await storage.close()
