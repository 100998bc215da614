"""Tier-1 backlog under sustained appends with a storage writer (not a test).

Starts 3 bookie processes on a temporary SQLite metadata store and one
segment store (one container, E3 W3 A2, ``file://`` tier-2 in the same
temporary directory), creates ``--segments`` segments and appends
``--append-bytes`` events round robin with ``--outstanding`` in flight for
``--seconds`` (as ``benchmarks/segment_appends.py`` drives part 1: each
completion issues the next append, unthrottled; ``--rate N`` caps it at N
appends/s).  Meanwhile the container's storage writer flushes
(``--flush-threshold-kib``, ``--flush-threshold-ms``) and the backlog
(committed bytes of live segments not yet in tier-2,
:meth:`~quire.segmentstore.storage_writer.StorageWriter.backlog_bytes`) is
sampled every ``--sample-ms``.  Prints the append rate, the largest
backlog over the run and over its last third (bounded: the last third's
peak is not above the first two thirds'), against the issue's goal bound
2 x flush_threshold_bytes x eligible segments, and how long the backlog
takes to reach zero once appends stop.

    .venv/bin/python benchmarks/tier2_backlog.py [--seconds 60] [--segments 100]
        [--append-bytes 1024] [--flush-threshold-kib 1024] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from quire.client import Client
from quire.sandbox import BookieProcess, sqlite_uri, start_all, stop_all
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.tier2 import Tier2Config

_MiB = 1 << 20


async def sustain(store: SegmentStore, names: list[str], event: bytes, seconds: float,
                  outstanding: int, rate: float, on_tick: Any) -> dict[str, float]:
    """Appends round robin for ``seconds``; count, rate, and the backlog samples' peaks."""
    loop = asyncio.get_running_loop()
    writer = store.writers[0]
    done = loop.create_future()
    failures: list[BaseException] = []
    issued = answered = 0
    start = time.perf_counter()
    stop_at = start + seconds

    def issue() -> None:
        nonlocal issued
        i = issued
        issued += 1
        store.append(names[i % len(names)], event).add_done_callback(finished)

    def finished(future: asyncio.Future[Any]) -> None:
        nonlocal answered
        answered += 1
        if future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]
        now = time.perf_counter()
        if now < stop_at and not failures:
            if rate and issued >= (now - start) * rate:
                loop.call_later(1 / rate, issue_later)
            else:
                issue()
        elif answered == issued and not done.done():
            done.set_result(None)

    def issue_later() -> None:
        if time.perf_counter() < stop_at and not failures:
            issue()
        elif answered == issued and not done.done():
            done.set_result(None)

    for _ in range(outstanding):
        issue()
    samples: list[tuple[float, int]] = []
    while not done.done():
        samples.append((time.perf_counter() - start, writer.backlog_bytes()))
        on_tick(min(seconds, time.perf_counter() - start), samples[-1][1])
        await asyncio.wait([done], timeout=0.1)
    seconds_run = time.perf_counter() - start
    if failures:
        raise failures[0]
    if writer.failure is not None:
        raise writer.failure
    cut = seconds * 2 / 3
    early = max((b for t, b in samples if t < cut), default=0)
    late = max((b for t, b in samples if t >= cut), default=0)
    return {"appends": issued, "seconds": seconds_run, "appends_per_s": issued / seconds_run,
            "mb_per_s": issued * len(event) / seconds_run / 1e6,
            "max_backlog_bytes": max(b for _t, b in samples),
            "max_backlog_first_two_thirds": early, "max_backlog_last_third": late,
            "samples": len(samples)}


async def drain(store: SegmentStore, timeout_s: float) -> float:
    """Seconds until the backlog is zero (appends stopped)."""
    writer = store.writers[0]
    start = time.perf_counter()
    writer.wake()
    while writer.backlog_bytes() > 0:
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"backlog {writer.backlog_bytes()} B after {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.perf_counter() - start


