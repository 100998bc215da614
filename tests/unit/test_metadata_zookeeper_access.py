"""How a process is told to reach a ``zk://`` store securely, checked before
any connection: the ``zookeeper_*`` settings (one flat key each in every
server's config and the client's), the digest file (a secret file: refused
when its group or others may read it), and the options of other stores."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from quire.bookie.config import BookieConfig
from quire.cli.main import cli
from quire.client import ClientConfig
from quire.config import load_config, settings_of
from quire.errors import ConfigError, InsecureSecretFileError
from quire.hosts.controller_host import ControllerHostConfig
from quire.hosts.segmentstore_host import SegmentStoreHostConfig
from quire.metadata import open_leased_store, open_store
from quire.metadata._zkaccess import ZooKeeperAccess
from quire.security import ZooKeeperSecurityConfig, write_secret

KEYS = ("zookeeper_digest_file", "zookeeper_tls_ca_file", "zookeeper_tls_cert_file",
        "zookeeper_tls_key_file")
UNREACHABLE = "zk://127.0.0.1:1/quire"
"""Nothing listens there: a test that fails before connecting never waits."""


@pytest.fixture
def digest_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "zk.digest", "quire:s3cret:with:colons\n")


@pytest.mark.parametrize("config", [BookieConfig, SegmentStoreHostConfig,
                                    ControllerHostConfig, ClientConfig])
def test_every_process_takes_the_settings_as_flat_keys(config: type[object],
                                                       tmp_path: Path) -> None:
    assert set(KEYS) <= set(settings_of(config))
    toml = tmp_path / "c.toml"
    toml.write_text('zookeeper_digest_file = "/etc/quire/zk.digest"\n'
                    'zookeeper_tls_ca_file = "/etc/quire/zk-ca.pem"\n')
    loaded = load_config(config, toml)
    zookeeper = getattr(loaded, "zookeeper", None) or loaded.security.zookeeper  # type: ignore[attr-defined]
    assert zookeeper.store_options() == {"zookeeper_digest_file": "/etc/quire/zk.digest",
                                         "zookeeper_tls_ca_file": "/etc/quire/zk-ca.pem"}


def test_tls_settings_that_do_not_go_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="go together"):
        ZooKeeperSecurityConfig(zookeeper_tls_ca_file="ca", zookeeper_tls_cert_file="c")
    with pytest.raises(ConfigError, match="needs zookeeper_tls_ca_file"):
        ZooKeeperSecurityConfig(zookeeper_tls_cert_file="c", zookeeper_tls_key_file="k")
    assert ZooKeeperSecurityConfig().store_options() == {}


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
async def test_a_digest_file_others_may_read_or_write_is_refused_before_connecting(
        digest_file: Path, mode: int) -> None:
    digest_file.chmod(mode)
    started = time.monotonic()
    with pytest.raises(InsecureSecretFileError, match=f"chmod 600 {digest_file}"):
        await open_leased_store(UNREACHABLE, 3000, zookeeper_digest_file=str(digest_file))
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("content", ["quire\n", ":password\n", "quire:\n", "a:b\nc:d\n"])
async def test_a_digest_file_that_is_not_one_user_password_line_is_refused(
        tmp_path: Path, content: str) -> None:
    path = write_secret(tmp_path / "zk.digest", content)
    with pytest.raises(ConfigError, match="one line user:password"):
        await open_store(UNREACHABLE, zookeeper_digest_file=str(path))


async def test_missing_tls_files_are_refused_before_connecting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        await open_store(UNREACHABLE, zookeeper_tls_ca_file=str(tmp_path / "nowhere.pem"))


def test_the_credential_reaches_kazoo_and_never_a_repr(digest_file: Path) -> None:
    access = ZooKeeperAccess.load(ZooKeeperSecurityConfig(
        zookeeper_digest_file=str(digest_file)))
    assert access.user == "quire"  # the user ends at the first colon
    assert "s3cret" not in repr(access)
    options = access.kazoo_options()
    assert options["auth_data"] == [("digest", "quire:s3cret:with:colons")]
    (acl,) = options["default_acl"]
    assert acl.perms == 31 and acl.id.scheme == "digest"  # every permission, one id
    assert acl.id.id.startswith("quire:") and "s3cret" not in acl.id.id
    assert "use_ssl" not in options
    assert ZooKeeperAccess().kazoo_options() == {}


async def test_other_stores_refuse_zookeeper_settings_but_ignore_empty_ones(
        digest_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="zookeeper_digest_file: for zk:// metadata stores"):
        await open_store("memory://", zookeeper_digest_file=str(digest_file))
    store = await open_store(f"sqlite:///{tmp_path / 'm.db'}", zookeeper_digest_file="",
                             zookeeper_tls_ca_file="")
    await store.close()


def test_commands_take_the_digest_file_from_an_option_or_the_environment(
        digest_file: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    runner = CliRunner()
    by_option = runner.invoke(cli, ["ledger", "list", "--metadata", uri,
                                    "--zookeeper-digest-file", str(digest_file)])
    by_environment = runner.invoke(cli, ["ledger", "list", "--metadata", uri],
                                   env={"QUIRE_ZOOKEEPER_DIGEST_FILE": str(digest_file)})
    for result in (by_option, by_environment):  # given, and refused by a SQLite store
        assert result.exit_code == 1
        assert "zookeeper_digest_file: for zk:// metadata stores only" in result.stderr
