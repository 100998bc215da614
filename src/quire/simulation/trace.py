"""The readable record of one simulated run.

Every line is ``<virtual seconds> <event>``; the same seed gives the same
lines, so :meth:`Trace.digest` compares two runs byte for byte.  Keeps
every line (a run is short); :meth:`Trace.tail` gives the last ones for a
failure report.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterator


class Trace:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, text: str) -> None:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # (outside the loop: set-up and final checks)
            now = -1.0
        self.lines.append(f"{now:12.6f} {text}")

    def digest(self) -> str:
        """SHA-256 of every line, in order."""
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def tail(self, count: int) -> list[str]:
        return self.lines[-count:]


class _ToTrace(logging.Handler):
    def __init__(self, trace: Trace, label: str | None) -> None:
        super().__init__(logging.INFO)
        self._trace = trace
        self._label = label

    def emit(self, record: logging.LogRecord) -> None:
        label = self._label or record.name.removeprefix("quire.")
        self._trace.event(f"[{label}] {record.getMessage()}")


@contextlib.contextmanager
def product_logs(trace: Trace, logger: str, label: str | None = None) -> Iterator[None]:
    """Inside the block, logger ``logger``'s INFO lines go to ``trace`` as
    ``[label] message`` (``label`` None: the logger's name without
    ``quire.``); every other product log line is dropped (bookies warn
    about each malformed or reset connection)."""
    root, kept = logging.getLogger("quire"), logging.getLogger(logger)
    saved = root.level, kept.level, kept.propagate
    handler = _ToTrace(trace, label)
    root.setLevel(logging.CRITICAL + 1)
    kept.setLevel(logging.INFO)
    kept.propagate = False
    kept.addHandler(handler)
    try:
        yield
    finally:
        kept.removeHandler(handler)
        root.setLevel(saved[0])
        kept.setLevel(saved[1])
        kept.propagate = saved[2]
