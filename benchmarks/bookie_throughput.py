"""One bookie, 1 KiB PD adds, 256 outstanding: entries/s against raw fsync/s.

Prints, per run and as the median of three runs: acknowledged entries/s,
journal fsyncs/s and mean entries per fsync (from the bookie's /metrics), and
the disk's raw 4 KiB write+fsync rate measured in the same run on the same
directory.  Goals (issue 3): >= 20 entries per fsync on average, and
entries/s >= 20x the raw fsync rate.

    .venv/bin/python benchmarks/bookie_throughput.py [--seconds 10] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import FSYNC_COUNT, raw_fsync, scrape
from quire.errors import StatusCode
from quire.protocol import DigestManager, encode_add_request, master_key
from quire.sandbox import BookieProcess, sqlite_uri
from quire.types import DigestType
from tests.support.bookies import RawBookieClient

KEY = master_key(b"bench")


async def drive(address: str, seconds: float, outstanding: int, size: int) -> tuple[int, float]:
    client = await RawBookieClient.connect(address)
    digest = DigestManager(1, DigestType.CRC32C, b"bench")
    payload = os.urandom(size)
    next_entry = 0
    acked = 0
    done = asyncio.Event()
    deadline = time.perf_counter() + seconds
    in_flight = 0

    def send_one() -> None:
        nonlocal next_entry, in_flight
        rid = client.next_id()
        fut = asyncio.get_running_loop().create_future()
        client.waiting[rid] = fut
        assert client.transport is not None
        client.transport.write(encode_add_request(
            rid, KEY, digest.encode(next_entry, next_entry - 1, 0, payload)))
        next_entry += 1
        in_flight += 1
        fut.add_done_callback(on_ack)

    def on_ack(fut: asyncio.Future[object]) -> None:
        nonlocal acked, in_flight
        in_flight -= 1
        response = fut.result()
        if response.status != StatusCode.OK:  # type: ignore[attr-defined]
            raise SystemExit(f"add failed: {response}")
        acked += 1
        if time.perf_counter() < deadline:
            send_one()
        elif in_flight == 0:
            done.set()

    start = time.perf_counter()
    for _ in range(outstanding):
        send_one()
    await done.wait()
    elapsed = time.perf_counter() - start
    client.close()
    return acked, elapsed


def one_run(seconds: float, outstanding: int, size: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="quire-bench-", dir=os.getcwd()) as tmp:
        root = Path(tmp)
        raw = raw_fsync(root)["per_s"]
        bookie = BookieProcess(root, sqlite_uri(root / "meta.db"), "bench-bookie",
                               metrics_port=0, flush_interval_ms=1000)
        bookie.start()
        try:
            assert bookie.metrics_address
            names = (FSYNC_COUNT, "quire_bookie_entries_written_total")
            before = scrape(bookie.metrics_address, *names)
            acked, elapsed = asyncio.run(drive(bookie.address, seconds, outstanding, size))
            after = scrape(bookie.metrics_address, *names)
        finally:
            bookie.stop()
        fsyncs = after[FSYNC_COUNT] - before[FSYNC_COUNT]
        return {
            "entries_per_s": acked / elapsed,
            "fsyncs_per_s": fsyncs / elapsed,
            "entries_per_fsync": acked / fsyncs if fsyncs else float("inf"),
            "raw_fsync_per_s": raw,
            "ratio_entries_to_raw_fsync": (acked / elapsed) / raw,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        result = one_run(args.seconds, args.outstanding, args.entry_bytes)
        runs.append(result)
        if not args.json:
            print(f"run {i + 1}/{args.runs}: " + "  ".join(
                f"{k}={v:,.1f}" for k, v in result.items()), flush=True)
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if args.json:
        print(json.dumps({"runs": runs, "median": median}))
        return
    print(f"median of {args.runs}: " + "  ".join(f"{k}={v:,.1f}" for k, v in median.items()))
    print(f"goal entries/fsync >= 20: {median['entries_per_fsync']:.1f}; "
          f"goal entries/s >= 20x raw fsync/s: {median['ratio_entries_to_raw_fsync']:.1f}x")


if __name__ == "__main__":
    main()
