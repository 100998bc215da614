"""Protocol fuzzing of a live bookie (issue 28).

Starts a real bookie process, then sends mutated frames from ``--connections``
connections at once: valid frames of every op (encoded with the codec, random
fields) with flipped bits, lying lengths, truncations, random op codes and
flags, oversized lengths and random bytes.  Fuzz connections never wait for
answers; one the bookie closes (a malformed frame) is reopened and fuzzing
goes on.  Meanwhile two valid-traffic connections add entries to ledgers the
fuzzer never names (fuzz ledger ids are < 1,000,000, valid ones are above
2**40) and read them back.

At the end it asserts that the bookie process is alive, that no fuzz frame
was answered IO_ERROR (a failure inside a handler, contained to one
request; the frames are reported as hex), that every valid
request was answered within ``--timeout`` seconds on a connection that was
never closed, and that every valid entry reads back exactly; it prints frames
sent, frames/s, connections closed by the bookie and answers by status.

    .venv/bin/python benchmarks/fuzz_bookie.py [--frames 1000000] [--connections 8]
        [--seed 1] [--timeout 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quire.errors import ProtocolError, StatusCode
from quire.metadata import LedgerMetadata, open_store
from quire.protocol import (
    FLAG_DO_FENCING,
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    AddRequest,
    BatchReadRequest,
    BookieInfoRequest,
    Decoder,
    DigestManager,
    LedgerKeys,
    ReadLacRequest,
    ReadRequest,
    SyncRequest,
    WriteLacRequest,
    master_key,
)
from quire.sandbox import BookieProcess, sqlite_uri
from quire.types import DigestType

FUZZ_LEDGERS = 1_000_000
"""Fuzz frames name ledger ids below this (before mutation)."""
VALID_LEDGER_BASE = 1 << 40
"""Valid traffic's ledgers: far from any small id a few bit flips can reach."""
FUZZ_KEY = master_key(b"fuzz")
VALID_PASSWORD = b"valid-traffic"
VALID_KEY = master_key(VALID_PASSWORD)
MAX_FRAME = 5 * 1024 * 1024
CHUNK_SIZES = (1, 4, 16)
"""Frames per write (then a sentinel): short chunks get more fuzz frames served
before a malformed one closes the connection."""
FLAGS = (0, FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FLAG_VOLATILE_DURABILITY)


def _rid(rng: random.Random) -> int:
    return rng.getrandbits(64)


def _ledger(rng: random.Random) -> int:
    return rng.randrange(FUZZ_LEDGERS)


def _entry_id(rng: random.Random) -> int:
    return rng.choice((-1, rng.randrange(64), rng.randrange(1 << 20)))


def _flags(rng: random.Random) -> int:
    return rng.choice(FLAGS) | (rng.choice(FLAGS) if rng.random() < 0.2 else 0)


def valid_frame(rng: random.Random) -> bytes:
    """A well-formed request of a random op, random fields, a fuzz ledger."""
    op = rng.randrange(7)
    key = FUZZ_KEY if rng.random() < 0.8 else rng.randbytes(20)
    if op == 0:
        ledger, entry_id = _ledger(rng), rng.randrange(64)
        payload = rng.randbytes(rng.choice((0, 1, 16, 200)))
        if rng.random() < 0.7:
            stored = DigestManager(ledger, DigestType.CRC32C, b"fuzz").encode(
                entry_id, entry_id - 1, len(payload), payload)
        else:
            stored = struct.pack(">qq", ledger, entry_id) + payload
        return AddRequest(_rid(rng), key, stored, _flags(rng) & ~FLAG_DO_FENCING).encode()
    if op == 1:
        flags = _flags(rng) & FLAG_DO_FENCING
        return ReadRequest(_rid(rng), _ledger(rng), _entry_id(rng), flags,
                           key if flags else None).encode()
    if op == 2:
        return ReadLacRequest(_rid(rng), _ledger(rng)).encode()
    if op == 3:
        return WriteLacRequest(_rid(rng), _ledger(rng), _entry_id(rng), key).encode()
    if op == 4:
        return BookieInfoRequest(_rid(rng)).encode()
    if op == 5:
        flags = _flags(rng) & FLAG_DO_FENCING
        return BatchReadRequest(_rid(rng), _ledger(rng), _entry_id(rng),
                                rng.choice((0, 1, 10, -1, 1 << 31 - 1)),
                                rng.choice((0, 100, 1 << 20, -1, (1 << 63) - 1)),
                                flags, key if flags else None).encode()
    return SyncRequest(_rid(rng), _ledger(rng)).encode()


