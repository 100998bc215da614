"""A blocking facade over :class:`~quire.client.Client` for scripts,
notebooks and Spark workers.

:class:`SyncClient` runs a private event loop in a daemon thread (a
:class:`~quire.loop_thread.LoopThread`); every method submits a coroutine to
it and blocks for the result, so it works whether or not the calling thread
has an event loop of its own.  Handles returned by it are blocking too;
``append_many`` pipelines a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType

from quire.client.client import Client
from quire.client.config import ClientConfig
from quire.client.passwords import Password
from quire.client.read_handle import ReadHandle
from quire.client.reads import LedgerEntry
from quire.client.write_handle import WriteHandle
from quire.errors import QueueFullError
from quire.loop_thread import LoopThread
from quire.metadata import LedgerMetadata
from quire.types import DigestType, LedgerType


class SyncReadHandle:
    """Blocking :class:`~quire.client.ReadHandle`."""

    def __init__(self, runner: LoopThread, handle: ReadHandle) -> None:
        self._runner = runner
        self._handle = handle

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    @property
    def is_closed(self) -> bool:
        return self._handle.is_closed

    def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        return self._runner.run(self._handle.read(first_entry_id, last_entry_id))

    def read_unconfirmed(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        return self._runner.run(self._handle.read_unconfirmed(first_entry_id, last_entry_id))

    def read_last_add_confirmed(self) -> int:
        return self._runner.run(self._handle.read_last_add_confirmed())

    def close(self) -> None:
        self._runner.run(self._handle.close())

    def __enter__(self) -> SyncReadHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SyncWriteHandle(SyncReadHandle):
    """Blocking :class:`~quire.client.WriteHandle`."""

    _handle: WriteHandle

    def __init__(self, runner: LoopThread, handle: WriteHandle) -> None:
        super().__init__(runner, handle)

    @property
    def last_add_pushed(self) -> int:
        return self._handle.last_add_pushed

    def sync(self) -> int:
        """BP-14: make the acknowledged entries persistent; the new LAC."""
        async def go() -> int:
            return await self._handle.sync()  # the task is made on the loop's thread

        return self._runner.run(go())

    def append(self, data: bytes) -> int:
        """Append one entry and wait until it is acknowledged; its entry id."""
        async def go() -> int:
            return await self._handle.append(data)

        return self._runner.run(go())

    def append_many(self, payloads: Iterable[bytes]) -> list[int]:
        """Append every payload, pipelined (waiting only when the handle's queue
        is full); the entry ids once all are acknowledged."""
        handle = self._handle

        async def go() -> list[int]:
            futures: list[asyncio.Future[int]] = []
            waited = 0
            for payload in payloads:
                while True:
                    try:
                        futures.append(handle.append(payload))
                        break
                    except QueueFullError:
                        if waited >= len(futures):
                            raise
                        await futures[waited]
                        waited += 1
            return list(await asyncio.gather(*futures))

        return self._runner.run(go())


class SyncClient:
    """Blocking :class:`~quire.client.Client` (same methods, same arguments)::

        with quire.SyncClient.connect("sqlite:////tmp/quire/meta.db") as client:
            ledger = client.create_ledger(ensemble_size=3, write_quorum_size=3,
                                          ack_quorum_size=2, password=b"secret")
            ids = ledger.append_many([b"a", b"b", b"c"])
            ledger.close()
    """

    def __init__(self, metadata_uri: str, config: ClientConfig | None = None) -> None:
        self._runner = LoopThread("quire-client-loop", "a SyncClient")
        try:
            self._client = self._runner.run(Client.connect(metadata_uri, config))
        except BaseException:
            self._runner.stop()
            raise
        self._closed = False

    @classmethod
    def connect(cls, metadata_uri: str, config: ClientConfig | None = None) -> SyncClient:
        return cls(metadata_uri, config)

    @property
    def config(self) -> ClientConfig:
        return self._client.config

    def create_ledger(
            self, ensemble_size: int = 3, write_quorum_size: int = 3, ack_quorum_size: int = 2,
            *, ledger_type: LedgerType = LedgerType.PD_JOURNAL,
            digest_type: DigestType = DigestType.CRC32C, password: Password = b"",
            custom_metadata: Mapping[str, bytes] | None = None) -> SyncWriteHandle:
        handle = self._runner.run(self._client.create_ledger(
            ensemble_size, write_quorum_size, ack_quorum_size, ledger_type=ledger_type,
            digest_type=digest_type, password=password, custom_metadata=custom_metadata))
        return SyncWriteHandle(self._runner, handle)

    def open_ledger(self, ledger_id: int, *, password: Password = b"",
                    recovery: bool) -> SyncReadHandle:
        handle = self._runner.run(
            self._client.open_ledger(ledger_id, password=password, recovery=recovery))
        return SyncReadHandle(self._runner, handle)

    def delete_ledger(self, ledger_id: int) -> None:
        self._runner.run(self._client.delete_ledger(ledger_id))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
