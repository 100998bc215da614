"""A cluster of real bookie processes on one SQLite metadata file.

``Cluster(root, size)`` prepares ``size`` :class:`BookieProcess` es (ids
``bookie-0`` ...; each keeps its port across restarts) sharing
``root/metadata.db`` (or the store at ``metadata_uri``, e.g. ``zk://``);
:meth:`Cluster.start` starts them in parallel.  Bookies
are addressed by index: :meth:`kill9`, :meth:`stop`, :meth:`restart`.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from quire.sandbox import free_port, sqlite_uri, start_all, stop_all
from tests.support.bookies import BookieProcess


class Cluster:
    def __init__(self, root: Path, size: int, metadata_uri: str | None = None,
                 **bookie_settings: Any) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.metadata_uri = metadata_uri or sqlite_uri(root / "metadata.db")
        self.bookies = [
            BookieProcess(root, self.metadata_uri, f"bookie-{i}", port=free_port(),
                          **bookie_settings)
            for i in range(size)]
        self.client_settings: dict[str, Any] = {}
        """ClientConfig keys its tests' clients take (TLS: tests.support.tls)."""
        self.client_tls: ssl.SSLContext | None = None
        """The context of raw connections to its bookies (None: plaintext)."""

    def __len__(self) -> int:
        return len(self.bookies)

    def start(self, timeout_s: float = 60.0) -> Cluster:
        """Start every bookie that is not running, in parallel; wait until all serve."""
        start_all([b for b in self.bookies if not b.running], timeout_s)
        return self

    def bookie_id(self, index: int) -> str:
        return self.bookies[index].bookie_id

    def index_of(self, bookie_id: str) -> int:
        return next(i for i, b in enumerate(self.bookies) if b.bookie_id == bookie_id)

    def kill9(self, index: int) -> None:
        self.bookies[index].kill9()

    def stop(self, index: int) -> None:
        """Clean shutdown of one bookie (SIGTERM)."""
        self.bookies[index].stop()

    def restart(self, index: int, timeout_s: float = 60.0) -> None:
        """Start one bookie again (same id, port and directories)."""
        bookie = self.bookies[index]
        if bookie.running:
            bookie.stop()
        bookie.start(timeout_s=timeout_s)

    def close(self) -> None:
        """Stop every bookie (SIGTERM to all first, so they stop in parallel)."""
        stop_all(self.bookies)
