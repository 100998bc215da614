"""Bookie ids to addresses and connections (BookKeeper's BookieClient pool).

The pool follows the registry through ``watch_bookies``: it knows which
bookies are live and writable, and the last address each bookie registered
(kept after its registration lapses, so a bookie that is still serving reads
stays reachable).  It holds one :class:`BookieClient` per bookie and a ticker
that fails requests past their deadline, both set by a
:class:`~quire.peer.PeerConfig`; with ``tls_ca`` set every connection is
TLS (one :class:`~quire.security.ClientTls` for the pool, its files
reloaded when they change).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Protocol

from quire.errors import BookieUnavailableError
from quire.metadata import BookieInfo, Watch
from quire.peer.config import PeerConfig
from quire.peer.connection import BookieClient
from quire.security import ClientTls
from quire.types import BookieState


class BookieRegistry(Protocol):
    """What the pool needs of the metadata store: the bookie registry
    (:class:`~quire.metadata.MetadataStore` is one).

    ``list_bookies`` returns the live (registered) bookies, sorted by id;
    ``watch_bookies(callback)`` calls ``callback`` with them now and whenever
    the set or an entry changes, until the returned watch is cancelled.
    """

    async def list_bookies(self) -> list[BookieInfo]: ...

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Watch: ...


class BookiePool:
    """Connections to bookies, made on demand; use :meth:`open`."""

    SUSPECT_S = 5.0
    """A bookie whose connection failed this recently is tried last by reads."""

    def __init__(self, registry: BookieRegistry, config: PeerConfig) -> None:
        self._registry = registry
        self._config = config
        self._live: dict[str, BookieInfo] = {}
        self._addresses: dict[str, str] = {}
        self._clients: dict[str, BookieClient] = {}
        self._watch: Watch | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._tls = ClientTls(config.tls_ca, config.tls_cert or None, config.tls_key or None) \
            if config.tls_enabled else None
        """TlsConfigError here, at open, for files that do not load."""

    @classmethod
    async def open(cls, registry: BookieRegistry, config: PeerConfig) -> BookiePool:
        pool = cls(registry, config)
        pool._update(await registry.list_bookies())
        pool._watch = registry.watch_bookies(pool._update)
        pool._ticker = pool._loop.create_task(pool._expire_requests())
        return pool

    def _update(self, bookies: Iterable[BookieInfo]) -> None:
        self._live = {b.bookie_id: b for b in bookies}
        for info in self._live.values():
            self._addresses[info.bookie_id] = info.address

    async def refresh(self) -> None:
        """Re-read the registry now (the watch may lag behind a new bookie)."""
        self._update(await self._registry.list_bookies())

    def writable_bookies(self) -> list[str]:
        """Ids of the live bookies that accept writes."""
        return [b.bookie_id for b in self._live.values() if b.state is BookieState.WRITABLE]

    async def address_of(self, bookie_id: str) -> str:
        """The bookie's last registered address (BookieUnavailableError if it
        never registered)."""
        address = self._addresses.get(bookie_id)
        if address is None:
            await self.refresh()
            address = self._addresses.get(bookie_id)
        if address is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered")
        return address

    def client(self, bookie_id: str) -> BookieClient:
        """The (cached) client of one bookie; connects on its first request.
        Once the pool is closing, a closed client, whose requests fail with
        ClientClosedError (closing a client fails its requests, and their
        callbacks may ask for another bookie at once)."""
        client = self._clients.get(bookie_id)
        if client is None:
            client = BookieClient(
                bookie_id, self.address_of,
                connect_timeout_s=self._config.connect_timeout_ms / 1000.0,
                max_frame_bytes=self._config.max_frame_bytes, tls=self._tls)
            if self._closed:
                client.close()
            else:
                self._clients[bookie_id] = client
        return client

    def is_suspect(self, bookie_id: str) -> bool:
        """True when the bookie is not registered or its connection failed lately."""
        if bookie_id not in self._live:
            return True
        client = self._clients.get(bookie_id)
        return (client is not None and client.last_failure is not None
                and self._loop.time() - client.last_failure < self.SUSPECT_S)

    def order_for_reads(self, bookies: tuple[str, ...]) -> tuple[str, ...]:
        """``bookies`` with the suspect ones moved last (stable otherwise)."""
        suspects = [b for b in bookies if self.is_suspect(b)]
        if not suspects:
            return bookies
        return tuple(b for b in bookies if b not in suspects) + tuple(suspects)

    async def _expire_requests(self) -> None:
        interval = self._config.timeout_check_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval)
            now = self._loop.time()
            for client in list(self._clients.values()):
                client.expire(now)

    async def close(self) -> None:
        """Stop the watch and the ticker; outstanding requests fail with
        ClientClosedError."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            client.close()
