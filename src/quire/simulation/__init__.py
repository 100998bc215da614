"""Deterministic simulation of the replication protocol (test-only).

Real Quire clients and bookies (the client's quorums, recovery, ensemble
changes and fencing; the bookie's server, handlers and storage engine) run
in one process on a virtual-time event loop (:mod:`~quire.simulation.loop`),
over a simulated network (:mod:`~quire.simulation.network`) and simulated
disks (:mod:`~quire.simulation.disk`), with the in-memory metadata store.
One seed fixes every choice: ``python -m quire.simulation --seed N``
replays a run exactly.  The product never imports this package
(``tests/unit/test_layering.py``).
"""

from quire.simulation.run import RunResult, run_seed

__all__ = ["RunResult", "run_seed"]
