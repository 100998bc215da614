"""The wire server's configuration."""

from __future__ import annotations

from dataclasses import dataclass

from quire.errors import ConfigError
from quire.pravega_wire import MAX_WIRECOMMAND_SIZE


@dataclass(frozen=True)
class SegmentServerConfig:
    max_frame_bytes: int = MAX_WIRECOMMAND_SIZE
    """Largest request payload taken; a longer one closes the connection
    (refused from its header, before it is buffered)."""
    max_outstanding_requests: int = 1024
    """Unanswered requests on one connection above which it is no longer
    read (resumed at half)."""
    tail_read_wait_ms: int = 5_000
    """How long a read at the tail of an unsealed segment waits for data
    before it is answered empty (``at_tail``); the client times out at 30 s."""
    tail_read_linger_ms: int = 10
    """Once data reached a read waiting at the tail, how long more must stay
    away before it is answered (0: answer at once); see
    :meth:`~quire.segmentserver.segment_requests.SegmentRequests.burst`."""
    max_read_bytes: int = 2 * 1024 * 1024
    """Most bytes one SegmentRead carries (and table reads, roughly)."""
    max_table_entries_per_read: int = 1_000
    """Most entries or keys one table read answers, whatever was suggested."""
    max_connections: int = 10_000
    """Client connections served at once; one more is closed as soon as it
    is accepted (after its TLS handshake, under TLS)."""
    max_connections_per_peer: int = 1_000
    """Client connections from one IP address at once (the same refusal)."""
    idle_timeout_ms: int = 30_000
    """A connection that has not finished its TLS handshake and its Hello
    within this, or that leaves a frame it started unfinished this long, is
    closed.  (A connection idle between requests is kept: clients keep
    their connections open.)"""
    max_buffered_reply_bytes: int = 4 << 20
    """Replies written but not yet taken by the client above which the
    connection is no longer read (``pause_writing``), until the client has
    taken them down to a quarter of this (``resume_writing``)."""
    max_outstanding_bytes: int = 16 << 20
    """A connection's budget: bytes of its unanswered requests (appended
    data, table entries, and the most each pending read may answer) above
    which it is no longer read, until half are answered."""

    def __post_init__(self) -> None:
        if not 8 <= self.max_frame_bytes <= MAX_WIRECOMMAND_SIZE:
            raise ConfigError(f"max_frame_bytes must be in 8..{MAX_WIRECOMMAND_SIZE}")
        if self.max_outstanding_requests < 1:
            raise ConfigError("max_outstanding_requests must be positive")
        if not 0 <= self.tail_read_wait_ms < 30_000:
            raise ConfigError("tail_read_wait_ms must be in 0..29999 (the client waits 30 s)")
        if not 0 <= self.tail_read_linger_ms <= 1_000:
            raise ConfigError("tail_read_linger_ms must be in 0..1000")
        if not 1 <= self.max_read_bytes <= MAX_WIRECOMMAND_SIZE // 2:
            raise ConfigError("max_read_bytes must be in 1..half the largest frame")
        if self.max_table_entries_per_read < 1:
            raise ConfigError("max_table_entries_per_read must be positive")
        for name in ("max_connections", "max_connections_per_peer", "idle_timeout_ms",
                     "max_buffered_reply_bytes", "max_outstanding_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
