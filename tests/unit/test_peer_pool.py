"""BookiePool over a scripted registry, with the settings of its own
PeerConfig (built by the client from its ClientConfig)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from quire.client import ClientConfig
from quire.errors import (
    BookieUnavailableError,
    ClientClosedError,
    ClientTimeoutError,
    ConfigError,
)
from quire.metadata import BookieInfo, Watch
from quire.peer import BookiePool, PeerConfig
from quire.peer.connection import BookieClient
from quire.types import BookieState


class ScriptedRegistry:
    """A BookieRegistry whose bookies the test sets."""

    def __init__(self, *bookies: BookieInfo) -> None:
        self.bookies = list(bookies)
        self.callbacks: list[Callable[[list[BookieInfo]], None]] = []

    async def list_bookies(self) -> list[BookieInfo]:
        return list(self.bookies)

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Watch:
        self.callbacks.append(callback)
        callback(list(self.bookies))
        return Watch(lambda: self.callbacks.remove(callback))

    def change(self, *bookies: BookieInfo) -> None:
        self.bookies = list(bookies)
        for callback in list(self.callbacks):
            callback(list(self.bookies))


def test_the_client_config_gives_the_peer_settings() -> None:
    config = ClientConfig(connect_timeout_ms=1234, max_frame_bytes=1 << 20,
                          timeout_check_interval_ms=7)
    assert config.peer_config() == PeerConfig(connect_timeout_ms=1234, max_frame_bytes=1 << 20,
                                              timeout_check_interval_ms=7)


def test_the_client_tls_settings_reach_the_peers_and_must_go_together() -> None:
    config = ClientConfig(tls_ca="ca.pem", tls_cert="c.pem", tls_key="c.key")
    peers = config.peer_config()
    assert (peers.tls_ca, peers.tls_cert, peers.tls_key) == ("ca.pem", "c.pem", "c.key")
    assert peers.tls_enabled and not PeerConfig().tls_enabled
    with pytest.raises(ConfigError, match="go together"):
        ClientConfig(tls_ca="ca.pem", tls_cert="c.pem")
    with pytest.raises(ConfigError, match="needs tls_ca"):
        PeerConfig(tls_cert="c.pem", tls_key="c.key")


@pytest.mark.parametrize("field", ["connect_timeout_ms", "max_frame_bytes",
                                   "timeout_check_interval_ms"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_peer_settings_out_of_range_are_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        PeerConfig(**{field: value})  # type: ignore[arg-type]


async def test_the_pool_follows_the_registry() -> None:
    registry = ScriptedRegistry(BookieInfo("a", "127.0.0.1:1", BookieState.WRITABLE),
                                BookieInfo("b", "127.0.0.1:2", BookieState.READ_ONLY))
    pool = await BookiePool.open(registry, PeerConfig())
    try:
        assert pool.writable_bookies() == ["a"]
        assert pool.order_for_reads(("c", "a", "b")) == ("a", "b", "c")  # unregistered: last
        registry.change(BookieInfo("b", "127.0.0.1:2", BookieState.WRITABLE))
        assert pool.writable_bookies() == ["b"]
        assert await pool.address_of("a") == "127.0.0.1:1"  # kept after its registration lapsed
        with pytest.raises(BookieUnavailableError):
            await pool.address_of("c")
    finally:
        await pool.close()
    assert not registry.callbacks


async def test_a_silent_bookie_times_out_on_the_configured_ticker() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # accepts connections, never answers
    host, port = listener.getsockname()
    registry = ScriptedRegistry(BookieInfo("a", f"{host}:{port}", BookieState.WRITABLE))
    pool = await BookiePool.open(registry, PeerConfig(timeout_check_interval_ms=10))
    try:
        with pytest.raises(ClientTimeoutError):  # the ticker fails it: wait_for is a bound
            await asyncio.wait_for(pool.client("a").read_lac(1, 0.05), 5.0)
    finally:
        await pool.close()
        listener.close()


async def test_a_client_asked_for_while_the_pool_closes_is_closed() -> None:
    # Closing a client fails its requests, whose callbacks may ask the pool
    # for another bookie at once (a write moving on to a new ensemble): the
    # pool's close must not trip over the client that makes (the 10,000-seed
    # simulation soak found "dictionary changed size during iteration" there).
    registry = ScriptedRegistry(BookieInfo("a", "127.0.0.1:1", BookieState.WRITABLE),
                                BookieInfo("b", "127.0.0.1:2", BookieState.WRITABLE))
    pool = await BookiePool.open(registry, PeerConfig())
    first = pool.client("a")
    asked: list[BookieClient] = []
    closing = first.close

    def close_and_ask() -> None:
        closing()
        asked.append(pool.client("b"))

    first.close = close_and_ask  # type: ignore[method-assign]
    await pool.close()
    assert len(asked) == 1
    with pytest.raises(ClientClosedError):
        await asyncio.wait_for(asked[0].read_lac(1, 1.0), 5.0)
