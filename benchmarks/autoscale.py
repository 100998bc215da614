"""Auto-scaling with the real Pravega client: how soon a hot stream splits
and a cold one merges, and what the split does to the rates.

A sandbox (``--bookies`` bookie processes, a segment store, a controller;
auto-scaling windows, cooldown and mute of ``--autoscale-interval-s``)
and one stream created by the PyPI ``pravega`` client with an event-rate
policy (``--target`` events/s per segment, scale factor 2, one segment to
start).  The client writes 100 B events (``--event-bytes``) over
``--keys`` routing keys with ``write_event_async`` at ``--rate`` events/s
(0: as fast as ``--outstanding`` futures allow) for ``--seconds``, then
stops; a reader group reads everything once the stream merged back.

What the client promises, and so how the load writes: the Pravega client
keeps a routing key's events in the order they enter its ``EventWriter``;
the Python binding (``pravega`` 0.3.8) promises only exactly once for
``write_event_async``.  Each call there becomes its own task on the
binding's multi-threaded tokio runtime (pyo3-asyncio's ``future_into_py``),
which takes the writer's lock and enqueues the event whenever it is
scheduled, so two calls in flight may enter in either order.  Measured
(issue 40) on a fixed one-segment stream, no scaling: 20,000 events over
64 keys with up to 1,024 calls in flight came back with every key out of
order; the synchronous ``write_event``, which enqueues before it returns,
came back in order, also with 1,024 events in flight
(``max_inflight_events``) and across a scale.  So the load chains each
key's writes: a key's next event is handed to the client once its previous
one is acknowledged.  Asynchronous still, but at most ``--keys`` writes are
in the client at once: the rate the load can reach is ``--keys`` over the
write latency (about 2,300 events/s with 64 keys on a loaded two-core
machine, one bookie).

Reported (``--json``: one JSON object):

- ``split_after_s``: from the load's start (the rate crossing the target,
  from nothing) to the first split, as the controller records it;
- ``successor_rates``: each successor's event rate over the rest of the
  load (its length growth), against the target;
- ``acked_before`` / ``acked_after``: the acknowledged events/s before the
  split and after it (the rest of the load), and their ratio (on one
  machine more segments add no CPU: it should not fall below 0.9);
- ``merged_after_s``: from the load's end to the stream back at one segment;
- ``read``: events/s of the reader group reading everything, every event
  once and in order per key (checked);
- the scaling history.

    .venv/bin/python benchmarks/autoscale.py [--autoscale-interval-s 10] [--target 1000]
        [--rate 3000] [--seconds 60] [--keys 64] [--bookies 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pravega_client

from benchmarks._common import Progress
from quire.sandbox import Sandbox
from quire.streams import ControllerClient, RemoteSegmentStore, controller_resolver

SCOPE, STREAM = "bench", "autoscaled"
HEADER_BYTES = 8


async def _describe(uri: str) -> dict[str, Any]:
    async with ControllerClient(uri) as controller:
        found: dict[str, Any] = await controller.admin("describeStream",
                                                       {"scope": SCOPE, "stream": STREAM})
        return found


async def _lengths(uri: str, ids: list[int]) -> dict[int, int]:
    async with ControllerClient(uri) as controller:
        segments = RemoteSegmentStore(controller_resolver(controller))
        try:
            infos = await asyncio.gather(*(segments.get_info(
                f"{SCOPE}/{STREAM}/{sid & 0xFFFF_FFFF}.#epoch.{sid >> 32}") for sid in ids))
        finally:
            await segments.close()
        return {sid: i.length for sid, i in zip(ids, infos, strict=True)}


def describe(uri: str) -> dict[str, Any]:
    return asyncio.run(_describe(uri))


async def write_load(writer: pravega_client.StreamWriter, args: argparse.Namespace,
                     numbers: dict[str, int], acked: list[float]) -> None:
    """``write_event_async`` at ``args.rate`` (0: a window of outstanding
    futures) for ``args.seconds``; each acknowledgement's time into ``acked``.
    A key's event enters the client only after the key's previous one is
    acknowledged (see the module's docstring): per-key order."""
    payload = "x" * max(0, args.event_bytes - 16)
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending: set[asyncio.Future[Any]] = set()
    last: dict[str, asyncio.Future[Any]] = {}  # each key's newest write

    async def write(after: asyncio.Future[Any] | None, event: str, key: str) -> None:
        if after is not None:
            await after
        await writer.write_event_async(event, key)

    sent = 0
    while loop.time() - start < args.seconds:
        if args.rate:
            due = int((loop.time() - start) * args.rate)
            if sent >= due:
                await asyncio.sleep(0.001)  # the load's pace
                continue
        elif len(pending) >= args.outstanding:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            continue
        key = f"k{sent % args.keys}"
        n = numbers.get(key, 0)
        numbers[key] = n + 1
        future = asyncio.ensure_future(write(last.get(key), f"{key}:{n}:{payload}", key))
        last[key] = future
        future.add_done_callback(lambda _f: acked.append(time.monotonic()))
        pending.add(future)
        future.add_done_callback(pending.discard)
        sent += 1
    if pending:
        await asyncio.gather(*pending)


async def read_all(group: pravega_client.StreamReaderGroup, total: int) -> list[str]:
    reader = group.create_reader("bench-reader")
    got: list[str] = []
    try:
        while len(got) < total:
            piece = await asyncio.wait_for(reader.get_segment_slice_async(), 60)
            got += [event.data().decode() for event in piece]
            reader.release_segment(piece)
    finally:
        reader.reader_offline()
    return got


def read_check(by_key: dict[str, list[int]], numbers: dict[str, int]) -> dict[str, int]:
    """What a read got wrong: events missing, read more than once, and keys
    whose events came out of order (each 0 when it read exactly once, in order)."""
    missing = duplicated = out_of_order = 0
    for key, n in numbers.items():
        got = by_key.get(key, [])
        seen = set(got)
        missing += sum(1 for i in range(n) if i not in seen)
        duplicated += len(got) - len(seen)
        out_of_order += any(b < a for a, b in itertools.pairwise(got))
    return {"missing": missing, "duplicated": duplicated, "out_of_order_keys": out_of_order}


def rate_between(times: list[float], start: float, end: float) -> float:
    inside = sum(1 for t in times if start <= t < end)
    return inside / (end - start) if end > start else 0.0


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="quire-autoscale-"))
    cluster = Sandbox(directory, bookies=args.bookies,
                      autoscale_interval_s=args.autoscale_interval_s)
    cluster.start()
    try:
        uri = cluster.controller_uri
        manager = pravega_client.StreamManager(uri)
        manager.create_scope(SCOPE)
        policy = pravega_client.StreamScalingPolicy.auto_scaling_policy_by_event_rate(
            args.target, 2, 1)
        manager.create_stream_with_policy(SCOPE, STREAM, policy,
                                          pravega_client.StreamRetentionPolicy.none(), [])
        group = manager.create_reader_group("bench", SCOPE, STREAM)
        writer = manager.create_writer(SCOPE, STREAM)
        numbers: dict[str, int] = {}
        acked: list[float] = []
        progress.note(f"writing for {args.seconds} s")
        wall_start, start = time.time() * 1000, time.monotonic()
        asyncio.run(write_load(writer, args, numbers, acked))
        end, wall_end = time.monotonic(), time.time() * 1000
        epochs = describe(uri)["epochs"]
        splits = [e for e in epochs if e["reason"] == "auto-split"]
        result: dict[str, Any] = {"target": args.target, "rate": args.rate,
                                  "events": sum(numbers.values())}
        if splits:
            split_at = splits[0]["created_ms"]
            result["split_after_s"] = (split_at - wall_start) / 1000
            split_mono = start + (split_at - wall_start) / 1000
            result["acked_before"] = rate_between(acked, start, split_mono)
            result["acked_after"] = rate_between(acked, split_mono, end)
            if result["acked_before"]:
                result["acked_ratio"] = result["acked_after"] / result["acked_before"]
            first = splits[0]
            created = [s["id"] for s in first["segments"]
                       if s["id"] >> 32 == first["epoch"]]
            lengths = asyncio.run(_lengths(uri, created))
            seconds = max(0.001, (wall_end - split_at) / 1000)
            result["successor_rates"] = {
                str(sid): length / (args.event_bytes + HEADER_BYTES) / seconds
                for sid, length in lengths.items()}
        progress.note("waiting for the merge")
        deadline = time.monotonic() + args.merge_timeout_s
        while time.monotonic() < deadline:
            found = describe(uri)
            if len(found["epochs"][-1]["segments"]) == 1 and len(found["epochs"]) > 1:
                result["merged_after_s"] = (found["epochs"][-1]["created_ms"] - wall_end) / 1000
                break
            time.sleep(0.25)  # polling the controller, with a deadline
        result["history"] = [(e["epoch"], e["reason"], len(e["segments"]))
                             for e in describe(uri)["epochs"]]
        progress.note("reading")
        read_start = time.monotonic()
        got = asyncio.run(read_all(group, result["events"]))
        result["read"] = len(got) / (time.monotonic() - read_start)
        by_key: dict[str, list[int]] = {}
        for data in got:
            key, n, _ = data.split(":", 2)
            by_key.setdefault(key, []).append(int(n))
        result["read_exactly_once_in_order"] = \
            by_key == {k: list(range(n)) for k, n in numbers.items()}
        result["read_check"] = read_check(by_key, numbers)
        return result
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--autoscale-interval-s", type=int, default=10)
    parser.add_argument("--target", type=int, default=1000, help="events/s per segment")
    parser.add_argument("--rate", type=int, default=3000, help="events/s written (0: all)")
    parser.add_argument("--outstanding", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--keys", type=int, default=128)
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--merge-timeout-s", type=float, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    result = run(args, Progress(not args.quiet))
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
