"""The options of the ``quire`` data source over a named log, parsed once into
plain data.  (Reading a stream, ``option("stream", "scope/stream")``, takes
the options of :mod:`quire.spark.stream_options`.)

====================  =======================================================
option                meaning
====================  =======================================================
metadata              metadata store URI (default: ``$QUIRE_METADATA``)
log                   log name (required)
password              password of the log's ledgers (default empty)
tls_ca                PEM CA file of the bookies' certificates: reach them
                      over TLS (default: ``$QUIRE_TLS_CA``, else plaintext)
zookeeper_digest_file, zookeeper_tls_ca_file, zookeeper_tls_cert_file,
zookeeper_tls_key_file
                      a ``zk://`` metadata store's digest credentials and TLS
                      (defaults: ``$QUIRE_ZOOKEEPER_DIGEST_FILE``, ...)
tls_cert, tls_key     PEM client certificate and key, for bookies with mutual
                      TLS (defaults: ``$QUIRE_TLS_CERT``, ``$QUIRE_TLS_KEY``)
start, end            batch read range, ``"seq:entry"`` positions: rows with
                      start <= position < end.  For a stream, ``start`` is
                      ``earliest`` (default), ``latest`` or a position.
partition_entries     entries per input partition at most (default 250000)
batch_entries         entries per Arrow batch / batched read (default 8192)
ensemble_size, write_quorum_size, ack_quorum_size
                      quorums of written ledgers (default 3/3/2, lowered to
                      the number of live bookies when fewer)
job_ttl               a write job not committed within this is garbage
                      (seconds, or with a unit: ``90s``, ``15m``, ``24h``,
                      ``7d``; default ``24h``)
sink_id               streaming write: the sink's stable id (required)
max_rows_per_trigger, max_bytes_per_trigger
                      streaming read: limits per micro-batch
fail_on_data_loss     streaming read: fail when the next offset was
                      truncated away (default ``true``; else skip ahead)
create                writes create the log if missing (default ``true``)
====================  =======================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from quire.client import ClientConfig
from quire.errors import ConfigError
from quire.log import Position
from quire.log.records import check_name
from quire.security import ZooKeeperSecurityConfig

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``"90"`` (seconds), ``"250ms"``, ``"90s"``, ``"15m"``, ``"24h"``, ``"7d"`` -> ms."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"bad duration {text!r}: use e.g. 90s, 15m, 24h, 7d")
    return int(float(match.group(1)) * _UNITS_MS[match.group(2) or "s"])


def bool_option(text: str, name: str) -> bool:
    """``text`` as a boolean option (true/false, 1/0, yes/no); ValueError naming
    the option otherwise."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, got {text!r}")


def positive_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    """Option ``name`` as an integer > 0 (``default`` when unset); ValueError
    naming the option otherwise.  Shared with the stream options."""
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name} must be an integer > 0, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"option {name} must be > 0, got {text!r}")
    return value


ZOOKEEPER_OPTIONS = tuple(f.name for f in fields(ZooKeeperSecurityConfig))
"""``zookeeper_digest_file``, ``zookeeper_tls_ca_file``, ...: how a ``zk://``
metadata store is reached (default: ``$QUIRE_ZOOKEEPER_DIGEST_FILE``, ...)."""


def zookeeper_of(options: Mapping[str, str]) -> ZooKeeperSecurityConfig:
    """The ``zookeeper_*`` options (or their ``$QUIRE_ZOOKEEPER_*`` defaults)."""
    try:
        return ZooKeeperSecurityConfig(**{
            name: options.get(name) or os.environ.get(f"QUIRE_{name.upper()}", "")
            for name in ZOOKEEPER_OPTIONS})
    except ConfigError as e:
        raise ValueError(f"options {', '.join(ZOOKEEPER_OPTIONS)}: {e}") from None


def client_config_of(tls_ca: str, tls_cert: str, tls_key: str,
                     zookeeper: ZooKeeperSecurityConfig | None = None) -> ClientConfig:
    """A ledger client's settings with these TLS files and ZooKeeper access;
    ValueError naming the options if they do not go together."""
    try:
        return ClientConfig(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                            zookeeper=zookeeper or ZooKeeperSecurityConfig())
    except ConfigError as e:
        raise ValueError(f"options tls_ca, tls_cert, tls_key: {e}") from None


