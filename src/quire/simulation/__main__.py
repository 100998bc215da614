"""``python -m quire.simulation``: run seeds, report failures, replay one.

::

    python -m quire.simulation --seeds 500            # seeds 0..499, on every core
    python -m quire.simulation --seed 24               # replay one, print its trace
    python -m quire.simulation --seeds 50 --bug skip-fencing   # show the invariants bite

Every seed runs in its own process forked from this one before any run
(``multiprocessing`` with ``maxtasksperchild=1``), under
``PYTHONHASHSEED=0`` (the command re-executes itself to get it), so a seed
gives the same run whether it ran first, last, alone or among thousands;
``--seed`` replays it exactly.  Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass

from quire.simulation.bugs import BUGS
from quire.simulation.run import run_seed

HASH_SEED = "0"


@dataclass(frozen=True)
class Outcome:
    """What a worker sends back for one seed (the trace only if it failed,
    or if asked for)."""

    seed: int
    ok: bool
    failures: tuple[str, ...]
    digest: str
    ledgers: int
    acked: int
    virtual_s: float
    faults: str
    trace: tuple[str, ...]


def _run(job: tuple[int, str, bool]) -> Outcome:
    seed, bug, keep_trace = job
    result = run_seed(seed, bug=bug)
    failures = tuple(map(str, result.violations)) + ((result.error,) if result.error else ())
    return Outcome(seed, result.ok, failures, result.digest, result.ledgers, result.acked,
                   result.virtual_s, result.faults,
                   tuple(result.trace) if keep_trace or not result.ok else ())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m quire.simulation",
                                     description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    which.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--bug", choices=BUGS, default="",
                        help="switch a seeded bug on (the invariants must catch it)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--until-failure", action="store_true",
                        help="stop at the first failing seed")
    parser.add_argument("--digests", action="store_true",
                        help="print each seed's trace sha256 (to compare runs)")
    parser.add_argument("--trace-lines", type=int, default=80,
                        help="trace lines shown for a failure (0: all)")
    return parser


def _report_failure(outcome: Outcome, bug: str, lines: int) -> None:
    print(f"\nFAILED seed {outcome.seed} ({outcome.faults})")
    for failure in outcome.failures:
        print(f"  violated: {failure}")
    trace = outcome.trace if lines <= 0 else outcome.trace[-lines:]
    print(f"  trace ({len(trace)} of {len(outcome.trace)} lines):")
    for line in trace:
        print(f"    {line}")
    print(f"  replay: python -m quire.simulation --seed {outcome.seed}"
          + (f" --bug {bug}" if bug else ""))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    context = multiprocessing.get_context("fork")
    started = time.monotonic()
    if args.seed is not None:
        with context.Pool(1, maxtasksperchild=1) as pool:
            outcome = pool.apply(_run, ((args.seed, args.bug, True),))
        print("\n".join(outcome.trace))
        print(f"seed {outcome.seed}: {'ok' if outcome.ok else 'FAILED'}; {outcome.ledgers} "
              f"ledgers, {outcome.acked} entries acknowledged, {outcome.virtual_s:.1f} virtual s; "
              f"trace sha256 {outcome.digest}")
        for failure in outcome.failures:
            print(f"  violated: {failure}")
        return 0 if outcome.ok else 1
    seeds = range(args.first, args.first + args.seeds)
    failed: list[Outcome] = []
    ran = acked = 0
    virtual_s = 0.0
    with context.Pool(max(1, args.workers), maxtasksperchild=1) as pool:
        for outcome in pool.imap(_run, [(seed, args.bug, False) for seed in seeds]):
            ran += 1
            if args.digests:
                print(f"seed {outcome.seed}: trace sha256 {outcome.digest}")
            acked += outcome.acked
            virtual_s += outcome.virtual_s
            if not outcome.ok:
                failed.append(outcome)
                _report_failure(outcome, args.bug, args.trace_lines)
                if args.until_failure:
                    pool.terminate()
                    break
    print(f"\n{ran} seeds from {args.first}" + (f" with bug {args.bug}" if args.bug else "")
          + f": {ran - len(failed)} ok, {len(failed)} failed"
          + (f" (seeds {', '.join(str(o.seed) for o in failed)})" if failed else "")
          + f"; {acked} entries acknowledged, {virtual_s:.0f} virtual s "
          f"in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # one hash seed for every run
        os.execve(sys.executable, [sys.executable, "-m", "quire.simulation", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    sys.exit(main(sys.argv[1:]))
