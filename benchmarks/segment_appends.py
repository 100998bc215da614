"""Segment store appends against raw ledger appends, in the same run.

Starts 3 bookie processes on a temporary SQLite metadata store, then writes
the same payloads with 256 outstanding (E=3 W=3 A=2): raw ``ledger.append``
(one entry each), then ``SegmentStore.append`` to 1, 10 and 1,000 segments
of one container (round robin) of single events (frames pack many per
entry), then raw ``ledger.append`` again, and blocks of 100 events (as the
Pravega client sends them), counted in events; for 100 B and 1 KiB events.
Each ratio is to the mean of a size's two raw rows, which bracket its
single-event rows: the raw rate varied 18,000-24,000 appends/s of 1 KiB
from run to run, while a raw row after the segment rows ran as fast as the
one before them on average (20,800 / 21,100 over five runs), so the
bracket halves the baseline's noise and cancels a drift within the run.  Prints appends/s,
events/s, MB/s, p50/p99, CPU per append of this process (the client and
the driver) and of the three bookie processes together, and the time to
reopen the container (replaying everything written, as part 1 never
truncates tier-1).  Under each segment
row, the phases its latency is made of: the frames it took (operations
and KiB per frame) and their tier-1 acknowledgement, append of the frame
to its ack (p50/p99/max: the bookies' share), and the garbage collections
during the row (count per generation and the pause in all): an append's
p99 well above its frames' ack p99 waited in the client (frames in
flight, CPU), not in tier-1.

    .venv/bin/python benchmarks/segment_appends.py [--appends 20000] [--outstanding 256]
        [--sizes 100,1024] [--segments 1,10,1000] [--max-frame-bytes N]
        [--frames-in-flight N] [--frame-cut-ops N] [--frame-cut-bytes N]
        [--reopen-gib G] [--warmup N] [--lead-in N] [--gc-gen0-threshold N]
        [--rounds N] [--json]

Fairness: before each row the bookies are let finish the previous one's
checkpoint work (:func:`settle`) and a lead-in of the row's own kind of
append runs unrecorded (:func:`row`); the rows run in one order for every size, single events first
(raw, then 1, 10 and 1,000 segments), and the blocks of 100 events of every
size only after all of them, so that no single-event row (nor a raw one)
follows the 100 MB of block writes the bookies are still flushing; a short
unrecorded warm-up of both kinds of append comes first (the first row of a
run used to pay for the container's first frames and the bookies' first
ledger).  The process runs with the segment store host's interpreter
settings (``quire.hosts.process.tune_interpreter``: gen-0 threshold 50,000,
start-up objects frozen), raw rows included; ``--gc-gen0-threshold -1``
keeps Python's defaults.

``--reopen-gib 1`` fills tier-1 to 1 GiB (appends of 512 KiB to one more
segment, with checkpoints every 2 GiB so that all of it is since the last
one) before timing the reopen: the issue's reopen figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from quire.client import Client
from quire.hosts import SegmentStoreHostConfig
from quire.hosts.process import tune_interpreter
from quire.log import NamedDataLog, Position
from quire.sandbox import BookieProcess, sqlite_uri, start_all, stop_all
from quire.segmentstore import ContainerConfig, SegmentStore, SegmentStoreConfig
from quire.segmentstore.names import container_log_name
from quire.segmentstore.store import LEGACY_LOG_PASSWORD


class TimedLog(NamedDataLog):
    """The container's tier-1 log as the store opens it, timing each frame
    from its append to its acknowledgement (one clock read and a callback
    per frame, not per append): the tier-1 phase of an append's latency."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frame_seconds: list[float] = []
        self.frame_bytes = 0

    def append(self, data: bytes) -> asyncio.Future[Position]:
        future = super().append(data)
        seconds, clock = self.frame_seconds, time.perf_counter
        start = clock()
        self.frame_bytes += len(data)
        future.add_done_callback(lambda _f: seconds.append(clock() - start))
        return future


