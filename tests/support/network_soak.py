"""Random seeded fault rounds on one cluster until the time is up:
``python -m tests.support.network_soak --minutes N [--first-seed S]``
(``scripts/soak-network``).  One cluster (a three-member ZooKeeper
ensemble, five bookies on small file systems, two segment stores, the
controller, S3) serves every kind of round of
:mod:`tests.support.netrounds` but the planted bug's; each round's report is
printed, every anomaly and client error is collected, and the status is 1
if there was any.  Histories stay in the run's directory."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.support.netcluster import NetCluster, NetClusterSpec
from tests.support.netrounds import ROUNDS, RoundResult, settled

KINDS = sorted(k for k in ROUNDS if k != "planted-fencing-off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--first-seed", type=int, default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="quire-soak-network-"))
    seed = args.first_seed if args.first_seed is not None else random.randrange(10**6)
    pick = random.Random(seed)
    failed: list[RoundResult] = []
    rounds = 0
    print(f"soak-network: histories in {root}, first seed {seed}", flush=True)
    with NetCluster(root / "cluster", NetClusterSpec(zookeepers=3, bookie_disk_mib=32)) \
            as cluster:
        end = time.monotonic() + args.minutes * 60  # (rounds' time; the start is extra)
        while time.monotonic() < end:
            try:
                settled(cluster)
            except AssertionError as e:  # a round left the cluster broken: stop here
                print(f"soak-network: the cluster did not recover after seed {seed - 1}: {e}",
                      flush=True)
                failed.append(RoundResult("settle", seed - 1, [], [], str(e), 0.0))
                break
            kind = pick.choice(KINDS)
            kwargs = {"probe": True} if kind.startswith("store-") else {}
            try:
                result = ROUNDS[kind](cluster, seed, root / "rounds", **kwargs)
            except AssertionError as e:  # the round could not finish: a liveness failure
                print(f"round {kind} seed {seed}: FAILED TO FINISH: {e}", flush=True)
                failed.append(RoundResult(kind, seed, [], [], str(e), 0.0))
            else:
                print(result.summary(), flush=True)
                if result.anomalies or result.facts.get("client_errors"):
                    failed.append(result)
            rounds += 1
            seed += 1
    print(f"soak-network: {rounds} rounds, {len(failed)} with anomalies", flush=True)
    for result in failed:
        print(f"  {result.name} seed {result.seed}: {len(result.anomalies)} anomalies "
              f"{result.facts.get('client_errors') or ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
