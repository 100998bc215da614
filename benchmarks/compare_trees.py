"""Run one benchmark script from two source trees, interleaved, and compare them.

A change that claims "no regression" is measured with this: the same script
(``write_vs_redis.py``, ``batch_read.py``, ``vd_vs_pd.py``, ...) runs from the
tree before the change and the tree after it, one round at a time, in the
order before, after, after, before, ... so that this VM's drift over minutes
falls on both sides alike.  Each round runs the script with ``--rounds 1
--json`` and that tree's ``src`` first on ``PYTHONPATH`` (the bookie processes
the script starts inherit it).  Every figure named ``entries_per_s``,
``p50_ms`` or ``p99_ms`` in the script's JSON is collected; the table gives
each figure's median per tree and the ratio after/before of the medians.

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python benchmarks/compare_trees.py --before /tmp/before --after . \\
        --rounds 5 write_vs_redis.py -- --skip-redis --seconds 8

Progress goes to stderr; ``--json`` prints one object with every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIGURE_SUFFIXES = ("_per_s", "p50_ms", "p99_ms", "_cpu_us")
"""A figure is a number under a key ending so: rates, latencies, CPU per call."""
ROW_LABELS = ("what", "name", "label", "shape", "size", "segments")
"""Keys that name a row of a list of rows (the path shows them, not its index)."""


def is_figure(key: str) -> bool:
    return key.endswith(FIGURE_SUFFIXES) and not key.startswith(("raw_fsync",))


def figures_of(result: Any, prefix: str = "") -> dict[str, float]:
    """Flatten a benchmark's JSON into {"path/to/figure": value}."""
    found: dict[str, float] = {}
    if isinstance(result, dict):
        for key, value in result.items():
            path = f"{prefix}/{key}" if prefix else str(key)
            if is_figure(str(key)) and isinstance(value, int | float) \
                    and not isinstance(value, bool):
                found[path] = float(value)
            else:
                found.update(figures_of(value, path))
    elif isinstance(result, list):
        for index, item in enumerate(result):
            label = ",".join(f"{item[k]}" for k in ROW_LABELS if isinstance(item, dict)
                             and k in item) or str(index)
            found.update(figures_of(item, f"{prefix}[{label}]"))
    return found


def takes(script: Path, option: str) -> bool:
    """Whether ``script`` declares ``option`` (not every script has ``--rounds``)."""
    return f'"{option}"' in script.read_text()


def run_round(tree: Path, script: str, extra: list[str]) -> dict[str, float]:
    tree = tree.resolve()
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    path = tree / "benchmarks" / script
    rounds = ["--rounds", "1"] if takes(path, "--rounds") else []
    command = [sys.executable, str(path), *rounds, "--json", *extra]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        sys.exit(f"compare_trees: {script} in {tree} failed ({done.returncode}):\n"
                 f"{done.stderr[-4000:]}")
    return figures_of(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="tree before the change")
    parser.add_argument("--after", type=Path, required=True, help="tree after the change")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per tree (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("script", help="a script under benchmarks/, e.g. write_vs_redis.py")
    parser.add_argument("extra", nargs="*", help="after --: arguments for the script")
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    # ABBA order: each pair of rounds starts with the tree the last pair ended on
    order = [("before", "after") if i % 2 == 0 else ("after", "before")
             for i in range(args.rounds)]
    started = time.monotonic()
    for i, pair in enumerate(order, 1):
        for side in pair:
            print(f"[{time.monotonic() - started:6.0f} s] round {i}/{args.rounds}: "
                  f"{args.script} from {side} ({trees[side]})", file=sys.stderr, flush=True)
            rounds[side].append(run_round(trees[side], args.script, args.extra))
    names = [n for n in rounds["before"][0] if all(n in r for r in rounds["after"])]
    table = {}
    for name in names:
        before = statistics.median(r[name] for r in rounds["before"])
        after = statistics.median(r[name] for r in rounds["after"])
        table[name] = {"before": before, "after": after,
                       "after_over_before": after / before if before else float("nan")}
    if args.json:
        print(json.dumps({"script": args.script, "extra": args.extra, "rounds": rounds,
                          "medians": table}, indent=2))
        return
    print(f"{args.script} {' '.join(args.extra)}: medians of {args.rounds} interleaved "
          f"rounds per tree")
    print(f"{'figure':<60} {'before':>12} {'after':>12} {'after/before':>13}")
    for name, row in table.items():
        print(f"{name:<60} {row['before']:>12,.2f} {row['after']:>12,.2f} "
              f"{row['after_over_before']:>12.3f}x")


if __name__ == "__main__":
    main()
