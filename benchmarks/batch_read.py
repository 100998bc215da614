"""BP-62: batch reads against single-entry reads and Redis XRANGE.

One run on a 3-bookie sandbox (ledgers E=W=3 A=2) holding 1,000,000 entries
of 100 bytes and 200,000 of 1 KiB, each entry size read four ways through the
Quire client:

- single-entry reads, one request at a time (capped at ``--single-cap-s``);
- pipelined single-entry reads, 128 outstanding (upstream's non-batch path);
- batch reads of 100 and of 1,000 entries, one batch at a time;

and, in the same run, Redis 7 XRANGE with COUNT 100 and 1,000 through
redis-py over a stream holding the same entries, once per reply parser in
``--redis-parsers``: ``python``, redis-py as ``pip install redis`` gives it
(a pure-Python client like Quire's), which the goal is set against, and
``hiredis``, its optional C parser, for reference.  Every variant runs once
per round (``--rounds``, default 3), interleaved; prints the median
entries/s and MB/s of each and the ratios of the medians.  Goals (issue 6):
batch(100) >= 5x pipelined single, >= 20x one-at-a-time single, >= 2x Redis
XRANGE COUNT 100 (python parser).

    .venv/bin/python benchmarks/batch_read.py [--small 1000000] [--large 200000]
        [--redis-parsers python,hiredis] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import (
    GOAL_REDIS_PARSER,
    REDIS_PARSERS,
    REDIS_PARSERS_HELP,
    median_run,
    parse_redis_parsers,
    redis_parser_class,
    redis_server,
)
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


def redis_load(r: Any, stream: str, count: int, size: int) -> None:
    payload = os.urandom(size)
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(stream, {"p": payload})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def redis_xrange(r: Any, stream: str, size: int, count_per_call: int) -> dict[str, float]:
    """The whole stream, ``count_per_call`` entries per XRANGE, each call
    starting just after the last id seen (an exclusive start, Redis >= 6.2)."""
    started = time.perf_counter()
    entries = 0
    low = "-"
    while True:
        got = r.xrange(stream, min=low, max="+", count=count_per_call)
        entries += len(got)
        if len(got) < count_per_call:
            break
        low = "(" + got[-1][0].decode()
    elapsed = time.perf_counter() - started
    return {"entries": entries, "seconds": elapsed, "entries_per_s": entries / elapsed,
            "mb_per_s": entries * size / elapsed / 1e6}


def run_async(fn: Callable[..., Coroutine[Any, Any, dict[str, float]]], *args: Any
              ) -> dict[str, float]:
    return uvloop.run(fn(*args))


def one_round(uri: str, ledger_id: int, clients: dict[str, Any], stream: str, count: int,
              size: int, single_cap_s: float) -> Iterator[tuple[str, dict[str, float]]]:
    """Every variant once, Redis (each parser's client in turn) between Quire's."""
    def xrange(count_per_call: int) -> list[tuple[str, Callable[[], dict[str, float]]]]:
        return [(f"redis XRANGE COUNT {count_per_call} ({parser})",
                 partial(redis_xrange, r, stream, size, count_per_call))
                for parser, r in clients.items()]

    steps: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("single, one at a time",
         partial(run_async, read_single_one_at_a_time, uri, ledger_id, single_cap_s)),
        ("single, 128 outstanding",
         partial(run_async, read_pipelined_single, uri, ledger_id, count - 1)),
        *xrange(100),
        ("batch(100)", partial(run_async, read_batches, uri, ledger_id, 100, 1)),
        ("batch(1000)", partial(run_async, read_batches, uri, ledger_id, 1000, 1)),
        *xrange(1000),
        ("batch(100), 4 outstanding", partial(run_async, read_batches, uri, ledger_id, 100, 4)),
    ]
    for label, step in steps:
        result = step()
        note(f"  {label:<40} {result['entries_per_s']:>12,.0f} entries/s")
        yield label, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000_000, help="100-byte entries")
    parser.add_argument("--large", type=int, default=200_000, help="1 KiB entries")
    parser.add_argument("--single-cap-s", type=float, default=20.0,
                        help="one-at-a-time single reads: seconds in all, over the rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-parsers", type=parse_redis_parsers,
                        default=",".join(REDIS_PARSERS),
                        help=REDIS_PARSERS_HELP)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import redis

    datasets = {"100B": (args.small, 100), "1KiB": (args.large, 1024)}
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        root = Path(tmp)
        sandbox = Sandbox(root / "sandbox", 3, write_cache_max_bytes=256 * 1024 * 1024)
        sandbox.start()
        try:
            with redis_server(root / "redis") as port:
                clients = {p: redis.Redis(connection_pool=redis.ConnectionPool(
                               port=port, parser_class=redis_parser_class(p, asyncio=False)))
                           for p in args.redis_parsers}
                r = next(iter(clients.values()))
                uri = sandbox.metadata_uri
                ledgers = {}
                for name, (count, size) in datasets.items():
                    note(f"loading {count:,} entries of {size} B into a ledger and a stream ...")
                    ledgers[name] = uvloop.run(load(uri, count, size))
                    redis_load(r, f"stream-{name}", count, size)
                # Every variant once per round, Redis between them: this VM's
                # speed drifts over minutes, and interleaving spreads the drift
                # over all variants instead of favouring whichever ran first.
                for round_no in range(1, args.rounds + 1):
                    for name, (count, size) in datasets.items():
                        note(f"round {round_no}/{args.rounds}, {name} ...")
                        for label, result in one_round(
                                uri, ledgers[name], clients, f"stream-{name}", count, size,
                                args.single_cap_s / args.rounds):
                            runs.setdefault(f"{name} {label}", []).append(result)
        finally:
            sandbox.stop()
    results = {label: median_run(rs) for label, rs in runs.items()}
    ratios: dict[str, Any] = {}
    for name in datasets:
        single = results[f"{name} single, one at a time"]["entries_per_s"]
        pipelined = results[f"{name} single, 128 outstanding"]["entries_per_s"]
        for variant in ("batch(100)", "batch(100), 4 outstanding"):
            rate = results[f"{name} {variant}"]["entries_per_s"]
            ratios[f"{name} {variant}"] = {
                "over_pipelined_single": rate / pipelined,
                "over_single_one_at_a_time": rate / single,
                **{f"over_redis_xrange100_{p}":
                   rate / results[f"{name} redis XRANGE COUNT 100 ({p})"]["entries_per_s"]
                   for p in args.redis_parsers},
            }
    if args.json:
        print(json.dumps({"rounds": args.rounds, "results": results, "ratios": ratios}))
        return
    print(f"medians of {args.rounds} interleaved rounds")
    for label, res in results.items():
        print(f"{label:<44} {res['entries_per_s']:>12,.0f} entries/s {res['mb_per_s']:>8.1f} MB/s")
    for name, ratio in ratios.items():
        against_redis = [
            f"{ratio[f'over_redis_xrange100_{p}']:.2f}x Redis XRANGE 100 ({p}, "
            + ("goal 2x)" if p == GOAL_REDIS_PARSER else "reference)")
            for p in args.redis_parsers]
        print(", ".join([f"{name}: {ratio['over_pipelined_single']:.1f}x pipelined single "
                         f"(goal 5x)",
                         f"{ratio['over_single_one_at_a_time']:.1f}x one-at-a-time (goal 20x)",
                         *against_redis]))


if __name__ == "__main__":
    main()
