"""Crash chaos over tier-2 (``tests/support/tier2_chaos.py``): the process
owning a container (3 real bookie processes, a ``file://`` tier-2, small
flush thresholds, 200 user segments with attributes, tables, system
segments, transactions merged, seals, truncates, deletes) is killed with
``kill -9`` at hypothesis-drawn points: after n acknowledgements, or before
the n-th flush step of a kind.  After each kill PDP-40's check over tier-2
alone finds nothing, and a new owner (fencing the old log, replaying it
over tier-2) shows the model after a prefix of the calls that holds every
acknowledged operation.  Under ``flush_order="unordered"`` the same chaos,
with the owner killed between a metadata flush and the data flush it
depends on, is reported by the check every time.

``QUIRE_TIER2_CHAOS_EXAMPLES=N`` runs N examples; ``benchmarks/soak_tier2_chaos.py``
runs many kills.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.cluster import Cluster
from tests.support.tier2_chaos import CHAOS_CONFIG, Chaos, KillPoint

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


@pytest.mark.timeout(240 + 120 * EXAMPLES)
@settings(max_examples=EXAMPLES or 2, deadline=None, database=None, print_blob=True,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1),
       kills=st.lists(kill_points, min_size=KILLS_PER_EXAMPLE, max_size=KILLS_PER_EXAMPLE))
def test_pdp40_owner_killed_under_heavy_flushing_leaves_tier2_consistent_and_loses_no_ack(
        bookies: Cluster, tmp_path_factory: pytest.TempPathFactory, seed: int,
        kills: list[KillPoint]) -> None:
    chaos = Chaos(bookies.metadata_uri, tmp_path_factory.mktemp("tier2"), seed)
    for kill in kills:
        report = chaos.round(kill)
        assert report.violations == [], (seed, kill, report.killed_at, report.violations)
        assert report.acked > 0 or kill.kind != "acks"
    chaos.finish()
    assert len(set(chaos.epochs)) == KILLS_PER_EXAMPLE + 1  # each owner fenced the last


@pytest.mark.timeout(240)
def test_unordered_owner_killed_between_metadata_and_data_flush_is_reported(
        bookies: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    caught = 0
    for seed in range(3):
        chaos = Chaos(bookies.metadata_uri, tmp_path_factory.mktemp("tier2-unordered"), seed,
                      config={**CHAOS_CONFIG, "flush_order": "unordered",
                              "unordered_seed": seed}, ops_per_round=3000)
        report = chaos.round(KillPoint("gap"))
        assert report.killed_at.startswith("data:"), "the window never came up"
        assert any(v.segment == report.killed_at[5:] + "$attributes"
                   and v.recorded_offset > v.guaranteed_length
                   for v in report.violations), (seed, report.killed_at, report.violations)
        caught += 1
    assert caught == 3