async def run(uri: str, tier2_uri: str, args: argparse.Namespace,
              progress: Progress | None) -> dict[str, Any]:
    threshold = args.flush_threshold_kib * 1024
    client = await Client.connect(uri)
    try:
        store = await SegmentStore.open(
            client, [0], Tier2Config(uri=tier2_uri), config=SegmentStoreConfig(
                container_count=1, storage_writer=StorageWriterConfig(
                    flush_threshold_bytes=threshold,
                    flush_threshold_ms=args.flush_threshold_ms,
                    iteration_interval_ms=args.iteration_interval_ms)))
        try:
            names = [f"bench/backlog/{i}" for i in range(args.segments)]
            await asyncio.gather(*(store.create_segment(n) for n in names))
            task = progress.add_task("appending", total=args.seconds) if progress else None

            def tick(elapsed: float, backlog: int) -> None:
                if progress is not None and task is not None:
                    progress.update(task, completed=elapsed,
                                    description=f"appending (backlog {backlog / _MiB:.1f} MiB)")
            result = await sustain(store, names, b"e" * args.append_bytes, args.seconds,
                                   args.outstanding, args.rate, tick)
            writer = store.writers[0]
            result["drain_seconds"] = await drain(store, args.drain_timeout_s)
            result["iterations"] = writer.iterations
            result["tier1_truncated"] = writer.truncated_at is not None
        finally:
            await store.close()
    finally:
        await client.close()
    bound = 2 * threshold * args.segments
    result.update({"flush_threshold_bytes": threshold, "eligible_segments": args.segments,
                   "goal_bound_bytes": bound,
                   "x_bound": result["max_backlog_bytes"] / bound,
                   "bounded": result["max_backlog_bytes"] <= bound
                   and result["max_backlog_last_third"]
                   <= max(result["max_backlog_first_two_thirds"], threshold)})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--segments", type=int, default=100)
    parser.add_argument("--append-bytes", type=int, default=1024)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="cap appends/s (0: unthrottled, as segment_appends.py)")
    parser.add_argument("--flush-threshold-kib", type=int, default=1024)
    parser.add_argument("--flush-threshold-ms", type=int, default=30_000)
    parser.add_argument("--iteration-interval-ms", type=int, default=1000)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--dir", default=None, help="where tier-2 and the bookies live")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-tier2-backlog-", dir=args.dir) as tmp:
        root = Path(tmp)
        uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, uri, f"bench-{i}", port=0) for i in range(3)]
        start_all(bookies)
        try:
            if args.json:
                result = uvloop.run(run(uri, f"file://{root}/tier2", args, None))
            else:
                with Progress(TextColumn("{task.description}"), BarColumn(),
                              TimeElapsedColumn(), console=Console(stderr=True),
                              transient=True) as progress:
                    result = uvloop.run(run(uri, f"file://{root}/tier2", args, progress))
        finally:
            stop_all(bookies)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['appends']:,} appends of {args.append_bytes} B to {args.segments} segments "
          f"in {result['seconds']:.1f} s: {result['appends_per_s']:,.0f}/s, "
          f"{result['mb_per_s']:.1f} MB/s (E3 W3 A2, 3 bookie processes, file:// tier-2)")
    print(f"largest tier-1 backlog {result['max_backlog_bytes'] / _MiB:.1f} MiB "
          f"(first two thirds {result['max_backlog_first_two_thirds'] / _MiB:.1f}, last third "
          f"{result['max_backlog_last_third'] / _MiB:.1f}); goal bound 2 x "
          f"{args.flush_threshold_kib} KiB x {args.segments} = "
          f"{result['goal_bound_bytes'] / _MiB:.0f} MiB: {result['x_bound']:.2f}x, "
          f"{'bounded' if result['bounded'] else 'NOT bounded'}")
    print(f"drained to zero {result['drain_seconds']:.1f} s after appends stopped; "
          f"{result['iterations']} flush iterations; tier-1 truncated: "
          f"{result['tier1_truncated']}")


if __name__ == "__main__":
    main()
