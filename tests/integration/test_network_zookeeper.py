"""ZooKeeper losing its quorum under a running cluster (``tests.support.netcluster``
with a three-member ensemble and three bookies): two members die while a ledger writer
(a new ledger every 40 entries) and the stream writers go on.  No new
ledger and no ownership change happen until they are back, no acknowledged
data is lost (each round's history is checked), and service resumes by
itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.netcluster import NetCluster, NetClusterSpec
from tests.support.netrounds import assert_clean, started_cluster, zookeeper_quorum_loss


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    with started_cluster(tmp_path_factory.mktemp("net-zookeeper"),
                         NetClusterSpec(zookeepers=3, bookies=3)) as started:
        yield started


@pytest.mark.parametrize("seed", [31])
def test_quorum_loss_stops_metadata_changes_loses_nothing_and_heals(
        cluster: NetCluster, tmp_path: Path, seed: int) -> None:
    result = zookeeper_quorum_loss(cluster, seed, tmp_path)
    assert_clean(result)
    facts = result.facts
    # no ledger created or closed without a quorum: the writer's next one waited for it
    assert facts["metadata_changed_during_fault"] == [], facts
    assert facts["metadata_ops_held"] >= 1, facts
    assert facts["assignment_kept"], "containers moved"
    assert facts["resumed"] == {"ledger.create": True, "event.write": True}, facts
