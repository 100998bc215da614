"""The ledger client's settings (one frozen dataclass, units in the names).

Load one from TOML with :func:`quire.config.load_config` (section
``client``) or build it directly; out-of-range values raise
:class:`~quire.errors.ConfigError` at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quire.errors import ConfigError
from quire.peer import PeerConfig
from quire.peer.config import check_client_tls
from quire.protocol import DEFAULT_MAX_FRAME_BYTES
from quire.security import ZooKeeperSecurityConfig


@dataclass(frozen=True)
class ClientConfig:
    max_pending_adds: int = 1000
    """Adds of one ledger on the wire at once; later appends queue, in order,
    inside the client."""
    max_queued_bytes: int = 64 * 1024 * 1024
    """Payload bytes one ledger may hold queued behind ``max_pending_adds``;
    an append beyond it raises :class:`~quire.errors.QueueFullError`."""
    add_entry_timeout_ms: int = 10_000
    """A bookie that does not answer an add within this is replaced."""
    read_timeout_ms: int = 5_000
    """A read, READ_LAC or fencing request unanswered within this is an
    unknown answer (never a "no")."""
    speculative_read_timeout_ms: int = 1_000
    """After this without an answer a read is also sent to the next replica
    (0 disables speculative reads)."""
    explicit_lac_interval_ms: int = 1_000
    """An idle writer sends WRITE_LAC this often when its LAC moved past the
    last one it piggy-backed (0 disables)."""
    connect_timeout_ms: int = 5_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """Largest frame sent or accepted (must match the bookies' limit)."""
    max_outstanding_reads: int = 256
    """Entry reads one ``read()`` call keeps on the wire at once."""
    recovery_batch_size: int = 16
    """Entries a recovery reads ahead of the one it is deciding."""
    recovery_max_attempts: int = 5
    """Recovery restarts after losing a metadata race, at most this often."""
    metadata_max_attempts: int = 5
    """Tries of a metadata update whose outcome was unknown (store errors)."""
    timeout_check_interval_ms: int = 100
    """How often requests are checked against their deadlines."""
    batch_read_enabled: bool = True
    """BP-62: read runs of entries with BATCH_READ_ENTRY (False: one request
    per entry, the way back if batch reads misbehave)."""
    batch_read_max_bytes: int = 4 * 1024 * 1024
    """Largest batch asked for (also clamped to ``max_frame_bytes``)."""
    read_batch_entries: int = 1000
    """``read()`` of a long range asks for at most this many entries a batch."""
    max_outstanding_batch_reads: int = 4
    """Batches one ``read()`` call keeps on the wire at once."""
    tls_ca: str = ""
    """PEM file of the CA that signs the bookies' certificates: set, the
    client reaches every bookie over TLS and checks its certificate ("" :
    plaintext)."""
    tls_cert: str = ""
    """PEM client certificate, for bookies that authenticate their peers by
    mutual TLS (``tls_ca_file`` set on the bookie); the bookie authorizes
    its role (the subject's OU by default, ``tls_allowed_roles``)."""
    tls_key: str = ""
    """PEM private key of ``tls_cert`` (a secret file, mode 0600)."""
    zookeeper: ZooKeeperSecurityConfig = field(default_factory=ZooKeeperSecurityConfig)
    """How :meth:`Client.connect <quire.client.Client.connect>` reaches a
    ``zk://`` metadata store (flat keys ``zookeeper_digest_file``,
    ``zookeeper_tls_ca_file``, ...)."""

    def __post_init__(self) -> None:
        positive = ("max_pending_adds", "max_queued_bytes", "add_entry_timeout_ms",
                    "read_timeout_ms", "connect_timeout_ms", "max_frame_bytes",
                    "max_outstanding_reads", "recovery_batch_size", "recovery_max_attempts",
                    "metadata_max_attempts", "timeout_check_interval_ms",
                    "batch_read_max_bytes", "read_batch_entries", "max_outstanding_batch_reads")
        for name in positive:
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"client setting {name} must be a positive int, got {value!r}")
        for name in ("speculative_read_timeout_ms", "explicit_lac_interval_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ConfigError(f"client setting {name} must be an int >= 0, got {value!r}")
        check_client_tls(self.tls_ca, self.tls_cert, self.tls_key)

    def peer_config(self) -> PeerConfig:
        """The settings of this client's connections to bookies."""
        return PeerConfig(connect_timeout_ms=self.connect_timeout_ms,
                          max_frame_bytes=self.max_frame_bytes,
                          timeout_check_interval_ms=self.timeout_check_interval_ms,
                          tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key)
