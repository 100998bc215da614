"""A segment store process's tier-1 ledger password comes from
``ledger_password_file``, and its ledger client reaches bookies that serve
mutual TLS with a ``segmentstore`` certificate (``tier1_tls_*_file``).

A store of a cluster made before the setting existed (the built-in
password) writes events; started again with a password file that its
group may read, it refuses to start, naming the file; with the file made
0600 it starts, replays the old ledgers (which keep the built-in password),
makes its new ledgers with the configured one, and serves every event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quire.errors import QuireError
from quire.metadata import open_store
from quire.pravega_wire import (
    AppendSetup,
    CreateSegment,
    DataAppended,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    WrongHost,
)
from quire.sandbox import SegmentStoreProcess
from quire.security import LedgerKeys, write_secret
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
from tests.support.cluster import Cluster
from tests.support.pravega_wire_client import WireClient, block, events_of
from tests.support.tls import Pki, secure_bookies

SECRET = b"the cluster's tier-1 secret"
SEGMENT = "sc/st/0.#epoch.0"
WRITER = 0x5E


async def wire(address: str) -> WireClient:
    host, port = address.rsplit(":", 1)
    return await WireClient.connect(host, int(port))


async def append(address: str, first: int, events: list[bytes]) -> None:
    """Append ``events`` (numbered from ``first``) once the container is open."""
    async with asyncio.timeout(60):
        while True:
            client = await wire(address)
            try:
                created = await client.request(CreateSegment(1, SEGMENT, 0, 0, ""))
                if not isinstance(created, WrongHost):
                    break
            finally:
                await client.close()
            await asyncio.sleep(0.05)  # the container is not open yet
    assert isinstance(created, SegmentCreated) or first > 1
    client = await wire(address)
    try:
        setup = await client.request(SetupAppend(2, WRITER, SEGMENT, ""))
        assert isinstance(setup, AppendSetup)
        assert setup.last_event_number == first - 1 if first > 1 else \
            setup.last_event_number < 0
        await client.send(block(WRITER, first + len(events) - 1, 3, *events))
        appended = await client.recv()
        assert isinstance(appended, DataAppended)
        assert appended.event_number == first + len(events) - 1
    finally:
        await client.close()


async def read_events(address: str) -> list[bytes]:
    client = await wire(address)
    try:
        read = await client.request(ReadSegment(SEGMENT, 0, 1 << 20, "", 4))
        assert isinstance(read, SegmentRead)
        return events_of(read.data)
    finally:
        await client.close()


async def ledger_keys(metadata_uri: str) -> dict[int, LedgerKeys]:
    store = await open_store(metadata_uri)
    try:
        return {i: (await store.read_ledger(i)).value.keys for i in await store.list_ledgers()}
    finally:
        await store.close()


async def test_tier1_ledgers_take_the_configured_password_and_old_ones_still_open(
        tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    cluster = Cluster(tmp_path / "cluster", 3)
    secure_bookies(cluster, pki, roles=("bookie", "segmentstore"))
    cluster.start()
    own = pki.issue("ss-1", "segmentstore")
    store = SegmentStoreProcess(
        tmp_path / "hosts", cluster.metadata_uri, "ss-1", container_count=1, lease_ms=1500,
        rebalance_interval_ms=100, tier1_tls_ca_file=str(pki.ca.cert_file),
        tier1_tls_cert_file=str(own.cert_file), tier1_tls_key_file=str(own.key_file))
    try:
        store.start()  # as made before the setting: the built-in password
        await append(store.address, 1, [b"before %d" % i for i in range(5)])
        legacy = LedgerKeys.of_password(LEGACY_LOG_PASSWORD)
        before = await ledger_keys(cluster.metadata_uri)
        assert before and all(keys == legacy for keys in before.values())
        store.stop()

        password_file = write_secret(tmp_path / "tier1.secret", SECRET + b"\n")
        password_file.chmod(0o640)
        store.settings["ledger_password_file"] = str(password_file)
        with pytest.raises(QuireError, match="exited before it was ready"):
            store.start()
        assert "chmod 600" in store.log() and str(password_file) in store.log()

        password_file.chmod(0o600)
        store.start()
        await append(store.address, 6, [b"after %d" % i for i in range(5)])
        assert await read_events(store.address) == [b"before %d" % i for i in range(5)] + [
            b"after %d" % i for i in range(5)]
        after = await ledger_keys(cluster.metadata_uri)
        configured = LedgerKeys.of_password(SECRET)  # one trailing newline is not the secret
        made_since = {i: keys for i, keys in after.items() if i not in before}
        assert made_since and all(keys == configured for keys in made_since.values())
        assert all(after[i] == legacy for i in before if i in after)
    finally:
        store.stop()
        cluster.close()
