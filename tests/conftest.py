"""Fixtures shared by every test suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.s3_server import CREDENTIALS, MotoS3Server, S3Endpoint, S3ServerUnavailable
from tests.support.streams import StreamSystem, start_system
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


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    """A real S3-compatible server process (moto) for the whole session, with
    the bucket ``quire-tier2`` and test credentials in the environment
    (tests give each storage its own key prefix)."""
    server = MotoS3Server()
    try:
        server.start()
    except S3ServerUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    try:
        with pytest.MonkeyPatch.context() as environment:
            for name, value in CREDENTIALS.items():
                environment.setenv(name, value)
            yield server.create_bucket("quire-tier2")
    finally:
        server.stop()


@pytest.fixture
async def system() -> AsyncIterator[StreamSystem]:
    """A stream system (controller and segment stores on in-memory logs) for
    one test, closed after it."""
    s = await start_system()
    yield s
    await s.close()