@dataclass(frozen=True)
class QuireOptions:
    """Parsed data source options (picklable; see the module docstring)."""

    metadata: str
    log: str
    password: bytes = b""
    start: str | None = None
    end: Position | None = None
    partition_entries: int = 250_000
    batch_entries: int = 8192
    ensemble_size: int | None = None
    write_quorum_size: int | None = None
    ack_quorum_size: int | None = None
    job_ttl_ms: int = 86_400_000
    sink_id: str | None = None
    max_rows_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    create: bool = True
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    zookeeper: ZooKeeperSecurityConfig = field(default_factory=ZooKeeperSecurityConfig)

    @property
    def client_config(self) -> ClientConfig:
        """The settings of the ledger client that reads and writes the log."""
        return client_config_of(self.tls_ca, self.tls_cert, self.tls_key, self.zookeeper)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> QuireOptions:
        """Parse Spark's (case-insensitive) options; ValueError names the bad one."""
        get = options.get
        metadata = get("metadata") or os.environ.get("QUIRE_METADATA")
        if not metadata:
            raise ValueError("the quire data source needs option 'metadata' (a metadata "
                             "store URI such as sqlite:////path/metadata.db)")
        log = get("log")
        if not log:
            raise ValueError("the quire data source needs option 'log' (the log's name)")
        start = get("start")
        if start is not None and start.strip().lower() not in ("earliest", "latest"):
            Position.parse(start)  # validate now
        end = get("end")
        sink_id = get("sink_id")
        parsed = cls(
            metadata=metadata,
            log=check_name(log),
            password=(get("password") or "").encode(),
            start=None if start is None else start.strip().lower()
            if start.strip().lower() in ("earliest", "latest") else start.strip(),
            end=None if end is None else Position.parse(end),
            partition_entries=positive_option(options, "partition_entries", 250_000) or 250_000,
            batch_entries=positive_option(options, "batch_entries", 8192) or 8192,
            ensemble_size=positive_option(options, "ensemble_size", None),
            write_quorum_size=positive_option(options, "write_quorum_size", None),
            ack_quorum_size=positive_option(options, "ack_quorum_size", None),
            job_ttl_ms=parse_duration_ms(get("job_ttl") or "24h"),
            sink_id=None if sink_id is None else check_name(sink_id, "sink_id"),
            max_rows_per_trigger=positive_option(options, "max_rows_per_trigger", None),
            max_bytes_per_trigger=positive_option(options, "max_bytes_per_trigger", None),
            fail_on_data_loss=bool_option(get("fail_on_data_loss") or "true", "fail_on_data_loss"),
            create=bool_option(get("create") or "true", "create"),
            tls_ca=get("tls_ca") or os.environ.get("QUIRE_TLS_CA", ""),
            tls_cert=get("tls_cert") or os.environ.get("QUIRE_TLS_CERT", ""),
            tls_key=get("tls_key") or os.environ.get("QUIRE_TLS_KEY", ""),
            zookeeper=zookeeper_of(options),
        )
        parsed.client_config  # noqa: B018  (checks the TLS options now)
        return parsed

    @property
    def start_position(self) -> Position | None:
        """``start`` as a position (None for unset, earliest or latest)."""
        if self.start is None or self.start in ("earliest", "latest"):
            return None
        return Position.parse(self.start)

    def quorums(self, live_bookies: int) -> tuple[int, int, int]:
        """(E, W, A) for written ledgers: the options, else 3/3/2 lowered to
        the number of live bookies."""
        ensemble = self.ensemble_size or max(1, min(3, live_bookies))
        write = self.write_quorum_size or ensemble
        ack = self.ack_quorum_size or min(2, write)
        if not 1 <= ack <= write <= ensemble:
            raise ValueError(f"need 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size,"
                             f" got {ack}/{write}/{ensemble}")
        return ensemble, write, ack