def mutate(rng: random.Random, frame: bytes) -> tuple[str, bytes]:
    """One mutation of a valid frame: (its kind, the bytes to send)."""
    kind = rng.choices(("valid", "bitflip", "lying_length", "truncated", "header",
                        "oversized", "garbage", "extended"),
                       (40, 25, 8, 6, 12, 1, 3, 5))[0]
    if kind == "valid":
        return kind, frame
    data = bytearray(frame)
    if kind == "bitflip":
        for _ in range(rng.choice((1, 1, 2, 3, 8))):
            bit = rng.randrange(len(data) * 8)
            data[bit >> 3] ^= 1 << (bit & 7)
    elif kind == "lying_length":
        length = len(data) - 4
        lie = rng.choice((rng.randrange(0, 8), length + rng.randrange(-8, 9),
                          length + rng.randrange(1, 4096), rng.randrange(1 << 32)))
        struct.pack_into(">I", data, 0, max(0, min(lie, (1 << 32) - 1)))
    elif kind == "truncated":
        del data[rng.randrange(len(data)):]
    elif kind == "header":
        version = rng.choice((1, 1, 1, 0, 2, rng.randrange(256)))
        op = rng.choice((rng.randrange(16), rng.randrange(256)))
        flags = rng.choice((0, rng.randrange(1 << 16), 0x8000, 0xFFFF))
        struct.pack_into(">I", data, 4, (version << 24) | (op << 16) | flags)
    elif kind == "oversized":
        struct.pack_into(">I", data, 0, rng.choice((MAX_FRAME + 1, (1 << 32) - 1,
                                                    MAX_FRAME + rng.randrange(1 << 20))))
    elif kind == "garbage":
        data = bytearray(rng.randbytes(rng.randrange(1, 64)))
    elif kind == "extended":  # right length, extra bytes in the body
        data += rng.randbytes(rng.randrange(1, 64))
        struct.pack_into(">I", data, 0, len(data) - 4)
    return kind, bytes(data)


@dataclass
class Stats:
    frames: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    closed_by_bookie: int = 0
    undecodable_answers: int = 0
    valid_requests: int = 0
    valid_entries: int = 0
    sentinels_lost: int = 0
    abandoned: int = 0
    odd_frames: list[str] = field(default_factory=list)
    valid_failures: list[str] = field(default_factory=list)
    valid_max_latency_s: float = 0.0


async def _fuzz_connection(address: str, rng: random.Random, quota: list[int],
                           stats: Stats, pace_s: float) -> None:
    """Send fuzz frames in chunks, each chunk followed by a GET_BOOKIE_INFO
    sentinel; wait (up to ``pace_s``) for its answer or the bookie's close,
    so that the bookie really processes what was sent.  A sentinel eaten by
    a lying length is simply not answered: the next chunk feeds that body;
    after three lost in a row the fuzzer closes the connection and opens
    another (a bookie waiting for up to 5 MiB of a promised body is right)."""
    host, port = address.rsplit(":", 1)
    sentinel_ids = iter(range((1 << 64) - 1, 0, -1))
    while quota[0] > 0:
        reader, writer = await asyncio.open_connection(host, int(port))
        answered = asyncio.Event()
        sentinel = [0]
        sent: dict[int, bytes] = {}

        async def read_answers(reader: asyncio.StreamReader = reader,
                               answered: asyncio.Event = answered,
                               sentinel: list[int] = sentinel,
                               sent: dict[int, bytes] = sent) -> None:
            decoder = Decoder("responses")
            while data := await reader.read(1 << 16):
                try:
                    decoder.feed(data)
                    for message in decoder:
                        if getattr(message, "request_id", None) == sentinel[0]:
                            answered.set()
                            continue
                        status = getattr(message, "status", None)
                        stats.statuses[status.name if status is not None else "?"] += 1
                        if status == StatusCode.IO_ERROR:  # a bug contained to one request
                            rid = getattr(message, "request_id", None)
                            stats.odd_frames.append(sent.get(rid, b"?").hex())
                except ProtocolError:
                    stats.undecodable_answers += 1
                    break
            answered.set()

        answers = asyncio.create_task(read_answers())
        lost = 0
        try:
            while quota[0] > 0 and not answers.done():
                n = min(rng.choice(CHUNK_SIZES), quota[0])
                quota[0] -= n
                chunk = []
                for _ in range(n):
                    kind, data = mutate(rng, valid_frame(rng))
                    stats.kinds[kind] += 1
                    if len(data) >= 16:  # by either place a request id can be
                        sent[int.from_bytes(data[8:16])] = data
                        sent[int.from_bytes(data[24:32])] = data
                    chunk.append(data)
                stats.frames += n
                sentinel[0] = next(sentinel_ids)
                answered.clear()
                chunk.append(BookieInfoRequest(sentinel[0]).encode())
                writer.write(b"".join(chunk))
                await writer.drain()
                try:
                    await asyncio.wait_for(answered.wait(), pace_s)
                    lost = 0
                except TimeoutError:
                    stats.sentinels_lost += 1
                    lost += 1
                    if lost >= 3:  # waiting for a long lying length's body: start afresh
                        stats.abandoned += 1
                        break
                await asyncio.sleep(0)  # let the reader see an EOF
        except (ConnectionError, OSError):
            pass
        if not answers.done():
            with contextlib.suppress(TimeoutError, ConnectionError, OSError):
                # did the bookie close it?
                await asyncio.wait_for(asyncio.shield(answers), 0.2 if quota[0] == 0 else 0.001)
        if answers.done():
            stats.closed_by_bookie += 1
        else:
            answers.cancel()
        writer.close()


