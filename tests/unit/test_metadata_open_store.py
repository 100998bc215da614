"""Choosing a metadata driver from a URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.errors import ConfigError, NoMetadataError
from quire.metadata import open_store


@pytest.mark.parametrize("uri", [
    "", "metadata.db", "mysql://host/db", "sqlite://", "sqlite:///", "sqlite://relative.db",
    "zk://", "zk://host/chroot", "zk://host:port/chroot", "zk://host:2181/bad/.segment",
])
async def test_bad_uri_raises_config_error(uri: str) -> None:
    with pytest.raises(ConfigError):
        await open_store(uri)


async def test_unknown_option_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="session_timeout_ms"):
        await open_store("memory://", session_timeout_ms=1000)
    with pytest.raises(ConfigError):
        await open_store("memory://", lease_ms=0)


async def test_sqlite_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "metadata.db"
    store = await open_store(f"sqlite:///{path}")
    try:
        assert await store.new_ledger_id() == 1
    finally:
        await store.close()
    assert path.exists()


async def test_named_memory_stores_share_data_until_the_last_closes() -> None:
    first = await open_store("memory://shared-test")
    second = await open_store("memory://shared-test")
    await first.create_record("k", b"v")
    assert (await second.read_record("k")).value == b"v"
    await first.close()
    assert (await second.read_record("k")).value == b"v"
    await second.close()
    third = await open_store("memory://shared-test")
    assert await third.list_records("") == []
    await third.close()


async def test_reading_never_creates_a_sqlite_store(tmp_path: Path) -> None:
    """``create=False`` (what every read-only command passes): a path that
    names nothing, an empty file or a file that is not SQLite is
    NoMetadataError, and nothing is created or changed."""
    missing = tmp_path / "nonexistent-dir" / "none" / "m.db"
    uri = f"sqlite:///{missing}"
    with pytest.raises(NoMetadataError, match=f"no Quire metadata at {uri}"):
        await open_store(uri, create=False)
    assert not (tmp_path / "nonexistent-dir").exists()
    for content in (b"", b"not a database at all, some text " * 10):
        other = tmp_path / "other.db"
        other.write_bytes(content)
        with pytest.raises(NoMetadataError):
            await open_store(f"sqlite:///{other}", create=False)
        assert other.read_bytes() == content
    created = await open_store(uri)  # a server's open initialises it, and says so
    assert created.initialised  # type: ignore[attr-defined]
    await created.close()
    again = await open_store(uri, create=False)
    try:
        assert not again.initialised  # type: ignore[attr-defined]
        assert await again.list_bookies() == []
    finally:
        await again.close()
