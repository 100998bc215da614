"""A ``zk://`` store with digest credentials and TLS, on real ZooKeeper
servers: its znodes carry the digest ACL, so a ZooKeeper client without
Quire's digest can neither read nor change them, and Quire without it (or
with another) is refused at open with the fix in the message; a command
takes the digest file from an option or the environment.  And Quire
reaches ZooKeeper's TLS port (Netty, PEM stores, client certificates),
refusing a server its CA did not sign."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from quire.cli.main import cli
from quire.errors import MetadataAccessDeniedError, MetadataError
from quire.metadata import BookieInfo, LedgerMetadata, MetadataStore, open_store
from quire.security import LedgerKeys, write_secret
from quire.security.certificates import make_ca
from quire.types import BookieState, LedgerState
from tests.support.tls import Pki
from tests.support.zookeeper import ZooKeeperServer, ZooKeeperTls

pytestmark = pytest.mark.zookeeper

USER, PASSWORD = "quire", "zk digest password"
ACL = make_digest_acl(USER, PASSWORD, all=True)


def kazoo(hosts: str, digest: str | None = None, **options: Any) -> KazooClient:
    """A started plain kazoo client (``digest``: authenticated with it)."""
    client = KazooClient(hosts=hosts, auth_data=[("digest", digest)] if digest else None,
                         **options)
    client.start(10)
    return client


def every_znode(client: KazooClient, top: str) -> Iterator[str]:
    yield top
    for name in client.get_children(top):
        yield from every_znode(client, f"{top}/{name}")


def ledger(ensemble: tuple[str, ...] = ("b1:1", "b2:1")) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2,
                          keys=LedgerKeys.of_password(b"pw"), state=LedgerState.OPEN,
                          ensembles=((0, ensemble),))


async def fill(store: MetadataStore) -> int:
    """One of each kind of znode the store makes; the ledger's id."""
    ledger_id = await store.new_ledger_id()
    await store.create_ledger(ledger_id, ledger())
    await store.create_record("streams/s1/segment", b"v")
    await store.create_leased_record("hosts/h1", b"alive")
    await store.write_cookie("b1", b"cookie", None)
    await store.register_bookie(BookieInfo("b1", "127.0.0.1:3181", BookieState.WRITABLE))
    return ledger_id


def refused(request: Callable[..., object], *args: object) -> bool:
    """Whether ZooKeeper answers ``request(*args)`` with NoAuth."""
    try:
        request(*args)
    except NoAuthError:
        return True
    return False


