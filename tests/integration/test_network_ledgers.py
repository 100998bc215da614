"""Ledgers on a network of hosts (``tests.support.netcluster``: a network
namespace per process, ZooKeeper metadata, five bookies each on a small
file system of its own), under faults between real processes; every round's
history is checked (``quire.testing.history``).

A writer (E3 W3 A2) adds while a reader follows its LastAddConfirmed; a
fault hits one bookie of the ensemble (cut off from the writer by nftables,
cut off from everyone by nftables or by its link going down, its disk
filled) or the writer itself (cut off from
ZooKeeper while another client recovers its ledger); then the reader
recovers the ledger and reads it whole.  The planted-bug round switches
fencing off in every bookie and must be caught."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.netcluster import NetCluster, NetClusterSpec
from tests.support.netrounds import (
    RoundResult,
    assert_clean,
    bookie_cut_off,
    bookie_disk_full,
    recovery_while_fencing_is_off,
    recovery_while_writing,
    started_cluster,
    writer_partitioned_from_bookie,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    spec = NetClusterSpec(segment_stores=0, controller=False, s3=False, bookie_disk_mib=32)
    with started_cluster(tmp_path_factory.mktemp("net-ledgers"), spec) as started:
        yield started


def assert_moved_off(result: RoundResult) -> None:
    """The writer replaced the victim: a later fragment's ensemble lacks it."""
    victim, ensembles = result.facts["victim"], result.facts["ensembles"]
    assert victim in ensembles[0][1] and len(ensembles) >= 2, ensembles
    assert victim not in ensembles[-1][1], ensembles


def test_a_writer_cut_off_from_one_bookie_changes_ensemble_and_loses_nothing(
        cluster: NetCluster, tmp_path: Path) -> None:
    result = writer_partitioned_from_bookie(cluster, 11, tmp_path)
    assert_clean(result)
    assert_moved_off(result)


def test_a_bookie_whose_disk_fills_turns_read_only_and_the_writer_moves_on(
        cluster: NetCluster, tmp_path: Path) -> None:
    result = bookie_disk_full(cluster, 13, tmp_path)
    assert_clean(result)
    assert_moved_off(result)
    assert "turning read-only" in cluster.service(result.facts["victim"]).log()


@pytest.mark.parametrize("seed", [12, 17])  # its link down; isolated by nftables
def test_a_bookie_cut_off_from_everyone_is_replaced(cluster: NetCluster, tmp_path: Path,
                                                    seed: int) -> None:
    result = bookie_cut_off(cluster, seed, tmp_path)
    assert_clean(result)
    assert_moved_off(result)


def test_recovery_fences_a_writer_cut_off_from_zookeeper(cluster: NetCluster,
                                                         tmp_path: Path) -> None:
    result = recovery_while_writing(cluster, 15, tmp_path)
    assert_clean(result)
    closes = [o for o in result.ops if o.f == "ledger.close"]
    assert [o.outcome for o in closes] == ["unknown"], closes  # fenced: the recoverer's end


def test_the_checker_catches_fencing_switched_off(cluster: NetCluster, tmp_path: Path) -> None:
    """The same round with every bookie's fencing off (``quire.testing.planted``):
    the old writer keeps being acknowledged past the recovered close."""
    result = recovery_while_fencing_is_off(cluster, 16, tmp_path)
    kinds = {a.kind for a in result.anomalies}
    assert "closed below an acknowledged entry" in kinds, result.summary()
