"""``python -m quire.simulation``: run seeds, report failures, replay one.

::

    python -m quire.simulation --seeds 500            # seeds 0..499, on every core
    python -m quire.simulation --seed 24               # replay one, print its trace
    python -m quire.simulation --seeds 50 --bug skip-fencing   # show the invariants bite
    python -m quire.simulation --seeds 10000 --first 100000 --progress   # a soak
    python -m quire.simulation --seed 5702 --faults classic    # only the first faults
    python -m quire.simulation --layer streams --seeds 150     # the stream path

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
from quire.simulation.run import CLASSIC, FAULT_NAMES, run_seed
from quire.simulation.streams.bugs import STREAM_BUGS
from quire.simulation.streams.nemesis import STREAM_FAULTS
from quire.simulation.streams.run import run_stream_seed

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
    cpu_s: float
    """CPU time the run took in its worker (``time.process_time``)."""


Job = tuple[int, str, bool, frozenset[str], str]
"""(seed, bug, keep the trace, faults enabled, layer)."""
LAYERS = ("ledgers", "streams")


def _run(job: Job) -> Outcome:
    seed, bug, keep_trace, faults, layer = job
    started = time.process_time()
    run = run_stream_seed if layer == "streams" else run_seed
    result = run(seed, bug=bug, faults_enabled=faults)
    failures = tuple(map(str, result.violations)) + ((result.error,) if result.error else ())
    return Outcome(seed, result.ok, failures, result.digest, result.ledgers, result.acked,
                   result.virtual_s, result.faults,
                   tuple(result.trace) if keep_trace or not result.ok else (),
                   time.process_time() - started)


def parse_faults(text: str, layer: str = "ledgers") -> frozenset[str]:
    """``all``, ``classic`` (ledgers) or a comma-separated list of the
    layer's faults (:data:`FAULT_NAMES`, :data:`STREAM_FAULTS`)."""
    known = STREAM_FAULTS if layer == "streams" else FAULT_NAMES
    if text == "all":
        return frozenset(known)
    if text == "classic" and layer != "streams":
        return CLASSIC
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown faults {', '.join(unknown)} (known for {layer}: all"
            + (", classic" if layer != "streams" else "") + f", {', '.join(known)})")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m quire.simulation",
                                     description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    which.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--layer", choices=LAYERS, default="ledgers",
                        help="ledgers (the replication protocol, default) or streams "
                             "(segment stores, tier-2, controllers on the ledgers)")
    parser.add_argument("--bug", choices=BUGS + STREAM_BUGS, default="",
                        help="switch a seeded bug on (the invariants must catch it)")
    parser.add_argument("--faults", default="all",
                        help="faults a run may draw: all (default), classic (ledgers), or a "
                             "list of the layer's: " + ", ".join(FAULT_NAMES) + " (ledgers); "
                             + ", ".join(STREAM_FAULTS) + " (streams)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--progress", action="store_true",
                        help="show a progress bar (seeds done, failures) on stderr")
    parser.add_argument("--until-failure", action="store_true",
                        help="stop at the first failing seed")
    parser.add_argument("--digests", action="store_true",
                        help="print each seed's trace sha256 (to compare runs)")
    parser.add_argument("--trace-lines", type=int, default=80,
                        help="trace lines shown for a failure (0: all)")
    return parser


def _faults_flag(faults: frozenset[str], layer: str) -> str:
    """The ``--layer`` and ``--faults`` that select ``faults`` ("" for all of them)."""
    known = STREAM_FAULTS if layer == "streams" else FAULT_NAMES
    flag = " --layer streams" if layer == "streams" else ""
    if faults == frozenset(known):
        return flag
    return flag + " --faults " + ("classic" if faults == CLASSIC else
                                  ",".join(f for f in known if f in faults))