async def test_without_the_digest_the_znodes_can_be_neither_read_nor_changed(
        zookeeper_server: ZooKeeperServer, tmp_path: Path) -> None:
    hosts = zookeeper_server.connect_string
    parent = f"/quire-acl-test/{uuid.uuid4().hex}"
    uri = f"zk://{hosts}{parent}/cluster"
    digest = write_secret(tmp_path / "zk.digest", f"{USER}:{PASSWORD}\n")
    store = await open_store(uri, zookeeper_digest_file=str(digest), session_timeout_ms=2000)
    try:
        ledger_id = await fill(store)
        quire = kazoo(hosts, f"{USER}:{PASSWORD}")
        outsider = kazoo(hosts)
        impostor = kazoo(hosts, f"{USER}:another password")
        try:
            znodes = list(every_znode(quire, f"{parent}/cluster"))
            assert len(znodes) > 15  # the chroot, the layout, and what fill made
            assert all(quire.get_acls(path)[0] == [ACL] for path in znodes)
            assert quire.get_acls(parent)[0] == OPEN_ACL_UNSAFE  # above the chroot: namespace
            for client in (outsider, impostor):
                for path in znodes:
                    assert refused(client.get, path), path
                    assert refused(client.get_children, path), path
                    assert refused(client.get_acls, path), path
                    assert refused(client.set, path, b"changed"), path
                    assert refused(client.set_acls, path, OPEN_ACL_UNSAFE), path
                    assert refused(client.create, f"{path}/planted", b"x"), path
                leaf = f"{parent}/cluster/cookies/b1"
                assert refused(client.delete, leaf)
                assert client.exists(leaf) is not None  # ZooKeeper checks no ACL on exists
        finally:
            for client in (quire, outsider, impostor):
                client.stop()
                client.close()

        # Quire without the digest, or with another, is refused at open
        with pytest.raises(MetadataAccessDeniedError,
                           match="no credentials: set zookeeper_digest_file"):
            await open_store(uri, create=False)
        wrong = write_secret(tmp_path / "wrong.digest", f"{USER}:another password")
        with pytest.raises(MetadataAccessDeniedError, match="other credentials than user"):
            await open_store(uri, zookeeper_digest_file=str(wrong))

        # with it, a command reads the store (digest from an option or the environment)
        def quire_ledger_list(*options: str, **env: str) -> Result:
            return CliRunner().invoke(cli, ["ledger", "list", "--metadata", uri, "--json",
                                            *options], env=env)

        without = await asyncio.to_thread(quire_ledger_list)
        assert without.exit_code == 1 and "--zookeeper-digest-file" in without.stderr
        by_option = await asyncio.to_thread(quire_ledger_list, "--zookeeper-digest-file",
                                            str(digest))
        by_environment = await asyncio.to_thread(
            quire_ledger_list, QUIRE_ZOOKEEPER_DIGEST_FILE=str(digest))
        for result in (by_option, by_environment):
            assert result.exit_code == 0, result.output
            assert f'"ledger_id": {ledger_id}' in result.stdout
    finally:
        await store.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("zk-pki"))


@pytest.fixture(scope="module")
def tls_zookeeper(pki: Pki) -> Iterator[ZooKeeperServer]:
    """A second server, serving TLS too (only this test needs one)."""
    files = pki.issue("zookeeper", "zookeeper")
    server = ZooKeeperServer(tls=ZooKeeperTls(files.cert_file, files.key_file,
                                              pki.ca.cert_file))
    server.start()
    yield server
    server.stop()


async def test_quire_reaches_zookeepers_tls_port(tls_zookeeper: ZooKeeperServer, pki: Pki,
                                                tmp_path: Path) -> None:
    client = pki.issue("quire", "client")
    tls = {"zookeeper_tls_ca_file": str(pki.ca.cert_file),
           "zookeeper_tls_cert_file": str(client.cert_file),
           "zookeeper_tls_key_file": str(client.key_file)}
    digest = write_secret(tmp_path / "zk.digest", f"{USER}:{PASSWORD}")
    uri = f"zk://{tls_zookeeper.secure_connect_string}/quire-tls"
    store = await open_store(uri, zookeeper_digest_file=str(digest), **tls)
    try:
        ledger_id = await fill(store)
        other = await open_store(uri, create=False, zookeeper_digest_file=str(digest), **tls)
        try:
            assert (await other.read_ledger(ledger_id)).value == ledger()
            assert (await other.read_record("streams/s1/segment")).value == b"v"
        finally:
            await other.close()
    finally:
        await store.close()
    secure = kazoo(tls_zookeeper.secure_connect_string, f"{USER}:{PASSWORD}", use_ssl=True,
                   ca=tls["zookeeper_tls_ca_file"], certfile=str(client.cert_file),
                   keyfile=str(client.key_file))
    try:  # what Quire made over TLS carries the ACL too
        assert secure.get_acls("/quire-tls/ledgers")[0] == [ACL]
    finally:
        secure.stop()
        secure.close()

    stranger = make_ca(tmp_path / "stranger")  # a CA that did not sign the server
    with pytest.raises(MetadataError, match="secureClientPort"):
        await open_store(uri, connect_timeout_ms=1500,
                         **{**tls, "zookeeper_tls_ca_file": str(stranger.cert_file)})
