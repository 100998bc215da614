"""Load generators behind ``quire bench`` (BookKeeper's BenchThroughputLatency style).

Latency is measured per entry from ``append()`` to its completion; a bounded
number of appends is outstanding across all ledgers at any time.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quire.types import DigestType, LedgerType

if TYPE_CHECKING:
    from quire.client import Client


@dataclass(frozen=True)
class WriteBenchParams:
    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    entry_bytes: int = 1024
    ledgers: int = 1
    outstanding: int = 256
    duration_s: float = 10.0
    count: int = 0
    """Stop after this many entries (0: run for ``duration_s``)."""
    ledger_type: LedgerType = LedgerType.PD_JOURNAL


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarize(latencies_ms: list[float], elapsed_s: float, entry_bytes: int) -> dict[str, float]:
    values = sorted(latencies_ms)
    n = len(values)
    return {
        "entries": n,
        "seconds": elapsed_s,
        "entries_per_s": n / elapsed_s if elapsed_s else 0.0,
        "mb_per_s": n * entry_bytes / elapsed_s / 1e6 if elapsed_s else 0.0,
        "p50_ms": percentile(values, 0.50),
        "p95_ms": percentile(values, 0.95),
        "p99_ms": percentile(values, 0.99),
        "max_ms": values[-1] if values else 0.0,
    }


async def bench_write(client: Client, params: WriteBenchParams,
                      progress: Callable[[dict[str, Any]], None] | None = None
                      ) -> dict[str, float]:
    handles = [await client.create_ledger(
        ensemble_size=params.ensemble_size, write_quorum_size=params.write_quorum_size,
        ack_quorum_size=params.ack_quorum_size, ledger_type=params.ledger_type,
        digest_type=DigestType.CRC32C, password=b"bench") for _ in range(params.ledgers)]
    payload = os.urandom(params.entry_bytes)
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    started = time.perf_counter()
    deadline = started + params.duration_s
    sent = 0
    in_flight = 0
    error: list[BaseException] = []

    def more() -> bool:
        if error:
            return False
        if params.count:
            return sent < params.count
        return time.perf_counter() < deadline

    def send() -> None:
        nonlocal sent, in_flight
        handle = handles[sent % len(handles)]
        sent += 1
        in_flight += 1
        t0 = time.perf_counter()
        handle.append(payload).add_done_callback(lambda f: done(f, t0))

    def done(future: asyncio.Future[int], t0: float) -> None:
        nonlocal in_flight
        in_flight -= 1
        if future.cancelled() or future.exception() is not None:
            error.append(future.exception() or asyncio.CancelledError())
        else:
            latencies.append((time.perf_counter() - t0) * 1000.0)
        if more():
            send()
        elif in_flight == 0 and not finished.done():
            finished.set_result(None)

    async def report() -> None:
        last_n, last_t = 0, started
        while True:
            await asyncio.sleep(1.0)
            now, n = time.perf_counter(), len(latencies)
            if progress is not None:
                progress({"elapsed_s": now - started, "entries": n,
                          "entries_per_s": (n - last_n) / (now - last_t)})
            last_n, last_t = n, now

    reporter = asyncio.create_task(report())
    for _ in range(min(params.outstanding, params.count or params.outstanding)):
        send()
    try:
        await finished
    finally:
        reporter.cancel()
    elapsed = time.perf_counter() - started
    if error:
        raise error[0]
    for handle in handles:
        await handle.close()
    return summarize(latencies, elapsed, params.entry_bytes)