def _report_failure(outcome: Outcome, bug: str, lines: int, faults: frozenset[str],
                    layer: str) -> None:
    print(f"\nFAILED seed {outcome.seed} ({outcome.faults})")
    for failure in outcome.failures:
        print(f"  violated: {failure}")
    trace = outcome.trace if lines <= 0 else outcome.trace[-lines:]
    print(f"  trace ({len(trace)} of {len(outcome.trace)} lines):")
    for line in trace:
        print(f"    {line}")
    print(f"  replay: python -m quire.simulation --seed {outcome.seed}"
          + (f" --bug {bug}" if bug else "") + _faults_flag(faults, layer))


class _Progress:
    """Progress on stderr: a rich bar on a terminal, else a line per 1% of
    the seeds (a soak's log); seeds done of all, failures so far."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        console = Console(stderr=True)
        self._total = total
        self._done = self._failed = 0
        self._started = time.monotonic()
        self._every = max(1, total // 100)
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(TextColumn("seeds"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=console)
            self._task = self._bar.add_task("seeds", total=total, failed=0)
            self._bar.start()

    def advance(self, ok: bool) -> None:
        self._done += 1
        self._failed += not ok
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self._failed)
        elif self._done % self._every == 0 or self._done == self._total:
            print(f"{self._done}/{self._total} seeds, {self._failed} failed, "
                  f"{time.monotonic() - self._started:.0f} s", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.faults, args.layer)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if args.bug and (args.bug in STREAM_BUGS) != (args.layer == "streams"):
        parser.error(f"bug {args.bug} belongs to the other layer")
    context = multiprocessing.get_context("fork")
    started = time.monotonic()
    if args.seed is not None:
        with context.Pool(1, maxtasksperchild=1) as pool:
            outcome = pool.apply(_run, ((args.seed, args.bug, True, faults, args.layer),))
        print("\n".join(outcome.trace))
        things = ("events read at the end", "events acknowledged") if args.layer == "streams" \
            else ("ledgers", "entries acknowledged")
        print(f"seed {outcome.seed}: {'ok' if outcome.ok else 'FAILED'}; {outcome.ledgers} "
              f"{things[0]}, {outcome.acked} {things[1]}, {outcome.virtual_s:.1f} virtual s, "
              f"{outcome.cpu_s:.2f} CPU s; trace sha256 {outcome.digest}")
        for failure in outcome.failures:
            print(f"  violated: {failure}")
        return 0 if outcome.ok else 1
    seeds = range(args.first, args.first + args.seeds)
    failed: list[Outcome] = []
    ran = acked = 0
    virtual_s = cpu_s = 0.0
    progress = _Progress(len(seeds)) if args.progress else None
    with context.Pool(max(1, args.workers), maxtasksperchild=1) as pool:
        for outcome in pool.imap(_run, [(seed, args.bug, False, faults, args.layer)
                                        for seed in seeds]):
            ran += 1
            cpu_s += outcome.cpu_s
            if progress is not None:
                progress.advance(outcome.ok)
            if args.digests:
                print(f"seed {outcome.seed}: trace sha256 {outcome.digest}")
            acked += outcome.acked
            virtual_s += outcome.virtual_s
            if not outcome.ok:
                failed.append(outcome)
                _report_failure(outcome, args.bug, args.trace_lines, faults, args.layer)
                if args.until_failure:
                    pool.terminate()
                    break
    if progress is not None:
        progress.stop()
    what = "events" if args.layer == "streams" else "entries"
    print(f"\n{ran} seeds from {args.first}" + (f" with bug {args.bug}" if args.bug else "")
          + (" (streams)" if args.layer == "streams" else "")
          + f": {ran - len(failed)} ok, {len(failed)} failed"
          + (f" (seeds {', '.join(str(o.seed) for o in failed)})" if failed else "")
          + f"; {acked} {what} acknowledged, {virtual_s:.0f} virtual s "
          f"in {time.monotonic() - started:.1f} s ({cpu_s:.1f} CPU s in the runs); "
          f"{cpu_s / max(1, ran):.2f} CPU s per seed")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # one hash seed for every run
        os.execve(sys.executable, [sys.executable, "-m", "quire.simulation", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    sys.exit(main(sys.argv[1:]))
