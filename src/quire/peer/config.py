"""Settings of the connections to bookies (one frozen dataclass, units in
the names).

The ledger client builds one from its :class:`~quire.client.ClientConfig`
(``ClientConfig.peer_config``); a bookie process that reads its peers builds
its own.  Out-of-range values raise :class:`~quire.errors.ConfigError` at
construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.errors import ConfigError
from quire.protocol import DEFAULT_MAX_FRAME_BYTES


@dataclass(frozen=True)
class PeerConfig:
    connect_timeout_ms: int = 5_000
    """A connect to a bookie that takes longer fails its requests."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """Largest answer frame accepted (must match the bookies' limit)."""
    timeout_check_interval_ms: int = 100
    """How often requests are checked against their deadlines."""
    tls_ca: str = ""
    """PEM file of the CA certificates that sign the bookies' certificates:
    set, every connection is TLS, the bookie's certificate checked against
    them and against the host of its registered address ("" : plaintext)."""
    tls_cert: str = ""
    """PEM certificate shown to bookies that ask for one (mutual TLS; its
    subject's role field is what they authorize)."""
    tls_key: str = ""
    """PEM private key of ``tls_cert`` (a secret file, mode 0600)."""

    def __post_init__(self) -> None:
        for name in ("connect_timeout_ms", "max_frame_bytes", "timeout_check_interval_ms"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"peer setting {name} must be a positive int, got {value!r}")
        check_client_tls(self.tls_ca, self.tls_cert, self.tls_key)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_ca)


def check_client_tls(ca: str, cert: str, key: str) -> None:
    """ConfigError unless the client TLS settings make sense: a certificate
    and its key go together, and need the CA (a client that shows a
    certificate also checks the bookie's)."""
    if bool(cert) != bool(key):
        raise ConfigError("tls_cert and tls_key go together: set both or neither")
    if cert and not ca:
        raise ConfigError("a client certificate (tls_cert) needs tls_ca, the CA that "
                          "signs the bookies' certificates")
