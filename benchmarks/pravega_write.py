"""The real Pravega client (PyPI ``pravega`` 0.3.8) writing to Quire, against
Redis 7 XADD with ``appendfsync always``, in the same run.

1. A ``quire.sandbox.Sandbox`` in a temporary directory: 3 bookie processes,
   a segment store process (tier-1 ledgers E=3 W=3 A=2) and the controller
   process.  A stream of ``--segments`` (3) segments is created;
2. the real client (``StreamManager.create_writer``) writes ``--seconds`` of
   ``--event-bytes`` (100) B events with ``write_event_async``, routing keys
   ``key-<i % 1000>``, keeping ``--outstanding`` (1024) futures in flight, on
   uvloop (asyncio's own loop halves the client's rate); the latency, from
   the call to the acknowledgement, is taken of every 16th event;
3. Quire's own ``StreamWriter`` (``quire.streams``) on the same stream, the
   same way;
4. a reader group of one reader (the real client) reads every event of the
   stream from the head: events/s, against the write rates;
5. the sandbox is stopped and ``redis-server`` started (a free loopback port,
   a temporary directory, ``--appendonly yes --appendfsync always``), taking
   XADD of the same payloads for ``--seconds`` from redis-py with the hiredis
   parser (``benchmarks.write_vs_redis.bench_redis``), pipelined: one
   pipeline of the whole window (``hiredis/1``, the goal's baseline) and 4
   pipelines sharing it (``hiredis/4``, for reference).

2b. the real client again with ``max_inflight_events=--outstanding`` and
   the blocking ``write_event``, which then waits only when that many are
   unacknowledged: no Python future per event (each future's completion
   costs the binding a GIL hand-off, which caps 2.); its rate only (a timed
   ``write_event_async`` mixed in deadlocks the binding, see
   :func:`real_client_inflight_writes`);

Prints a table and each writer's ratio to Redis (``hiredis/1``), goal
>= 1.5x; ``--json`` prints one JSON object instead.  Progress goes to stderr.
The client's blocking calls hold the GIL, so every server runs in its own
process; only the client (awaited on this process's event loop) runs here.

    .venv/bin/python benchmarks/pravega_write.py [--seconds 10] [--outstanding 1024]
        [--event-bytes 100] [--segments 3] [--json] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pravega_client
import uvloop

from benchmarks._common import Progress, redis_server
from benchmarks.write_vs_redis import RedisClient, bench_redis
from quire.bench import summarize
from quire.sandbox import Sandbox
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    StreamWriter,
    controller_resolver,
)

SCOPE, STREAM = "bench", "events"
GOAL = 1.5
GOAL_REDIS_CLIENT = RedisClient("hiredis", 1)
REDIS_CLIENTS = (GOAL_REDIS_CLIENT, RedisClient("hiredis", 4))
ROUTING_KEYS = 1000
ROUTING_KEY_NAMES = [f"key-{i}" for i in range(ROUTING_KEYS)]
LATENCY_SAMPLE_EVERY = 16
"""The real client's latency is taken of every 16th event."""


async def real_client_writes(manager: pravega_client.StreamManager,
                             args: argparse.Namespace) -> dict[str, Any]:
    """The real client's ``write_event_async`` for ``args.seconds``, keeping
    ``args.outstanding`` of its futures in flight: when the window is full
    the oldest is awaited (futures, not a task per event: the client's
    completions already cost a GIL hand-off each).  Every future is awaited
    (a failed write raises); the latency (call to completion) is taken of
    every ``LATENCY_SAMPLE_EVERY``-th event, as a callback per event would
    add about 5 us of Python per event on the thread that also drives the
    client (``docs/performance.md``, "The real Pravega client's ceiling").
    Run it on uvloop: asyncio's own loop doubles the binding's cost per
    completion (its ``call_soon_threadsafe`` writes to the self-pipe each
    time)."""
    writer = manager.create_writer(SCOPE, STREAM, args.outstanding)
    write = writer.write_event_async
    payload = "p" * args.event_bytes  # write_event_async takes str (UTF-8 on the wire)
    latencies: list[float] = []
    window: collections.deque[asyncio.Future[None]] = collections.deque()
    clock = time.perf_counter
    started = clock()
    deadline = started + args.seconds
    i = 0
    while clock() < deadline:
        if len(window) >= args.outstanding:
            await window.popleft()
        future = write(payload, ROUTING_KEY_NAMES[i % ROUTING_KEYS])
        if i % LATENCY_SAMPLE_EVERY == 0:
            t0 = clock()
            future.add_done_callback(
                lambda _f, t0=t0: latencies.append((clock() - t0) * 1000.0))
        window.append(future)
        i += 1
    # gather's own callbacks run after the latency callbacks registered before them
    await asyncio.gather(*window)
    elapsed = clock() - started
    sampled = (i + LATENCY_SAMPLE_EVERY - 1) // LATENCY_SAMPLE_EVERY
    if len(latencies) != sampled:
        raise SystemExit(f"the real client completed {len(latencies)} of {sampled} "
                         "sampled events")
    result = summarize(latencies, elapsed, args.event_bytes)
    result.update(entries=i, entries_per_s=i / elapsed,
                  mb_per_s=i * args.event_bytes / elapsed / 1e6,
                  latency_samples=len(latencies))
    return result


