"""The config loader: flat TOML keys and flags into nested config dataclasses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quire.bookie.config import DEFAULT_DATA_DIR, BookieConfig
from quire.bookie.storage import StorageConfig
from quire.cli.main import cli
from quire.config import ServerAddressConfig, is_wildcard_host, load_config, settings_of
from quire.errors import ConfigError
from quire.hosts import ControllerHostConfig, SegmentStoreHostConfig
from quire.metadata import open_store
from tests.support.bookie_node import node_at, node_config

SERVERS = [BookieConfig, SegmentStoreHostConfig, ControllerHostConfig]


def test_storage_knobs_are_flat_keys_declared_once() -> None:
    settings = settings_of(BookieConfig)
    assert "storage" not in settings
    assert settings["write_cache_max_bytes"].path == ("storage",)
    assert settings["journal_dirs"].default == (DEFAULT_DATA_DIR,)
    assert settings["flush_interval_ms"].path == ()
    storage_fields = {n for n, s in settings.items() if s.path == ("storage",)}
    assert storage_fields == set(StorageConfig.__dataclass_fields__)


@pytest.mark.parametrize("table", ["", "[bookie]\n"])
def test_flat_toml_keys_reach_the_nested_storage_config(tmp_path: Path, table: str) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(f'{table}port = 0\njournal_dirs = ["{tmp_path}/j"]\n'
                    f'ledger_dirs = ["{tmp_path}/l"]\nwrite_cache_max_bytes = 4096\n'
                    "entry_log_direct_io = false\n")
    config = load_config(BookieConfig, path, {"read_ahead_bytes": "0", "port": None},
                         section="bookie")
    assert config.port == 0
    assert config.storage == StorageConfig(
        journal_dirs=(tmp_path / "j",), ledger_dirs=(tmp_path / "l",),
        write_cache_max_bytes=4096, entry_log_direct_io=False, read_ahead_bytes=0)


def test_untouched_storage_keeps_its_defaults_and_errors_name_the_key(tmp_path: Path) -> None:
    assert load_config(BookieConfig, None, {"port": 5}).storage == BookieConfig().storage
    with pytest.raises(ConfigError, match="write_cache_max_bytes"):
        load_config(BookieConfig, None, {"write_cache_max_bytes": "lots"})
    with pytest.raises(ConfigError, match="write_cache_max_bytes must be positive"):
        load_config(BookieConfig, None, {"write_cache_max_bytes": 0})
    with pytest.raises(ConfigError, match="unknown setting 'storage'"):
        load_config(BookieConfig, None, {"storage": "x"})


def test_the_security_and_limit_keys_are_flat_and_checked() -> None:
    config = load_config(BookieConfig, None, {
        "tls_cert_file": "b.pem", "tls_key_file": "b.key", "tls_ca_file": "ca.pem",
        "tls_allowed_roles": "bookie,client", "max_connections_per_peer": "8",
        "idle_timeout_ms": "0"})
    assert config.security.tls_ca_file == "ca.pem"
    assert config.tls_allowed_roles == ("bookie", "client")
    assert config.limits.max_connections_per_peer == 8 and config.limits.idle_timeout_ms == 0
    with pytest.raises(ConfigError, match="tls_allowed_roles needs tls_ca_file"):
        load_config(BookieConfig, None, {"tls_allowed_roles": "bookie"})
    with pytest.raises(ConfigError, match="max_connections"):
        load_config(BookieConfig, None, {"max_connections": -1})


def test_bookie_start_has_a_flag_per_flat_key(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    started: list[Any] = []
    monkeypatch.setattr("quire.node.run", started.append)
    result = CliRunner().invoke(cli, [
        "bookie", "start", "--port", "0", "--bookie-id", "b", "--journal-dirs", str(tmp_path),
        "--ledger-dirs", str(tmp_path), "--no-entry-log-direct-io",
        "--journal-reuse-files-max", "2"])
    assert result.exit_code == 0, result.output
    (config,) = started
    assert isinstance(config, BookieConfig)
    assert config.storage.journal_dirs == (tmp_path,)
    assert not config.storage.entry_log_direct_io
    assert config.storage.journal_reuse_files_max == 2


# --- listen and advertise apart ---------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
def test_every_server_takes_the_same_three_address_keys(server: type[Any]) -> None:
    settings = settings_of(server)
    for key in ("host", "listen_host", "advertised_host"):
        assert settings[key].path == () and settings[key].hint is str
    plain = load_config(server, None, {"host": "10.0.0.5"})  # host alone is both, as before
    assert plain.resolved_listen_host == plain.resolved_advertised_host == "10.0.0.5"
    apart = load_config(server, None, {"listen_host": "0.0.0.0",
                                       "advertised_host": "ss-1.example"})
    assert apart.resolved_listen_host == "0.0.0.0"
    assert apart.advertised_address(12345) == "ss-1.example:12345"
    half = load_config(server, None, {"host": "10.0.0.5", "listen_host": "::"})
    assert (half.resolved_listen_host, half.resolved_advertised_host) == ("::", "10.0.0.5")


@pytest.mark.parametrize("server", SERVERS)
def test_a_wildcard_address_is_never_advertised(server: type[Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"host '0\.0\.0\.0' is a wildcard.*set listen_host"):
        load_config(server, None, {"host": "0.0.0.0"})
    with pytest.raises(ConfigError, match="advertised_host '::' is a wildcard"):
        load_config(server, None, {"listen_host": "0.0.0.0", "advertised_host": "::"})
    path = tmp_path / "server.toml"
    path.write_text('listen_host = "0.0.0.0"\nhost = "[::]"\n')
    with pytest.raises(ConfigError, match="wildcard"):
        load_config(server, path)
    with pytest.raises(ConfigError, match="wildcard"):
        server(host="")


def test_what_counts_as_a_wildcard() -> None:
    assert all(map(is_wildcard_host, ["", " ", "*", "0.0.0.0", "::", "[::]", "0:0::0"]))
    assert not any(map(is_wildcard_host, ["127.0.0.1", "::1", "[::1]", "10.1.2.3",
                                          "bookie-1", "localhost"]))
    assert ServerAddressConfig(listen_host="0.0.0.0").resolved_advertised_host == "127.0.0.1"


def test_the_default_bookie_id_is_the_advertised_address() -> None:
    config = BookieConfig(listen_host="0.0.0.0", advertised_host="10.0.0.7", port=3181)
    assert config.resolved_bookie_id == "10.0.0.7:3181"
    assert BookieConfig(host="10.0.0.8", port=3181).resolved_bookie_id == "10.0.0.8:3181"


@pytest.mark.parametrize("flags, listen, advertised", [
    (["--host", "127.0.0.3"], "127.0.0.3", "127.0.0.3"),
    (["--listen-host", "0.0.0.0", "--advertised-host", "127.0.0.4"], "0.0.0.0", "127.0.0.4"),
])
def test_segment_store_start_has_the_address_flags(monkeypatch: pytest.MonkeyPatch,
                                                   flags: list[str], listen: str,
                                                   advertised: str) -> None:
    started: list[Any] = []
    monkeypatch.setattr("quire.hosts.run_segment_store", started.append)
    result = CliRunner().invoke(cli, ["segmentstore", "start", *flags])
    assert result.exit_code == 0, result.output
    (config,) = started
    assert (config.resolved_listen_host, config.resolved_advertised_host) == (listen, advertised)


async def test_a_bookie_listening_everywhere_registers_its_advertised_address(
        tmp_path: Path) -> None:
    config = node_config(tmp_path, bookie_id="b-any", port=0, metrics_port=0,
                         listen_host="0.0.0.0", advertised_host="127.0.0.1")
    async with node_at(config) as node:
        store = await open_store(config.metadata_uri)
        try:
            (info,) = await store.list_bookies()
        finally:
            await store.close()
        port = int(node.address.rpartition(":")[2])
        assert info.address == node.address == f"127.0.0.1:{port}"
        assert info.metrics_address == node.metrics_address
        assert info.metrics_address is not None
        assert info.metrics_address.startswith("127.0.0.1:")
        # bound to every interface: another loopback address reaches it too
        _reader, writer = await asyncio.open_connection("127.0.0.2", port)
        writer.close()
        await writer.wait_closed()
