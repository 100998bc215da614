"""A cluster made before security, on ZooKeeper, upgraded in place.

Before: bookie processes and a segment store on a ``zk://`` store whose
znodes carry no ACL, a ledger left open by its writer with a metadata
record of the old format (version 1: it holds the password), and the
segment store's tier-1 logs under the built-in legacy password.  The
upgrade, with every process stopped: a digest file, ``quire metadata
secure`` (which reports what it did, and changes nothing when run again),
and every process started again with ``zookeeper_digest_file`` (the
segment store also with its ``ledger_password_file``).  After: ZooKeeper
refuses the znodes to a client without the digest; the old ledger opens
and recovers with its password; the segment store serves the events
written before and takes new ones; and every znode the upgraded processes
made carries the ACL."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from quire.cli.main import cli
from quire.client import Client, ClientConfig
from quire.errors import MetadataAccessDeniedError, UnauthorizedError
from quire.metadata import open_store
from quire.sandbox import SegmentStoreProcess
from quire.security import LedgerKeys, ZooKeeperSecurityConfig, write_secret
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
from quire.types import LedgerState
from tests.support.cluster import Cluster
from tests.support.metadata import ledger_keys
from tests.support.segment_events import append, read_events
from tests.support.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

PW = b"old ledger password"
DIGEST = "quire:the cluster's zookeeper digest"


def rewrite_as_version_1(hosts: str, path: str, password: bytes) -> None:
    """Put a ledger's record back in the format written before the derived
    keys: version 1, the password itself."""
    client = KazooClient(hosts=hosts)
    client.start(10)
    try:
        data, stat = client.get(path)
        doc = json.loads(data)
        del doc["master_key"], doc["mac_key"]
        doc.update(format_version=1, password=base64.b64encode(password).decode())
        client.set(path, json.dumps(doc).encode(), stat.version)
    finally:
        client.stop()
        client.close()


def quire(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def refused_everywhere(hosts: str, chroot: str) -> int:
    """Check that a client without the digest may neither read nor change
    any znode under ``chroot`` (listed with the digest); their number."""
    quire_zk = KazooClient(hosts=hosts, auth_data=[("digest", DIGEST)])
    outsider = KazooClient(hosts=hosts)
    for client in (quire_zk, outsider):
        client.start(10)
    try:
        frontier, count = [chroot], 0
        while frontier:
            path = frontier.pop()
            try:
                children = quire_zk.get_children(path)
            except Exception:  # gone meanwhile (a ledger id's node)
                continue
            for request, args in ((outsider.get, ()), (outsider.get_children, ()),
                                  (outsider.set, (b"x",))):
                with pytest.raises(NoAuthError):
                    request(path, *args)
            count += 1
            frontier.extend(f"{path}/{name}" for name in children)
        return count
    finally:
        for client in (quire_zk, outsider):
            client.stop()
            client.close()


async def test_a_cluster_made_before_security_is_upgraded_in_place(
        zookeeper_server: ZooKeeperServer, tmp_path: Path) -> None:
    hosts = zookeeper_server.connect_string
    chroot = f"/quire-upgrade/{uuid.uuid4().hex}"
    uri = f"zk://{hosts}{chroot}"
    cluster = Cluster(tmp_path / "cluster", 3, metadata_uri=uri)
    segment_store = SegmentStoreProcess(tmp_path / "hosts", uri, "ss-1", container_count=1,
                                        lease_ms=1500, rebalance_interval_ms=100)
    try:
        # --- before: no ACLs, the old ledger format, the legacy tier-1 password
        cluster.start()
        writer = await Client.connect(uri)
        ledger = await writer.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(ledger.append(b"old %d" % i) for i in range(10)))
        await writer.close()  # the writer is gone, its ledger OPEN
        rewrite_as_version_1(hosts, f"{chroot}/ledgers/{ledger.ledger_id:010d}", PW)
        segment_store.start()
        await append(segment_store.address, 1, [b"before %d" % i for i in range(5)])
        legacy = LedgerKeys.of_password(LEGACY_LOG_PASSWORD)
        tier1 = {i: k for i, k in (await ledger_keys(uri)).items() if i != ledger.ledger_id}
        assert tier1 and all(keys == legacy for keys in tier1.values())
        segment_store.stop()
        cluster.close()

        # --- the upgrade: a digest file for every process, then the ACLs
        digest = write_secret(tmp_path / "zk.digest", DIGEST + "\n")
        secure = ("metadata", "secure", "--metadata", uri, "--zookeeper-digest-file",
                  str(digest))
        first = await asyncio.to_thread(quire, *secure)
        assert first.exit_code == 0, first.output
        assert "znodes walked" in first.stderr  # the progress line
        report = re.search(r"(\d+) znodes given the digest ACL, 0 had it already", first.stdout)
        assert report is not None, first.stdout
        again = await asyncio.to_thread(quire, *secure, "--json")
        assert json.loads(again.stdout)["secured"] == 0  # idempotent
        assert json.loads(again.stdout)["znodes"] == int(report[1])
        assert refused_everywhere(hosts, chroot) == int(report[1])
        with pytest.raises(MetadataAccessDeniedError, match="zookeeper_digest_file"):
            await open_store(uri, create=False)  # a process not given the digest

        # --- after: every process with the digest
        for bookie in cluster.bookies:
            bookie.settings["zookeeper_digest_file"] = str(digest)
        cluster.start()
        password_file = write_secret(tmp_path / "tier1.secret", b"the tier-1 secret")
        segment_store.settings.update(zookeeper_digest_file=str(digest),
                                      ledger_password_file=str(password_file))
        segment_store.start()

        config = ClientConfig(zookeeper=ZooKeeperSecurityConfig(
            zookeeper_digest_file=str(digest)))
        client = await Client.connect(uri, config)
        try:
            with pytest.raises(UnauthorizedError):
                await client.open_ledger(ledger.ledger_id, password=b"wrong", recovery=False)
            recovered = await client.open_ledger(ledger.ledger_id, password=PW, recovery=True)
            assert recovered.metadata.state is LedgerState.CLOSED
            assert recovered.metadata.last_entry_id == 9
            assert [e.data for e in await recovered.read(0, 9)] == \
                [b"old %d" % i for i in range(10)]
        finally:
            await client.close()

        await append(segment_store.address, 6, [b"after %d" % i for i in range(5)])
        assert await read_events(segment_store.address) == \
            [b"before %d" % i for i in range(5)] + [b"after %d" % i for i in range(5)]

        # whatever the upgraded processes made carries the ACL already
        third = await asyncio.to_thread(quire, *secure, "--json")
        assert third.exit_code == 0, third.output
        assert json.loads(third.stdout)["secured"] == 0
        assert json.loads(third.stdout)["znodes"] > int(report[1])
    finally:
        segment_store.stop()
        cluster.close()
