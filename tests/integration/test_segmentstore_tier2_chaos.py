"""Crash chaos over tier-2 (``tests/support/tier2_chaos.py``): the process
owning a container (3 real bookie processes, a ``file://`` tier-2 or an
``s3://`` one on a moto server process, small
flush thresholds, 200 user segments with attributes, tables, system
segments, transactions merged, seals, truncates, deletes) is killed with
``kill -9`` at hypothesis-drawn points: after n acknowledgements, or before
the n-th flush step of a kind.  After each kill PDP-40's check over tier-2
alone finds nothing, and a new owner (fencing the old log, replaying it
over tier-2) shows the model after a prefix of the calls that holds every
acknowledged operation; after the last kill, disaster recovery from (a
copy of) tier-2 alone brings back every recorded segment with its bytes.
The same on the S3 driver (fewer operations a round, 2-3 kills).
Under ``flush_order="unordered"`` (the owner's writer a
:class:`~quire.testing.chaos_writer.ChaosStorageWriter` with PDP-40's order
broken) the same chaos, with the owner killed between a metadata flush and the data flush it
depends on, is reported by the check every time.

``QUIRE_TIER2_CHAOS_EXAMPLES=N`` runs N examples; ``benchmarks/soak_tier2_chaos.py``
runs many kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import read_journal, read_storage_metadata
from quire.tier2 import open_chunk_storage, parse_chunk_name
from tests.support.cluster import Cluster
from tests.support.s3_server import S3Endpoint
from tests.support.tier2_chaos import (
    CHAOS_CONFIG,
    Chaos,
    ChaosOwner,
    KillPoint,
    file_tier2,
    recover_and_compare,
    remove_tier2,
)
from tests.support.tier2_workload import generate

EXAMPLES = int(os.environ.get("QUIRE_TIER2_CHAOS_EXAMPLES", "0"))
KILLS_PER_EXAMPLE = 3


@pytest.fixture(scope="module")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster(tmp_path_factory.mktemp("tier2-chaos"), 3).start()
    yield started
    started.close()


kill_points = st.one_of(
    st.builds(KillPoint, st.just("acks"), st.integers(1, 1400)),
    st.builds(KillPoint, st.just("step"), st.integers(1, 150),
              st.sampled_from(["data:", "index:", "attributes:", "metadata", ""])))


def _pdp40_chaos(bookies: Cluster, tier2_uri: str, seed: int, kills: list[KillPoint],
                 ops_per_round: int = 1500, segments: int = CHAOS_CONFIG["segments"]) -> None:
    """The kills, each followed by a clean check and a new owner showing every
    acknowledged operation; then disaster recovery from (a copy of) tier-2
    alone onto fresh tier-1 logs brings back every recorded segment with its
    bytes; then a last owner."""
    chaos = Chaos(bookies.metadata_uri, tier2_uri, seed, ops_per_round=ops_per_round,
                  config={**CHAOS_CONFIG, "segments": segments})
    for kill in kills:
        report = chaos.round(kill)
        assert report.violations == [], (seed, kill, report.killed_at, report.violations)
        assert report.acked > 0 or kill.kind != "acks"
    recovered = asyncio.run(recover_and_compare(bookies.metadata_uri, chaos.tier2_uri,
                                                chaos.model))
    assert recovered.segments > 0 and recovered.compared_with_model > 0
    chaos.finish()
    assert len(set(chaos.epochs)) == len(kills) + 1  # each owner fenced the last


@pytest.mark.timeout(240 + 120 * EXAMPLES)
@settings(max_examples=EXAMPLES or 2, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1),
       kills=st.lists(kill_points, min_size=KILLS_PER_EXAMPLE - 1,
                      max_size=KILLS_PER_EXAMPLE - 1),
       last_metadata_step=st.integers(8, 25))
def test_pdp40_owner_killed_under_heavy_flushing_leaves_tier2_consistent_and_loses_no_ack(
        bookies: Cluster, tmp_path_factory: pytest.TempPathFactory, seed: int,
        kills: list[KillPoint], last_metadata_step: int) -> None:
    """The last kill comes before the metadata flush of a later iteration of
    its round, so that tier-2 surely records user segments for the recovery
    to bring back (drawn kills alone may all come before the first one)."""
    _pdp40_chaos(bookies, file_tier2(tmp_path_factory.mktemp("tier2")), seed,
                 [*kills, KillPoint("step", last_metadata_step, "metadata")])


S3_OPS_PER_ROUND = 600
s3_kill_points = st.one_of(
    st.builds(KillPoint, st.just("acks"), st.integers(1, S3_OPS_PER_ROUND - 50)),
    st.builds(KillPoint, st.just("step"), st.integers(1, 60),
              st.sampled_from(["data:", "index:", "attributes:", "metadata", ""])))


@pytest.mark.timeout(180 + 90 * EXAMPLES)
@settings(max_examples=EXAMPLES or 2, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), kills=st.lists(s3_kill_points, min_size=1, max_size=2),
       last_metadata_step=st.integers(8, 25))
def test_pdp40_owner_killed_under_heavy_flushing_to_s3_leaves_tier2_consistent_and_loses_no_ack(
        bookies: Cluster, s3_endpoint: S3Endpoint, seed: int, kills: list[KillPoint],
        last_metadata_step: int) -> None:
    """The chaos above with an ``s3://`` tier-2 on the moto server process
    (100 user segments and fewer operations a round: moto answers each
    request in milliseconds): two or three kills, the last one before the
    metadata flush of the 8th to 25th iteration of its round (so that tier-2 surely records user
    segments for the recovery to bring back, which it does from a
    server-side copy of the prefix, see ``tier2_copy``)."""
    uri = s3_endpoint.uri(f"chaos-{uuid.uuid4().hex[:12]}")
    try:
        _pdp40_chaos(bookies, uri, seed,
                     [*kills, KillPoint("step", last_metadata_step, "metadata")],
                     ops_per_round=S3_OPS_PER_ROUND, segments=100)
    finally:
        asyncio.run(remove_tier2(uri))


@pytest.mark.timeout(240)
def test_unordered_owner_killed_between_metadata_and_data_flush_is_reported(
        bookies: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    caught = 0
    for seed in range(2):
        tier2 = file_tier2(tmp_path_factory.mktemp("tier2-unordered"))
        chaos = Chaos(bookies.metadata_uri, tier2, seed,
                      config={**CHAOS_CONFIG, "flush_order": "unordered",
                              "unordered_seed": seed}, ops_per_round=3000)
        report = chaos.round(KillPoint("gap"))
        assert report.killed_at.startswith("data:"), "the window never came up"
        assert any(v.segment == report.killed_at[5:] + "$attributes"
                   and v.recorded_offset > v.guaranteed_length
                   for v in report.violations), (seed, report.killed_at, report.violations)
        caught += 1
    assert caught == 2


def _acks(lines: list[dict[str, Any]]) -> list[int]:
    return [got["ack"] for got in lines if "ack" in got]


def _available(owner: ChaosOwner, wait_s: float = 0.5) -> list[dict[str, Any]]:
    """The lines the owner printed (waiting up to ``wait_s`` for each next one)."""
    lines, owner.events = owner.events, []
    while (got := owner.line(time.monotonic() + wait_s, quiet=True)):
        lines.append(got)
    return lines


def _chunks(uri: str) -> set[str]:
    async def listed() -> set[str]:
        storage = await open_chunk_storage(uri)
        try:
            return {info.name for info in await storage.list_chunks("")}
        finally:
            await storage.close()
    return asyncio.run(listed())


def _recorded(uri: str) -> tuple[set[str], int]:
    """The chunks tier-2's records name, and the epoch of its journal."""
    async def read() -> tuple[set[str], int]:
        storage = await open_chunk_storage(uri)
        try:
            layouts = await read_storage_metadata(storage, 0)
            journal = await read_journal(storage, 0)
            assert journal is not None
            return {c.name for layout in layouts.values() for c in layout.chunks}, journal.epoch
        finally:
            await storage.close()
    return asyncio.run(read())


