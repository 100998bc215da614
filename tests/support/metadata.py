"""Where the metadata store tests point each driver, and the worker processes
of the multi-process tests (see ``metadata_worker.py``)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from quire.metadata import MetadataStore, open_store
from quire.security import LedgerKeys, write_secret
from tests.support.zookeeper import ZooKeeperServer

T = TypeVar("T")


def with_metadata(metadata_uri: str, use: Callable[[MetadataStore], Awaitable[T]]) -> T:
    """``use(store)`` on a metadata store opened for it, closed after (from
    code not in a loop: a harness's main thread)."""
    async def run() -> T:
        store = await open_store(metadata_uri)
        try:
            return await use(store)
        finally:
            await store.close()
    return asyncio.run(run())


WORKER = Path(__file__).with_name("metadata_worker.py")
LEASE_MS = 600
ZK_SESSION_TIMEOUT_MS = 2000
ZK_DIGEST = "quire-test:digest-password"
"""The ``user:password`` of the ``zk-digest`` targets' digest files."""


@dataclass
class Target:
    """A store location plus the options the tests open it with."""

    uri: str
    options: dict[str, Any] = field(default_factory=dict)

    async def open(self) -> MetadataStore:
        return await open_store(self.uri, **self.options)

    @property
    def liveness_period(self) -> float:
        """Seconds a registration lives without renewal (lease or session)."""
        if self.uri.startswith("zk://"):
            return ZK_SESSION_TIMEOUT_MS / 1000
        return LEASE_MS / 1000


def target_for(driver: str, tmp_path: Path, zookeeper: ZooKeeperServer | None) -> Target:
    """A fresh, empty store of ``driver`` (a unique chroot for ZooKeeper;
    ``zk-digest``: opened with digest credentials, so its znodes carry ACLs)."""
    unique = uuid.uuid4().hex
    if driver == "memory":
        return Target(f"memory://test-{unique}", {"lease_ms": LEASE_MS})
    if driver == "sqlite":
        return Target(f"sqlite:///{tmp_path / 'metadata' / 'store.db'}",
                      {"lease_ms": LEASE_MS, "poll_interval_ms": 50})
    assert driver in ("zk", "zk-digest") and zookeeper is not None
    options: dict[str, Any] = {"session_timeout_ms": ZK_SESSION_TIMEOUT_MS}
    if driver == "zk-digest":
        digest = write_secret(tmp_path / f"zk-{unique}.digest", ZK_DIGEST)
        options["zookeeper_digest_file"] = str(digest)
    return Target(f"zk://{zookeeper.connect_string}/quire-test/{unique}", options)


async def ledger_keys(metadata_uri: str, **options: Any) -> dict[int, LedgerKeys]:
    """Every ledger's keys, as the store at ``metadata_uri`` keeps them."""
    store = await open_store(metadata_uri, **options)
    try:
        return {i: (await store.read_ledger(i)).value.keys for i in await store.list_ledgers()}
    finally:
        await store.close()


async def next_matching(queue: asyncio.Queue[T], predicate: Callable[[T], bool],
                        timeout: float = 10.0) -> T:
    """The first value from ``queue`` (fed by a watch) that satisfies ``predicate``."""
    async def scan() -> T:
        while not predicate(value := await queue.get()):
            pass
        return value
    return await asyncio.wait_for(scan(), timeout)


class Worker:
    """``metadata_worker.py`` running in its own process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, target: Target, *command: str) -> Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), target.uri, json.dumps(target.options), *command,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return cls(process)

    async def read_line(self, timeout: float = 20.0) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise AssertionError(f"worker exited ({await self.process.wait()}) without output")
        return line.decode().strip()

    async def read_until(self, wanted: str, timeout: float = 20.0) -> None:
        """Read lines until one equals ``wanted``."""
        async def scan() -> None:
            while await self.read_line(timeout) != wanted:
                pass
        await asyncio.wait_for(scan(), timeout)

    def release(self) -> None:
        """Let a worker waiting after "ready" go on."""
        self.send("go")

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
