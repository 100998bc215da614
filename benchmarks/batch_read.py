"""BP-62: batch reads against single-entry reads and Redis XRANGE.

One run on a 3-bookie sandbox (ledgers E=W=3 A=2) holding 1,000,000 entries
of 100 bytes and 200,000 of 1 KiB, each entry size read four ways through the
Quire client:

- single-entry reads, one request at a time (capped at ``--single-cap-s``);
- pipelined single-entry reads, 128 outstanding (upstream's non-batch path);
- batch reads of 100 and of 1,000 entries, one batch at a time;

and, in the same run, Redis 7 XRANGE with COUNT 100 and 1,000 through
redis-py over a stream holding the same entries.  Prints entries/s and MB/s
for each and the ratios.  Goals (issue 6): batch(100) >= 5x pipelined single,
>= 20x one-at-a-time single, >= 2x Redis XRANGE COUNT 100.

    .venv/bin/python benchmarks/batch_read.py [--small 1000000] [--large 200000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import redis_server
from quire.bench import ReadBenchParams, bench_read
from quire.client import Client, ClientConfig
from quire.sandbox import Sandbox

PASSWORD = b"bench"


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def load(uri: str, count: int, size: int) -> int:
    client = await Client.connect(uri)
    try:
        ledger = await client.create_ledger(3, 3, 2, password=PASSWORD)
        payload = os.urandom(size)
        window: list[asyncio.Future[int]] = []
        started = time.perf_counter()
        for i in range(count):
            window.append(ledger.append(payload))
            if len(window) >= 512:
                await asyncio.gather(*window)
                window.clear()
            if i and i % 200_000 == 0:
                note(f"  loaded {i:,} entries of {size} B "
                     f"({i / (time.perf_counter() - started):,.0f}/s)")
        await asyncio.gather(*window)
        await ledger.close()
        return ledger.ledger_id
    finally:
        await client.close()


async def read_single_one_at_a_time(uri: str, ledger_id: int, cap_s: float) -> dict[str, float]:
    client = await Client.connect(uri)
    try:
        return await bench_read(client, ReadBenchParams(ledger_id, PASSWORD, batch=0, window=1,
                                                        duration_s=cap_s))
    finally:
        await client.close()


async def read_pipelined_single(uri: str, ledger_id: int, last: int) -> dict[str, float]:
    """read() with batch reads off: up to 128 single-entry reads on the wire."""
    client = await Client.connect(uri, ClientConfig(batch_read_enabled=False,
                                                    max_outstanding_reads=128))
    try:
        reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        started = time.perf_counter()
        entries = payload_bytes = 0
        for low in range(0, last + 1, 10_000):
            got = await reader.read(low, min(low + 9_999, last))
            entries += len(got)
            payload_bytes += sum(len(e.data) for e in got)
        elapsed = time.perf_counter() - started
        return {"entries": entries, "seconds": elapsed, "entries_per_s": entries / elapsed,
                "mb_per_s": payload_bytes / elapsed / 1e6}
    finally:
        await client.close()


async def read_batches(uri: str, ledger_id: int, batch: int, window: int) -> dict[str, float]:
    client = await Client.connect(uri)
    try:
        return await bench_read(client, ReadBenchParams(ledger_id, PASSWORD, batch=batch,
                                                        window=window))
    finally:
        await client.close()


def redis_results(port: int, datasets: dict[str, tuple[int, int]]) -> dict[str, dict[str, float]]:
    import redis

    r = redis.Redis(port=port)
    out = {}
    for name, (count, size) in datasets.items():
        stream = f"stream-{name}"
        payload = os.urandom(size)
        pipe = r.pipeline(transaction=False)
        for i in range(count):
            pipe.xadd(stream, {"p": payload})
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        for count_per_call in (100, 1000):
            started = time.perf_counter()
            entries = 0
            last_id = "-"
            while True:
                got = r.xrange(stream, min=last_id, max="+", count=count_per_call)
                if last_id != "-":
                    got = got[1:] if got and got[0][0] == last_id else got
                if not got:
                    break
                entries += len(got)
                last_id = got[-1][0]
                if len(got) < count_per_call - 1:
                    break
            elapsed = time.perf_counter() - started
            out[f"{name} redis XRANGE COUNT {count_per_call}"] = {
                "entries": entries, "seconds": elapsed, "entries_per_s": entries / elapsed,
                "mb_per_s": entries * size / elapsed / 1e6}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000_000, help="100-byte entries")
    parser.add_argument("--large", type=int, default=200_000, help="1 KiB entries")
    parser.add_argument("--single-cap-s", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    datasets = {"100B": (args.small, 100), "1KiB": (args.large, 1024)}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        root = Path(tmp)
        sandbox = Sandbox(root / "sandbox", 3, write_cache_max_bytes=256 * 1024 * 1024)
        sandbox.start()
        try:
            uri = sandbox.metadata_uri
            for name, (count, size) in datasets.items():
                note(f"loading {count:,} entries of {size} B into a ledger ...")
                ledger_id = uvloop.run(load(uri, count, size))
                note(f"{name}: single-entry reads, one at a time ...")
                results[f"{name} single, one at a time"] = uvloop.run(
                    read_single_one_at_a_time(uri, ledger_id, args.single_cap_s))
                note(f"{name}: pipelined single-entry reads, 128 outstanding ...")
                results[f"{name} single, 128 outstanding"] = uvloop.run(
                    read_pipelined_single(uri, ledger_id, count - 1))
                for batch in (100, 1000):
                    note(f"{name}: batch reads of {batch}, one at a time ...")
                    results[f"{name} batch({batch})"] = uvloop.run(
                        read_batches(uri, ledger_id, batch, 1))
                note(f"{name}: batch reads of 100, 4 outstanding ...")
                results[f"{name} batch(100), 4 outstanding"] = uvloop.run(
                    read_batches(uri, ledger_id, 100, 4))
        finally:
            sandbox.stop()
        note("Redis: loading the same entries and reading with XRANGE ...")
        with redis_server(root / "redis") as port:
            results.update(redis_results(port, datasets))
    ratios: dict[str, Any] = {}
    for name in datasets:
        single = results[f"{name} single, one at a time"]["entries_per_s"]
        pipelined = results[f"{name} single, 128 outstanding"]["entries_per_s"]
        redis100 = results[f"{name} redis XRANGE COUNT 100"]["entries_per_s"]
        for variant in ("batch(100)", "batch(100), 4 outstanding"):
            rate = results[f"{name} {variant}"]["entries_per_s"]
            ratios[f"{name} {variant}"] = {
                "over_pipelined_single": rate / pipelined,
                "over_single_one_at_a_time": rate / single,
                "over_redis_xrange100": rate / redis100,
            }
    if args.json:
        print(json.dumps({"results": results, "ratios": ratios}))
        return
    for label, r in results.items():
        print(f"{label:<34} {r['entries_per_s']:>12,.0f} entries/s {r['mb_per_s']:>8.1f} MB/s")
    for name, r in ratios.items():
        print(f"{name}: {r['over_pipelined_single']:.1f}x pipelined single (goal 5x), "
              f"{r['over_single_one_at_a_time']:.1f}x one-at-a-time (goal 20x), "
              f"{r['over_redis_xrange100']:.2f}x Redis XRANGE 100 (goal 2x)")


if __name__ == "__main__":
    main()