class Phases:
    """What a segment row's appends waited for besides the driver: the
    frames' tier-1 acknowledgement (p50/p99, operations and bytes per
    frame) and the garbage collector (collections and their pause), taken
    between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.log: TimedLog | None = None
        self._gc_started = 0.0
        self.gc_collections = [0, 0, 0]
        self.gc_seconds = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_collections[info["generation"]] += 1
            self.gc_seconds += time.perf_counter() - self._gc_started

    def start(self, store: SegmentStore) -> None:
        self._ops = store.container(0).operation_log.operations_written
        self.gc_collections = [0, 0, 0]
        self.gc_seconds = 0.0
        if self.log is not None:
            self.log.frame_seconds.clear()
            self.log.frame_bytes = 0

    def stop(self, store: SegmentStore) -> dict[str, Any]:
        ops = store.container(0).operation_log.operations_written - self._ops
        figures: dict[str, Any] = {"gc_collections": list(self.gc_collections),
                                   "gc_ms": self.gc_seconds * 1000}
        if self.log is not None and self.log.frame_seconds:
            acks = sorted(self.log.frame_seconds)
            figures.update({
                "frames": len(acks), "ops_per_frame": ops / len(acks),
                "frame_kib": self.log.frame_bytes / len(acks) / 1024,
                "frame_ack_p50_ms": statistics.median(acks) * 1000,
                "frame_ack_p99_ms": acks[max(0, int(len(acks) * 0.99) - 1)] * 1000,
                "frame_ack_max_ms": acks[-1] * 1000})
        return figures


BOOKIE_PIDS: list[int] = []
"""The bookie processes, whose CPU :func:`drive` reports per call."""


def bookies_cpu_s() -> float:
    """CPU seconds the bookie processes have used (``/proc/<pid>/stat``)."""
    ticks = 0
    for pid in BOOKIE_PIDS:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def settle(idle_fraction: float = 0.05, interval_s: float = 0.1,
                 timeout_s: float = 15.0) -> float:
    """Wait until the bookies are idle: below ``idle_fraction`` of a core
    together over an ``interval_s`` (polled, up to ``timeout_s``); the
    seconds waited.  A row would otherwise pay for the previous row's
    checkpoints (the index entries and entry-log writes of 100,000 raw
    entries take the bookies about a second after the row ends), so the
    row after the raw one looked slower than the one after it."""
    start = time.perf_counter()
    used = bookies_cpu_s()
    while time.perf_counter() - start < timeout_s:
        await asyncio.sleep(interval_s)  # a poll of the bookies' CPU, with a deadline
        now = bookies_cpu_s()
        if now - used < idle_fraction * interval_s:
            break
        used = now
    return time.perf_counter() - start


async def drive(call: Callable[[int], asyncio.Future[Any]], count: int, outstanding: int
                ) -> dict[str, float]:
    """``call(i)`` for i < count with ``outstanding`` in flight; rate, latencies
    and this process's CPU per call (``time.process_time``, the driver's
    own share included: under a saturated CPU the rate follows it).

    Each completion issues the next call from its callback: no task, lock
    or semaphore per call, so the driver's own cost (two clock reads and a
    callback) is small beside what it measures, and the same for every row."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[BaseException] = []
    done = loop.create_future()
    issued = 0
    clock = time.perf_counter

    def issue() -> None:
        nonlocal issued
        i = issued
        issued += 1
        t0 = clock()
        call(i).add_done_callback(lambda f: finished(t0, f))

    def finished(t0: float, future: asyncio.Future[Any]) -> None:
        latencies.append(clock() - t0)
        if future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]
        if issued < count:
            issue()
        elif len(latencies) == count and not done.done():
            done.set_result(None)

    start, cpu_start, bookies_start = clock(), time.process_time(), bookies_cpu_s()
    for _ in range(min(outstanding, count)):
        issue()
    await done
    seconds = clock() - start
    cpu = time.process_time() - cpu_start
    bookies_cpu = bookies_cpu_s() - bookies_start
    if failures:
        raise failures[0]
    latencies.sort()
    return {"per_s": count / seconds, "seconds": seconds,
            "client_cpu_us": cpu / count * 1e6,
            "bookies_cpu_us": bookies_cpu / count * 1e6,
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000}


