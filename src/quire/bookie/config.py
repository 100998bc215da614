"""The bookie's settings: one frozen dataclass holding the storage engine's.

Every field is a flat TOML key and a flag of ``quire bookie start``, the
nested :class:`~quire.bookie.storage.StorageConfig`'s fields included (see
:func:`quire.config.settings_of`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from quire.bookie.storage.config import StorageConfig
from quire.config import ServerAddressConfig
from quire.errors import ConfigError
from quire.protocol import DEFAULT_MAX_FRAME_BYTES
from quire.security import SecurityConfig

log = logging.getLogger("quire.bookie")

DEFAULT_DATA_DIR = Path("quire-bookie/data")
"""Journal and ledger directory of a bookie configured without one."""


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection limits of :mod:`quire.bookie.connection` (0: no limit,
    no timeout); :attr:`BookieConfig.limits`."""

    max_connections: int = 0
    max_connections_per_peer: int = 0
    idle_timeout_ms: int = 0
    max_buffered_reply_bytes: int = 0


@dataclass(frozen=True)
class BookieConfig(ServerAddressConfig):
    """``host``, ``listen_host`` and ``advertised_host``: see
    :class:`~quire.config.ServerAddressConfig` (the bookie port and the HTTP
    endpoint listen on the listen host; the registration carries the
    advertised one)."""

    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    bookie_id: str = ""
    """Stable identity kept in the cookie; empty = the advertised ``host:port``
    (port must be set)."""
    port: int = 3181
    """Listening port; 0 picks a free one (the registry records the real one)."""
    metrics_port: int = -1
    """HTTP port of ``/metrics``; 0 picks a free one, -1 disables it."""
    journal_max_group_wait_ms: float = 0.0
    """Extra time an fsync waits to gather more adds (0: group only what
    arrives while the previous fsync runs, BookKeeper's natural batching)."""
    journal_sync_on_loop_max_ms: float = 2.0
    """The event loop writes and fsyncs each journal group itself while the
    journal's fsyncs take less than this on average; slower ones (or 0, or
    a group wait) go to the ``quire-fsync`` thread, so that the loop is not
    held up that long for each.  Syncing on the loop saves the thread's
    hand-overs on every group (see ``quire.bookie.group_commit``)."""
    data_integrity_checking: bool = False
    """BP-46: at boot, after an unclean run without the journal, fence this
    bookie's ledgers and put the open ones in limbo before serving (phase
    one), then recover them and copy back from peers what this bookie lacks
    (phase two, while serving).  Without it, a journal-less bookie warns at
    start that it can lose acknowledged entries undetected."""
    data_integrity_stamp_missing_cookies: bool = False
    """BP-46: a journal or ledger directory whose cookie is missing while the
    metadata store holds this bookie's (an emptied or replaced disk) is a
    cookie failure.  False: the bookie refuses to start, naming the
    directories and ``quire cookie fix``.  True: it fences and limbos its
    open ledgers (phase one) and then writes the missing cookies itself."""
    storage: StorageConfig = field(default_factory=lambda: StorageConfig(
        journal_dirs=(DEFAULT_DATA_DIR,), ledger_dirs=(DEFAULT_DATA_DIR,)))
    """The storage engine's settings.  Its fields are flat keys of the
    bookie's TOML and flags of ``quire bookie start`` like the fields above
    (``write_cache_max_bytes = ...``, ``--journal-dirs``), declared once, in
    :class:`~quire.bookie.storage.StorageConfig`."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """TLS and authentication, flat keys like the storage's (``tls_cert_file``,
    ``tls_key_file``, ``tls_ca_file``, ``auth_enabled``, ...; see
    :class:`~quire.security.SecurityConfig`).  With ``tls_cert_file`` the
    bookie port serves TLS (:mod:`quire.bookie.listener`); with
    ``tls_ca_file`` too, peers must show a certificate that CA signed
    (mutual TLS, authorized by ``tls_allowed_roles``), and the bookie's
    own connections to its peers (repair, autorecovery) are TLS, showing
    its certificate.  The HTTP endpoint (``/metrics``, ``POST /admin/gc``)
    serves over TLS and authenticates against the metadata store's users
    when they are set."""
    tls_allowed_roles: tuple[str, ...] = ()
    """Mutual TLS on the bookie port: the roles whose certificates may
    connect (BookKeeper's ``BookieAuthZFactory``), e.g. ``("bookie",
    "segmentstore", "client")``; empty: any certificate ``tls_ca_file``
    signed.  A bookie's own certificate needs an allowed role for repair
    and autorecovery."""
    tls_role_field: str = "OU"
    """The subject field of a peer certificate that holds its role (``OU``,
    ``CN``, ``O``...; a value ``a,b`` is the role ``a``)."""
    max_connections: int = 4096
    """Open connections at most, TLS handshakes in progress included; one
    more is closed at once (0: no limit)."""
    max_connections_per_peer: int = 512
    """Open connections from one IP address at most (0: no limit); a client
    process holds one per bookie."""
    idle_timeout_ms: int = 30_000
    """A connection that sent nothing for this long and never sent a whole
    request, or holds part of one, or has not finished its TLS handshake,
    is closed, and so is one that read none of its waiting answers for as
    long (0: never).  A connection that did its work and waits for the
    next is kept (clients pool them)."""
    max_buffered_reply_bytes: int = 4 * 1024 * 1024
    """Write back-pressure: while more answer bytes than this wait in a
    connection's write buffer (its client does not read them), the bookie
    stops reading that connection; nor does it take more of its requests
    once their answers queued in one loop iteration pass it (0: no limit)."""
    flush_interval_ms: int = 1000
    """Checkpoint period: write cache to entry logs, index commit, journal mark."""
    gc_interval_ms: int = 60_000
    """How often deleted ledgers are dropped and dead entry logs removed
    (and whether a compaction is due is checked)."""
    minor_compaction_threshold: float = 0.2
    """Minor compaction copies out the live entries of entry logs less than
    this fraction live and removes the logs (0 turns it off)."""
    minor_compaction_interval_ms: int = 3_600_000
    """How often a minor compaction runs (at a GC, so at most every
    ``gc_interval_ms``; 0 turns it off)."""
    major_compaction_threshold: float = 0.8
    """Major compaction does the same for logs less than this fraction live
    (0 turns it off)."""
    major_compaction_interval_ms: int = 86_400_000
    """How often a major compaction runs (0 turns it off)."""
    compaction_disk_usage_threshold: float = 0.85
    """Above this used fraction of the ledger disk, the disk watch runs GC
    and a major compaction at once (at most once per ``gc_interval_ms``),
    whatever the intervals; 0 turns it off."""
    disk_check_interval_ms: int = 5_000
    disk_usage_threshold: float = 0.95
    """Above this used fraction of a ledger dir's disk the bookie turns read-only."""
    disk_usage_lwm_threshold: float = 0.90
    """Below this it turns writable again."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_connection_pending_bytes: int = 16 * 1024 * 1024
    """A connection's budget in bytes: the requests it sent and was not
    answered yet (adds held until durable) plus the answers queued for it
    in this loop iteration (see ``max_buffered_reply_bytes`` too).  Past it
    the bookie takes no more of its requests and stops reading it until
    half is free (a read of 64 KiB of batch-read requests would otherwise
    queue gigabytes of answers)."""
    batch_read_enabled: bool = True
    batch_read_max_size_bytes: int = 4 * 1024 * 1024
    registration_lease_ms: int = 3000
    """How long the bookie's registration outlives its last contact with the
    metadata store: the embedded drivers' lease, or ZooKeeper's session
    timeout (the server may raise it to twice its tick time)."""
    autorecovery_enabled: bool = False
    """Run an autorecovery auditor candidate and a replication worker in this
    bookie process (see ``quire.node.autorecovery``)."""
    lost_bookie_delay_s: float = 30.0
    """Autorecovery: how long a bookie must be missing from the registry
    before its ledgers are re-replicated."""
    open_ledger_grace_ms: int = 30_000
    """Autorecovery: how long an open ledger's writer gets to replace a lost
    bookie itself before a worker closes the ledger and re-replicates it."""
    autorecovery_interval_ms: int = 1000
    """Autorecovery: the auditor's look at the registry, an idle worker's pause."""
    repair_start_delay_ms: int = 0
    """BP-46 phase two: wait this long after the bookie serves before the
    first pass (limbo ledgers answer UNKNOWN meanwhile; tests of limbo
    answers hold phase two back with it)."""
    repair_retry_interval_ms: int = 2000
    """BP-46 phase two: pause before trying again the ledgers a pass could
    not finish (no peer answered, recovery could not decide, no good copy);
    it doubles after each such pass, up to a minute."""
    repair_parallel_ledgers: int = 4
    """BP-46 phase two: ledgers recovered and repaired at once."""
    repair_progress_every_ledgers: int = 100
    """BP-46 phase two: a progress log line per this many ledgers."""
    repair_read_timeout_ms: int = 10_000
    """BP-46 phase two: timeout of one read of a peer's copies."""
    gil_switch_interval_us: int = 200
    """``sys.setswitchinterval`` of the bookie process.  The fsync thread
    needs the GIL for a moment after every system call; with Python's default
    (5,000 us) it waits behind the busy event loop for up to that long, which
    was most of each group-commit cycle (see ARCHITECTURE.md)."""
    gc_gen0_threshold_allocations: int = 100_000
    """Python's first garbage-collector threshold (``gc.set_threshold``) in
    the bookie process; the start-up objects are also frozen out of every
    collection (``gc.freeze``).  The add path allocates a few objects per
    entry and makes no reference cycles, so Python's default (700) ran a
    collection every few hundred adds, each walking what the write cache and
    the BP-14 cursors hold: about a tenth of the bookie's CPU under load."""


    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("minor_compaction_threshold", "major_compaction_threshold",
                     "compaction_disk_usage_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be between 0 and 1")
        if not 0.0 <= self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1.0:
            raise ConfigError("disk thresholds must be 0 <= disk_usage_lwm_threshold"
                              " <= disk_usage_threshold <= 1")
        if self.minor_compaction_interval_ms < 0 or self.major_compaction_interval_ms < 0:
            raise ConfigError("compaction intervals must be 0 (off) or positive")
        for name in ("max_connections", "max_connections_per_peer", "idle_timeout_ms",
                     "max_buffered_reply_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 (no limit) or positive")
        if self.max_connection_pending_bytes <= 0:
            raise ConfigError("max_connection_pending_bytes must be positive")
        if self.tls_allowed_roles and not self.security.tls_ca_file:
            raise ConfigError("tls_allowed_roles needs tls_ca_file (mutual TLS)")

    @property
    def limits(self) -> ConnectionLimits:
        """The connection limits of :mod:`quire.bookie.connection`."""
        return ConnectionLimits(self.max_connections, self.max_connections_per_peer,
                                self.idle_timeout_ms, self.max_buffered_reply_bytes)

    @property
    def resolved_bookie_id(self) -> str:
        """The id the bookie registers and keeps in its cookie:
        ``bookie_id``, else the advertised ``host:port``."""
        return self.bookie_id or self.advertised_address(self.port)


def warn_if_unprotected(config: BookieConfig) -> bool:
    """Log a loud warning if ``config`` runs without the journal and without
    BP-46's data integrity checking, so that a crash can lose acknowledged
    entries unnoticed; return whether it did."""
    if config.storage.journal_write_data or config.data_integrity_checking:
        return False
    log.warning(
        "UNSAFE: journal_write_data = false and data_integrity_checking = false: this bookie "
        "answers adds before they are on disk and a crash or power loss can lose "
        "acknowledged entries WITHOUT ANYONE NOTICING (set data_integrity_checking = true "
        "or journal_write_data = true)")
    return True
