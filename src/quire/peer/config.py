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

    def __post_init__(self) -> None:
        for name in ("connect_timeout_ms", "max_frame_bytes", "timeout_check_interval_ms"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"peer setting {name} must be a positive int, got {value!r}")