async def row(call: Callable[[int], asyncio.Future[Any]], count: int, outstanding: int,
              lead_in: int, phases: Phases | None = None,
              store: SegmentStore | None = None) -> dict[str, Any]:
    """One measured row: let the bookies settle, run ``lead_in`` unrecorded
    calls of the same kind, then :func:`drive` ``count`` recorded ones
    (numbered on from the lead-in, so writers' event numbers keep rising)
    and, for a segment row, its phases.  The lead-in is there because the
    first row of a kind after another kind ran slower (the first segment
    row after a raw one at about 0.8x the next, whichever segment count it
    had), with the bookies settled or not."""
    await settle()
    if lead_in:
        await drive(call, lead_in, outstanding)
    if phases is not None and store is not None:
        phases.start(store)
    result = await drive(lambda i: call(lead_in + i), count, outstanding)
    if phases is not None and store is not None:
        result.update(phases.stop(store))
    return result


async def warm_up(client: Client, store: SegmentStore, args: argparse.Namespace) -> None:
    """Unrecorded appends of both kinds (raw entries, then single events to
    one segment), so that no measured row pays for first times."""
    event = b"w" * min(args.sizes)
    ledger = await client.create_ledger(3, 3, 2, password=b"bench")
    await drive(lambda i: ledger.append(event), args.warmup, args.outstanding)
    await ledger.close()
    name = "bench/warmup/0"
    await store.create_segment(name)
    await drive(lambda i: store.append(name, event), args.warmup, args.outstanding)


