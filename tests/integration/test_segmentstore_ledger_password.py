"""A segment store process's tier-1 ledger password comes from
``ledger_password_file``, and its ledger client reaches bookies that serve
mutual TLS with a ``segmentstore`` certificate (``tier1_tls_*_file``).

A store of a cluster made before the setting existed (the built-in
password) writes events; started again with a password file that its
group may read, it refuses to start, naming the file; with the file made
0600 it starts, replays the old ledgers (which keep the built-in password),
makes its new ledgers with the configured one, and serves every event."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.errors import QuireError
from quire.sandbox import SegmentStoreProcess
from quire.security import LedgerKeys, write_secret
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
from tests.support.cluster import Cluster
from tests.support.metadata import ledger_keys
from tests.support.segment_events import append, read_events
from tests.support.tls import Pki, secure_bookies

SECRET = b"the cluster's tier-1 secret"


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
