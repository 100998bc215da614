"""Choosing a metadata driver from a URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.errors import ConfigError
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
