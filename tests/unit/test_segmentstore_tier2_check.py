"""PDP-40's consistency check over tier-2 alone: a "pdp40" writer killed at
any step of an iteration leaves tier-2 consistent; an "unordered" one
killed between a metadata flush and the data flush it depends on does not,
and the check says so every time."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from quire.segmentstore import AttributeUpdate, SegmentContainer, SegmentType, UpdateType
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.testing.chaos_writer import ChaosStorageWriter
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import ChunkStorage, open_chunk_storage

STREAMS = ["sc/a/0", "sc/a/1", "sc/a/2"]
TABLE = "sc/kv/0"
DOOMED = "sc/a/doomed"
_names = itertools.count()


class Killed(Exception):
    """The owner dies here (a test hook raises it before a flush step)."""


KillAt = Callable[[list[str]], bool]
"""Given the steps begun so far (the last one about to run): kill now?"""


async def run(uri: str, order: str, kill_at: KillAt, seed: int = 0
              ) -> tuple[ChunkStorage, list[str], bool]:
    """Two iterations of heavy flushing in ``order`` after one in order
    (killed where ``kill_at`` says); tier-2, the steps begun and whether the
    kill happened."""
    storage = await open_chunk_storage(uri)
    container = await SegmentContainer.open(0, MemoryDataLogs().open("c0"))
    try:
        config = StorageWriterConfig(flush_threshold_bytes=1)
        # the first iteration in order, so that tier-2 records all of round 0
        writer = await ChaosStorageWriter.start(ContainerWriterSource(container), storage,
                                                config, max_chunk_bytes=64)
        for name in [*STREAMS, DOOMED]:
            await container.create_segment(name)
        await container.create_segment(TABLE, SegmentType.TABLE)
        for round_ in range(2):
            for i, name in enumerate([*STREAMS, DOOMED]):
                await container.append(name, b"%d-%d;" % (i, round_) * 10,
                                       [AttributeUpdate(i, UpdateType.REPLACE, round_)])
            await container.tables.put(TABLE, [(b"k%d.%d" % (round_, j), b"v", None)
                                              for j in range(5)])
            if round_ == 1:
                await container.truncate(STREAMS[2], 50)
                await container.delete(DOOMED)
                await container.tables.remove(TABLE, [(b"k0.1", None)])
            if round_ == 0:
                await writer.flush_once()
        if order == "unordered":
            writer.break_order(seed)
        steps: list[str] = []

        async def hook(step: str) -> None:
            steps.append(step)
            if kill_at(steps):
                raise Killed(step)
        writer.before_step = hook
        try:
            await writer.flush_once()
            await writer.flush_once()
            killed = False
        except Killed:
            killed = True
        return storage, steps, killed
    finally:
        await container.close()


async def test_a_pdp40_writer_killed_at_any_step_leaves_tier2_consistent(tmp_path: Path
                                                                         ) -> None:
    storage, steps, killed = await run("memory://", "pdp40", lambda steps: False)
    assert not killed and await check(storage) == []
    await storage.close()
    for k in range(1, len(steps) + 1):
        uri = f"memory://check-{next(_names)}" if k % 4 else f"file://{tmp_path}/k{k}"
        storage, _steps, killed = await run(uri, "pdp40",
                                            lambda begun, k=k: len(begun) == k)  # type: ignore[misc]
        assert killed
        assert await check(storage) == [], f"killed before step {k}: {steps[k - 1]}"
        await storage.close()


def _attributes_before_their_data(steps: list[str]) -> bool:
    """Killed before a data flush whose attributes were flushed and then
    recorded by a metadata flush, all in this iteration."""
    step = steps[-1]
    if not step.startswith("data:") or step[5:] not in STREAMS[:2]:
        return False
    name = step[5:]
    return f"attributes:{name}" in steps and "metadata" in steps[steps.index(
        f"attributes:{name}"):]


async def test_an_unordered_writer_killed_between_metadata_and_data_is_reported() -> None:
    caught = 0
    for seed in range(40):
        storage, _steps, killed = await run("memory://", "unordered",
                                            _attributes_before_their_data, seed)
        if killed:
            violations = await check(storage)
            assert any(v.segment.endswith("$attributes") and v.recorded_offset
                       > v.guaranteed_length for v in violations), (seed, violations)
            caught += 1
        await storage.close()
    assert caught >= 3  # the kill point came up, and each time it was reported


async def test_unordered_deletes_before_the_metadata_flush_are_reported() -> None:
    cut = (DOOMED, STREAMS[2])  # deleted, truncated in the killed iteration

    def deleted_then_metadata(steps: list[str]) -> bool:
        return steps[-1] == "metadata" and any(f"data:{name}" in steps[:-1] for name in cut)
    caught = 0
    for seed in range(20):
        storage, _steps, killed = await run("memory://", "unordered", deleted_then_metadata,
                                            seed)
        if killed:
            violations = await check(storage)
            assert any(v.segment.split("$")[0] in cut and "missing" in v.reason
                       for v in violations), \
                (seed, violations)
            caught += 1
        await storage.close()
    assert caught >= 3
