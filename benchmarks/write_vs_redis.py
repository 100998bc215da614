"""Quire durable appends against Redis 7 XADD with ``appendfsync always``.

Each system is measured alone on this machine (loopback only):

1. a 3-bookie sandbox (``quire.sandbox.Sandbox`` in a temporary directory)
   takes ``quire bench write`` (``quire.bench.bench_write``, in process, on
   uvloop) with PD_JOURNAL entries at E=W=A=1, then at E=3 W=3 A=2; the
   sandbox is stopped before Redis starts;
2. Debian's ``redis-server`` (started here on a free loopback port with a
   temporary directory, ``--appendonly yes --appendfsync always --save ""``)
   takes XADD of the same entries from redis-py (``redis.asyncio``), once
   per client in ``--redis-clients``, each named ``PARSER/PIPELINES``:

   - ``python/1``, the goals' baseline, is the issue's words taken as Redis
     means them: redis-py as ``pip install redis`` gives it (the pure-Python
     reply parser, a pure-Python client like Quire's) "pipelined 256 deep",
     one pipeline of 256 XADDs sent at once and answered at once, again and
     again, as ``redis-benchmark -P 256`` does;
   - ``python/4``, for reference: 4 pipelines of 64 on 4 connections, each
     re-sent as soon as it is answered, so that 192-256 XADDs are always in
     flight, like Quire's rolling window of 256 (a stricter baseline: Redis
     takes 1.2-1.7x the XADDs/s this way);
   - ``hiredis/4``, for reference: the same with redis-py's optional C
     parser (redis-py picks it silently whenever it is installed, so the
     parser is always named here).

Quire keeps ``--outstanding`` (256) entries in flight; each Redis pipeline
holds its share of them.  Both time each entry from the moment it is handed
to the client until its acknowledgement.

Both run in each of ``--rounds`` (default 3) rounds, Quire then Redis, so
that a drift of this machine's speed over minutes hits both alike.  Prints,
per system, the run with the median entries/s (latency p50/p99 from that
run), and per shape and Redis client the median of the rounds' Quire /
Redis ratios; those against ``python/1`` are checked against the goals
(E=W=A=1 >= 1.5x Redis, E=3 W=3 A=2 >= 1.0x Redis); ``--json`` prints one
JSON object instead.  Progress goes to stderr.

    .venv/bin/python benchmarks/write_vs_redis.py [--seconds 10] [--rounds 3] [--outstanding 256]
        [--entry-bytes 1024] [--shapes 1/1/1,3/3/2] [--redis-clients python/1,python/4,hiredis/4]
        [--skip-quire | --skip-redis] [--json] [--quiet]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import (
    GOAL_REDIS_PARSER,
    Progress,
    median_run,
    parse_redis_parsers,
    redis_parser_class,
    redis_server,
)
from quire.bench import WriteBenchParams, bench_write, summarize
from quire.client import Client
from quire.sandbox import Sandbox
from quire.types import LedgerType

SHAPES = ((1, 1, 1), (3, 3, 2))
GOALS = {"E=1 W=1 A=1": 1.5, "E=3 W=3 A=2": 1.0}


class RedisClient(NamedTuple):
    """How redis-py drives Redis: its reply parser, and how many pipelines
    share the outstanding window (each on its own connection)."""

    parser: str
    pipelines: int

    def __str__(self) -> str:
        return f"{self.parser}/{self.pipelines}"

    def depths(self, outstanding: int) -> list[int]:
        """Each pipeline's share of the ``outstanding`` window."""
        pipelines = min(self.pipelines, outstanding)
        return [outstanding // pipelines + (1 if i < outstanding % pipelines else 0)
                for i in range(pipelines)]

    def describe(self, outstanding: int) -> str:
        depths = self.depths(outstanding)
        shape = (f"1 pipeline x {outstanding}" if len(depths) == 1
                 else f"{len(depths)} pipelines x {max(depths)}")
        return f"{self.parser}, {shape}"


GOAL_REDIS_CLIENT = RedisClient(GOAL_REDIS_PARSER, 1)
"""The goals' baseline: redis-py "pipelined 256 deep" (the issue's words) as
Redis means it, one pipeline of the whole window per round trip."""
REDIS_CLIENTS = (GOAL_REDIS_CLIENT, RedisClient("python", 4), RedisClient("hiredis", 4))


