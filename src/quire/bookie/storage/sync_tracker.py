"""Records which bytes of the engine's files an fsync made durable.

With ``StorageConfig.power_loss_tracking`` the storage engine records, **after
each fsync returns**, the length of the file that the fsync made durable, in
a sidecar file per directory.  A test can then rewind every tracked file to
what a power cut would have left (``quire.testing.power_loss`` reads the
sidecar this module writes; see there for what it emulates).

Sidecar format: ``<dir>/.quire-synced``, one ASCII line per event, appended
with ``O_APPEND`` and never fsynced (it only has to outlive the process)::

    create <kind> <file name> 0
    sync <kind> <file name> <synced length in bytes>
    remove <kind> <file name> 0

``kind`` is ``journal`` (preallocated journal files) or ``entrylog``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SIDECAR_NAME = ".quire-synced"
KIND_JOURNAL = "journal"
KIND_ENTRY_LOG = "entrylog"
TRACKED_KINDS = (KIND_JOURNAL, KIND_ENTRY_LOG)


class SyncTracker:
    """Appends create/sync/remove events for the files of one directory."""

    def __init__(self, directory: Path, kind: str) -> None:
        if kind not in TRACKED_KINDS:
            raise ValueError(f"unknown tracked file kind {kind!r}")
        self.directory = Path(directory)
        self.kind = kind
        self._lock = threading.Lock()
        self._fd = os.open(self.directory / SIDECAR_NAME,
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _event(self, event: str, name: str, length: int) -> None:
        line = f"{event} {self.kind} {name} {length}\n".encode("ascii")
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line)

    def created(self, name: str) -> None:
        self._event("create", name, 0)

    def synced(self, name: str, length: int) -> None:
        """Record that ``name``'s first ``length`` bytes are durable (call
        this only after the fsync returned)."""
        self._event("sync", name, length)

    def removed(self, name: str) -> None:
        self._event("remove", name, 0)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
