"""A storage writer for crash tests: a hook before each flush step, and
optionally PDP-40's order broken on purpose.

:class:`ChaosStorageWriter` is a :class:`~quire.segmentstore.storage_writer.StorageWriter`
that awaits :attr:`~ChaosStorageWriter.before_step` before each step of an
iteration ("data:<name>", "index:<name>", "attributes:<name>", "metadata"),
so a test can kill the owner at an exact point (the hook raises, or the
process kills itself there).  After :meth:`~ChaosStorageWriter.break_order`
it flushes an iteration's steps (each segment's data, index and attributes,
and the metadata bucket) in a shuffled order, writes an ``$index`` or
``$attributes`` batch without waiting for its data, and deletes dropped
chunks as soon as their layout is put in tier-1 (one iteration), which is
what PDP-40 forbids: ``quire tier2 check`` must catch it.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from quire.segmentstore.flush_plan import Tracked
from quire.segmentstore.recorded_layouts import SYSTEM, USER
from quire.segmentstore.storage_writer import (
    IterationReport,
    SegmentSnapshot,
    StorageWriter,
    StorageWriterConfig,
)
from quire.segmentstore.store import StartWriter
from quire.segmentstore.writer_source import WriterSource
from quire.tier2 import ChunkStorage

StepHook = Callable[[str], Awaitable[None]]
"""Awaited before a flush step, with the step's name; raising stops the
iteration there, as a crash of the owner would."""
_Step = Callable[[], Awaitable[None]]


class ChaosStorageWriter(StorageWriter):
    """See the module docstring.  In PDP-40's order until :meth:`break_order`."""

    def __init__(self, source: WriterSource, storage: ChunkStorage,
                 config: StorageWriterConfig, max_chunk_bytes: int) -> None:
        super().__init__(source, storage, config, max_chunk_bytes)
        self.before_step: StepHook | None = None
        self.shuffle: random.Random | None = None
        """The shuffle of the steps once the order is broken (None: PDP-40's order)."""

    def break_order(self, seed: int) -> None:
        """Flush in any order from now on (shuffled with ``seed``: runs replay)."""
        self.shuffle = random.Random(seed)

    @classmethod
    def starter(cls, unordered_seed: int | None = None) -> StartWriter:
        """A store's ``start_writer`` starting one of these (its order broken
        with ``unordered_seed`` from the first iteration, unless None)."""
        async def start(source: WriterSource, storage: ChunkStorage,
                        config: StorageWriterConfig, max_chunk_bytes: int) -> StorageWriter:
            writer = await cls.start(source, storage, config, max_chunk_bytes=max_chunk_bytes)
            if unordered_seed is not None:
                writer.break_order(unordered_seed)
            return writer
        return start

    async def _hook(self, step: str) -> None:
        if self.before_step is not None:
            await self.before_step(step)

    # --- the steps, each after the hook ----------------------------------------------

    async def _flush_data(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        await self._hook(f"data:{snapshot.name}")
        await super()._flush_data(snapshot, report)

    async def _flush_index(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        if snapshot.index is not None:
            await self._hook(f"index:{snapshot.name}")
        await super()._flush_index(snapshot, report)

    async def _write_attributes(self, snapshot: SegmentSnapshot, tracked: Tracked,
                                changed: dict[int, int], report: IterationReport) -> None:
        await self._hook(f"attributes:{snapshot.name}")
        await super()._write_attributes(snapshot, tracked, changed, report)

    async def _flush_metadata(self, report: IterationReport) -> None:
        await self._hook("metadata")
        await super()._flush_metadata(report)

    # --- the order broken ---------------------------------------------------------------

    def _data_flushed(self, snapshot: SegmentSnapshot) -> bool:
        return self.shuffle is not None or super()._data_flushed(snapshot)

    async def _flush_planned(self, plan: list[list[int]], report: IterationReport) -> None:
        if self.shuffle is None:
            await super()._flush_planned(plan, report)
            return
        steps: list[_Step] = []
        for sid in plan[USER] + plan[SYSTEM]:
            snapshot = self._snapshot(sid)
            steps.append(self._step(self._flush_data, snapshot, report))
            steps.append(self._step(self._flush_index, snapshot, report))
            steps.append(self._step(self._flush_attributes, snapshot, report))
        steps.append(lambda: self._flush_metadata(report))
        self.shuffle.shuffle(steps)
        for step in steps:
            await step()
        # and tier-1 is not truncated

    def _step(self, flush: Callable[[SegmentSnapshot, IterationReport], Awaitable[None]],
              snapshot: SegmentSnapshot, report: IterationReport) -> _Step:
        async def step() -> None:
            await flush(snapshot, report)
            dropped = self.recorded.take_all_dropped()
            if dropped:  # deleted in the same iteration
                await self._record()
                for name in dropped:
                    await self.storage.delete(name)
                    report.chunks_deleted += 1
        return step
