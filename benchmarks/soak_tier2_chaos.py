"""Tier-2 crash chaos soak: the chaos of
tests/integration/test_segmentstore_tier2_chaos.py for many kills.

Three real bookie processes; containers (a fresh tier-1 log and tier-2 each:
a ``file://`` directory, or with ``--tier2 s3`` a prefix of a bucket on a moto
server process the script starts, ``--kills-per-container`` kills each) whose owner process runs
the workload of ``tests/support/tier2_workload.py`` (200 user segments with
attributes, tables, system segments, transactions merged, seals,
truncates, deletes; small flush thresholds) and is killed with ``kill -9``
at random points: after n acknowledgements, or before the n-th flush step
of a kind.  After each kill, PDP-40's check over tier-2 alone must find
nothing, disaster recovery from a copy of tier-2 alone onto fresh tier-1
logs must bring back every recorded segment with its bytes
(``--recover-every``), and the next owner must show every acknowledged
operation.  Then
the same with ``flush_order="unordered"`` (a
:class:`~quire.testing.chaos_writer.ChaosStorageWriter` breaking PDP-40's
order): ``--unordered-kills`` kills at
random points (how many the check reports is printed) and as many in the
window between a metadata flush and the data flush it depends on (each
must be reported).  Exit status 1 on any failure.

    .venv/bin/python benchmarks/soak_tier2_chaos.py [--kills 60] [--seed 1] [--tier2 s3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tests.support.cluster import Cluster
from tests.support.s3_server import CREDENTIALS, MotoS3Server
from tests.support.tier2_chaos import (
    CHAOS_CONFIG,
    Chaos,
    KillPoint,
    file_tier2,
    recover_and_compare,
)

STEP_KINDS = ["data:", "index:", "attributes:", "metadata", ""]


def draw(rng: random.Random) -> KillPoint:
    if rng.random() < 0.5:
        return KillPoint("acks", rng.randint(1, 1400))
    return KillPoint("step", rng.randint(1, 150), rng.choice(STEP_KINDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--kills-per-container", type=int, default=10)
    parser.add_argument("--unordered-kills", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--recover-every", type=int, default=1,
                        help="disaster recovery from tier-2 after every N-th kill (0: never)")
    parser.add_argument("--tier2", choices=["file", "s3"], default="file",
                        help="tier-2 driver (s3: a moto server process started here)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    console = Console(stderr=True)
    failures: list[str] = []
    rounds: list[dict[str, Any]] = []
    unordered: list[dict[str, Any]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-tier2-chaos-") as tmp, \
            contextlib.ExitStack() as stack:
        root = Path(tmp)
        if args.tier2 == "s3":
            moto = MotoS3Server()
            moto.start()
            stack.callback(moto.stop)
            os.environ.update(CREDENTIALS)  # the owner processes inherit them
            endpoint = moto.create_bucket("soak-tier2-chaos")

            def tier2(name: str) -> str:
                return endpoint.uri(name)
        else:
            def tier2(name: str) -> str:
                return file_tier2(root / name)
        cluster = Cluster(root / "cluster", 3).start()
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                          console=console) as progress:
                task = progress.add_task("pdp40 kills", total=args.kills)
                chaos: Chaos | None = None
                for k in range(args.kills):
                    if chaos is None or k % args.kills_per_container == 0:
                        if chaos is not None:
                            chaos.finish()
                        chaos = Chaos(cluster.metadata_uri, tier2(f"tier2-{k}"),
                                      rng.randrange(1 << 32))
                    kill = draw(rng)
                    try:
                        report = chaos.round(kill)
                    except AssertionError as e:
                        failures.append(f"kill {k}: {e}")
                        chaos = None
                        progress.advance(task)
                        continue
                    recovered = None
                    if args.recover_every and (k + 1) % args.recover_every == 0 \
                            and not report.violations:
                        try:
                            recovered = asyncio.run(recover_and_compare(
                                cluster.metadata_uri, chaos.tier2_uri, chaos.model))
                        except AssertionError as e:
                            failures.append(f"kill {k}: recovery: {e}")
                    rounds.append({"kill": f"{kill.kind}:{kill.match}{kill.n}",
                                   "recovered_segments": recovered.segments if recovered else None,
                                   "recovered_bytes": recovered.bytes if recovered else None,
                                   "recovery_s": round(recovered.seconds, 2) if recovered
                                   else None,
                                   "killed_at": report.killed_at.split(":")[0],
                                   "acked": report.acked, "landed": report.landed,
                                   "violations": len(report.violations),
                                   "seconds": round(report.seconds, 2)})
                    if report.violations:
                        failures.append(f"kill {k} ({kill}, before {report.killed_at!r}): "
                                        f"{[str(v) for v in report.violations[:3]]}")
                    progress.console.print(
                        f"kill {k + 1}/{args.kills} ({kill.kind} {kill.match}{kill.n}): "
                        f"before {report.killed_at or 'an answer'}, {report.acked} acks, "
                        f"{report.landed} unanswered landed, {len(report.violations)} "
                        f"violations, {report.seconds:.1f} s"
                        + (f"; recovered {recovered.segments} segments, "
                           f"{recovered.bytes:,} B in {recovered.seconds:.1f} s"
                           if recovered else ""))
                    progress.update(task, advance=1, description=(
                        f"pdp40 kills ({sum(r['acked'] for r in rounds):,} acks, "
                        f"{len(failures)} failures)"))
                if chaos is not None:
                    try:
                        chaos.finish()
                    except AssertionError as e:
                        failures.append(f"final owner: {e}")
                task = progress.add_task("unordered kills", total=2 * args.unordered_kills)
                for k in range(2 * args.unordered_kills):
                    gap = k % 2 == 1
                    seed = rng.randrange(1 << 32)
                    chaos = Chaos(cluster.metadata_uri, tier2(f"unordered-{k}"), seed,
                                  config={**CHAOS_CONFIG, "flush_order": "unordered",
                                          "unordered_seed": seed}, ops_per_round=3000)
                    kill = KillPoint("gap") if gap else draw(rng)
                    report = chaos.round(kill)
                    progress.console.print(
                        f"unordered kill {k + 1} ({kill.kind} {kill.match}{kill.n}): before "
                        f"{report.killed_at or 'an answer'}, {len(report.violations)} violations")
                    unordered.append({"kill": f"{kill.kind}:{kill.match}{kill.n}",
                                      "killed_at": report.killed_at,
                                      "violations": len(report.violations)})
                    if gap and not (report.killed_at and report.violations):
                        failures.append(f"unordered gap kill {k} (seed {seed}) at "
                                        f"{report.killed_at!r}: not reported")
                    progress.advance(task)
        finally:
            cluster.close()
    by_kind = collections.Counter(r["killed_at"] or "from outside" for r in rounds)
    summary = {
        "kills": len(rounds), "failures": failures,
        "killed_before_step": dict(by_kind),
        "acked": sum(r["acked"] for r in rounds),
        "landed_unacknowledged": sum(r["landed"] for r in rounds),
        "violations": sum(r["violations"] for r in rounds),
        "recoveries": sum(1 for r in rounds if r["recovered_segments"] is not None),
        "recovered_segments": sum(r["recovered_segments"] or 0 for r in rounds),
        "recovered_bytes": sum(r["recovered_bytes"] or 0 for r in rounds),
        "median_round_s": sorted(r["seconds"] for r in rounds)[len(rounds) // 2] if rounds
        else 0,
        "unordered_random_kills_reported": sum(1 for u in unordered[0::2] if u["violations"]),
        "unordered_random_kills": len(unordered[0::2]),
        "unordered_gap_kills_reported": sum(1 for u in unordered[1::2] if u["violations"]),
        "unordered_gap_kills": len(unordered[1::2]),
        "tier2": args.tier2,
        "seconds": round(time.monotonic() - began, 1),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['kills']} kills of a pdp40 owner ({summary['killed_before_step']}): "
              f"{summary['acked']:,} operations acknowledged, all kept; "
              f"{summary['landed_unacknowledged']} unanswered ones landed; "
              f"{summary['violations']} violations; median round {summary['median_round_s']} s")
        print(f"{summary['recoveries']} disaster recoveries from tier-2 alone: "
              f"{summary['recovered_segments']:,} recorded segments, "
              f"{summary['recovered_bytes']:,} B, all back with their bytes")
        print(f"unordered: random kills reported {summary['unordered_random_kills_reported']}"
              f"/{summary['unordered_random_kills']}, kills in the metadata/data window "
              f"reported {summary['unordered_gap_kills_reported']}"
              f"/{summary['unordered_gap_kills']}")
        print(f"{len(failures)} failures in {summary['seconds']} s")
        for failure in failures:
            print("FAILURE:", failure[:2000])
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
