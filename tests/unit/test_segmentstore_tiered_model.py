"""The container model test (tests/unit/test_segmentstore_model.py) with
tier-2: a storage writer flushes at random points (random thresholds, the
clock moved on), truncating tier-1, and a reopen replays from the
truncation checkpoint and reads older bytes from tier-2.  The model must
hold throughout, and after every flush PDP-40's check over tier-2 alone
finds nothing."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from quire.segmentstore import SegmentContainer
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import Tier2Reader, storage_metadata_name
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.tier2 import ChunkStorage, open_chunk_storage
from tests.support.segment_model import TABLE
from tests.unit.test_segmentstore_model import ContainerMachine

_stores = itertools.count()


class TieredContainerMachine(ContainerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.storage: ChunkStorage = self.run(
            open_chunk_storage(f"memory://tiered-{next(_stores)}"))
        self.writer = self.run(self._start_writer())
        self.truncations = 0

    async def _start_writer(self) -> StorageWriter:
        # evicted chunks leave the read index as soon as tier-2 holds them
        self.container.read_index.drop_batch_chunks = 1
        return await StorageWriter.start(ContainerWriterSource(self.container), self.storage,
                                         StorageWriterConfig(),
                                         max_chunk_bytes=32)

    def teardown(self) -> None:
        self.run(self.storage.close())
        super().teardown()

    @rule(threshold_bytes=st.sampled_from([1, 20, 1 << 30]), later_ms=st.integers(0, 2),
          iterations=st.integers(1, 3))
    def flush(self, threshold_bytes: int, later_ms: int, iterations: int) -> None:
        self.writer.config = StorageWriterConfig(flush_threshold_bytes=threshold_bytes,
                                                 flush_threshold_ms=1)
        for _ in range(iterations):
            self.clock.advance(later_ms)
            before = self.writer.truncated_at
            self.run(self.writer.flush_once())
            if self.writer.truncated_at != before:
                self.truncations += 1
            assert self.run(check(self.storage)) == []

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.run(self.container.close())
        old = self.container
        reader = self.run(Tier2Reader.load(self.storage, 0))
        self.container = self.run(SegmentContainer.open(0, self.logs.open("c"), self.config,
                                                        clock=self.clock,
                                                        tier2_read=reader.read))
        if not clean:
            self.run(old.close())
        self.writer = self.run(self._start_writer())

    @invariant()
    def matches_the_model(self) -> None:
        committed = self.container.committed
        assert sorted(committed.by_name) == sorted([*self.model, TABLE,
                                                     storage_metadata_name(0)])
        for name, seg in self.model.items():
            info = self.run(self.container.get_info(name))
            assert (info.length, info.start_offset, info.sealed, info.attributes) == \
                (len(seg.data), seg.start, seg.sealed, seg.attrs)
            assert info.storage_length <= info.length
            got = self.run(self.container.read(name, seg.start, 1 << 20))
            assert got.data == bytes(seg.data[seg.start:])


TestTieredContainerModel = TieredContainerMachine.TestCase
TestTieredContainerModel.settings = settings(max_examples=40, stateful_step_count=30,
                                             deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