def parse_redis_clients(text: str) -> tuple[RedisClient, ...]:
    """``--redis-clients`` (an argparse type): comma-separated
    ``PARSER/PIPELINES``, parsers as :func:`parse_redis_parsers` checks them."""
    clients = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        parser, _, pipelines = part.partition("/")
        if not pipelines.isdigit() or int(pipelines) < 1:
            raise argparse.ArgumentTypeError(
                f"expected PARSER/PIPELINES such as python/1, got {part!r}")
        parse_redis_parsers(parser)
        clients.append(RedisClient(parser, int(pipelines)))
    if not clients:
        raise argparse.ArgumentTypeError(f"no Redis client in {text!r}")
    return tuple(clients)


def shape_name(ensemble: int, write: int, ack: int) -> str:
    return f"E={ensemble} W={write} A={ack}"


def parse_shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    shapes = []
    for part in text.split(","):
        e, w, a = (int(x) for x in part.split("/"))
        shapes.append((e, w, a))
    return tuple(shapes)


# --- Quire --------------------------------------------------------------------


def run_quire(args: argparse.Namespace, root: Path, progress: Progress) -> dict[str, Any]:
    sandbox = Sandbox(root / "sandbox", bookies=3)
    progress.note("quire: starting a 3-bookie sandbox ...")
    sandbox.start()
    try:
        return uvloop.run(_quire_shapes(sandbox.metadata_uri, args, progress))
    finally:
        progress.note("quire: stopping the sandbox ...")
        sandbox.stop()


async def _quire_shapes(uri: str, args: argparse.Namespace,
                        progress: Progress) -> dict[str, Any]:
    client = await Client.connect(uri)
    results: dict[str, Any] = {}
    try:
        for ensemble, write, ack in args.shapes:
            name = shape_name(ensemble, write, ack)
            progress.note(f"quire {name}: {args.seconds:g} s of {args.entry_bytes} B "
                          f"PD_JOURNAL appends, {args.outstanding} outstanding")
            params = WriteBenchParams(
                ensemble_size=ensemble, write_quorum_size=write, ack_quorum_size=ack,
                entry_bytes=args.entry_bytes, outstanding=args.outstanding,
                duration_s=args.seconds, ledger_type=LedgerType.PD_JOURNAL)
            results[name] = await bench_write(
                client, params, lambda s, label=f"quire {name}": progress(label, s))
            progress.note(_line(f"quire {name}", results[name]))
    finally:
        await client.close()
    return results


# --- Redis --------------------------------------------------------------------




