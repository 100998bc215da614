"""The controller's records and rules (sans-IO): scaling keeps the key space
covered, successors and stream cuts follow the epochs, records round-trip."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quire.controller.cuts import check_cut
from quire.controller.model import (
    RetentionType,
    StreamConfig,
    StreamRecord,
    TxnRecord,
    TxnState,
    segment_id,
    txn_epoch,
    txn_id_of,
    txn_id_parts,
    txn_segment_name,
)
from quire.controller.records import (
    stream_from_json,
    stream_to_json,
    txn_from_json,
    txn_to_json,
)
from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerPreconditionError,
)
from quire.segmentstore.names import check_name


def covers_key_space(record: StreamRecord) -> bool:
    segments = record.current.segments
    return (segments[0].min_key == 0.0 and segments[-1].max_key == 1.0
            and all(a.max_key == b.min_key for a, b in itertools.pairwise(segments)))


@st.composite
def scaled_streams(draw: st.DrawFn) -> StreamRecord:
    """A stream of 1-5 segments after 0-8 random scales, each sealing a run
    of neighbouring segments and splitting their keys at random points."""
    record = StreamRecord.new(StreamConfig(draw(st.integers(1, 5))), 0)
    for step in range(draw(st.integers(0, 8))):
        active = record.current.segments
        first = draw(st.integers(0, len(active) - 1))
        last = draw(st.integers(first, min(first + 2, len(active) - 1)))
        start, end = active[first].min_key, active[last].max_key
        cuts = sorted(set(draw(st.lists(st.floats(start, end), max_size=3))) - {start, end})
        bounds = [start, *cuts, end]
        scale = record.plan_scale([s.id for s in active[first:last + 1]],
                                  list(itertools.pairwise(bounds)), step + 1)
        record.apply_scale(scale)
    return record


@settings(max_examples=150, deadline=None)
@given(scaled_streams())
def test_scales_keep_the_key_space_covered_and_successors_follow(record: StreamRecord) -> None:
    assert covers_key_space(record)
    assert all(e.epoch == i for i, e in enumerate(record.epochs))
    every = record.all_segments()
    current = record.current.ids()
    for sid, segment in every.items():
        assert record.find(sid) == segment
        successors = record.successors(sid)
        if sid in current:
            assert successors == []
            continue
        # its successors cover its keys, and each names it as a predecessor
        assert successors
        assert min(s.min_key for s, _ in successors) <= segment.min_key
        assert max(s.max_key for s, _ in successors) >= segment.max_key
        assert all(sid in preds for _, preds in successors)
    # the current epoch as a stream cut: everything sealed is before it
    assert check_cut(record, {sid: 0 for sid in current}) == sorted(set(every) - current)
    again = stream_from_json(stream_to_json(record))
    assert again == record


def test_new_streams_split_the_keys_evenly_and_end_at_one() -> None:
    record = StreamRecord.new(StreamConfig(3), 7)
    assert [(s.id, s.min_key, s.max_key) for s in record.current.segments] == \
        [(0, 0.0, 1 / 3), (1, 1 / 3, 2 / 3), (2, 2 / 3, 1.0)]
    with pytest.raises(ControllerInvalidArgumentError):
        StreamConfig(0)


def test_scale_refusals() -> None:
    record = StreamRecord.new(StreamConfig(2), 0)
    with pytest.raises(ControllerInvalidArgumentError):
        record.plan_scale([0], [(0.0, 0.0)], 1)  # empty range
    with pytest.raises(ControllerInvalidArgumentError):
        record.plan_scale([0], [(-0.1, 0.5)], 1)
    with pytest.raises(ControllerInvalidArgumentError):
        record.plan_scale([0, 0], [(0.0, 0.5)], 1)
    with pytest.raises(ControllerPreconditionError):
        record.plan_scale([5], [(0.0, 0.5)], 1)  # not active
    with pytest.raises(ControllerPreconditionError):
        record.plan_scale([0], [(0.0, 0.4)], 1)  # a gap
    with pytest.raises(ControllerPreconditionError):
        record.plan_scale([0], [(0.0, 0.3), (0.2, 0.5)], 1)  # an overlap
    scale = record.plan_scale([0, 1], [(0.0, 1.0)], 1)
    assert [s.id for s in scale.created] == [segment_id(1, 2)]



def test_a_plan_never_replaces_a_pending_scale_or_roll() -> None:
    """While a scale or a roll is written down, planning another is a
    concurrent update (the workflow, retried, finishes the pending one
    first): two controllers' commits once replaced each other's roll, and
    the stream stuck (the stream simulation, seed 102487)."""
    record = StreamRecord.new(StreamConfig(2), 0)
    first = TxnRecord(txn_id_of(0, 1), (0, 1), TxnState.COMMITTING, 0)
    second = TxnRecord(txn_id_of(0, 2), (0, 1), TxnState.COMMITTING, 0)
    record.apply_scale(record.plan_scale([0, 1], [(0.0, 1.0)], 1))
    record.roll = record.plan_roll(first, 2)
    with pytest.raises(ControllerConcurrentUpdateError):
        record.plan_roll(second, 3)
    with pytest.raises(ControllerConcurrentUpdateError):
        record.plan_scale([segment_id(1, 2)], [(0.0, 0.5), (0.5, 1.0)], 3)
    assert record.roll.txn_id == first.txn_id
    record.apply_roll(record.roll, 0)
    record.roll = record.plan_roll(second, 4)  # idle again: the next one is planned
    record.apply_roll(record.roll, 0)
    record.scale = record.plan_scale([s.id for s in record.current.segments], [(0.0, 1.0)], 5)
    with pytest.raises(ControllerConcurrentUpdateError):
        record.plan_roll(second, 6)


def test_transaction_ids_and_names() -> None:
    txn_id = (3 << 96) | ((1 << 63) - 1)
    high, low = txn_id_parts(txn_id)
    assert (high, low) == (3 << 32, (1 << 63) - 1) and txn_id_of(high, low) == txn_id
    assert txn_epoch(txn_id) == 3
    assert txn_id_of(-1, -1) == (1 << 128) - 1 and txn_id_parts((1 << 128) - 1) == (-1, -1)
    assert txn_segment_name("sc", "st", segment_id(3, 7), txn_id) == \
        "sc/st/7.#epoch.3#transaction.00000003000000007fffffffffffffff"
    record = TxnRecord(txn_id, (1, 2), TxnState.COMMITTING, 99, 0)
    assert txn_from_json(txn_to_json(record)) == record


def test_names() -> None:
    for good in ("a", "A-b.c", ".", "..", "0" * 255):  # Pravega's rule (test_naming_rule.py)
        check_name("scope", good)
    for bad in ("", "_sys", "a_b", "a/b", "a b", "0" * 256, "é"):
        with pytest.raises(ControllerInvalidArgumentError):
            check_name("scope", bad)
    assert StreamConfig(1, RetentionType.SIZE, 10).retention is RetentionType.SIZE
