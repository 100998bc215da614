"""What the file driver's fsyncs made durable, recorded for power-loss tests.

With ``Tier2Config.power_loss_tracking`` the file driver appends one line to
``<root>/.quire-tier2-synced`` **after** each step returns, so the file says
only what really happened; :mod:`quire.testing.tier2_power_loss` reads it
and removes whatever a power cut could have lost.  The sidecar is appended
with ``O_APPEND``, one ``write`` per line, and never fsynced (it only has
to outlive the process).  Lines (paths relative to the root, ``.`` for the
root itself)::

    mkdir <directory>          the driver created this directory
    dirsync <directory>        an fsync of this directory returned
    sync <chunk name> <bytes>  the chunk's bytes (still in its temporary
                               file) were fsynced, this many of them
    link <chunk name>          the chunk got its name (before its
                               directory's fsync)
    unlink <chunk name>        the chunk was deleted

A name or a directory is durable once a ``dirsync`` of its directory follows
its ``link``/``mkdir`` and that directory is durable itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SIDECAR_NAME = ".quire-tier2-synced"


class SyncTracker:
    """Appends the events above to one root's sidecar (thread-safe)."""

    def __init__(self, root: Path) -> None:
        self._lock = threading.Lock()
        self._fd = os.open(root / SIDECAR_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _event(self, *words: str | int) -> None:
        line = (" ".join(str(w) for w in words) + "\n").encode("ascii")
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line)

    def created_directory(self, directory: str) -> None:
        self._event("mkdir", directory)

    def synced_directory(self, directory: str) -> None:
        self._event("dirsync", directory)

    def synced_chunk(self, name: str, length: int) -> None:
        self._event("sync", name, length)

    def linked(self, name: str) -> None:
        self._event("link", name)

    def unlinked(self, name: str) -> None:
        self._event("unlink", name)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
