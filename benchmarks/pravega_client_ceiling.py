"""The real Pravega client's own ceiling: ``write_event_async`` against a
server that stores nothing, against the full Quire stack and against Redis
XADD, in alternated rounds of one run.

Issue 26's goal is ``write_event_async`` of the PyPI ``pravega`` 0.3.8
client (100 B events, a 3-segment stream) at >= 1.5x Redis XADD
(``appendfsync always``, redis-py + hiredis, one pipeline of the window).
This script tells how much of the gap a server can close: the null
endpoint (``benchmarks/_pravega_null.py``, its own process: a stub
controller and a wire server answering every ``AppendBlockEnd`` with
``DataAppended`` as soon as it is decoded) costs the client nothing to
wait for, so its rate is the most any server could give that client in
this process.

Set up once: the null endpoint and a ``quire.sandbox.Sandbox`` (3 bookie
processes, a segment store with E3 W3 A2 tier-1, the controller).  Then
``--rounds`` rounds, each running every row for ``--seconds``, in this
order:

- ``null/async/asyncio``: ``write_event_async`` on the null endpoint, a
  rolling window of ``--outstanding`` futures
  (``benchmarks.pravega_write.real_client_writes``) on asyncio's own loop;
- ``null/async/uvloop``: the same on uvloop;
- ``null/write_event``: the blocking ``write_event`` with
  ``max_inflight_events=--outstanding`` (no Python future per event);
- ``full/async/asyncio``, ``full/async/uvloop``: ``write_event_async`` on the
  full stack;
- with ``--await-variants``, two more ways to await on the null endpoint
  (uvloop): ``.../each-timed``, a latency callback on every future (as
  ``pravega_write.py`` did before), and ``.../gather``, whole windows
  handed out then gathered;
- ``redis``: XADD to a fresh ``redis-server`` (``--appendfsync always``),
  redis-py + hiredis, one pipeline of ``--outstanding``
  (``benchmarks.write_vs_redis.bench_redis``).

Each row reports events/s, p50/p99 (the async rows), events per block at
the server (the null endpoint's count, or the segment store's
``/metrics``, which also give its mean time per block from arrival to
acknowledgement), the server process's CPU per event, this process's CPU
per event split into the Python thread and the binding's Rust threads
(``/proc/self/task``), and, with the CPU of every server process (all the
sandbox's), the rate that much CPU per event allows on this machine's
cores if nothing else ran: a bound that the load does not move much (the
GIL makes the real limit lower).  Each round's rates are divided by that round's
Redis rate; the medians of those ratios are printed, with the verdict:
whether the null endpoint's best ``write_event_async`` row reaches the
goal (if not, no server change can).  ``--json`` prints one JSON object.

    .venv/bin/python benchmarks/pravega_client_ceiling.py [--seconds 5] [--rounds 3]
        [--outstanding 1024] [--event-bytes 100] [--segments 3] [--await-variants]
        [--json] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pravega_client
import uvloop

from benchmarks._common import Progress, redis_server, scrape
from benchmarks.pravega_write import (
    GOAL,
    GOAL_REDIS_CLIENT,
    LATENCY_SAMPLE_EVERY,
    ROUTING_KEY_NAMES,
    ROUTING_KEYS,
    SCOPE,
    STREAM,
    real_client_inflight_writes,
    real_client_writes,
)
from benchmarks.write_vs_redis import bench_redis
from quire.bench import summarize
from quire.sandbox import Sandbox

NULL_SERVER = Path(__file__).resolve().parent / "_pravega_null.py"
ROWS = ("null/async/asyncio", "null/async/uvloop", "null/write_event",
        "full/async/asyncio", "full/async/uvloop", "redis")
AWAIT_VARIANT_ROWS = ("null/async/uvloop/each-timed", "null/async/uvloop/gather")
"""With ``--await-variants``, after the null endpoint's rows: other ways to
await the same futures."""
_TICKS = os.sysconf("SC_CLK_TCK")
_APPENDS = "quire_segmentstore_append_latency_seconds_count"
_EVENTS = "quire_segmentstore_events_appended_total"
_LATENCY_SUM = "quire_segmentstore_append_latency_seconds_sum"


def thread_cpu_s() -> dict[str, float]:
    """This process's CPU seconds so far: its main (Python) thread, and every
    other thread (the binding's tokio runtimes)."""
    main = str(os.getpid())
    cpu = {"python": 0.0, "rust": 0.0}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        cpu["python" if task == main else "rust"] += (int(fields[11]) + int(fields[12])) / _TICKS
    return cpu


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class NullEndpoint:
    """``_pravega_null.py`` in its own process: its controller URI, and its
    counters since the last :meth:`take`."""

    def __init__(self, log: IO[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(NULL_SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the null endpoint did not start (see its log)")
        self.controller_uri: str = json.loads(line)["controller"]

    def take(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        taken: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return taken

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def null_endpoint(log_path: Path) -> Iterator[NullEndpoint]:
    with open(log_path, "w") as log:
        endpoint = NullEndpoint(log)
        try:
            yield endpoint
        finally:
            endpoint.close()


class FullStack:
    """The sandbox's segment store counters since the last :meth:`take`, and
    the CPU of the segment store and of all the sandbox's processes
    (bookies, segment store, controller)."""

    def __init__(self, sandbox: Sandbox) -> None:
        store = sandbox.segment_stores[0]
        assert store.proc is not None and store.metrics_address is not None
        self.pid = store.proc.pid
        self.pids = [p.proc.pid for p in sandbox.processes if p.proc is not None]
        self.metrics = store.metrics_address
        self._last = self._now()

    def _now(self) -> tuple[float, float, float, float, float]:
        found = scrape(self.metrics, _APPENDS, _EVENTS, _LATENCY_SUM)
        return (found[_APPENDS], found[_EVENTS], found[_LATENCY_SUM],
                process_cpu_s(self.pid), sum(process_cpu_s(pid) for pid in self.pids))

    def take(self) -> dict[str, Any]:
        now = self._now()
        blocks, events, latency_s, cpu, stack_cpu = (
            a - b for a, b in zip(now, self._last, strict=True))
        self._last = now
        return {"blocks": blocks, "events": events, "cpu_s": cpu, "stack_cpu_s": stack_cpu,
                "block_ms": latency_s / blocks * 1000 if blocks else None}


def measure(name: str, run: Callable[[], dict[str, Any]],
            server: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
    """One row: ``run``'s figures with the CPU each side spent per event."""
    if server is not None:
        server()
    before = thread_cpu_s()
    result = run()
    after = thread_cpu_s()
    events = result["entries"]
    result["client_cpu_us_per_event"] = {
        k: (after[k] - before[k]) / events * 1e6 for k in after}
    if server is not None:
        taken = server()
        result["server_events_per_block"] = taken["events"] / max(1.0, taken["blocks"])
        result["server_cpu_us_per_event"] = taken["cpu_s"] / events * 1e6
        if taken.get("block_ms") is not None:
            result["server_block_ms"] = taken["block_ms"]
        # every process's CPU per event, and the rate that much CPU allows on
        # this machine's cores if nothing else ran (a bound, not a forecast)
        servers_cpu = taken.get("stack_cpu_s", taken["cpu_s"]) / events * 1e6
        total = sum(result["client_cpu_us_per_event"].values()) + servers_cpu
        result["all_cpu_us_per_event"] = total
        result["cpu_bound_events_per_s"] = (os.cpu_count() or 1) / total * 1e6
    result["row"] = name
    result["load_average"] = os.getloadavg()[0]
    return result


async def each_timed_writes(manager: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The rolling window as ``benchmarks/pravega_write.py`` ran it before:
    a latency callback on every future and a routing key formatted per
    event (the Python thread's cost per event, against the sampled one)."""
    writer = manager.create_writer(SCOPE, STREAM, args.outstanding)
    payload = "p" * args.event_bytes
    latencies: list[float] = []
    window: collections.deque[asyncio.Future[None]] = collections.deque()
    clock = time.perf_counter
    started = clock()
    deadline = started + args.seconds
    i = 0
    while clock() < deadline:
        if len(window) >= args.outstanding:
            await window.popleft()
        t0 = clock()
        future = writer.write_event_async(payload, f"key-{i % ROUTING_KEYS}")
        future.add_done_callback(lambda _f, t0=t0: latencies.append((clock() - t0) * 1000.0))
        window.append(future)
        i += 1
    await asyncio.gather(*window)
    return summarize(latencies, clock() - started, args.event_bytes)


async def gathered_writes(manager: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Whole windows: ``args.outstanding`` futures handed out, then all
    gathered, then the next window (every 16th event timed)."""
    writer = manager.create_writer(SCOPE, STREAM, args.outstanding)
    write = writer.write_event_async
    payload = "p" * args.event_bytes
    latencies: list[float] = []
    clock = time.perf_counter
    started = clock()
    deadline = started + args.seconds
    i = 0
    while clock() < deadline:
        window = []
        for _ in range(args.outstanding):
            future = write(payload, ROUTING_KEY_NAMES[i % ROUTING_KEYS])
            if i % LATENCY_SAMPLE_EVERY == 0:
                t0 = clock()
                future.add_done_callback(
                    lambda _f, t0=t0: latencies.append((clock() - t0) * 1000.0))
            window.append(future)
            i += 1
        await asyncio.gather(*window)
    elapsed = clock() - started
    result = summarize(latencies, elapsed, args.event_bytes)
    result.update(entries=i, entries_per_s=i / elapsed)
    return result


def redis_row(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """XADD on a fresh redis-server (as ``pravega_write.py`` runs it)."""
    redis_args = argparse.Namespace(seconds=args.seconds, outstanding=args.outstanding,
                                    entry_bytes=args.event_bytes)
    with redis_server(directory) as port:
        result: dict[str, Any] = uvloop.run(bench_redis(port, redis_args, GOAL_REDIS_CLIENT,
                                                        lambda _s: None))
    shutil.rmtree(directory, ignore_errors=True)
    return result


def one_round(args: argparse.Namespace, null: NullEndpoint, null_manager: Any,
              full: FullStack, full_manager: Any, redis_dir: Path,
              progress: Progress) -> dict[str, dict[str, Any]]:
    runs: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], dict[str, Any]] | None]] = {
        "null/async/asyncio": (lambda: asyncio.run(real_client_writes(null_manager, args)),
                               null.take),
        "null/async/uvloop": (lambda: uvloop.run(real_client_writes(null_manager, args)),
                              null.take),
        "null/write_event": (lambda: real_client_inflight_writes(null_manager, args),
                             null.take),
        "full/async/asyncio": (lambda: asyncio.run(real_client_writes(full_manager, args)),
                               full.take),
        "full/async/uvloop": (lambda: uvloop.run(real_client_writes(full_manager, args)),
                              full.take),
        "redis": (lambda: redis_row(args, redis_dir), None),
        "null/async/uvloop/each-timed": (
            lambda: uvloop.run(each_timed_writes(null_manager, args)), null.take),
        "null/async/uvloop/gather": (
            lambda: uvloop.run(gathered_writes(null_manager, args)), null.take),
    }
    names = list(ROWS)
    if args.await_variants:
        names[3:3] = AWAIT_VARIANT_ROWS
    results = {}
    for name in names:
        run, server = runs[name]
        results[name] = measure(name, run, server)
        progress.note(_line(name, results[name]))
    return results


def _line(name: str, r: dict[str, Any]) -> str:
    latency = (f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
               if r.get("p50_ms") is not None else f"{'':<30}")
    cpu = r["client_cpu_us_per_event"]
    block = (f"  {r['server_events_per_block']:5.1f} ev/block  server "
             f"{r['server_cpu_us_per_event']:5.1f} us/ev" if "server_events_per_block" in r
             else "")
    if "server_block_ms" in r:
        block += f" {r['server_block_ms']:5.1f} ms/block"
    return (f"{name:<28} {r['entries_per_s']:>9,.0f} events/s  {latency}  client "
            f"py {cpu['python']:5.1f} + rust {cpu['rust']:5.1f} us/ev{block}  "
            f"(load {r['load_average']:.1f})")


def summarize_rounds(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per row: the median rate, each round's rate and ratio to that round's
    Redis rate, the median ratio, and medians of the other figures."""
    rows: dict[str, Any] = {}
    for name in rounds[0]:
        runs = [r[name] for r in rounds]
        ratios = [r[name]["entries_per_s"] / r["redis"]["entries_per_s"] for r in rounds]

        def median_of(key: str, runs: list[dict[str, Any]] = runs) -> float | None:
            values = [r[key] for r in runs if r.get(key) is not None]
            return statistics.median(values) if values else None
        row: dict[str, Any] = {
            "entries_per_s": median_of("entries_per_s"),
            "runs_entries_per_s": [r["entries_per_s"] for r in runs],
            "ratio_to_redis": statistics.median(ratios),
            "runs_ratio_to_redis": ratios,
            "p50_ms": median_of("p50_ms"), "p99_ms": median_of("p99_ms"),
            "client_cpu_us_per_event": {
                side: statistics.median(r["client_cpu_us_per_event"][side] for r in runs)
                for side in ("python", "rust")},
            "load_average": [r["load_average"] for r in runs],
        }
        if "server_events_per_block" in runs[0]:
            row["all_cpu_us_per_event"] = median_of("all_cpu_us_per_event")
            row["cpu_bound_events_per_s"] = median_of("cpu_bound_events_per_s")
            row["server_events_per_block"] = median_of("server_events_per_block")
            row["server_cpu_us_per_event"] = median_of("server_cpu_us_per_event")
            row["server_block_ms"] = median_of("server_block_ms")
        rows[name] = row
    ceiling = max(row["ratio_to_redis"] for name, row in rows.items()
                  if name.startswith("null/async/"))
    return {"rows": rows, "ceiling_ratio": ceiling, "goal": GOAL,
            "ceiling_reaches_goal": ceiling >= GOAL}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outstanding", type=int, default=1024)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--await-variants", action="store_true",
                        help="also await the null endpoint's futures in other ways")
    parser.add_argument("--tmpdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    progress = Progress(not args.quiet)
    root = Path(tempfile.mkdtemp(prefix="quire-pravega-ceiling-", dir=args.tmpdir))
    rounds = []
    try:
        with contextlib.ExitStack() as stack:
            progress.note("starting the null endpoint, the sandbox (3 bookies, a segment "
                          "store, the controller) and redis-server ...")
            null = stack.enter_context(null_endpoint(root / "null.log"))
            sandbox = Sandbox(root / "sandbox", bookies=3)
            sandbox.start()
            stack.callback(sandbox.stop)
            assert sandbox.controller is not None
            managers = []
            for uri in (null.controller_uri, sandbox.controller.uri):
                manager = pravega_client.StreamManager(uri)
                manager.create_scope(SCOPE)
                manager.create_stream(SCOPE, STREAM, args.segments)
                managers.append(manager)
            full = FullStack(sandbox)
            for i in range(args.rounds):
                progress.note(f"round {i + 1} of {args.rounds}: {args.seconds:g} s per row, "
                              f"{args.outstanding} outstanding")
                rounds.append(one_round(args, null, managers[0], full, managers[1],
                                        root / "redis", progress))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarize_rounds(rounds)
    params = {"seconds": args.seconds, "rounds": args.rounds, "outstanding": args.outstanding,
              "event_bytes": args.event_bytes, "segments": args.segments,
              "tier1": "E=3 W=3 A=2", "redis_client": str(GOAL_REDIS_CLIENT)}
    if args.json:
        print(json.dumps({"params": params, **summary, "rounds": rounds}, indent=2))
        return
    print(f"\n{args.event_bytes} B events, {args.outstanding} outstanding, {args.segments} "
          f"segments, {args.rounds} rounds of {args.seconds:g} s per row; medians, x = "
          "each round's rate over the same round's Redis XADD")
    for name, row in summary["rows"].items():
        latency = (f"p50 {row['p50_ms']:7.2f}  p99 {row['p99_ms']:7.2f} ms"
                   if row["p50_ms"] is not None else f"{'':<27}")
        cpu = row["client_cpu_us_per_event"]
        block = (f"  {row['server_events_per_block']:5.1f} ev/block"
                 if "server_events_per_block" in row else "")
        if row.get("server_block_ms") is not None:
            block += f", {row['server_block_ms']:.1f} ms each"
        if "cpu_bound_events_per_s" in row:
            block += (f"; all processes {row['all_cpu_us_per_event']:.1f} us/ev, "
                      f"<= {row['cpu_bound_events_per_s']:,.0f}/s on {os.cpu_count()} cores")
        runs = " ".join(f"{x:.2f}" for x in row["runs_ratio_to_redis"])
        print(f"{name:<28} {row['entries_per_s']:>9,.0f}/s {row['ratio_to_redis']:5.2f}x "
              f"({runs})  {latency}  client py {cpu['python']:5.1f} + rust "
              f"{cpu['rust']:5.1f} us/ev{block}")
    loads = [x for row in summary["rows"].values() for x in row["load_average"]]
    print(f"load average during the rows: {min(loads):.1f}-{max(loads):.1f}")
    verdict = "reaches" if summary["ceiling_reaches_goal"] else "does NOT reach"
    print(f"ceiling (best write_event_async row on the null endpoint) = "
          f"{summary['ceiling_ratio']:.2f}x Redis: {verdict} the {GOAL:.1f}x goal")


if __name__ == "__main__":
    main()
