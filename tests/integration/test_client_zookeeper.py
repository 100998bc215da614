"""The ledger client on ZooKeeper metadata (real ZooKeeper, in-process fake bookies)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.fake_bookie import FakeCluster
from tests.support.zookeeper import ZooKeeperServer


@pytest.mark.zookeeper
async def test_write_recover_read_on_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    uri = f"zk://{zookeeper_server.connect_string}/quire-client-test/{uuid.uuid4().hex}"
    cluster = await FakeCluster.start(4, uri)
    try:
        writer = await (await cluster.client()).create_ledger(3, 3, 2, password=b"pw")
        ids = await asyncio.gather(*[writer.append(b"entry-%d" % i) for i in range(20)])
        assert ids == list(range(20))
        reader_client = await cluster.client()
        recovered = await reader_client.open_ledger(writer.ledger_id, password=b"pw",
                                                    recovery=True)
        assert recovered.last_add_confirmed == 19
        assert [e.data for e in await recovered.read(0, 19)] == \
            [b"entry-%d" % i for i in range(20)]
    finally:
        await cluster.close()
