"""What every handle of one client shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from quire.client.config import ClientConfig
from quire.client.placement import RandomPlacement
from quire.metadata import MetadataStore
from quire.peer import BookiePool


@dataclass(eq=False)
class ClientContext:
    store: MetadataStore
    pool: BookiePool
    config: ClientConfig
    placement: RandomPlacement
    batch_unsupported: set[str] = field(default_factory=set)
    """Bookies that answered UNSUPPORTED to a batch read (read entry by entry)."""

    @property
    def add_timeout_s(self) -> float:
        return self.config.add_entry_timeout_ms / 1000.0

    @property
    def read_timeout_s(self) -> float:
        return self.config.read_timeout_ms / 1000.0

    @property
    def speculative_timeout_s(self) -> float:
        return self.config.speculative_read_timeout_ms / 1000.0
