"""Entry-log compaction in a real bookie process: a long-lived ledger
interleaved with ledgers created and deleted keeps the disk bounded, every
live entry reads back, also after a kill -9 and a power loss in the middle of
a compaction; ``quire bookie gc --now`` and the compaction metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from quire.bookie.admin import request_gc
from quire.client import Client, WriteHandle
from quire.errors import AdminRequestError
from quire.sandbox import sqlite_uri
from tests.support.bookies import BookieProcess

PASSWORD = b"pw"
ENTRY_BYTES = 1024
LOG_MAX_BYTES = 128 * 1024
"""Larger than a checkpoint's worth of adds, so that every entry log holds
some of the long-lived ledger (a checkpoint writes its batch sorted by
ledger: a log filled by one checkpoint could hold short ledgers only, and GC
alone would remove it)."""
ROUNDS = 30
SHORT_ENTRIES = 60
LONG_ENTRIES_PER_ROUND = 3

COMPACTING = {
    "metrics_port": 0,
    "flush_interval_ms": 20,  # small checkpoints: each log gets some of the long ledger
    "entry_log_max_bytes": LOG_MAX_BYTES,
    "gc_interval_ms": 250,
    "minor_compaction_threshold": 0.5,
    "minor_compaction_interval_ms": 250,
    "major_compaction_interval_ms": 0,
    "compaction_disk_usage_threshold": 0.0,  # (the test machine's disk may be full)
}


def payload(ledger_id: int, entry_id: int) -> bytes:
    head = b"%d:%d:" % (ledger_id, entry_id)
    return head + bytes([entry_id % 251]) * (ENTRY_BYTES - len(head))


def entry_log_bytes(bookie: BookieProcess) -> int:
    directory = Path(bookie.settings["ledger_dirs"][0]) / "ledgers" / "entrylog"
    return sum(p.stat().st_size for p in directory.glob("*.log"))


async def write_round(client: Client, long: WriteHandle, first_long_entry: int) -> None:
    """A short-lived ledger written interleaved with the long one, then
    closed and deleted from metadata (the bookie's GC drops it)."""
    short = await client.create_ledger(1, 1, 1, password=PASSWORD)
    step = SHORT_ENTRIES // LONG_ENTRIES_PER_ROUND
    adds = []
    for i in range(SHORT_ENTRIES):
        adds.append(short.append(payload(short.ledger_id, i)))
        if i % step == 0:
            adds.append(long.append(payload(long.ledger_id, first_long_entry + i // step)))
    await asyncio.gather(*adds)
    await short.close()
    await client.delete_ledger(short.ledger_id)


async def wait_for_disk_at_most(bookie: BookieProcess, bound: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (used := entry_log_bytes(bookie)) > bound:
        assert time.monotonic() < deadline, (
            f"entry logs hold {used} bytes, more than {bound}: not compacted")
        await asyncio.sleep(0.1)
    return used


async def read_all(metadata_uri: str, ledgers: dict[int, int]) -> None:
    """Every entry of each ``ledger: entry count`` reads back."""
    async with await Client.connect(metadata_uri) as client:
        for ledger_id, count in ledgers.items():
            reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            entries = await reader.read(0, count - 1)
            assert [e.data for e in entries] == [payload(ledger_id, i) for i in range(count)]


def metric(bookie: BookieProcess, name: str) -> float:
    text = urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics",
                                  timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def wait_for_metric(bookie: BookieProcess, name: str, timeout_s: float = 60) -> None:
    """Poll until the metric is above zero."""
    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(metric, bookie, name) <= 0:
        assert time.monotonic() < deadline, f"{name} stayed at 0"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
async def test_compaction_bounds_the_disk_and_survives_a_crash_in_the_middle(
        tmp_path: Path) -> None:
    metadata_uri = sqlite_uri(tmp_path / "metadata.db")
    bookie = BookieProcess(tmp_path, metadata_uri, "bookie-1", **COMPACTING)
    bookie.start()
    try:
        # 1. Rounds of short ledgers interleaved with one long-lived ledger:
        # every entry log holds some of the long ledger, so without
        # compaction none is ever removed (about 63 KiB a round stay).
        async with await Client.connect(metadata_uri) as client:
            long = await client.create_ledger(1, 1, 1, password=PASSWORD)
            written = 0
            for round_ in range(ROUNDS):
                await write_round(client, long, written)
                written += LONG_ENTRIES_PER_ROUND
                if round_ in (ROUNDS // 2, ROUNDS - 1):
                    # Live: the long ledger's entries; compacted logs are at
                    # least half live, plus the log being written.
                    live = written * (ENTRY_BYTES + 64)
                    bound = 2 * live + 2 * LOG_MAX_BYTES
                    without = (round_ + 1) * (SHORT_ENTRIES + LONG_ENTRIES_PER_ROUND) \
                        * ENTRY_BYTES
                    assert bound < without / 2.5  # the bound means something
                    await wait_for_disk_at_most(bookie, bound, timeout_s=60)
            await long.close()
        long_id = long.ledger_id
        await read_all(metadata_uri, {long_id: written})
        # a log that mixes the long ledger's entries with dead ones is
        # compacted once it is no longer the one being written: the GC pass
        # that does it may come after the disk bound was already met
        await wait_for_metric(bookie, 'quire_bookie_compactions_total{kind="minor"}')
        await wait_for_metric(bookie, "quire_bookie_compaction_entries_moved_total")
        await wait_for_metric(bookie, "quire_bookie_compaction_bytes_reclaimed_total")

        # 2. kill -9 and power loss in the middle of a compaction: the copies
        # are fsynced, the index not yet committed.
        bookie.stop()
        bookie.settings.update(gc_interval_ms=600_000, minor_compaction_interval_ms=0,
                               test_kill_during_compaction="copied")
        bookie.start()
        async with await Client.connect(metadata_uri) as client:
            second = await client.create_ledger(1, 1, 1, password=PASSWORD)
            for round_ in range(3):
                await write_round(client, second, round_ * LONG_ENTRIES_PER_ROUND)
            await second.close()
        assert bookie.metrics_address is not None
        with pytest.raises(AdminRequestError):  # the bookie dies answering it
            await asyncio.to_thread(request_gc, bookie.metrics_address, timeout_s=60)
        assert bookie.wait_exit(30) == -9
        bookie.power_loss()
        live = {long_id: written, second.ledger_id: 3 * LONG_ENTRIES_PER_ROUND}

        bookie.settings.update(test_kill_during_compaction="")
        bookie.start()
        await read_all(metadata_uri, live)

        # 3. quire bookie gc --now finishes the work; everything still reads.
        out = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "quire.cli.main", "bookie", "gc", "--now",
            "--metadata", metadata_uri, "--json"], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()
        report = json.loads(out.stdout)["bookie-1"]
        assert report["compaction"] == "major"
        assert report["compaction_stats"]["logs_compacted"] >= 1
        assert report["compaction_stats"]["logs_failed"] == 0
        await read_all(metadata_uri, live)
        assert metric(bookie, 'quire_bookie_compactions_total{kind="major"}') == 1
        bookie.stop()
        bookie.start()  # and after a clean restart
        await read_all(metadata_uri, live)
    finally:
        bookie.kill9()
