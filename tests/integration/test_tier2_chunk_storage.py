"""The ChunkStorage contract, the same assertions on every driver: memory,
file (a real directory) and S3 (a real moto server process on loopback)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quire.errors import (
    ChunkExistsError,
    ChunkNotFoundError,
    ChunkRangeError,
    ChunkTooLargeError,
    InvalidChunkNameError,
    Tier2Error,
)
from quire.tier2 import ChunkInfo, ChunkStorage, Tier2Config, concat_chunks, open_chunk_storage
from tests.support.s3_server import S3Endpoint

MAX_CHUNK_BYTES = 9 * 1024 * 1024


def uri_for(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if driver == "memory":
        return "memory://"
    if driver == "file":
        return f"file://{tmp_path / 'tier2'}"
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    options = {"create": "head-then-put"} if driver == "s3-head-then-put" else {}
    return endpoint.uri(f"contract-{uuid.uuid4().hex}", **options)


@pytest.fixture(params=["memory", "file", "s3"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ChunkStorage]:
    opened = await open_chunk_storage(Tier2Config(
        uri=uri_for(request.param, tmp_path, request), max_chunk_bytes=MAX_CHUNK_BYTES))
    yield opened
    await opened.close()


async def test_write_read_length_list_delete(storage: ChunkStorage) -> None:
    await storage.write_chunk("seg-a.E1.0", b"hello world")
    await storage.write_chunk("seg-a.E1.1", bytearray(b"second"))
    await storage.write_chunk("seg-b.E2.0", memoryview(b"other segment"))
    await storage.write_chunk("scope/stream/0.#epoch.0$attributes.E1.0", b"")
    assert await storage.read("seg-a.E1.0", 0, 11) == b"hello world"
    assert await storage.read("seg-a.E1.0", 6, 3) == b"wor"
    assert await storage.read("seg-a.E1.1", 0, 100) == b"second"
    assert await storage.length("seg-b.E2.0") == 13
    assert await storage.length("scope/stream/0.#epoch.0$attributes.E1.0") == 0
    assert await storage.exists("seg-a.E1.1")
    assert not await storage.exists("seg-c.E1.0")
    assert await storage.list_chunks() == [
        ChunkInfo("scope/stream/0.#epoch.0$attributes.E1.0", 0), ChunkInfo("seg-a.E1.0", 11),
        ChunkInfo("seg-a.E1.1", 6), ChunkInfo("seg-b.E2.0", 13)]
    assert [c.name for c in await storage.list_chunks("seg-a.")] == ["seg-a.E1.0", "seg-a.E1.1"]
    assert [c.name for c in await storage.list_chunks("scope/")] == [
        "scope/stream/0.#epoch.0$attributes.E1.0"]
    assert [c.name for c in await storage.list_chunks("scope/str")] == [
        "scope/stream/0.#epoch.0$attributes.E1.0"]
    assert await storage.list_chunks("nothing") == []
    await storage.delete("seg-a.E1.0")
    assert not await storage.exists("seg-a.E1.0")
    assert [c.name for c in await storage.list_chunks("seg-a.")] == ["seg-a.E1.1"]


async def test_exclusive_create_refuses_other_bytes_and_keeps_the_first(
        storage: ChunkStorage) -> None:
    await storage.write_chunk("c.E1.0", b"first")
    with pytest.raises(ChunkExistsError):
        await storage.write_chunk("c.E1.0", b"second")
    with pytest.raises(ChunkExistsError):
        await storage.write_chunk("c.E1.0", b"first and more")
    assert await storage.read("c.E1.0", 0, 100) == b"first"
    # the same bytes again: a retry of a write whose outcome was unknown
    await storage.write_chunk("c.E1.0", b"first")
    assert await storage.list_chunks() == [ChunkInfo("c.E1.0", 5)]


async def test_concurrent_creates_of_one_name_let_exactly_one_win(storage: ChunkStorage) -> None:
    contenders = [f"writer {i}".encode() * 1000 for i in range(8)]
    outcomes = await asyncio.gather(*(storage.write_chunk("race.E1.0", data)
                                      for data in contenders), return_exceptions=True)
    winners = [data for data, outcome in zip(contenders, outcomes, strict=True)
               if outcome is None]
    assert len(winners) == 1
    assert all(isinstance(o, ChunkExistsError) for o in outcomes if o is not None)
    assert await storage.read("race.E1.0", 0, 1 << 20) == winners[0]


async def test_reads_at_and_past_the_end(storage: ChunkStorage) -> None:
    await storage.write_chunk("r.E1.0", b"0123456789")
    assert await storage.read("r.E1.0", 8, 10) == b"89"
    assert await storage.read("r.E1.0", 10, 5) == b""
    assert await storage.read("r.E1.0", 3, 0) == b""
    with pytest.raises(ChunkRangeError) as refused:
        await storage.read("r.E1.0", 11, 1)
    assert (refused.value.offset, refused.value.chunk_length) == (11, 10)
    with pytest.raises(ChunkRangeError):
        await storage.read("r.E1.0", 12, 0)
    with pytest.raises(ValueError):
        await storage.read("r.E1.0", -1, 1)


async def test_a_vanished_chunk_is_a_typed_not_found(storage: ChunkStorage) -> None:
    await storage.write_chunk("v.E1.0", b"soon gone")
    await storage.delete("v.E1.0")
    await storage.delete("v.E1.0")  # idempotent
    await storage.delete("never-written.E1.0")
    for call in (storage.read("v.E1.0", 0, 1), storage.length("v.E1.0"),
                 storage.read("v.E1.0", 0, 0), storage.read("never.E1.0", 0, 1)):
        with pytest.raises(ChunkNotFoundError):
            await call
    assert not await storage.exists("v.E1.0")
    # a chunk's name may hold a directory on some drivers: still no chunk
    await storage.write_chunk("dir/inside.E1.0", b"x")
    with pytest.raises(ChunkNotFoundError):
        await storage.length("dir")
    await storage.delete("dir")
    assert await storage.exists("dir/inside.E1.0")


async def test_an_8_mib_chunk_round_trips(storage: ChunkStorage) -> None:
    data = os.urandom(8 * 1024 * 1024)
    await storage.write_chunk("big.E1.0", data)
    assert await storage.length("big.E1.0") == len(data)
    assert await storage.read("big.E1.0", 0, len(data)) == data
    assert await storage.read("big.E1.0", 3_000_001, 1_234_567) == data[3_000_001:4_234_568]


async def test_a_chunk_over_max_chunk_bytes_is_refused(storage: ChunkStorage) -> None:
    with pytest.raises(ChunkTooLargeError):
        await storage.write_chunk("huge.E1.0", bytes(MAX_CHUNK_BYTES + 1))
    assert not await storage.exists("huge.E1.0")


async def test_concurrent_writers_of_distinct_chunks(storage: ChunkStorage) -> None:
    chunks = {f"s{i % 4}/seg.E1.{i}": os.urandom(1000 + 97 * i) for i in range(40)}
    await asyncio.gather(*(storage.write_chunk(n, d) for n, d in chunks.items()))
    assert await storage.list_chunks() == sorted(
        (ChunkInfo(n, len(d)) for n, d in chunks.items()), key=lambda c: c.name)
    read_back = await asyncio.gather(*(storage.read(n, 0, len(d)) for n, d in chunks.items()))
    assert read_back == list(chunks.values())


BAD_NAMES = ["", "/abs", "a//b", "../up", "a/./b", ".hidden", "dir/.tmp-x", "trailing/",
             "space in", "back\\slash", "é", "x" * 201, "a/" + "x" * 201,
             "/".join(["x" * 200, "y" * 200, "z" * 111])]
LONGEST_NAME = "/".join(["x" * 200, "y" * 200, "z" * 110])


async def test_names_outside_the_contract_are_refused(storage: ChunkStorage) -> None:
    for name in BAD_NAMES:
        for call in (storage.write_chunk(name, b"x"), storage.read(name, 0, 1),
                     storage.length(name), storage.exists(name), storage.delete(name)):
            with pytest.raises(InvalidChunkNameError):
                await call
    await storage.write_chunk(LONGEST_NAME, b"the longest name")
    assert await storage.list_chunks() == [ChunkInfo(LONGEST_NAME, 16)]


async def test_concat_creates_a_new_chunk_and_keeps_the_sources(storage: ChunkStorage) -> None:
    for i, data in enumerate([b"abc", b"", b"defg", b"h"]):
        await storage.write_chunk(f"m.E1.{i}", data)
    sources = [f"m.E1.{i}" for i in range(4)]
    assert await concat_chunks(storage, "m.E2.0", sources) == 8
    assert await storage.read("m.E2.0", 0, 100) == b"abcdefgh"
    assert [c.name for c in await storage.list_chunks("m.")] == [*sources, "m.E2.0"]
    with pytest.raises(ChunkExistsError):
        await concat_chunks(storage, "m.E2.0", sources[:1])
    with pytest.raises(ChunkNotFoundError):
        await concat_chunks(storage, "m.E2.1", ["m.E1.0", "m.E1.9"])
    assert not await storage.exists("m.E2.1")


async def test_head_then_put_mode_refuses_an_existing_name(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``create=head-then-put`` (for servers without conditional PUTs) keeps
    the contract for one writer per name, which epoch-named chunks give."""
    storage = await open_chunk_storage(uri_for("s3-head-then-put", tmp_path, request))
    try:
        await storage.write_chunk("h.E1.0", b"first")
        with pytest.raises(ChunkExistsError):
            await storage.write_chunk("h.E1.0", b"second")
        await storage.write_chunk("h.E1.0", b"first")
        assert await storage.read("h.E1.0", 0, 10) == b"first"
    finally:
        await storage.close()


async def test_an_unreachable_s3_server_is_a_typed_error() -> None:
    from quire.sandbox import free_port

    storage = await open_chunk_storage(Tier2Config(
        uri=f"s3://nobucket/p?endpoint_url=http://127.0.0.1:{free_port()}",
        s3_timeout_ms=2_000, s3_max_attempts=1))
    try:
        for call in (storage.write_chunk("u.E1.0", b"x"), storage.read("u.E1.0", 0, 1),
                     storage.list_chunks()):
            with pytest.raises(Tier2Error) as failed:
                await call
            assert type(failed.value) is Tier2Error
    finally:
        await storage.close()
    with pytest.raises(Tier2Error, match="Invalid endpoint"):
        await open_chunk_storage("s3://bucket/p?endpoint_url=not-a-url")


async def test_a_missing_bucket_is_a_typed_error(s3_endpoint: S3Endpoint) -> None:
    storage = await open_chunk_storage(
        S3Endpoint(s3_endpoint.endpoint_url, "no-such-bucket").uri("p"))
    try:
        with pytest.raises(Tier2Error, match="NoSuchBucket"):
            await storage.write_chunk("b.E1.0", b"x")
    finally:
        await storage.close()