def real_client_inflight_writes(manager: pravega_client.StreamManager,
                                args: argparse.Namespace) -> dict[str, Any]:
    """The real client with ``max_inflight_events=args.outstanding``: its
    blocking ``write_event`` then returns without waiting for the ack (it
    waits only when that many are unacknowledged), so no future is made per
    event.  The rate counts the events the final ``flush`` saw acknowledged.
    No latency: a ``write_event_async`` mixed in to time a sample deadlocks
    the binding (the blocking call holds the GIL, which completing the
    sample's future needs before the client handles further acks)."""
    writer = manager.create_writer(SCOPE, STREAM, args.outstanding)
    payload = "i" * args.event_bytes
    clock = time.perf_counter
    started = clock()
    deadline = started + args.seconds
    i = 0
    while clock() < deadline:
        writer.write_event(payload, f"key-{i % ROUTING_KEYS}")
        i += 1
    writer.flush()
    elapsed = clock() - started
    return {"entries": i, "seconds": elapsed, "entries_per_s": i / elapsed,
            "mb_per_s": i * args.event_bytes / elapsed / 1e6, "p50_ms": None, "p99_ms": None}


async def quire_writes(controller_uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Quire's StreamWriter on the same stream, the same way."""
    controller = ControllerClient(controller_uri)
    segments = RemoteSegmentStore(controller_resolver(controller))
    writer = StreamWriter(controller, segments, SCOPE, STREAM)
    await writer.start()
    payload = b"q" * args.event_bytes
    latencies: list[float] = []
    window = asyncio.Semaphore(args.outstanding)
    clock = time.perf_counter

    def acked(t0: float, _future: asyncio.Future[None]) -> None:
        latencies.append((clock() - t0) * 1000.0)
        window.release()

    started = clock()
    deadline = started + args.seconds
    i = 0
    try:
        while clock() < deadline:
            await window.acquire()
            t0 = clock()
            writer.write_event(payload, f"key-{i % ROUTING_KEYS}").add_done_callback(
                lambda f, t0=t0: acked(t0, f))
            i += 1
        await writer.flush()
        elapsed = clock() - started
    finally:
        await writer.close()
        await segments.close()
        await controller.close()
    if len(latencies) != i:
        raise SystemExit(f"Quire's writer acknowledged {len(latencies)} of {i} events")
    return summarize(latencies, elapsed, args.event_bytes)


async def reader_group_reads(manager: pravega_client.StreamManager, total: int,
                             timeout_s: float) -> dict[str, Any]:
    """A reader group of one reader (the real client) reads all ``total``
    events from the head."""
    group = manager.create_reader_group("bench-readers", SCOPE, STREAM)
    reader = group.create_reader("reader-1")
    read = 0
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            while read < total:
                piece = await reader.get_segment_slice_async()
                read += sum(1 for _ in piece)
                reader.release_segment(piece)
    finally:
        reader.reader_offline()
    elapsed = time.perf_counter() - started
    return {"events": read, "seconds": elapsed, "events_per_s": read / elapsed}


def run_quire(args: argparse.Namespace, root: Path, progress: Progress) -> dict[str, Any]:
    sandbox = Sandbox(root / "sandbox", bookies=3)
    progress.note("quire: starting 3 bookies, a segment store and the controller ...")
    sandbox.start()
    try:
        assert sandbox.controller is not None
        uri = sandbox.controller.uri
        manager = pravega_client.StreamManager(uri)
        manager.create_scope(SCOPE)
        manager.create_stream(SCOPE, STREAM, args.segments)
        progress.note(f"pravega client: {args.seconds:g} s of {args.event_bytes} B "
                      f"write_event_async, {args.outstanding} outstanding")
        real = uvloop.run(real_client_writes(manager, args))
        progress.note(_line("pravega client write_event_async", real))
        progress.note(f"pravega client: {args.seconds:g} s of write_event, "
                      f"max_inflight_events={args.outstanding}")
        inflight = real_client_inflight_writes(manager, args)
        progress.note(_line("pravega client write_event (inflight)", inflight))
        progress.note(f"quire StreamWriter: {args.seconds:g} s, same stream")
        own = uvloop.run(quire_writes(uri, args))
        progress.note(_line("quire StreamWriter", own))
        total = real["entries"] + inflight["entries"] + own["entries"]
        progress.note(f"reader group: reading {total:,} events from the head")
        read = asyncio.run(reader_group_reads(manager, total, timeout_s=120 + total / 1000))
        return {"pravega_client": real, "pravega_client_inflight": inflight,
                "quire_stream_writer": own, "reader_group": read}
    finally:
        progress.note("quire: stopping the sandbox ...")
        sandbox.stop()


def run_redis(args: argparse.Namespace, root: Path, progress: Progress
              ) -> dict[str, dict[str, Any]]:
    results = {}
    redis_args = argparse.Namespace(seconds=args.seconds, outstanding=args.outstanding,
                                    entry_bytes=args.event_bytes)
    for client in REDIS_CLIENTS:
        progress.note(f"redis: {args.seconds:g} s of XADD ({client.describe(args.outstanding)})")
        with redis_server(root / f"redis-{client.parser}-{client.pipelines}") as port:
            results[str(client)] = uvloop.run(bench_redis(port, redis_args, client,
                                                          lambda s: progress("redis", s)))
        progress.note(_line(f"redis XADD ({client})", results[str(client)]))
    return results


def _line(label: str, r: dict[str, Any]) -> str:
    latency = ("p50 {:7.2f} ms  p99 {:7.2f} ms".format(r["p50_ms"], r["p99_ms"])
               if r["p50_ms"] is not None else f"{'(latency not measured)':<30}")
    return (f"{label:<38} {r['entries_per_s']:>9,.0f} events/s  {latency}  "
            f"({r['entries']:,} in {r['seconds']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each writer")
    parser.add_argument("--outstanding", type=int, default=1024)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--tmpdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    progress = Progress(not args.quiet)
    root = Path(tempfile.mkdtemp(prefix="quire-pravega-write-", dir=args.tmpdir))
    try:
        quire = run_quire(args, root, progress)
        redis = run_redis(args, root, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    baseline = redis[str(GOAL_REDIS_CLIENT)]["entries_per_s"]
    writers = {"pravega_client": "pravega client write_event_async",
               "pravega_client_inflight": "pravega client write_event (inflight)",
               "quire_stream_writer": "quire StreamWriter"}
    goals = {name: {"ratio": quire[name]["entries_per_s"] / baseline, "goal": GOAL,
                    "met": quire[name]["entries_per_s"] / baseline >= GOAL,
                    "redis_client": str(GOAL_REDIS_CLIENT)} for name in writers}
    read = quire["reader_group"]
    read_vs_write = read["events_per_s"] / quire["pravega_client"]["entries_per_s"]
    if args.json:
        print(json.dumps({
            "params": {"seconds": args.seconds, "outstanding": args.outstanding,
                       "event_bytes": args.event_bytes, "segments": args.segments,
                       "tier1": "E=3 W=3 A=2"},
            **quire, "redis": redis, "read_vs_client_write": read_vs_write,
            "goals": goals}, indent=2))
        return
    print(f"\n{args.event_bytes} B events, {args.outstanding} outstanding, {args.seconds:g} s "
          f"per writer, {args.segments}-segment stream, tier-1 E=3 W=3 A=2")
    for name, label in writers.items():
        print(_line(label, quire[name]))
    for name, r in redis.items():
        print(_line(f"redis XADD ({name})", r))
    print(f"{'pravega reader group (1 reader)':<38} {read['events_per_s']:>9,.0f} events/s  "
          f"({read['events']:,} in {read['seconds']:.1f} s; {read_vs_write:.2f}x "
          "write_event_async's rate)")
    print("(inflight: write_event with max_inflight_events, rate only: see 2b.)")
    for name, label in writers.items():
        goal = goals[name]
        print(f"{label} / redis ({GOAL_REDIS_CLIENT}) = {goal['ratio']:.2f}x  "
              f"(goal >= {GOAL:.1f}x: {'met' if goal['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