async def fill(store: SegmentStore, gib: float) -> dict[str, Any]:
    """Append blocks of 512 KiB to one segment until the container's segments
    hold ``gib`` GiB (for the reopen figure); the write rate."""
    container = store.container(0)
    name = "bench/reopen/0"
    await store.create_segment(name)
    target = int(gib * (1 << 30))
    have = sum(s.length for s in container.committed.segments.values())
    block = b"r" * (512 << 10)
    count = max(0, -(-(target - have) // len(block)))
    written = await drive(lambda i: store.append(name, block), count, 16) if count else \
        {"per_s": 0.0, "seconds": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "client_cpu_us": 0.0,
         "bookies_cpu_us": 0.0}
    return {"what": f"fill to {gib:g} GiB of tier-1, appends of 512 KiB", **written,
            "events_per_s": written["per_s"], "x_raw_events": None,
            "mb_per_s": written["per_s"] * len(block) / 1e6}


async def run(uri: str, args: argparse.Namespace, reopen: bool = True) -> list[dict[str, Any]]:
    client = await Client.connect(uri)
    results: list[dict[str, Any]] = []
    phases = Phases()
    config = SegmentStoreConfig()

    def open_log(container_id: int) -> TimedLog:
        phases.log = TimedLog(client, container_log_name(container_id),
                              password=LEGACY_LOG_PASSWORD, options=config.tier1)
        return phases.log
    try:
        store = await SegmentStore.open(client, [0], open_log=open_log, config=SegmentStoreConfig(
            container_count=1, container=ContainerConfig(
                max_frame_bytes=args.max_frame_bytes,
                max_frames_in_flight=args.frames_in_flight,
                # the reopen replays everything since one checkpoint (the first)
                checkpoint_every_bytes=max(64 << 20, int(args.reopen_gib * (1 << 31))),
                frame_cut_ops=args.frame_cut_ops, frame_cut_bytes=args.frame_cut_bytes)))
        try:
            if args.warmup:
                await warm_up(client, store, args)
            bases: dict[int, float] = {}
            lead_in = args.appends // 10 if args.lead_in < 0 else args.lead_in
            for size in args.sizes:
                event = b"e" * size

                async def raw_row(event: bytes = event) -> dict[str, Any]:
                    ledger = await client.create_ledger(3, 3, 2, password=b"bench")

                    def call(_i: int) -> asyncio.Future[int]:
                        return ledger.append(event)
                    raw = await row(call, args.appends, args.outstanding, lead_in)
                    await ledger.close()
                    return raw
                before = await raw_row()
                singles: list[tuple[int, dict[str, Any]]] = []
                for count in args.segments:
                    names = [f"bench/{size}/{count}/{i}" for i in range(count)]
                    await asyncio.gather(*(store.create_segment(n) for n in names))
                    singles.append((count, await row(
                        lambda i, names=names, event=event: store.append(names[i % len(names)],
                                                                         event),
                        args.appends, args.outstanding, lead_in, phases, store)))
                after = await raw_row()
                # the baseline brackets the segment rows (see the module docstring)
                base = bases[size] = (before["per_s"] + after["per_s"]) / 2
                measured = [(f"raw ledger.append, {size} B (before)", before),
                            *((f"{count} segment(s), 1 event of {size} B", single)
                              for count, single in singles),
                            (f"raw ledger.append, {size} B (after)", after)]
                results += [{"what": what, **figures, "events_per_s": figures["per_s"],
                             "x_raw_events": figures["per_s"] / base,
                             "mb_per_s": figures["per_s"] * size / 1e6}
                            for what, figures in measured]
            for size in args.sizes:
                if size > 1024:
                    continue
                block = b"e" * size * 100
                for count in args.segments:
                    names = [f"bench/{size}/{count}/{i}" for i in range(count)]
                    grouped = await row(
                        lambda i, names=names, block=block: store.append(
                            names[i % len(names)], block, writer=(1 + i % len(names), i)),
                        max(1, args.appends // 20), args.outstanding, lead_in // 20, phases,
                        store)
                    results.append({"what": f"{count} segment(s), 100 events of {size} B",
                                    **grouped, "events_per_s": grouped["per_s"] * 100,
                                    "x_raw_events": grouped["per_s"] * 100 / bases[size],
                                    "mb_per_s": grouped["per_s"] * len(block) / 1e6})
            if reopen:
                container = store.container(0)
                if args.reopen_gib:
                    results.append(await fill(store, args.reopen_gib))
                logged = container.committed.checkpoint()
                tier1_mb = sum(s.length for s in container.committed.segments.values()) / 1e6
                await store.stop_container(0)
                start = time.perf_counter()
                await store.start_container(0)
                reopen_s = time.perf_counter() - start
                results.append({"what": f"reopen the container ({tier1_mb:.0f} MB of tier-1)",
                                "seconds": reopen_s, "tier1_mb": tier1_mb,
                                "checkpoint_bytes": len(logged)})
        finally:
            await store.close()
    finally:
        await client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=20_000)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[100, 1024], help="event sizes, comma separated")
    parser.add_argument("--segments", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1, 10, 1000], help="segment counts, comma separated")
    parser.add_argument("--max-frame-bytes", type=int, default=1 << 20)
    parser.add_argument("--frames-in-flight", type=int, default=8)
    parser.add_argument("--frame-cut-ops", type=int, default=128,
                        help="cut a frame once this many operations are queued")
    parser.add_argument("--frame-cut-bytes", type=int, default=256 << 10,
                        help="... or this many bytes")
    parser.add_argument("--reopen-gib", type=float, default=0.0,
                        help="before the reopen, fill tier-1 to this many GiB since the "
                             "container's last checkpoint (1 for the issue's figure)")
    parser.add_argument("--warmup", type=int, default=2_000,
                        help="unrecorded appends of each kind before the rows (0: none)")
    parser.add_argument("--lead-in", type=int, default=-1,
                        help="unrecorded appends of a row's own kind before it is measured "
                             "(-1: a tenth of --appends; blocks: a twentieth of that)")
    parser.add_argument("--gc-gen0-threshold", type=int,
                        default=SegmentStoreHostConfig().gc_gen0_threshold_allocations,
                        help="the process's gen-0 GC threshold, as the segment store host "
                             "sets it (-1: Python's defaults, nothing frozen)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every row this many times, each round on fresh bookies "
                             "(the reopen in the first only), and print each row's median")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    if args.gc_gen0_threshold >= 0:
        tune_interpreter(args.gc_gen0_threshold)
    rounds = []
    for round_no in range(1, args.rounds + 1):
        results = one_round(args, reopen=round_no == 1)
        rounds.append(results)
        if not args.json:
            if args.rounds > 1:
                print(f"round {round_no} of {args.rounds}:")
            print_rows(args, results)
    if args.json:
        print(json.dumps(rounds[0] if args.rounds == 1 else
                         {"rounds": rounds, "medians": medians(rounds)}, indent=2))
    elif args.rounds > 1:
        print(f"medians of {args.rounds} rounds (min-max):")
        for m in medians(rounds):
            print(f"  {m['what']:<38} {m['x_raw_events']:4.2f}x raw "
                  f"({m['x_raw_min']:.2f}-{m['x_raw_max']:.2f})  p99 {m['p99_ms']:5.1f} ms "
                  f"({m['p99_min_ms']:.1f}-{m['p99_max_ms']:.1f})  {m['per_s']:>8.0f} appends/s")


