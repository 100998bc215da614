"""The TLS and authentication settings every Quire server shares.

:class:`SecurityConfig` is nested in each server's config
(``BookieConfig.security``, ``SegmentStoreHostConfig.security``,
``ControllerHostConfig.security``), so its fields are flat keys of each
server's TOML and flags of each ``quire <server> start``, with one name
and one meaning everywhere (``tls_cert_file = ...``, ``--auth-enabled``).
All off by default: a server without them serves as before, plain and
open.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.errors import ConfigError


@dataclass(frozen=True)
class SecurityConfig:
    tls_cert_file: str = ""
    """PEM certificate chain this server presents ("" : no TLS).  Reloaded
    when the file changes (see :class:`quire.security.tls.ServerTls`)."""
    tls_key_file: str = ""
    """PEM private key of ``tls_cert_file`` (a secret file: mode 0600)."""
    tls_ca_file: str = ""
    """PEM CA certificates trusted for the peers' certificates ("" : none;
    a server then asks no client certificate)."""
    tls_reload_interval_ms: int = 1000
    """How often, at most, a handshake looks whether the certificate files
    changed (0: at every handshake)."""
    auth_enabled: bool = False
    """Authenticate every request (Basic against the user database of the
    metadata store, Bearer for a token Quire issued) and authorize it with
    the principal's ACL; ``/health`` stays open."""
    auth_token_secret_file: str = ""
    """The cluster secret that signs delegation tokens (a secret file,
    mode 0600; "" : Bearer tokens are not accepted here)."""

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_reload_interval_ms < 0:
            raise ConfigError("tls_reload_interval_ms must not be negative")

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)
