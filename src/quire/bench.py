"""Load generators behind ``quire bench`` (BookKeeper's BenchThroughputLatency style).

Latency is measured per entry from ``append()`` to its completion; a bounded
number of appends is outstanding across all ledgers at any time.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from quire.types import DigestType, LedgerType

if TYPE_CHECKING:
    from quire.client import Client


BENCH_LEDGER_PASSWORD = b"bench"
"""The password of the throwaway ledgers :func:`bench_write` makes, and what
:func:`bench_read` opens with by default: not a secret (anyone may read a
benchmark's random payloads), so it may live here."""


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


async def report_progress(progress: Callable[[dict[str, Any]], None] | None, started: float,
                          count: Callable[[], int]) -> None:
    """Every second, ``progress`` gets elapsed time, entries so far and the
    last second's rate (until cancelled)."""
    last_n, last_t = 0, started
    while True:
        await asyncio.sleep(1.0)
        now, n = time.perf_counter(), count()
        if progress is not None:
            progress({"elapsed_s": now - started, "entries": n,
                      "entries_per_s": (n - last_n) / (now - last_t)})
        last_n, last_t = n, now


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
        digest_type=DigestType.CRC32C, password=BENCH_LEDGER_PASSWORD)
        for _ in range(params.ledgers)]
    payload = os.urandom(params.entry_bytes)
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    started = time.perf_counter()
    deadline = started + params.duration_s
    sent = 0
    in_flight = 0
    error: list[BaseException] = []

    perf_counter = time.perf_counter
    context = contextvars.copy_context()
    """One context for every completion callback: without it each
    add_done_callback copies the current one, a cost of this load generator
    that would count against the client it shares a process with."""

    def more(now: float) -> bool:
        if error:
            return False
        if params.count:
            return sent < params.count
        return now < deadline

    def send(t0: float) -> None:
        nonlocal sent, in_flight
        handle = handles[sent % len(handles)]
        sent += 1
        in_flight += 1
        handle.append(payload).add_done_callback(partial(done, t0), context=context)

    def done(t0: float, future: asyncio.Future[int]) -> None:
        # One clock read per completion: this entry's latency, the deadline
        # check, and the next entry's start (the load generator's own cost
        # counts against the client process it shares).
        nonlocal in_flight
        now = perf_counter()
        in_flight -= 1
        if future.cancelled() or future.exception() is not None:
            error.append(future.exception() or asyncio.CancelledError())
        else:
            latencies.append((now - t0) * 1000.0)
        if more(now):
            send(now)
        elif in_flight == 0 and not finished.done():
            finished.set_result(None)

    reporter = asyncio.create_task(report_progress(progress, started, lambda: len(latencies)))
    for _ in range(min(params.outstanding, params.count or params.outstanding)):
        send(perf_counter())
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


@dataclass(frozen=True)
class ReadBenchParams:
    ledger_id: int
    password: bytes = BENCH_LEDGER_PASSWORD
    first_entry_id: int = 0
    last_entry_id: int = -1
    """-1: the ledger's LAC / last entry."""
    batch: int = 100
    """Entries per BATCH_READ_ENTRY; 0: single-entry reads."""
    window: int = 1
    """Requests kept outstanding (single reads: 1 = one at a time)."""
    max_batch_bytes: int = 0
    duration_s: float = 0.0
    """Stop after this long even if the range is not done (0: no limit)."""


async def bench_read(client: Client, params: ReadBenchParams,
                     progress: Callable[[dict[str, Any]], None] | None = None
                     ) -> dict[str, float]:
    """Read a ledger range once; per-request latency, entries/s and MB/s."""
    reader = await client.open_ledger(params.ledger_id, password=params.password,
                                      recovery=False)
    last = params.last_entry_id
    if last < 0:
        last = await reader.read_last_add_confirmed()
    first = params.first_entry_id
    latencies: list[float] = []
    entries = 0
    payload_bytes = 0
    started = time.perf_counter()
    deadline = started + params.duration_s if params.duration_s > 0 else float("inf")
    step = params.batch if params.batch > 0 else 1
    next_start = first

    async def worker() -> None:
        nonlocal next_start, entries, payload_bytes
        while next_start <= last and time.perf_counter() < deadline:
            low = next_start
            high = min(low + step - 1, last)
            next_start = high + 1
            while low <= high:
                t0 = time.perf_counter()
                if params.batch > 0:
                    got = await reader.batch_read(low, high - low + 1, params.max_batch_bytes)
                else:
                    got = await reader.read(low, low)
                latencies.append((time.perf_counter() - t0) * 1000.0)
                entries += len(got)
                payload_bytes += sum(len(e.data) for e in got)
                low = got[-1].entry_id + 1

    reporter = asyncio.create_task(report_progress(progress, started, lambda: entries))
    try:
        await asyncio.gather(*(worker() for _ in range(max(1, params.window))))
    finally:
        reporter.cancel()
    elapsed = time.perf_counter() - started
    summary = summarize(latencies, elapsed, 0)
    summary["requests"] = summary.pop("entries")
    summary["requests_per_s"] = summary.pop("entries_per_s")
    summary.update(entries=entries, entries_per_s=entries / elapsed if elapsed else 0.0,
                   mb_per_s=payload_bytes / elapsed / 1e6 if elapsed else 0.0)
    return summary
