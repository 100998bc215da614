"""Running ``python -m quire.simulation`` from tests, and reading its output."""

from __future__ import annotations

import re
import subprocess
import sys


def simulate(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m quire.simulation ARGS`` (its exit status is not checked)."""
    return subprocess.run([sys.executable, "-m", "quire.simulation", *args],
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def digest(output: str) -> str:
    """The trace sha256 a replay printed."""
    match = re.search(r"trace sha256 ([0-9a-f]{64})", output)
    assert match, output[-2000:]
    return match.group(1)


def without_cpu(output: str) -> str:
    """The output without the CPU time the run took (the one thing a replay
    does not repeat)."""
    return re.sub(r"[\d.]+ CPU s", "CPU s", output)