def one_round(args: argparse.Namespace, reopen: bool) -> list[dict[str, Any]]:
    """Every row once, on 3 bookie processes of its own (a fresh directory)."""
    with tempfile.TemporaryDirectory(prefix="quire-segment-bench-") as tmp:
        root = Path(tmp)
        uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, uri, f"bench-{i}", port=0) for i in range(3)]
        start_all(bookies)
        BOOKIE_PIDS[:] = [b.proc.pid for b in bookies if b.proc is not None]
        try:
            return uvloop.run(run(uri, args, reopen))
        finally:
            stop_all(bookies)


def medians(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per measured row, its median over the rounds (and the range) of the
    ratio to raw, p99 and rate."""
    out = []
    for r in rounds[0]:
        if r.get("x_raw_events") is None:
            continue
        same = [row for results in rounds for row in results if row["what"] == r["what"]]
        xs = [row["x_raw_events"] for row in same]
        p99s = [row["p99_ms"] for row in same]
        out.append({"what": r["what"], "x_raw_events": statistics.median(xs),
                    "x_raw_min": min(xs), "x_raw_max": max(xs),
                    "p99_ms": statistics.median(p99s), "p99_min_ms": min(p99s),
                    "p99_max_ms": max(p99s),
                    "per_s": statistics.median(row["per_s"] for row in same)})
    return out


def print_rows(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    print(f"{args.outstanding} outstanding, E=3 W=3 A=2, 3 bookie processes on this machine")
    for r in results:
        if "per_s" not in r:
            print(f"  {r['what']}: {r['seconds']:.2f} s")
            continue
        x = "   -" if r["x_raw_events"] is None else f"{r['x_raw_events']:4.1f}"
        print(f"  {r['what']:<38} {r['per_s']:>8.0f} appends/s {r['events_per_s']:>8.0f} "
              f"events/s ({x}x raw) {r['mb_per_s']:>6.1f} MB/s  "
              f"p50 {r['p50_ms']:5.1f} ms  p99 {r['p99_ms']:5.1f} ms  "
              f"CPU us: client {r['client_cpu_us']:5.1f}, bookies {r['bookies_cpu_us']:5.1f}")
        if "frames" in r:
            print(f"  {'':<38} frames: {r['frames']} of {r['ops_per_frame']:.0f} ops / "
                  f"{r['frame_kib']:.0f} KiB, tier-1 ack p50 {r['frame_ack_p50_ms']:.1f} ms "
                  f"p99 {r['frame_ack_p99_ms']:.1f} ms max {r['frame_ack_max_ms']:.1f} ms; "
                  f"GC {'/'.join(map(str, r['gc_collections']))} ({r['gc_ms']:.1f} ms)")

if __name__ == "__main__":
    main()
