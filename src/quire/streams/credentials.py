"""How a user's client reaches a secured cluster: StreamAccess and ControllerTokens.

:class:`StreamAccess` is what the CLI, Spark's stream source and sink and
tests build clients from: the controller URI (``tls://host:port`` for
TLS), the CA to trust (a PEM file; none: the system's), and the user's
credentials (Basic, from a credentials file or given).  Its clients speak
TLS to the controller and to every segment store when the URI says so (as
the Pravega client does: TLS on the wire follows the controller's scheme),
send the credentials on every controller call, and carry delegation
tokens from the controller (:class:`ControllerTokens`) on the wire.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quire.errors import ConfigError
from quire.security import Credentials, client_context, read_credentials
from quire.streams.controller import (
    DEFAULT_CONTROLLER_URI,
    ControllerClient,
    controller_target,
    controller_uses_tls,
)
from quire.streams.resolvers import controller_resolver
from quire.streams.segments import RemoteSegmentStore, SegmentClientConfig
from quire.streams.tokens import NO_TOKENS, REFRESH_MARGIN_S, TokenSource, stream_key, token_expiry


class ControllerTokens:
    """Delegation tokens from the controller's ``getDelegationToken``, one
    per stream, fetched when first needed and again ``REFRESH_MARGIN_S``
    before they expire or when a store says one expired (the
    :class:`~quire.streams.tokens.TokenSource` contract).  ``clock`` gives
    Unix seconds."""

    def __init__(self, controller: ControllerClient,
                 clock: Callable[[], float] = time.time) -> None:
        self._controller = controller
        self._clock = clock
        self._held: dict[tuple[str, str], tuple[str, float | None]] = {}
        self._fetching: dict[tuple[str, str], asyncio.Future[str]] = {}

    async def token(self, segment: str) -> str:
        key = stream_key(segment)
        held = self._held.get(key)
        if held is not None and (held[1] is None or self._clock() + REFRESH_MARGIN_S < held[1]):
            return held[0]
        fetching = self._fetching.get(key)
        if fetching is None:  # one call per stream, whoever is waiting
            fetching = self._fetching[key] = asyncio.ensure_future(self._fetch(key))
            fetching.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(fetching)

    async def _fetch(self, key: tuple[str, str]) -> str:
        token = await self._controller.delegation_token(*key)
        self._held[key] = (token, token_expiry(token))
        return token

    def expired(self, segment: str, token: str) -> None:
        key = stream_key(segment)
        held = self._held.get(key)
        if held is not None and held[0] == token:
            del self._held[key]


@dataclass(frozen=True)
class StreamAccess:
    """A controller to use and how (module docstring)."""

    controller: str = DEFAULT_CONTROLLER_URI
    tls_ca: str | None = None
    """PEM file of the CAs to trust for a ``tls://`` controller and its
    segment stores (None: the system's)."""
    credentials: Credentials | None = None
    tls_cert: str | None = None
    """PEM client certificate shown to servers that ask for one (with
    ``tls_key``; needs ``tls_ca``)."""
    tls_key: str | None = None

    def __post_init__(self) -> None:
        controller_target(self.controller)  # ConfigError for a URI that is not one
        if bool(self.tls_cert) != bool(self.tls_key) or (self.tls_cert and not self.tls_ca):
            raise ConfigError("a client certificate needs its key and the CA (tls_ca)")

    @classmethod
    def of(cls, controller: str, tls_ca: str | Path | None = None,
           credentials_file: str | Path | None = None, username: str | None = None,
           password: str | None = None, tls_cert: str | Path | None = None,
           tls_key: str | Path | None = None) -> StreamAccess:
        """From options as given: a credentials file (TOML ``username`` and
        ``password``, mode 0600) or a username and password, not both."""
        credentials = None
        if credentials_file:
            if username or password:
                raise ConfigError("give a credentials file or a username and password, "
                                  "not both")
            credentials = read_credentials(credentials_file)
        elif username or password:
            if not (username and password):
                raise ConfigError("a username needs a password, and a password a username")
            credentials = Credentials(username, password)
        return cls(controller, str(tls_ca) if tls_ca else None, credentials,
                   str(tls_cert) if tls_cert else None, str(tls_key) if tls_key else None)

    @property
    def uses_tls(self) -> bool:
        return controller_uses_tls(self.controller)

    def tls_context(self) -> ssl.SSLContext | None:
        """The client context of segment-store connections (None: plain)."""
        if not self.uses_tls:
            return None
        if not self.tls_ca:
            return ssl.create_default_context()
        return client_context(self.tls_ca, self.tls_cert, self.tls_key)

    def controller_client(self, timeout_ms: int = 30_000) -> ControllerClient:
        return ControllerClient(self.controller, timeout_ms, tls_ca=self.tls_ca,
                                credentials=self.credentials, tls_cert=self.tls_cert,
                                tls_key=self.tls_key)

    def segment_store(self, controller: ControllerClient,
                      config: SegmentClientConfig | None = None) -> RemoteSegmentStore:
        """Segment stores found through ``controller``, with its tokens."""
        tokens: TokenSource = (ControllerTokens(controller) if self.credentials is not None
                               else NO_TOKENS)
        return RemoteSegmentStore(controller_resolver(controller), config,
                                  tls=self.tls_context(), tokens=tokens)

    def clients(self, timeout_ms: int = 30_000, config: SegmentClientConfig | None = None
                ) -> tuple[ControllerClient, RemoteSegmentStore]:
        """A controller client and the segment stores behind it (call on the
        loop that will use them; close both when done)."""
        controller = self.controller_client(timeout_ms)
        return controller, self.segment_store(controller, config)
