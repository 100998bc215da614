"""Fixtures shared by every test suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.zookeeper import ZooKeeperServer, ZooKeeperUnavailable


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A real ZooKeeper server for the whole session (never skipped: a machine
    without ZooKeeper fails these tests, naming what to install)."""
    server = ZooKeeperServer()
    try:
        server.start()
    except ZooKeeperUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.stop()
