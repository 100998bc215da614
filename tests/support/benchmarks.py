"""Running a script of ``benchmarks/`` as its short test does: this tree's
``src`` and root on ``PYTHONPATH``, output captured, a failure failing the
test with the script's stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, timeout_s: float) -> str:
    """``python benchmarks/<script> <args>`` from the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
