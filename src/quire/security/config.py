"""The TLS and authentication settings every Quire server shares.

:class:`SecurityConfig` is nested in each server's config
(``BookieConfig.security``, ``SegmentStoreHostConfig.security``,
``ControllerHostConfig.security``), so its fields are flat keys of each
server's TOML and flags of each ``quire <server> start``, with one name
and one meaning everywhere (``tls_cert_file = ...``, ``--auth-enabled``).
All off by default: a server without them serves as before, plain and
open.

:class:`ZooKeeperSecurityConfig`, nested in it and in the ledger client's
``ClientConfig``, says how a process reaches a ``zk://`` metadata store:
digest credentials and TLS (see :mod:`quire.metadata.zookeeper`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from quire.errors import ConfigError


@dataclass(frozen=True)
class ZooKeeperSecurityConfig:
    """How a process reaches a ``zk://`` metadata store: nested in
    :class:`SecurityConfig` (servers) and ``ClientConfig`` (ledger
    clients), so its keys are flat everywhere (``zookeeper_digest_file =
    ...``); ``quire`` commands take them as ``--zookeeper-digest-file``
    (``$QUIRE_ZOOKEEPER_DIGEST_FILE``) and so on.  They are options of
    ``quire.metadata.open_store`` under the same names, for ``zk://``
    stores only (another store refuses them: ConfigError)."""

    zookeeper_digest_file: str = ""
    """A secret file (mode 0600) holding ``user:password``: the process
    authenticates to ZooKeeper with that digest, and every znode it creates
    carries the ACL that gives that user every permission and nobody else
    any ("" : no credentials; znodes are created open to all, as before)."""
    zookeeper_tls_ca_file: str = ""
    """PEM CA certificates trusted for ZooKeeper's certificate: set, the
    store is reached over TLS (the URI then names the servers'
    ``secureClientPort``), and each server's certificate must name the host
    the URI gives for it ("" : plaintext)."""
    zookeeper_tls_cert_file: str = ""
    """PEM client certificate shown to ZooKeeper over TLS (its servers ask
    one unless ``ssl.clientAuth`` is ``none``)."""
    zookeeper_tls_key_file: str = ""
    """PEM private key of ``zookeeper_tls_cert_file`` (a secret file, mode 0600)."""

    def __post_init__(self) -> None:
        if bool(self.zookeeper_tls_cert_file) != bool(self.zookeeper_tls_key_file):
            raise ConfigError("zookeeper_tls_cert_file and zookeeper_tls_key_file go together: "
                              "set both or neither")
        if self.zookeeper_tls_cert_file and not self.zookeeper_tls_ca_file:
            raise ConfigError("zookeeper_tls_cert_file needs zookeeper_tls_ca_file, which "
                              "turns TLS to ZooKeeper on")

    def store_options(self) -> dict[str, Any]:
        """The keys that are set, as options of ``quire.metadata.open_store``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


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
    zookeeper: ZooKeeperSecurityConfig = field(default_factory=ZooKeeperSecurityConfig)
    """How this server reaches a ``zk://`` metadata store (flat keys
    ``zookeeper_digest_file``, ``zookeeper_tls_ca_file``, ...)."""

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_reload_interval_ms < 0:
            raise ConfigError("tls_reload_interval_ms must not be negative")

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)
