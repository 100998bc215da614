"""BP-46 soak: the ``kill -9`` loop of tests/integration/test_bp46_kill_loop.py
for many cycles.

Four real bookies (``journal_write_data = false``, ``data_integrity_checking
= true``, a checkpoint every ``--flush-interval-ms``), a writer appending pipelined E3 W3 A2
entries without pause to one ledger after another, a second client fencing
the writer's current ledger now and then (recovery); each cycle kills one
bookie with ``kill -9``, drops everything it never fsynced (power-loss
emulation), starts it again and waits until its phase two has cleared its
limbo before the next cycle.  At the end every ledger is recovered and read
back: every acknowledged entry must be there, byte for byte, and no ledger
may be closed below an acknowledged entry.  Prints a line per cycle and a
summary (``losses`` must be 0; the exit status is 1 otherwise).

    .venv/bin/python benchmarks/soak_bp46.py [--cycles 100] [--journal] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from tests.support.kill_loop import (
    CycleReport,
    KillLoopParams,
    KillLoopReport,
    kill_loop_cluster,
    run_kill_loop,
)


async def soak(root: Path, params: KillLoopParams, progress: bool) -> KillLoopReport:
    cluster = kill_loop_cluster(root / "cluster", params).start()

    def on_cycle(cycle: CycleReport) -> None:
        if progress:
            print(f"cycle {cycle.cycle}/{params.cycles}: killed {cycle.bookie}, "
                  f"{cycle.entries_copied:,} entries copied back; "
                  f"{cycle.entries_acknowledged:,} acknowledged in {cycle.ledgers} ledgers, "
                  f"{cycle.recoveries} recoveries so far ({cycle.seconds:.1f} s)",
                  file=sys.stderr, flush=True)

    try:
        return await run_kill_loop(cluster, params, on_cycle)
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--journal", action="store_true",
                        help="journal_write_data = true (the journal-on baseline)")
    parser.add_argument("--entries-per-cycle", type=int, default=3000)
    parser.add_argument("--max-entries-per-s", type=int, default=3000)
    parser.add_argument("--flush-interval-ms", type=int, default=2000,
                        help="the bookies' checkpoint interval: what a power loss costs")
    parser.add_argument("--quiet", action="store_true", help="no line per cycle")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    params = KillLoopParams(cycles=args.cycles, journal_write_data=args.journal,
                            entries_per_cycle=args.entries_per_cycle,
                            max_entries_per_s=args.max_entries_per_s,
                            flush_interval_ms=args.flush_interval_ms,
                            cycle_timeout_s=300.0)
    with tempfile.TemporaryDirectory(prefix="quire-soak-") as tmp:
        report = uvloop.run(soak(Path(tmp), params, not args.quiet))
    result = {"journal_write_data": args.journal, **report.as_dict()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['cycles']} cycles in {result['seconds']} s (journal "
              f"{'on' if args.journal else 'off'}, protection on): "
              f"{result['entries_acknowledged']:,} entries acknowledged in "
              f"{result['ledgers']} ledgers, {result['recoveries']} recoveries; "
              f"{result['entries_copied']:,} copied back by phase two; "
              f"{result['entries_verified']:,} verified; losses: {result['losses']}")
        for detail in result["loss_details"]:
            print(f"  {detail}")
    sys.exit(1 if report.losses else 0)


if __name__ == "__main__":
    main()
