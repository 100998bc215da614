"""Pieces the benchmark scripts share: the disk's raw fsync rate and latency,
scraping a bookie's /metrics, a Redis server, and the median of rounds."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import statistics
import subprocess
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


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median entries/s (of an even number, the upper one),
    with every run's entries/s added as ``runs_entries_per_s``."""
    ordered = sorted(runs, key=lambda r: r["entries_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["runs_entries_per_s"] = [r["entries_per_s"] for r in runs]
    return chosen
