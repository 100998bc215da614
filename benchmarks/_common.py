"""Pieces the benchmark scripts share: the disk's raw fsync rate and latency,
scraping a bookie's /metrics, a Redis server and redis-py's reply parsers,
the median of rounds, a progress line on stderr, and a local Spark session."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quire.sandbox import free_port

REDIS_SERVER = "/usr/bin/redis-server"


def raw_fsync(directory: Path, seconds: float = 2.0) -> dict[str, float]:
    """4 KiB write + fdatasync in a loop on ``directory``'s disk: the raw
    durable-write rate and its median latency."""
    path = directory / "fsync-probe"
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    latencies = []
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return {"per_s": len(latencies) / elapsed, "p50_ms": statistics.median(latencies) * 1000}


def scrape(metrics_address: str, *names: str) -> dict[str, float]:
    """The named samples (label-free) of one bookie's /metrics (0 if absent)."""
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    found = {}
    for name in names:
        m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
        found[name] = float(m.group(1)) if m else 0.0
    return found


FSYNC_COUNT = "quire_bookie_journal_fsync_latency_count"


def journal_fsyncs(metrics_addresses: list[str]) -> float:
    """Journal fsyncs so far, summed over bookies."""
    return sum(scrape(a, FSYNC_COUNT)[FSYNC_COUNT] for a in metrics_addresses)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    """A private redis-server: AOF with an fsync before every reply batch."""
    if not Path(REDIS_SERVER).exists():
        raise SystemExit(f"{REDIS_SERVER} not found (apt-get install redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = directory / "redis.log"
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
         "--appendonly", "yes", "--appendfsync", "always", "--save", "",
         "--daemonize", "no", "--protected-mode", "yes", "--logfile", str(log_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log = log_path.read_text(errors="replace") if log_path.exists() else ""
                raise SystemExit(f"redis-server did not start:\n{log[-2000:]}")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


REDIS_PARSERS = ("python", "hiredis")
"""redis-py's reply parsers the Redis baselines name, and (joined by commas,
so that argparse checks it like a given value) the default of
``--redis-parsers``.  ``python`` is redis-py as ``pip install redis`` gives
it, a pure-Python client like Quire's: the issues' goals are set against it
(:data:`GOAL_REDIS_PARSER`).  ``hiredis`` is its optional C parser
(``redis[hiredis]``, used whenever installed), measured for reference."""
GOAL_REDIS_PARSER = "python"
REDIS_PARSERS_HELP = ("redis-py reply parsers to measure, comma separated (default "
                      f"{','.join(REDIS_PARSERS)}; goals are checked against "
                      f"{GOAL_REDIS_PARSER})")


def parse_redis_parsers(text: str) -> tuple[str, ...]:
    """``--redis-parsers`` (an argparse type): comma-separated names of
    :data:`REDIS_PARSERS`, refused at start-up if hiredis is named and not
    installed (rather than after the Quire runs)."""
    from redis.utils import HIREDIS_AVAILABLE

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in REDIS_PARSERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(REDIS_PARSERS)}, got {text!r}")
    if "hiredis" in names and not HIREDIS_AVAILABLE:
        raise argparse.ArgumentTypeError(
            "the hiredis parser is not installed (scripts/setup installs it); "
            "or name only python")
    return names


def redis_parser_class(name: str, *, asyncio: bool) -> type:
    """redis-py's parser class for ``name``, one of the names
    :func:`parse_redis_parsers` accepted, for ``redis.asyncio`` or the
    blocking client.  Named explicitly because redis-py silently picks
    hiredis whenever it is installed."""
    from redis import _parsers  # underscore-named, but its __all__ exports these

    if name == "hiredis":
        return _parsers._AsyncHiredisParser if asyncio else _parsers._HiredisParser
    # RESP2's class: redis-py swaps in its RESP3 twin when the protocol is 3
    return _parsers._AsyncRESP2Parser if asyncio else _parsers._RESP2Parser


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median entries/s (of an even number, the upper one),
    with every run's entries/s added as ``runs_entries_per_s``."""
    ordered = sorted(runs, key=lambda r: r["entries_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["runs_entries_per_s"] = [r["entries_per_s"] for r in runs]
    return chosen


class Progress:
    """One self-overwriting status line on stderr (a plain line when not a tty)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()

    def __call__(self, label: str, snapshot: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = (f"[{label}] {snapshot['elapsed_s']:5.1f}s {snapshot['entries']:>10,} entries "
                f"{snapshot['entries_per_s']:>10,.0f}/s")
        if self.tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            print(("\n" if self.tty else "") + text, file=sys.stderr, flush=True)


async def write_closed_ledgers(uri: str, ledgers: int, entries_per_ledger: int,
                               entry_bytes: int, *, outstanding: int = 256,
                               quiet: bool = False) -> float:
    """Fill ``ledgers`` E3 W3 A2 ledgers one after the other, ``outstanding``
    appends in flight, and close each; return entries/s."""
    import asyncio

    from quire.client import Client

    client = await Client.connect(uri)
    try:
        payload = b"q" * entry_bytes
        started = time.monotonic()
        for n in range(ledgers):
            handle = await client.create_ledger(3, 3, 2, password=b"bench")
            window: set[asyncio.Future[int]] = set()
            for _ in range(entries_per_ledger):
                window.add(handle.append(payload))
                if len(window) >= outstanding:
                    done, window = await asyncio.wait(window,
                                                      return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        f.result()
            await asyncio.gather(*window)
            await handle.close()
            if not quiet:
                print(f"  written ledger {n + 1}/{ledgers}", file=sys.stderr, flush=True)
        return ledgers * entries_per_ledger / (time.monotonic() - started)
    finally:
        await client.close()


def local_spark_session(app: str, cores: int, root: Path) -> Any:
    """A ``local[cores]`` SparkSession for a benchmark: no UI or progress
    bar, on loopback, 2 GiB of driver memory, ``cores`` shuffle partitions,
    scratch under ``root/spark``, Python workers on this interpreter."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(f"local[{cores}]")
             .appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", str(cores))
             .config("spark.local.dir", str(root / "spark"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