class _ValidClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = Decoder("responses")
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.next_id = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        for message in self.decoder:
            future = self.waiting.pop(message.request_id, None)  # type: ignore[union-attr]
            if future is not None and not future.done():
                future.set_result(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("valid connection closed"))

    async def call(self, make: Any, timeout_s: float, stats: Stats) -> Any:
        self.next_id += 1
        request = make(self.next_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = future
        assert self.transport is not None
        started = time.monotonic()
        self.transport.write(request.encode())
        stats.valid_requests += 1
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            stats.valid_max_latency_s = max(stats.valid_max_latency_s,
                                            time.monotonic() - started)


async def _register(metadata_uri: str, ledger: int, bookie_id: str) -> None:
    """Record a valid-traffic ledger in the metadata store, as a client's
    create would, so the bookie's GC (which drops ledgers the metadata does
    not know: the fuzzer's) keeps it."""
    store = await open_store(metadata_uri)
    try:
        await store.create_ledger(ledger, LedgerMetadata(
            1, 1, 1, keys=LedgerKeys.of_password(VALID_PASSWORD), ensembles=((0, (bookie_id,)),)))
    finally:
        await store.close()


async def _valid_traffic(address: str, index: int, rng: random.Random, stop: asyncio.Event,
                         timeout_s: float, stats: Stats,
                         registry: tuple[str, str] | None = None) -> None:
    host, port = address.rsplit(":", 1)
    ledger = VALID_LEDGER_BASE + index * 1000
    if registry is not None:
        await _register(registry[0], ledger, registry[1])
    _t, client = await asyncio.get_running_loop().create_connection(
        _ValidClient, host, int(port))
    digest = DigestManager(ledger, DigestType.CRC32C, VALID_PASSWORD)
    written: list[bytes] = []
    failures = stats.valid_failures

    async def check(entry_id: int) -> None:
        answer = await client.call(lambda rid: ReadRequest(rid, ledger, entry_id),
                                   timeout_s, stats)
        if answer.status != StatusCode.OK or answer.entry != written[entry_id]:
            failures.append(f"ledger {ledger} entry {entry_id}: {answer.status.name}, "
                            f"{'same' if answer.entry == written[entry_id] else 'other'} bytes")

    try:
        while not stop.is_set():
            entry_id = len(written)
            payload = rng.randbytes(rng.randrange(1, 300))
            stored = digest.encode(entry_id, entry_id - 1, 0, payload)
            answer = await client.call(
                lambda rid, stored=stored: AddRequest(rid, VALID_KEY, stored),
                                       timeout_s, stats)
            if answer.status != StatusCode.OK:
                failures.append(f"add {ledger}/{entry_id}: {answer.status.name}")
                return
            written.append(stored)
            stats.valid_entries += 1
            await check(rng.randrange(len(written)))
        # everything reads back at the end, 256 reads in flight
        for first in range(0, len(written), 256):
            await asyncio.gather(*(check(e) for e in range(first, min(first + 256,
                                                                     len(written)))))
        if client.lost:
            failures.append(f"valid connection {index} was closed")
    except (TimeoutError, ConnectionError) as e:
        failures.append(f"valid connection {index}: {type(e).__name__} {e}")
    finally:
        assert client.transport is not None
        client.transport.close()


async def fuzz(address: str, frames: int, connections: int, seed: int,
               registry: tuple[str, str] | None = None,
               timeout_s: float = 10.0, valid_connections: int = 2, pace_s: float = 0.1,
               progress: bool = True) -> dict[str, Any]:
    """Fuzz the bookie at ``address``; the figures (see the module doc)."""
    stats = Stats()
    quota = [frames]
    stop = asyncio.Event()
    started = time.monotonic()
    valid = [asyncio.create_task(_valid_traffic(address, i, random.Random(f"{seed}-v{i}"), stop,
                                                timeout_s, stats, registry))
             for i in range(valid_connections)]
    fuzzers = [asyncio.create_task(_fuzz_connection(address, random.Random(f"{seed}-f{i}"),
                                                    quota, stats, pace_s))
               for i in range(connections)]

    async def report() -> None:
        while True:
            await asyncio.sleep(2)
            elapsed = time.monotonic() - started
            print(f"[fuzz] {elapsed:6.1f}s {stats.frames:>10,} frames "
                  f"{stats.frames / elapsed:>8,.0f}/s closed {stats.closed_by_bookie:,} "
                  f"valid entries {stats.valid_entries:,}", file=sys.stderr, flush=True)

    reporter = asyncio.create_task(report()) if progress else None
    try:
        await asyncio.gather(*fuzzers)
        elapsed = time.monotonic() - started
        stop.set()
        await asyncio.gather(*valid)
    finally:
        if reporter is not None:
            reporter.cancel()
    return {
        "frames": stats.frames,
        "seconds": round(elapsed, 2),
        "frames_per_s": round(stats.frames / elapsed),
        "connections": connections,
        "closed_by_bookie": stats.closed_by_bookie,
        "answers_by_status": dict(stats.statuses.most_common()),
        "sentinels_lost": stats.sentinels_lost,
        "abandoned_by_fuzzer": stats.abandoned,
        "io_error_frames": stats.odd_frames[:20],
        "undecodable_answers": stats.undecodable_answers,
        "mutations": dict(stats.kinds.most_common()),
        "valid_requests": stats.valid_requests,
        "valid_entries": stats.valid_entries,
        "valid_max_latency_s": round(stats.valid_max_latency_s, 3),
        "valid_failures": stats.valid_failures[:20],
    }


def _rss_mb(bookie: BookieProcess) -> float | None:
    """The bookie process's resident set (MB), from /proc (None elsewhere)."""
    try:
        assert bookie.proc is not None
        with open(f"/proc/{bookie.proc.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, AssertionError):
        return None
    return round(kb / 1024, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds within which each valid request must be answered")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-fuzz-") as tmp:
        root = Path(tmp)
        metadata_uri = sqlite_uri(root / "meta.db")
        # GC every 30 s: it drops the fuzzer's ledgers (unknown to the metadata
        # store) while the valid traffic's, registered, stay
        bookie = BookieProcess(root, metadata_uri, "fuzz-bookie",
                               gc_interval_ms=30_000, compaction_disk_usage_threshold=0.0)
        bookie.start()
        try:
            rss_before = _rss_mb(bookie)
            result = uvloop.run(fuzz(bookie.address, args.frames, args.connections, args.seed,
                                     (metadata_uri, bookie.bookie_id),
                                     args.timeout))
            result["bookie_alive"] = bookie.running
            result["bookie_rss_mb"] = [rss_before, _rss_mb(bookie)]
            log = bookie.log_path.read_text(errors="replace").splitlines()
            result["bookie_log_errors"] = [line for line in log
                                           if "Error" in line or "error" in line][:40]
            if not bookie.running:
                result["bookie_log_tail"] = bookie.last_log_line()
        finally:
            bookie.stop()
    result["ok"] = bool(result["bookie_alive"] and not result["valid_failures"]
                        and not result["io_error_frames"]  # a bug, contained to one request
                        and result["frames"] >= args.frames)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