@pytest.mark.timeout(240)
def test_a_fenced_owner_paused_across_a_takeover_then_resumed_writes_nothing_harmful(
        bookies: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Owner A runs the workload; its storage writer is held before a data
    flush with bytes to write (so the pause falls inside an iteration) and
    A is stopped with SIGSTOP.  Owner B fences A's log, shows every
    operation A acknowledged, runs more and flushes.  A is resumed with
    SIGCONT and called again: its calls fail with ContainerFencedError,
    none lands; its writer writes its chunks (epoch A's names) and fails on
    tier-1 with ContainerFencedError.  Then: B's state is still the
    model's, tier-2 is consistent, no record names a chunk A wrote after
    the takeover, the journal is B's, and a third owner shows every
    acknowledged operation."""
    chaos = Chaos(bookies.metadata_uri, file_tier2(tmp_path_factory.mktemp("tier2-paused")),
                  11,
                  # A's writer reads what it flushes from memory after the resume
                  config={**CHAOS_CONFIG, "read_index_budget_bytes": 64 << 20})
    chaos.ops = generate(chaos.seed, 3000, chaos.config["segments"])
    a = chaos.owner()
    try:
        chaos.adopt(a.state())
        a.send({"op": "run", "from": 0, "to": 2500, "window": chaos.window,
                "kill": {"kind": "hold"}})
        chaos.sent = 2500
        held = a.expect("held")
        assert held is not None, f"A ended (exit {a.proc.poll()})"
        if not any("done" in got for got in a.events):  # A answers on, its writer held
            assert a.expect("done") is not None
        a.signal(signal.SIGSTOP)
        before = _available(a)
        assert not any("err" in got for got in before), before
        chaos.acked_up_to = max(_acks(before), default=0) + 1
        assert chaos.acked_up_to == 2500
        paused_chunks = _chunks(chaos.tier2_uri)
        epoch_a = a.epoch

        b = chaos.owner()  # fences A's log while A is stopped
        try:
            assert b.epoch > epoch_a
            chaos.adopt(b.state())
            taken_at = chaos.applied
            b.send({"op": "run", "from": taken_at, "to": taken_at + 400, "window": chaos.window})
            done = b.expect("done")
            assert done is not None and not any("err" in got for got in b.events), b.events
            chaos.acked_up_to = chaos.sent = taken_at + 400
            b.events = []
            b.send({"op": "flushed"})
            assert b.expect("flushed") is not None

            a.signal(signal.SIGCONT)
            a.send({"op": "run", "from": 2500, "to": 2600, "window": chaos.window})
            a.send({"op": "release"})
            failed = a.expect("writer_failed")
            assert failed is not None and failed["writer_failed"] == "ContainerFencedError", \
                (failed, a.events)
            after = _available(a)
            a.kill9()
            lines = [*after, *a.events]
            errors = [got["name"] for got in lines if "err" in got]
            assert errors and set(errors) == {"ContainerFencedError"}, errors
            assert not _acks(lines), lines  # nothing A called after the takeover landed
            written_late = {name for name in _chunks(chaos.tier2_uri) - paused_chunks
                            if parse_chunk_name(name)[1] == epoch_a}
            assert written_late, "A's writer wrote nothing after the takeover"

            assert chaos.adopt(b.state()) == 0  # B reads as before
            b.send({"op": "flushed"})
            assert b.expect("flushed") is not None
            b.close_cleanly()
        finally:
            b.close()
    finally:
        a.close()
    assert asyncio.run(check(chaos.tier2_uri)) == []
    recorded, journal_epoch = _recorded(chaos.tier2_uri)
    assert not recorded & written_late
    assert journal_epoch == b.epoch
    assert chaos.finish() == 0
