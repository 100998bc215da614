"""Histories of what clients saw, and their checker's report.

Every client of a fault round (ledger writers and readers, stream writers
and readers, the real Pravega client, probes of segment stores) records each
operation it makes as two JSON lines in a file of its own: the *invoke*,
before the call, and its *completion*, after it::

    {"process": "w1", "id": 7, "type": "invoke", "f": "ledger.add", "obj": "17",
     "value": {"payload": "w1-17-7"}, "time": 1712345678.123}
    {"process": "w1", "id": 7, "type": "ok", "result": {"entry": 6}, "time": ...}

A completion is ``ok``, ``fail`` (certainly not applied) or ``unknown``
(maybe applied: a timeout, a lost connection, an error after the request
left); an operation with no completion (its process was killed) is
unknown.  The harness records each fault the same way (``f`` is
``"fault"``: invoked when it starts, ok when it is healed).  Times are the
machine's wall clock, shared by the processes of one machine, so an
operation that completed before another was invoked precedes it in real
time.

:func:`load` merges the files of a round into :class:`Operation` s;
:func:`quire.testing.history_checks.check` finds the anomalies (what each
operation kind must satisfy is said there); :func:`report` prints both.
``python -m quire.testing.history FILE...`` does all three and exits with
status 1 if there is any anomaly.  No product code imports this package.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
OUTCOMES = (OK, FAIL, UNKNOWN)


@dataclass
class Operation:
    """One operation of one process: its invoke and (if seen) its completion."""

    process: str
    id: int
    f: str
    """What it did: ``ledger.add``, ``event.write``, ``fault`` ..."""
    obj: str
    """What it did it to: a ledger id, a stream ``scope/stream``, a segment."""
    value: Any
    invoked: float
    outcome: str = UNKNOWN
    result: Any = None
    error: str | None = None
    completed: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def arg(self, key: str, default: Any = None) -> Any:
        return self.value.get(key, default) if isinstance(self.value, dict) else default

    def res(self, key: str, default: Any = None) -> Any:
        return self.result.get(key, default) if isinstance(self.result, dict) else default

    def before(self, other: Operation) -> bool:
        """Completed before ``other`` was invoked (real-time order)."""
        return self.completed is not None and self.completed < other.invoked

    def describe(self, origin: float = 0.0) -> str:
        end = "never completed" if self.completed is None else \
            f"{self.outcome} {self.completed - origin:.3f}"
        what = f"{self.process}#{self.id} {self.f} {self.obj}"
        if self.value is not None:
            what += f" {_short(self.value)}"
        line = f"{what} invoked {self.invoked - origin:.3f} {end}"
        if self.result is not None:
            line += f" -> {_short(self.result)}"
        if self.error:
            line += f" ({self.error})"
        return line


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class Anomaly:
    """A violated guarantee, with the operations that show it."""

    kind: str
    message: str
    ops: list[Operation] = field(default_factory=list)


class Recorder:
    """Appends one process's operations to a history file (thread-safe;
    each line is flushed as it is written, so a killed process leaves its
    invokes behind)."""

    def __init__(self, path: Path | str, process: str) -> None:
        self.process = process
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (closed by close())
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"process": self.process, **record, "time": time.time()})
        with self._lock:
            self._file.write(line + "\n")

    def invoke(self, f: str, obj: str, value: Any = None) -> int:
        """Record the start of an operation; its id, for the completion."""
        op = next(self._ids)
        self._write({"id": op, "type": "invoke", "f": f, "obj": str(obj), "value": value})
        return op

    def ok(self, op: int, result: Any = None) -> None:
        self._write({"id": op, "type": OK, "result": result})

    def fail(self, op: int, error: BaseException | str) -> None:
        """The operation certainly had no effect."""
        self._write({"id": op, "type": FAIL, "error": _text(error)})

    def unknown(self, op: int, error: BaseException | str) -> None:
        """The operation may or may not have had its effect."""
        self._write({"id": op, "type": UNKNOWN, "error": _text(error)})

    def instant(self, f: str, obj: str, value: Any = None, result: Any = None) -> None:
        """An operation seen complete at once (an event handed to a reader)."""
        self.ok(self.invoke(f, obj, value), result)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _text(error: BaseException | str) -> str:
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


def load(paths: Iterable[Path | str]) -> list[Operation]:
    """The operations of every file, in invoke order; a completion whose
    invoke is missing is ignored (a torn last line too)."""
    ops: dict[tuple[str, int], Operation] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill
            key = (record["process"], record["id"])
            if record["type"] == "invoke":
                ops[key] = Operation(record["process"], record["id"], record["f"],
                                     record["obj"], record.get("value"), record["time"])
            elif key in ops and record["type"] in OUTCOMES:
                op = ops[key]
                op.outcome, op.completed = record["type"], record["time"]
                op.result, op.error = record.get("result"), record.get("error")
    return sorted(ops.values(), key=lambda o: (o.invoked, o.process, o.id))


def report(ops: Sequence[Operation], anomalies: Sequence[Anomaly], per_kind: int = 5) -> str:
    """Operations by kind and outcome, the faults, then each anomaly with
    the operations involved (times in seconds from the first invoke; the
    first ``per_kind`` anomalies of each kind, then how many more)."""
    origin = ops[0].invoked if ops else 0.0
    processes = {o.process for o in ops}
    faults = [o for o in ops if o.f == "fault"]
    lines = [f"history: {len(ops) - len(faults)} operations of {len(processes)} processes, "
             f"{len(faults)} faults"]
    counts = Counter((o.f, o.outcome) for o in ops if o.f != "fault")
    for f in sorted({f for f, _ in counts}):
        lines.append(f"  {f:<16}" + "".join(f" {o} {counts[f, o]:<6}" for o in OUTCOMES))
    for fault in faults:
        healed = "not healed" if fault.completed is None else \
            f"healed {fault.completed - origin:.3f} ({fault.completed - fault.invoked:.2f} s)"
        lines.append(f"fault {fault.obj} {json.dumps(fault.value, sort_keys=True)}: "
                     f"{fault.invoked - origin:.3f}, {healed}")
    lines.append(f"anomalies: {len(anomalies)}")
    shown: Counter[str] = Counter()
    for anomaly in anomalies:
        shown[anomaly.kind] += 1
        if shown[anomaly.kind] <= per_kind:
            lines.append(f"  {anomaly.kind}: {anomaly.message}")
            lines += [f"    {op.describe(origin)}" for op in anomaly.ops]
    lines += [f"  ({n - per_kind} more {kind} anomalies)" for kind, n in shown.items()
              if n > per_kind]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m quire.testing.history FILE...``: the report; status 1 on
    any anomaly, 2 on no input."""
    # (through the package: run as __main__, this module is a second copy)
    from quire.testing import history
    from quire.testing.history_checks import check

    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m quire.testing.history HISTORY_FILE...", file=sys.stderr)
        return 2
    ops = history.load(paths)
    anomalies = check(ops)
    print(history.report(ops, anomalies))
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
