"""Fixtures of the ledger client's integration tests (real bookie processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quire.client import Client, ClientConfig
from tests.support.cluster import Cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A fresh cluster of 3 bookies (``@pytest.mark.parametrize("cluster", [n],
    indirect=True)`` for n)."""
    started = Cluster(tmp_path / "cluster", getattr(request, "param", 3)).start()
    yield started
    started.close()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """5 bookies shared by the tests of one module that kill none of them."""
    started = Cluster(tmp_path_factory.mktemp("shared-cluster"), 5).start()
    yield started
    started.close()


@pytest.fixture(scope="session")
def cli_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """3 bookies shared by the command-line tests of the session (they use
    their own ledgers and log names)."""
    started = Cluster(tmp_path_factory.mktemp("cli-cluster"), 3).start()
    yield started
    started.close()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    """``await connect(cluster, **config)``: a Client closed at teardown."""
    clients: list[Client] = []

    async def make(on: Cluster, **config: Any) -> Client:
        client = await Client.connect(on.metadata_uri,
                                      ClientConfig(**{**on.client_settings, **config}))
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


# --- Spark data source tests (quire.spark; see tests/support/spark.py) -------


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """3 bookies shared by every Spark test of the session (tests use their
    own log names)."""
    started = Cluster(tmp_path_factory.mktemp("spark-cluster"), 3).start()
    yield started
    started.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's one local SparkSession (``local[2,2]``); it never
    registers the quire data source explicitly."""
    from tests.support.spark import start_spark

    session = start_spark(tmp_path_factory.mktemp("spark"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster (a master and two 1-core workers, each its
    own JVM process) for the session; tests drive it from a child process
    (:meth:`~tests.support.spark_cluster.SparkStandalone.run_driver`), as one
    process holds one SparkContext."""
    import pyspark  # noqa: F401  (a missing dependency fails, never skips)

    from tests.support.spark_cluster import SparkStandalone

    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone")).start()
    yield cluster
    cluster.close()
