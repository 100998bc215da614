"""One bookie, 1 KiB PD adds, 256 outstanding: entries/s against raw fsync/s.

Prints, per run and as the median of three runs: acknowledged entries/s,
journal fsyncs/s, mean entries per fsync and the journal's mean write+fsync
time (from the bookie's /metrics), and
the disk's raw 4 KiB write+fsync rate measured in the same run on the same
directory (the mean of a 2 s probe just before the bookie starts and one
just after it stops).  Goals (issue 3): >= 20 entries per fsync on average, and
entries/s >= 20x the raw fsync rate.  The driver runs on uvloop, as a
client would.

    .venv/bin/python benchmarks/bookie_throughput.py [--seconds 10] [--runs 3] [--json]
        [--set KEY=VALUE ...]   (bookie settings, e.g. --set gil_switch_interval_us=5000)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import FSYNC_COUNT, raw_fsync, scrape
from quire.errors import StatusCode
from quire.peer import FLUSH_AFTER_FRAMES
from quire.protocol import DigestManager, encode_add_request, master_key
from quire.protocol.codec import encode_add_response
from quire.sandbox import BookieProcess, sqlite_uri
from quire.types import DigestType

KEY = master_key(b"bench")


class _AddDriver(asyncio.Protocol):
    """Keeps ``outstanding`` PD adds on one connection until ``deadline``.

    Like a client's write path, it refills the window once per received
    chunk: every acknowledgement in one read is answered by that many new
    frames, written in pieces of ``FLUSH_AFTER_FRAMES`` as the client's
    connection does (a per-frame write would measure this driver's syscalls,
    not the bookie; one write per refill would keep the bookie waiting for
    the last frame of the refill)."""

    def __init__(self, outstanding: int, size: int, deadline: float) -> None:
        self.outstanding = outstanding
        self.deadline = deadline
        self.digest = DigestManager(1, DigestType.CRC32C, b"bench")
        self.payload = os.urandom(size)
        self.size = size
        self.next_entry = 0
        self.in_flight = 0
        self.acked = 0
        self.pending = b""
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send(self.outstanding)

    def send(self, count: int) -> None:
        encode, payload, size = self.digest.encode, self.payload, self.size
        first = self.next_entry
        self.next_entry = first + count
        self.in_flight += count
        assert self.transport is not None
        for start in range(first, first + count, FLUSH_AFTER_FRAMES):
            end = min(start + FLUSH_AFTER_FRAMES, first + count)
            self.transport.write(b"".join(
                [encode_add_request(e, KEY, encode(e, e - 1, (e + 1) * size, payload))
                 for e in range(start, end)]))

    def data_received(self, data: bytes) -> None:
        buf = self.pending + data if self.pending else data
        pos, acks = 0, 0
        while len(buf) - pos >= _ADD_RESPONSE_LEN:
            frame_len = _U32.unpack_from(buf, pos)[0]
            status = _STATUS.unpack_from(buf, pos + 16)[0]
            if frame_len + 4 != _ADD_RESPONSE_LEN or status != StatusCode.OK:
                raise SystemExit(f"add failed: status {status}, frame of {frame_len} bytes")
            pos += _ADD_RESPONSE_LEN
            acks += 1
        self.pending = buf[pos:]
        self.acked += acks
        self.in_flight -= acks
        if time.perf_counter() < self.deadline:
            self.send(acks)
        elif self.in_flight == 0 and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"bookie closed the connection: {exc}"))


FSYNC_SUM_MS = "quire_bookie_journal_fsync_latency_sum"
_U32 = struct.Struct(">I")
_STATUS = struct.Struct(">i")  # after frame length, header and request id
_ADD_RESPONSE_LEN = len(encode_add_response(0, 0, 0, 0, 0))


async def drive(address: str, seconds: float, outstanding: int, size: int) -> tuple[int, float]:
    host, port = address.rsplit(":", 1)
    start = time.perf_counter()
    transport, driver = await asyncio.get_running_loop().create_connection(
        lambda: _AddDriver(outstanding, size, start + seconds), host, int(port))
    await driver.done
    elapsed = time.perf_counter() - start
    transport.close()
    return driver.acked, elapsed


def one_run(seconds: float, outstanding: int, size: int,
            settings: dict[str, object] | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="quire-bench-", dir=os.getcwd()) as tmp:
        root = Path(tmp)
        raw_before = raw_fsync(root)["per_s"]
        bookie = BookieProcess(root, sqlite_uri(root / "meta.db"), "bench-bookie",
                               metrics_port=0,
                               **{"flush_interval_ms": 1000, **(settings or {})})
        bookie.start()
        try:
            assert bookie.metrics_address
            names = (FSYNC_COUNT, FSYNC_SUM_MS, "quire_bookie_entries_written_total")
            before = scrape(bookie.metrics_address, *names)
            acked, elapsed = uvloop.run(drive(bookie.address, seconds, outstanding, size))
            after = scrape(bookie.metrics_address, *names)
        finally:
            bookie.stop()
        # The disk's rate drifts from minute to minute on a shared VM: the
        # baseline is the mean of a probe just before and one just after.
        raw_after = raw_fsync(root)["per_s"]
        raw = (raw_before + raw_after) / 2
        fsyncs = after[FSYNC_COUNT] - before[FSYNC_COUNT]
        fsync_ms = after[FSYNC_SUM_MS] - before[FSYNC_SUM_MS]
        return {
            "entries_per_s": acked / elapsed,
            "fsyncs_per_s": fsyncs / elapsed,
            "entries_per_fsync": acked / fsyncs if fsyncs else float("inf"),
            "journal_sync_mean_ms": fsync_ms / fsyncs if fsyncs else 0.0,
            "raw_fsync_per_s": raw,
            "raw_fsync_before_per_s": raw_before,
            "raw_fsync_after_per_s": raw_after,
            "ratio_entries_to_raw_fsync": (acked / elapsed) / raw,
        }


def _parse(value: str) -> object:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra bookie setting (repeatable), e.g. --set flush_interval_ms=5000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = {k: _parse(v) for k, v in (s.split("=", 1) for s in args.set)}
    runs = []
    for i in range(args.runs):
        result = one_run(args.seconds, args.outstanding, args.entry_bytes, settings)
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
