"""A real bookie process on loopback, driven through the raw protocol."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from quire.errors import StatusCode
from quire.metadata import LedgerMetadata, open_store
from quire.protocol import (
    FLAG_DO_FENCING,
    FLAG_RECOVERY_ADD,
    AddRequest,
    BatchReadRequest,
    BookieInfoRequest,
    DigestManager,
    ErrorResponse,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
    master_key,
)
from quire.types import DigestType
from tests.support.bookies import BookieProcess, RawBookieClient

KEY = master_key(b"pw")


def entry(ledger_id: int, entry_id: int, payload: bytes = b"", lac: int = -1) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(
        entry_id, lac, 0, payload or f"entry-{ledger_id}-{entry_id}".encode())


@pytest.fixture
def metadata_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta.db'}"


@pytest.fixture
def bookie(tmp_path: Path, metadata_uri: str) -> Iterator[BookieProcess]:
    process = BookieProcess(tmp_path, metadata_uri, "bookie-1", metrics_port=0)
    process.start()
    yield process
    process.kill9()


@pytest.fixture
async def conn(bookie: BookieProcess) -> AsyncIterator[RawBookieClient]:
    client = await RawBookieClient.connect(bookie.address)
    yield client
    client.close()


async def add(conn: RawBookieClient, ledger_id: int, entry_id: int, key: bytes = KEY,
              flags: int = 0) -> StatusCode:
    response = await conn.call(AddRequest(conn.next_id(), key, entry(ledger_id, entry_id), flags))
    return response.status  # type: ignore[union-attr]


async def read(conn: RawBookieClient, ledger_id: int, entry_id: int, flags: int = 0,
               key: bytes | None = None) -> tuple[StatusCode, bytes | None]:
    response = await conn.call(ReadRequest(conn.next_id(), ledger_id, entry_id, flags, key))
    return response.status, response.entry  # type: ignore[union-attr]


async def test_add_then_read_and_last_entry(conn: RawBookieClient) -> None:
    for i in range(3):
        assert await add(conn, 7, i) == StatusCode.OK
    assert await read(conn, 7, 1) == (StatusCode.OK, entry(7, 1))
    assert await read(conn, 7, -1) == (StatusCode.OK, entry(7, 2))
    assert (await read(conn, 7, 3))[0] == StatusCode.NO_SUCH_ENTRY
    assert (await read(conn, 99, 0))[0] == StatusCode.NO_SUCH_LEDGER


async def test_wrong_master_key_is_refused(conn: RawBookieClient) -> None:
    assert await add(conn, 3, 0) == StatusCode.OK
    assert await add(conn, 3, 1, key=master_key(b"other")) == StatusCode.UNAUTHORIZED
    response = await conn.call(WriteLacRequest(conn.next_id(), 3, 0, master_key(b"other")))
    assert response.status == StatusCode.UNAUTHORIZED  # type: ignore[union-attr]
    assert (await read(conn, 3, 1))[0] == StatusCode.NO_SUCH_ENTRY


async def test_fencing_read_on_unknown_ledger_fences_it(conn: RawBookieClient) -> None:
    status, _ = await read(conn, 11, -1, FLAG_DO_FENCING, KEY)
    assert status == StatusCode.NO_SUCH_ENTRY  # never NO_SUCH_LEDGER: the ledger now exists
    assert await add(conn, 11, 0) == StatusCode.FENCED
    assert await add(conn, 11, 0, flags=FLAG_RECOVERY_ADD) == StatusCode.OK
    assert await read(conn, 11, 0) == (StatusCode.OK, entry(11, 0))


async def test_fencing_batch_read_fences_and_returns_entries(conn: RawBookieClient) -> None:
    for i in range(4):
        assert await add(conn, 12, i) == StatusCode.OK
    response = await conn.call(BatchReadRequest(conn.next_id(), 12, 1, 10, 1 << 20,
                                                FLAG_DO_FENCING, KEY))
    assert response.status == StatusCode.OK  # type: ignore[union-attr]
    assert response.entries == [entry(12, i) for i in (1, 2, 3)]  # type: ignore[union-attr]
    assert await add(conn, 12, 4) == StatusCode.FENCED


async def test_lac_from_piggyback_and_explicit_write(conn: RawBookieClient) -> None:
    await conn.call(AddRequest(conn.next_id(), KEY, entry(5, 0, lac=-1)))
    await conn.call(AddRequest(conn.next_id(), KEY, entry(5, 1, lac=0)))
    lac = await conn.call(ReadLacRequest(conn.next_id(), 5))
    assert lac.lac == 0  # type: ignore[union-attr]
    assert (await conn.call(WriteLacRequest(conn.next_id(), 5, 1, KEY))).status == StatusCode.OK
    assert (await conn.call(ReadLacRequest(conn.next_id(), 5))).lac == 1  # type: ignore[union-attr]
    missing = await conn.call(ReadLacRequest(conn.next_id(), 404))
    assert missing.status == StatusCode.NO_SUCH_LEDGER


async def test_unknown_operation_is_answered_unsupported(conn: RawBookieClient) -> None:
    rid = conn.next_id()
    body = struct.pack(">Q", rid)
    future = asyncio.get_running_loop().create_future()
    conn.waiting[rid] = future
    conn.write_raw(struct.pack(">II", 4 + len(body), (1 << 24) | (99 << 16)) + body)
    response = await asyncio.wait_for(future, 10)
    assert response == ErrorResponse(99, rid, StatusCode.UNSUPPORTED)
    info = await conn.call(BookieInfoRequest(conn.next_id()))
    assert info.status == StatusCode.OK and info.total_bytes > info.free_bytes > 0  # type: ignore[union-attr]


async def test_garbage_on_one_connection_does_not_disturb_fifty_others(
        bookie: BookieProcess) -> None:
    clients = [await RawBookieClient.connect(bookie.address) for _ in range(50)]
    garbage = await RawBookieClient.connect(bookie.address)
    try:
        async def work(index: int, client: RawBookieClient) -> None:
            ledger_id = 1000 + index
            for i in range(20):
                assert await add(client, ledger_id, i) == StatusCode.OK
                if i == 10 and index == 0:
                    garbage.write_raw(b"\xff" * 64)  # bad length/version mid-traffic
            for i in range(20):
                assert await read(client, ledger_id, i) == (StatusCode.OK, entry(ledger_id, i))

        await asyncio.gather(*(work(i, c) for i, c in enumerate(clients)))
        await asyncio.wait_for(garbage.closed, 10)  # the bad connection was closed
        assert await add(clients[0], 1, 0) == StatusCode.OK  # the server still serves
    finally:
        for c in clients:
            c.close()
    assert "malformed frame" in bookie.log()


async def test_deleted_ledger_stops_being_served(tmp_path: Path, metadata_uri: str) -> None:
    process = BookieProcess(tmp_path, metadata_uri, "bookie-1", metrics_port=0,
                            gc_interval_ms=300)  # (off in the other tests)
    process.start()
    conn = await RawBookieClient.connect(process.address)
    store = await open_store(metadata_uri)
    try:
        keep, drop = await store.new_ledger_id(), await store.new_ledger_id()
        for ledger_id in (keep, drop):
            await store.create_ledger(ledger_id, LedgerMetadata(1, 1, 1, ensembles=(
                (0, ("bookie-1",)),)))
            assert await add(conn, ledger_id, 0) == StatusCode.OK
        await store.delete_ledger(drop)
        deadline = time.monotonic() + 20
        while (await read(conn, drop, 0))[0] != StatusCode.NO_SUCH_LEDGER:
            assert time.monotonic() < deadline, "deleted ledger still served"
            await asyncio.sleep(0.1)
        assert await read(conn, keep, 0) == (StatusCode.OK, entry(keep, 0))
    finally:
        await store.close()
        conn.close()
        process.kill9()


async def test_registration_list_and_clean_unregister(bookie: BookieProcess,
                                                      metadata_uri: str) -> None:
    out = subprocess.run([sys.executable, "-m", "quire.cli.main", "bookie", "list",
                          "--metadata", metadata_uri, "--json"],
                         check=True, capture_output=True, timeout=60).stdout
    (listed,) = json.loads(out)
    assert listed["bookie_id"] == "bookie-1" and listed["address"] == bookie.address
    assert listed["state"] == "WRITABLE"
    bookie.stop()
    store = await open_store(metadata_uri)
    try:
        assert await store.list_bookies() == []  # unregistered at once, no lease wait
    finally:
        await store.close()


async def test_metrics_endpoint(conn: RawBookieClient, bookie: BookieProcess) -> None:
    assert await add(conn, 1, 0) == StatusCode.OK
    assert await read(conn, 1, 0) == (StatusCode.OK, entry(1, 0))
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics",
                                       timeout=10).read().decode())
    assert 'quire_bookie_add_entry_request_count{status="OK"} 1.0' in text
    assert 'quire_bookie_read_entry_request_count{status="OK"} 1.0' in text
    assert "quire_bookie_journal_fsync_latency_bucket" in text
    assert "quire_bookie_entries_written_total 1.0" in text


async def test_read_only_bookie_refuses_adds_but_serves_fencing_and_recovery(
        tmp_path: Path, metadata_uri: str) -> None:
    process = BookieProcess(tmp_path, metadata_uri, "ro-bookie", disk_usage_threshold=0.0,
                            disk_usage_lwm_threshold=0.0)
    process.start()
    try:
        client = await RawBookieClient.connect(process.address)
        assert await add(client, 1, 0) == StatusCode.READ_ONLY
        assert (await read(client, 1, -1, FLAG_DO_FENCING, KEY))[0] == StatusCode.NO_SUCH_ENTRY
        assert await add(client, 1, 0, flags=FLAG_RECOVERY_ADD) == StatusCode.OK
        store = await open_store(metadata_uri)
        try:
            (info,) = await store.list_bookies()
            assert info.state.value == "READ_ONLY"
        finally:
            await store.close()
        client.close()
    finally:
        process.kill9()


async def test_full_write_cache_pauses_reads_instead_of_refusing_adds(
        tmp_path: Path, metadata_uri: str) -> None:
    # A 512 KiB write cache (adds refused beyond 1 MiB) and no periodic
    # checkpoint: 4 MiB of adds with 256 outstanding fill it again and again.
    # The bookie must start checkpoints itself and stop reading while one
    # runs, so every add is acknowledged (none refused with TOO_MANY_REQUESTS)
    # and reads back.  No periodic GC either: ledger 7 has no metadata, so a
    # GC pass (300 ms in tests) would rightly drop it if the adds took longer.
    process = BookieProcess(tmp_path, metadata_uri, "bookie-1", metrics_port=0,
                            write_cache_max_bytes=512 * 1024, flush_interval_ms=600_000,
                            disk_check_interval_ms=600_000, gc_interval_ms=600_000)
    process.start()
    try:
        client = await RawBookieClient.connect(process.address)
        payload = os.urandom(1024)
        window = asyncio.Semaphore(256)

        async def one(entry_id: int) -> StatusCode:
            async with window:
                response = await client.call(
                    AddRequest(client.next_id(), KEY, entry(7, entry_id, payload)))
                return response.status  # type: ignore[union-attr]

        statuses = await asyncio.gather(*(one(i) for i in range(4096)))
        assert set(statuses) == {StatusCode.OK}
        for i in (0, 1000, 4095):
            assert await read(client, 7, i) == (StatusCode.OK, entry(7, i, payload))
        client.close()
    finally:
        process.stop()


async def test_fencing_read_of_a_negative_ledger_id_is_a_bad_request(
        conn: RawBookieClient) -> None:
    """Found by benchmarks/fuzz_bookie.py (seed 3): a fencing READ_ENTRY whose
    ledger id had its sign bit flipped reached the journal's unsigned pack
    (struct.error, answered IO_ERROR as an internal failure)."""
    frame = bytes.fromhex("00000030010200013ad6e82382af41d9800000000007968e"
                          "ffffffffffffffff61ce2a88a189f22cdf5b80e67f9f53fc9c61ba89")
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn.waiting[0x3AD6E82382AF41D9] = answer
    conn.write_raw(frame)
    assert (await asyncio.wait_for(answer, 10)).status == StatusCode.BAD_REQUEST
    assert await add(conn, 1, 0) == StatusCode.OK  # the connection serves on
