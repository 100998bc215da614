"""Fault injection for Spark drivers of the stream sink tests: put this
directory on ``PYTHONPATH`` (Python imports ``sitecustomize`` at start, in
the driver and in every Python worker it forks) and set
``QUIRE_CRASH_AFTER_COMMIT_RECORD=<stream>``: once a commit of a write to a
stream of that name is recorded (with ``QUIRE_CRASH_AFTER_FANOUT_DECISION=1``:
once a write across several streams is decided), before the first
transaction is committed,
the whole process group of the driver (its Python, its JVM, its Python
workers) is killed with SIGKILL, as a crashed driver host would be.  (PySpark's
daemon puts the Python workers in a group of their own: the driver's group
is the one the first process, the driver, finds and hands down in
``QUIRE_FAULT_DRIVER_PGID``; the worker then kills its own group, itself
included.)"""

from __future__ import annotations

import os
import signal

_STREAM = os.environ.get("QUIRE_CRASH_AFTER_COMMIT_RECORD")

if _STREAM:
    os.environ.setdefault("QUIRE_FAULT_DRIVER_PGID", str(os.getpgid(0)))
    from quire.spark import stream_commits

    _record = stream_commits.StreamCommits.commit_write

    async def _crashing_commit_write(self: stream_commits.StreamCommits, write_id: str,
                                     scope: str, stream: str, txns: object) -> int:
        if stream == _STREAM:
            def crash() -> None:
                os.killpg(int(os.environ["QUIRE_FAULT_DRIVER_PGID"]), signal.SIGKILL)
                os.killpg(os.getpgid(0), signal.SIGKILL)  # PySpark's daemon and this worker
            self.after_record = crash
        return await _record(self, write_id, scope, stream, txns)  # type: ignore[arg-type]

    stream_commits.StreamCommits.commit_write = _crashing_commit_write  # type: ignore[method-assign]

_FANOUT = os.environ.get("QUIRE_CRASH_AFTER_FANOUT_DECISION")

if _FANOUT:
    os.environ.setdefault("QUIRE_FAULT_DRIVER_PGID", str(os.getpgid(0)))
    from quire.spark import fanout_commits

    _decide = fanout_commits.FanOutCommits.commit_fanout

    async def _crashing_commit_fanout(self: fanout_commits.FanOutCommits, write_id: str,
                                      txns: object) -> int:
        def crash() -> None:
            os.killpg(int(os.environ["QUIRE_FAULT_DRIVER_PGID"]), signal.SIGKILL)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        self.after_record = crash
        return await _decide(self, write_id, txns)  # type: ignore[arg-type]

    fanout_commits.FanOutCommits.commit_fanout = (  # type: ignore[method-assign]
        _crashing_commit_fanout)
