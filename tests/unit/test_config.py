"""The config loader: flat TOML keys and flags into nested config dataclasses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quire.bookie.config import DEFAULT_DATA_DIR, BookieConfig
from quire.bookie.storage import StorageConfig
from quire.cli.main import cli
from quire.config import load_config, settings_of
from quire.errors import ConfigError


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
