"""BP-62 BATCH_READ_ENTRY on a real bookie."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from quire.errors import StatusCode
from quire.protocol import (
    AddRequest,
    BatchReadRequest,
    BatchReadResponse,
    DigestManager,
    ErrorResponse,
    master_key,
)
from quire.types import DigestType
from tests.support.bookies import BookieProcess, RawBookieClient

KEY = master_key(b"pw")


def entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(
        entry_id, entry_id - 1, 0, bytes([entry_id % 256]) * size)


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    root = tmp_path_factory.mktemp("batch")
    process = BookieProcess(root, f"sqlite:///{root / 'meta.db'}", "batch-bookie",
                            metrics_port=0, batch_read_max_size_bytes=64 * 1024)
    process.start()
    yield process
    process.kill9()


@pytest.fixture
async def client(bookie: BookieProcess) -> AsyncIterator[RawBookieClient]:
    c = await RawBookieClient.connect(bookie.address)
    yield c
    c.close()


async def fill(client: RawBookieClient, ledger_id: int, sizes: list[int]) -> None:
    futures = [client.send(AddRequest(client.next_id(), KEY, entry(ledger_id, i, size)))
               for i, size in enumerate(sizes)]
    assert all(r.status == StatusCode.OK for r in await asyncio.gather(*futures))  # type: ignore[union-attr]


async def batch(client: RawBookieClient, ledger_id: int, start: int, count: int,
                size: int) -> BatchReadResponse:
    response = await client.call(BatchReadRequest(client.next_id(), ledger_id, start, count, size))
    assert isinstance(response, BatchReadResponse)
    return response


async def test_limits_by_count_and_by_size(client: RawBookieClient) -> None:
    await fill(client, 1, [100] * 50)
    by_count = await batch(client, 1, 5, 10, 1 << 20)
    assert by_count.entries == [entry(1, i) for i in range(5, 15)]
    one = len(entry(1, 0)) + 4
    by_size = await batch(client, 1, 0, 100, 3 * one + 1)
    assert by_size.entries == [entry(1, i) for i in range(3)]


async def test_oversized_first_entry_is_returned_alone(client: RawBookieClient) -> None:
    await fill(client, 2, [5000, 10, 10])
    response = await batch(client, 2, 0, 10, 100)
    assert response.status == StatusCode.OK
    assert response.entries == [entry(2, 0, 5000)]


async def test_missing_entry_ends_the_batch_and_tail_is_short(client: RawBookieClient) -> None:
    await fill(client, 3, [10] * 5)
    response = await batch(client, 3, 2, 100, 1 << 20)
    assert response.entries == [entry(3, i, 10) for i in (2, 3, 4)]
    missing = await batch(client, 3, 5, 10, 1 << 20)
    assert (missing.status, missing.entries) == (StatusCode.NO_SUCH_ENTRY, [])
    unknown = await batch(client, 999, 0, 10, 1 << 20)
    assert unknown.status == StatusCode.NO_SUCH_LEDGER


async def test_max_count_zero_means_no_count_limit_and_size_is_clamped(
        client: RawBookieClient) -> None:
    await fill(client, 4, [1000] * 100)
    unlimited = await batch(client, 4, 0, 0, 0)
    # clamped by batch_read_max_size_bytes (64 KiB): about 63 entries of ~1 KiB
    assert 50 <= len(unlimited.entries) < 100
    assert unlimited.entries == [entry(4, i, 1000) for i in range(len(unlimited.entries))]
    huge = await batch(client, 4, 0, -5, 1 << 62)
    assert huge.entries == unlimited.entries


async def test_disabled_batch_read_answers_unsupported(tmp_path: Path) -> None:
    process = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "old-bookie",
                            batch_read_enabled=False)
    process.start()
    try:
        c = await RawBookieClient.connect(process.address)
        rid = c.next_id()
        response = await c.call(BatchReadRequest(rid, 1, 0, 10, 1000))
        assert response == ErrorResponse(7, rid, StatusCode.UNSUPPORTED)
        c.close()
    finally:
        process.kill9()


async def test_metrics_have_the_bp62_buckets(client: RawBookieClient,
                                             bookie: BookieProcess) -> None:
    await fill(client, 5, [10] * 3)
    await batch(client, 5, 0, 3, 1 << 20)
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(
        f"http://{bookie.metrics_address}/metrics", timeout=10).read().decode())
    for le in ("5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "3000.0",
               "+Inf"):
        assert f'quire_bookie_batch_read_entry_request_bucket{{le="{le}",status="OK"}}' in text
    for le in ("128.0", "512.0", "1024.0", "2048.0", "4096.0", "16384.0", "131072.0",
               "1.048576e+06", "+Inf"):
        assert f'quire_bookie_batch_read_entry_response_size_bucket{{le="{le}"}}' in text
