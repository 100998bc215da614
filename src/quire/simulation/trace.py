"""The readable record of one simulated run.

Every line is ``<virtual seconds> <event>``; the same seed gives the same
lines, so :meth:`Trace.digest` compares two runs byte for byte.  Keeps
every line (a run is short); :meth:`Trace.tail` gives the last ones for a
failure report.
"""

from __future__ import annotations

import asyncio
import hashlib


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
