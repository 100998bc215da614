"""BP-14: PD_JOURNAL against VD_JOURNAL appends on a 3-bookie sandbox, E=W=3 A=2.

Two cases, each for PD then VD back to back, in each of ``--rounds``
(default 3) rounds of one run:

(a) one append in flight at a time, 100-byte entries (the latency-bound case
    BP-14 is for);
(b) 256 outstanding 1 KiB appends.

For each: entries/s, p50/p99 append latency, and journal fsyncs per 1,000
entries (summed over the bookies' /metrics, sync() never called), plus the
disk's raw 4 KiB fsync p50 measured in the same run; the ratios are the
medians of the rounds' VD/PD ratios.  Goals (issue 5):
(a) VD entries/s >= 2.5x PD and VD p99 <= half of PD p99; (b) VD >= 1.2x PD
with at most one fsync per 1,000 VD entries.

    .venv/bin/python benchmarks/vd_vs_pd.py [--seconds 8] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import journal_fsyncs, median_run, raw_fsync
from quire.bench import WriteBenchParams, bench_write
from quire.client import Client
from quire.sandbox import Sandbox
from quire.types import LedgerType

CASES = {"a": {"outstanding": 1, "entry_bytes": 100},
         "b": {"outstanding": 256, "entry_bytes": 1024}}


async def measure(uri: str, metrics: list[str], case: str, ledger_type: LedgerType,
                  seconds: float) -> dict[str, float]:
    client = await Client.connect(uri)
    try:
        params = WriteBenchParams(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                  duration_s=seconds, ledger_type=ledger_type, **CASES[case])
        before = journal_fsyncs(metrics)
        result = await bench_write(client, params)
        fsyncs = journal_fsyncs(metrics) - before
    finally:
        await client.close()
    # bench_write closes its ledger at the end: a VD close syncs (one SYNC per
    # bookie); that fsync is counted, so the figure is an upper bound.
    result["fsyncs_per_1000_entries"] = fsyncs / result["entries"] * 1000
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        root = Path(tmp)
        raw = raw_fsync(root)
        sandbox = Sandbox(root / "sandbox", 3, metrics_port=0)
        sandbox.start()
        try:
            metrics = [b.metrics_address for b in sandbox.bookies if b.metrics_address]
            # PD and VD back to back, every round: this VM's speed drifts over
            # minutes, so each round's VD/PD ratio compares like with like.
            for round_no in range(1, args.rounds + 1):
                for case in CASES:
                    for ledger_type in (LedgerType.PD_JOURNAL, LedgerType.VD_JOURNAL):
                        label = f"{case}-{ledger_type.value}"
                        if not args.json:
                            print(f"round {round_no}/{args.rounds}: ({case}) {ledger_type.value} "
                                  f"for {args.seconds:.0f}s ...", file=sys.stderr, flush=True)
                        runs.setdefault(label, []).append(uvloop.run(measure(
                            sandbox.metadata_uri, metrics, case, ledger_type, args.seconds)))
        finally:
            sandbox.stop()
    results = {label: median_run(rs) for label, rs in runs.items()}
    ratios = {}
    for case in CASES:
        pds, vds = runs[f"{case}-PD_JOURNAL"], runs[f"{case}-VD_JOURNAL"]
        rate = [vd["entries_per_s"] / pd["entries_per_s"] for pd, vd in zip(pds, vds, strict=True)]
        p99 = [vd["p99_ms"] / pd["p99_ms"] if pd["p99_ms"] else 0.0
               for pd, vd in zip(pds, vds, strict=True)]
        ratios[case] = {"vd_over_pd_entries_per_s": statistics.median(rate),
                        "vd_p99_over_pd_p99": statistics.median(p99),
                        "rounds_vd_over_pd_entries_per_s": rate,
                        "rounds_vd_p99_over_pd_p99": p99}
    vd_fsyncs = max(r["fsyncs_per_1000_entries"] for r in runs["b-VD_JOURNAL"])
    if args.json:
        print(json.dumps({"raw_fsync": raw, "rounds": args.rounds, "results": results,
                          "ratios": ratios, "b_vd_fsyncs_per_1000_entries_max": vd_fsyncs}))
        return
    print(f"raw 4 KiB fsync: {raw['per_s']:,.0f}/s, p50 {raw['p50_ms']:.3f} ms")
    print(f"median run of {args.rounds} per case and type:")
    for label, r in results.items():
        print(f"({label}): {r['entries_per_s']:>9,.0f} entries/s  p50 {r['p50_ms']:7.2f} ms  "
              f"p99 {r['p99_ms']:7.2f} ms  fsyncs/1000 entries {r['fsyncs_per_1000_entries']:.2f}")
    a, b = ratios["a"], ratios["b"]

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    print(f"(a) VD/PD entries/s {a['vd_over_pd_entries_per_s']:.2f}x (goal >= 2.5x; rounds "
          f"{rounds(a['rounds_vd_over_pd_entries_per_s'])}); VD p99 / PD p99 "
          f"{a['vd_p99_over_pd_p99']:.2f} (goal <= 0.5; rounds "
          f"{rounds(a['rounds_vd_p99_over_pd_p99'])})")
    print(f"(b) VD/PD entries/s {b['vd_over_pd_entries_per_s']:.2f}x (goal >= 1.2x; rounds "
          f"{rounds(b['rounds_vd_over_pd_entries_per_s'])}); VD fsyncs per 1000 entries, "
          f"highest round {vd_fsyncs:.2f} (goal <= 1)")


if __name__ == "__main__":
    main()
