"""ZooKeeper-only behaviour: what the store does when its session expires."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from quire.metadata import (
    BookieInfo,
    ElectionView,
    Leadership,
    LeaseState,
    LedgerMetadata,
    MetadataStore,
    Versioned,
)
from quire.metadata.zookeeper import ZooKeeperStore
from quire.types import BookieState
from tests.support.metadata import next_matching, target_for
from tests.support.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper


def close_session(hosts: str, client_id: tuple[int, bytes]) -> None:
    """Expire a session the way ZooKeeper's own tests do: join it from a
    second client and close it there."""
    ghost = KazooClient(hosts=hosts, client_id=client_id)
    ghost.start(timeout=10)
    ghost.stop()
    ghost.close()


@pytest.fixture
async def stores(zookeeper_server: ZooKeeperServer,
                 tmp_path: Path) -> AsyncIterator[tuple[ZooKeeperStore, MetadataStore]]:
    """The store whose session the test expires, and another on the same chroot."""
    target = target_for("zk", tmp_path, zookeeper_server)
    store = await target.open()
    other = await target.open()
    assert isinstance(store, ZooKeeperStore)
    yield store, other
    await other.close()
    await store.close()


async def test_session_expiry_restores_registrations_and_watches(
        zookeeper_server: ZooKeeperServer,
        stores: tuple[ZooKeeperStore, MetadataStore]) -> None:
    store, observer = stores
    seen: asyncio.Queue[Versioned[LedgerMetadata] | None] = asyncio.Queue()
    store.watch_ledger(1, seen.put_nowait)
    assert await asyncio.wait_for(seen.get(), 10) is None
    info = BookieInfo("b1", "127.0.0.1:3181", BookieState.WRITABLE)
    await store.register_bookie(info)

    old_session = store._client.client_id
    await asyncio.to_thread(close_session, zookeeper_server.connect_string, old_session)

    deadline = time.monotonic() + 15
    while (store._client.client_id in (None, old_session)
           or await observer.list_bookies() != [info]):
        assert time.monotonic() < deadline, "bookie not registered again in a new session"
        await asyncio.sleep(0.05)

    md = LedgerMetadata(1, 1, 1)
    await observer.create_ledger(1, md)
    assert await asyncio.wait_for(seen.get(), 10) == Versioned(md, 0)


async def test_session_expiry_deposes_the_leader_and_it_campaigns_again(
        zookeeper_server: ZooKeeperServer,
        stores: tuple[ZooKeeperStore, MetadataStore]) -> None:
    store, other = stores
    first = store.elect("auditor", "a")
    await first.wait_leader()
    second = other.elect("auditor", "b")
    leases: asyncio.Queue[LeaseState] = asyncio.Queue()
    store.watch_lease(leases.put_nowait)
    views: asyncio.Queue[ElectionView] = asyncio.Queue()
    first.watch(views.put_nowait)

    await asyncio.to_thread(close_session, zookeeper_server.connect_string,
                            store._client.client_id)
    await next_matching(leases, lambda state: state is LeaseState.EXPIRED, 15)
    await asyncio.wait_for(second.wait_leader(), 15)
    await next_matching(leases, lambda state: state is LeaseState.LIVE, 15)  # a new session
    await next_matching(views, lambda v: v == ElectionView(Leadership.FOLLOWER, "b"), 15)
    assert second.is_leader and not first.is_leader


async def test_reading_never_creates_a_zookeeper_chroot(
        zookeeper_server: ZooKeeperServer, tmp_path: Path) -> None:
    """A chroot without Quire's layout is NoMetadataError for a reader
    (``create=False``), and the reader leaves no znode behind; a server's
    open creates the layout and says so; a reader then finds it."""
    from quire.errors import NoMetadataError
    from quire.metadata import open_store

    chroot = f"/read-only-{tmp_path.name}"
    uri = f"zk://{zookeeper_server.connect_string}{chroot}"
    with pytest.raises(NoMetadataError, match=f"no Quire metadata at {uri}"):
        await open_store(uri, create=False)
    zk = KazooClient(hosts=zookeeper_server.connect_string)
    zk.start(timeout=10)
    try:
        assert zk.exists(chroot) is None
    finally:
        zk.stop()
        zk.close()
    created = await open_store(uri)
    assert created.initialised  # type: ignore[attr-defined]
    await created.close()
    reader = await open_store(uri, create=False)
    try:
        assert await reader.list_ledgers() == []
    finally:
        await reader.close()
