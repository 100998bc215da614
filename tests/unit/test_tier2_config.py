"""Tier2Config and the tier-2 URIs: what each parses to, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.errors import ConfigError
from quire.tier2 import MemoryChunkStorage, Tier2Config, open_chunk_storage, parse_tier2_uri
from quire.tier2.config import FileLocation, MemoryLocation, S3Location


def test_uris_parse_to_their_locations() -> None:
    assert parse_tier2_uri("file:///var/lib/quire/tier2") == FileLocation(
        Path("/var/lib/quire/tier2"))
    assert parse_tier2_uri("file://localhost/data") == FileLocation(Path("/data"))
    assert parse_tier2_uri("memory://") == MemoryLocation("")
    assert parse_tier2_uri("memory://shared") == MemoryLocation("shared")
    s3 = parse_tier2_uri("s3://bucket/some/prefix/?endpoint_url=http://127.0.0.1:9000"
                         "&region=eu-west-1&create=head-then-put")
    assert s3 == S3Location("bucket", "some/prefix", "http://127.0.0.1:9000", "eu-west-1",
                            "head-then-put")
    assert isinstance(s3, S3Location) and s3.key_of("seg.E1.0") == "some/prefix/seg.E1.0"
    bare = parse_tier2_uri("s3://bucket")
    assert bare == S3Location("bucket", "", None, "us-east-1", "if-none-match")
    assert isinstance(bare, S3Location) and bare.key_of("seg.E1.0") == "seg.E1.0"


@pytest.mark.parametrize("uri", [
    "file://relative/path", "file:relative", "file://host/abs", "file:///x?fsync=no",
    "memory://name/path", "memory://x?y=1",
    "s3:///prefix", "s3://bucket/p?endpoint=http://x", "s3://bucket?create=sometimes",
    "gs://bucket/p", "/plain/path", ""])
def test_malformed_uris_are_refused(uri: str) -> None:
    with pytest.raises(ConfigError):
        parse_tier2_uri(uri)
    with pytest.raises(ConfigError):
        Tier2Config(uri=uri)


@pytest.mark.parametrize("setting", ["max_chunk_bytes", "s3_timeout_ms", "s3_max_attempts"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_out_of_range_settings_are_refused(setting: str, value: object) -> None:
    with pytest.raises(ConfigError, match=setting):
        Tier2Config(uri="memory://", **{setting: value})  # type: ignore[arg-type]


async def test_a_named_memory_store_is_shared_and_a_bare_one_is_private() -> None:
    first = await open_chunk_storage("memory://test-shared-store")
    await first.write_chunk("seg.E1.0", b"kept")
    await first.close()
    again = await open_chunk_storage("memory://test-shared-store")
    assert await again.read("seg.E1.0", 0, 4) == b"kept"
    private = await open_chunk_storage("memory://")
    assert isinstance(private, MemoryChunkStorage)
    await private.write_chunk("seg.E1.0", b"mine")
    assert await (await open_chunk_storage("memory://")).list_chunks() == []
    assert await again.read("seg.E1.0", 0, 4) == b"kept"