async def bench_redis(port: int, args: argparse.Namespace, redis_client: RedisClient,
                      progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    import redis.asyncio as aioredis

    depths = redis_client.depths(args.outstanding)
    pipelines = len(depths)
    payload = os.urandom(args.entry_bytes)
    pool = aioredis.ConnectionPool(
        host="127.0.0.1", port=port, max_connections=pipelines + 1,
        parser_class=redis_parser_class(redis_client.parser, asyncio=True))
    client = aioredis.Redis(connection_pool=pool)
    await client.ping()
    await client.config_set("appendfsync", "always")  # belt and braces: what we measure
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + args.seconds

    async def worker(n: int) -> None:
        pipe = client.pipeline(transaction=False)
        clock = time.perf_counter
        while clock() < deadline:
            handed = []  # each XADD's latency runs from when it is queued
            for _ in range(n):
                handed.append(clock())
                pipe.xadd("quire-bench", {"d": payload})
            await pipe.execute()
            done = clock()
            latencies.extend([(done - t) * 1000.0 for t in handed])

    async def report() -> None:
        last_n, last_t = 0, started
        while True:
            await asyncio.sleep(1.0)
            now, n = time.perf_counter(), len(latencies)
            progress({"elapsed_s": now - started, "entries": n,
                      "entries_per_s": (n - last_n) / (now - last_t)})
            last_n, last_t = n, now

    reporter = asyncio.create_task(report())
    try:
        await asyncio.gather(*(worker(n) for n in depths))
    finally:
        reporter.cancel()
    elapsed = time.perf_counter() - started
    length = await client.xlen("quire-bench")
    await client.aclose()
    if length != len(latencies):
        raise SystemExit(f"redis holds {length} entries, {len(latencies)} were acknowledged")
    return {**summarize(latencies, elapsed, args.entry_bytes), "pipelines": pipelines,
            "parser": redis_client.parser}


def run_redis(args: argparse.Namespace, redis_client: RedisClient, root: Path,
              progress: Progress) -> dict[str, Any]:
    """One run against a fresh redis-server (an empty AOF) driven by ``redis_client``."""
    described = redis_client.describe(args.outstanding)
    progress.note("redis: starting redis-server (appendonly yes, appendfsync always) ...")
    with redis_server(root / f"redis-{redis_client.parser}-{redis_client.pipelines}") as port:
        progress.note(f"redis: {args.seconds:g} s of {args.entry_bytes} B XADD, "
                      f"{args.outstanding} outstanding, {described}")
        result = uvloop.run(bench_redis(port, args, redis_client,
                                        lambda s: progress("redis", s)))
    progress.note(_line(f"redis ({described})", result))
    return result


# --- output -------------------------------------------------------------------


def _line(label: str, r: dict[str, Any]) -> str:
    return (f"{label:<40} {r['entries_per_s']:>9,.0f} entries/s {r['mb_per_s']:>6.1f} MB/s  "
            f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  ({r['entries']:,} entries "
            f"in {r['seconds']:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration per system/shape")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of Quire then Redis; figures are medians over them")
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                        help="Quire shapes as E/W/A, comma separated (default 1/1/1,3/3/2)")
    parser.add_argument(
        "--redis-clients", type=parse_redis_clients,
        default=",".join(map(str, REDIS_CLIENTS)),
        help="redis-py clients to measure, comma separated PARSER/PIPELINES (default "
             f"{','.join(map(str, REDIS_CLIENTS))}; goals are checked against "
             f"{GOAL_REDIS_CLIENT}, one pipeline holding the whole window)")
    parser.add_argument("--tmpdir", type=Path, default=None,
                        help="where sandbox and Redis keep their files (default: system temp)")
    skip = parser.add_mutually_exclusive_group()
    skip.add_argument("--skip-quire", action="store_true")
    skip.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    progress = Progress(not args.quiet)

    root = Path(tempfile.mkdtemp(prefix="quire-vs-redis-", dir=args.tmpdir))
    quire_rounds: list[dict[str, Any]] = []
    redis_rounds: dict[RedisClient, list[dict[str, Any]]] = {}
    try:
        for i in range(args.rounds):
            progress.note(f"round {i + 1}/{args.rounds}")
            here = root / f"round-{i + 1}"
            if not args.skip_quire:
                quire_rounds.append(run_quire(args, here, progress))
            if not args.skip_redis:
                for redis_client in args.redis_clients:
                    redis_rounds.setdefault(redis_client, []).append(
                        run_redis(args, redis_client, here, progress))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    names = list(quire_rounds[0]) if quire_rounds else []
    quire = {name: median_run([r[name] for r in quire_rounds]) for name in names}
    redis = {c: median_run(rs) for c, rs in redis_rounds.items()}
    # per Redis client, per shape: the rounds' Quire / Redis ratios
    round_ratios = {c: {name: [q[name]["entries_per_s"] / r["entries_per_s"]
                               for q, r in zip(quire_rounds, rs, strict=True)]
                        for name in names}
                    for c, rs in redis_rounds.items()}
    ratios = {c: {name: statistics.median(v) for name, v in by_shape.items()}
              for c, by_shape in round_ratios.items()}
    against = ratios.get(GOAL_REDIS_CLIENT, {})
    goals = {name: {"goal": goal, "ratio": against[name], "met": against[name] >= goal,
                    "rounds": round_ratios[GOAL_REDIS_CLIENT][name],
                    "redis_client": str(GOAL_REDIS_CLIENT)}
             for name, goal in GOALS.items() if name in against}
    if args.json:
        print(json.dumps({
            "params": {"seconds": args.seconds, "rounds": args.rounds,
                       "outstanding": args.outstanding, "entry_bytes": args.entry_bytes,
                       "redis_clients": [str(c) for c in args.redis_clients],
                       "ledger_type": LedgerType.PD_JOURNAL.value},
            "quire": quire, "redis": {str(c): r for c, r in redis.items()},
            "ratios": {str(c): r for c, r in ratios.items()}, "goals": goals}, indent=2))
        return
    print(f"\n{args.entry_bytes} B entries, {args.outstanding} outstanding, "
          f"{args.seconds:g} s per run, one system at a time; median run of {args.rounds}")
    for name, r in quire.items():
        print(_line(f"quire {name}", r))
    for c, r in redis.items():
        print(_line(f"redis XADD ({c.describe(args.outstanding)})", r))
    for c, by_shape in round_ratios.items():
        for name, rs in by_shape.items():
            rounds = ", ".join(f"{x:.2f}" for x in rs)
            goal = goals.get(name) if c == GOAL_REDIS_CLIENT else None
            verdict = (f"goal >= {goal['goal']:.1f}x: {'met' if goal['met'] else 'NOT met'}"
                       if goal else "reference, no goal")
            print(f"quire {name} / redis ({c}) = {ratios[c][name]:.2f}x, "
                  f"median of the rounds' ratios ({rounds})  ({verdict})")

if __name__ == "__main__":
    main()
