"""A model-based test of one segment container (hypothesis state machine).

The container runs on the in-memory tier-1 log twin; the model is plain
dicts of bytes, attributes and one table's entries.  Every operation kind comes in random order,
some pipelined (called together, awaited in reverse), and the container is
reopened (closed or just abandoned, then replayed) in the middle: every
acknowledged operation is there, refused ones left nothing behind, and
conditions (expected offsets, attribute compare-and-set, writer dedup) hold
as the model says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from quire.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.segmentstore import (
    NOT_EXISTS,
    AppendResult,
    AttributeUpdate,
    ContainerConfig,
    MergeResult,
    SegmentContainer,
    SegmentType,
)
from quire.segmentstore.tables import encode_batch
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from tests.support.segment_model import (
    KEYS,
    NAMES,
    TABLE,
    TABLE_KEYS,
    WRITERS,
    Seg,
    model_updates,
    updates_st,
)

T = TypeVar("T")




async def settle(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except SegmentStoreError as e:
        return type(e)


class ContainerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.logs = MemoryDataLogs()
        self.clock = ManualClock()
        self.config = ContainerConfig(checkpoint_every_bytes=300, read_index_budget_bytes=200,
                                      max_frame_bytes=256)
        self.container = self.run(SegmentContainer.open(0, self.logs.open("c"), self.config,
                                                        clock=self.clock))
        self.model: dict[str, Seg] = {}
        self.table: dict[bytes, tuple[int, bytes]] = {}
        self.table_length = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.container.close())
        self.loop.close()

    def outcome(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """What ``call()`` (made on the loop) gives: its result or its error's type."""
        async def wait() -> Any:
            return await settle(call())
        return self.run(wait())

    # --- the model's answers ---------------------------------------------------

    def model_append(self, name: str, data: bytes, updates: list[AttributeUpdate],
                     expected: int | None, writer: tuple[int, int] | None) -> Any:
        seg = self.model.get(name)
        if seg is None:
            return SegmentNotFoundError
        if seg.sealed:
            return SegmentSealedError
        previous = None
        if writer is not None:
            previous = seg.attrs.get(writer[0])
            if previous is not None and writer[1] <= previous:
                return AppendResult(len(seg.data), writer[1], previous, duplicate=True)
        if expected is not None and expected != len(seg.data):
            return BadOffsetError
        attrs = model_updates(seg.attrs, updates)
        if attrs is None:
            return BadAttributeUpdateError
        if writer is not None:
            attrs[writer[0]] = writer[1]
        seg.attrs = attrs
        seg.data += data
        return AppendResult(len(seg.data), None if writer is None else writer[1], previous)

    # --- rules -------------------------------------------------------------------

    @initialize()
    def create_all(self) -> None:
        for name in NAMES:
            self.create(name, {})
        assert self.outcome(lambda: self.container.create_segment(
            TABLE, SegmentType.TABLE)) is None

    def expected_version(self, key: bytes, kind: str) -> int | None:
        current = self.table.get(key)
        return {"any": None, "absent": NOT_EXISTS,
                "current": current[0] if current else None,
                "wrong": (current[0] + 1) if current else 10_001}[kind]

    def table_refusal(self, conditions: list[tuple[bytes, int | None]]) -> Any:
        for key, expected in conditions:
            current = self.table.get(key)
            if expected is None:
                continue
            if expected == NOT_EXISTS:
                if current is not None:
                    return TableKeyBadVersionError
            elif current is None:
                return TableKeyNotFoundError
            elif current[0] != expected:
                return TableKeyBadVersionError
        return None

    @rule(puts=st.dictionaries(st.sampled_from(TABLE_KEYS), st.tuples(
        st.binary(max_size=8), st.sampled_from(["any", "absent", "current", "current",
                                                "wrong"])),
        max_size=2))
    def table_put(self, puts: dict[bytes, tuple[bytes, str]]) -> None:
        entries = [(k, v, self.expected_version(k, kind)) for k, (v, kind) in puts.items()]
        want = self.table_refusal([(k, e) for k, _v, e in entries])
        got = self.outcome(lambda: self.container.tables.put(TABLE, entries))
        if want is not None:
            assert got is want
            return
        data, offsets = encode_batch([(k, v) for k, v, _e in entries])
        versions = [self.table_length + o for o in offsets]
        self.table_length += len(data)
        assert got == versions
        for (k, v, _e), version in zip(entries, versions, strict=True):
            self.table[k] = (version, v)

    @rule(removes=st.dictionaries(st.sampled_from(TABLE_KEYS),
                                  st.sampled_from(["any", "current", "current", "wrong"]),
                                  max_size=2))
    def table_remove(self, removes: dict[bytes, str]) -> None:
        keys = [(k, self.expected_version(k, kind)) for k, kind in removes.items()]
        want = self.table_refusal(keys)
        got = self.outcome(lambda: self.container.tables.remove(TABLE, keys))
        if want is not None:
            assert got is want
            return
        assert got is None
        present = [(k, None) for k, _e in keys if k in self.table]
        if present:
            self.table_length += len(encode_batch(present)[0])
        for k, _e in keys:
            self.table.pop(k, None)

    @rule(name=st.sampled_from(NAMES), attrs=st.dictionaries(st.sampled_from(KEYS),
                                                             st.integers(0, 3), max_size=2))
    def create(self, name: str, attrs: dict[int, int]) -> None:
        got = self.outcome(lambda: self.container.create_segment(name, attributes=attrs))
        if name in self.model:
            assert got is SegmentExistsError
        else:
            assert got is None
            self.model[name] = Seg(attrs=dict(attrs))

    @rule(name=st.sampled_from(NAMES), data=st.binary(min_size=1, max_size=40),
          updates=updates_st, offset=st.sampled_from(["none", "right", "wrong"]),
          writer=st.none() | st.tuples(st.sampled_from(WRITERS), st.integers(0, 6)))
    def append(self, name: str, data: bytes, updates: list[AttributeUpdate], offset: str,
               writer: tuple[int, int] | None) -> None:
        seg = self.model.get(name)
        length = len(seg.data) if seg is not None else 0
        expected = {"none": None, "right": length, "wrong": length + 1}[offset]
        want = self.model_append(name, data, updates, expected, writer)
        got = self.outcome(lambda: self.container.append(name, data, updates, expected, writer))
        assert got == want

    @rule(name=st.sampled_from(NAMES),
          blocks=st.lists(st.binary(min_size=1, max_size=30), min_size=2, max_size=12),
          conditional=st.booleans())
    def pipelined_appends(self, name: str, blocks: list[bytes], conditional: bool) -> None:
        calls = []
        wants = []
        for block in blocks:
            seg = self.model.get(name)
            expected = (len(seg.data) if seg is not None else 0) if conditional else None
            wants.append(self.model_append(name, block, [], expected, None))
            calls.append((block, expected))

        async def pipelined() -> list[Any]:
            futures = [self.container.append(name, block, expected_offset=expected)
                       for block, expected in calls]
            return [await settle(f) for f in reversed(futures)][::-1]
        assert self.run(pipelined()) == wants

    @rule(name=st.sampled_from(NAMES), skip=st.integers(0, 3))
    def seal(self, name: str, skip: int) -> None:
        if skip:  # seals and deletes are rarer than the rest, so segments live on
            return
        got = self.outcome(lambda: self.container.seal(name))
        seg = self.model.get(name)
        if seg is None:
            assert got is SegmentNotFoundError
        elif seg.sealed:
            assert got is SegmentSealedError
        else:
            assert got == len(seg.data)
            seg.sealed = True

    @rule(name=st.sampled_from(NAMES), where=st.floats(0, 1.2))
    def truncate(self, name: str, where: float) -> None:
        seg = self.model.get(name)
        offset = int(where * len(seg.data)) if seg is not None else 0
        got = self.outcome(lambda: self.container.truncate(name, offset))
        if seg is None:
            assert got is SegmentNotFoundError
        elif offset > len(seg.data):
            assert got is BadOffsetError
        else:
            assert got is None
            seg.start = max(seg.start, offset)

    @rule(name=st.sampled_from(NAMES), skip=st.integers(0, 3))
    def delete(self, name: str, skip: int) -> None:
        if skip:
            return
        got = self.outcome(lambda: self.container.delete(name))
        if name not in self.model:
            assert got is SegmentNotFoundError
        else:
            assert got is None
            del self.model[name]

    @rule(into=st.sampled_from(NAMES), source=st.sampled_from(NAMES))
    def merge(self, into: str, source: str) -> None:
        got = self.outcome(lambda: self.container.merge(into, source))
        t, src = self.model.get(into), self.model.get(source)
        if t is None:
            assert got is SegmentNotFoundError
        elif t.sealed:
            assert got is SegmentSealedError
        elif src is None:
            assert got is SegmentNotFoundError
        elif src is t:
            assert got is SegmentStoreError
        elif src.start:
            assert got is SegmentTruncatedError
        else:
            t.data += src.data
            del self.model[source]
            assert got == MergeResult(len(t.data))

    @rule(name=st.sampled_from(NAMES), updates=updates_st)
    def update_attributes(self, name: str, updates: list[AttributeUpdate]) -> None:
        got = self.outcome(lambda: self.container.update_attributes(name, updates))
        seg = self.model.get(name)
        if seg is None:
            assert got is SegmentNotFoundError
        elif seg.sealed:
            assert got is SegmentSealedError
        else:
            attrs = model_updates(seg.attrs, updates)
            if attrs is None:
                assert got is BadAttributeUpdateError
            else:
                assert got is None
                seg.attrs = attrs

    @rule(name=st.sampled_from(NAMES), at=st.floats(0, 1), size=st.integers(0, 50))
    def read(self, name: str, at: float, size: int) -> None:
        seg = self.model.get(name)
        if seg is None:
            assert self.outcome(lambda: self.container.read(name, 0, 1)) is SegmentNotFoundError
            return
        offset = int(at * len(seg.data))
        got = self.outcome(lambda: self.container.read(name, offset, size))
        if offset < seg.start:
            assert got is SegmentTruncatedError
        else:
            assert got.data == bytes(seg.data[offset:offset + size])
            assert got.at_tail == (offset + len(got.data) == len(seg.data))

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.run(self.container.close())
        # not clean: the old instance is just abandoned; the new one fences it
        old = self.container
        self.container = self.run(SegmentContainer.open(0, self.logs.open("c"), self.config,
                                                        clock=self.clock))
        if not clean:
            self.run(old.close())

    @invariant()
    def table_matches_the_model(self) -> None:
        got = self.run(self.container.tables.get(TABLE, TABLE_KEYS))
        assert {e.key: (e.version, e.value) for e in got if e is not None} == self.table
        delta = self.run(self.container.tables.read_delta(TABLE, 0, 100))
        assert [(e.key, e.version) for e in delta.entries] == \
            sorted(((k, v[0]) for k, v in self.table.items()), key=lambda kv: kv[1])
        assert delta.last_position == self.table_length

    @invariant()
    def matches_the_model(self) -> None:
        committed = self.container.committed
        assert sorted(committed.by_name) == sorted([*self.model, TABLE])
        for name, seg in self.model.items():
            info = self.run(self.container.get_info(name))
            assert (info.length, info.start_offset, info.sealed, info.attributes) == \
                (len(seg.data), seg.start, seg.sealed, seg.attrs)
            got = self.run(self.container.read(name, seg.start, 1 << 20))
            assert got.data == bytes(seg.data[seg.start:])


TestContainerModel = ContainerMachine.TestCase
TestContainerModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
