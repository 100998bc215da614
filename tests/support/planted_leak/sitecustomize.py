"""Plants :mod:`quire.testing.planted_leak` in a process started with this
directory on ``PYTHONPATH`` (Python imports ``sitecustomize`` at start) and
``QUIRE_PLANTED_LEAK=1``: ``benchmarks/soak_month.py --plant-leak`` starts
one of its segment stores so, and its slope test must catch it."""

from __future__ import annotations

import os

if os.environ.get("QUIRE_PLANTED_LEAK") == "1":
    from quire.testing.planted_leak import install

    install()
