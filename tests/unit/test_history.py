"""The history checker (``quire.testing.history``) on hand-made histories:
each guarantee it proves is broken once, and it reports exactly that."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quire.testing.history import FAIL, OK, UNKNOWN, Operation, Recorder, load, main, report
from quire.testing.history_checks import check


class History:
    """Operations with explicit times (seconds)."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def op(self, process: str, f: str, obj: str, value: Any, t0: float, t1: float | None,
           outcome: str = OK, result: Any = None) -> Operation:
        op = Operation(process, len(self.ops) + 1, f, obj, value, t0, outcome, result,
                       None if outcome == OK else "error", t1)
        self.ops.append(op)
        return op

    def add(self, writer: str, ledger: str, payload: str, entry: int | None, t: float,
            outcome: str = OK) -> Operation:
        return self.op(writer, "ledger.add", ledger, {"payload": payload}, t, t + 0.5, outcome,
                       {"entry": entry} if outcome == OK else None)

    def read_all(self, ledger: str, entries: list[str], t: float) -> Operation:
        """A recovery read: the ledger closed at its last entry, read whole."""
        return self.op("verifier", "ledger.read", ledger, {"from": 0}, t, t + 0.5, OK,
                       {"entries": [[i, p] for i, p in enumerate(entries)],
                        "last": len(entries) - 1, "complete": True})

    def write(self, writer: str, key: str, payload: str, t: float,
              outcome: str = OK) -> Operation:
        return self.op(writer, "event.write", "sc/st", {"key": key, "payload": payload,
                                                        "exactly_once": True},
                       t, t + 0.5, outcome)

    def read(self, reader: str, payload: str, segment: int, offset: int, t: float,
             group: str = "g") -> Operation:
        return self.op(reader, "event.read", "sc/st", {"group": group}, t, t, OK,
                       {"payload": payload, "segment": segment, "offset": offset})

    def done(self, t: float, group: str = "g") -> Operation:
        return self.op("harness", "group.done", "sc/st", {"group": group}, t, t)

    def kinds(self) -> list[str]:
        return [a.kind for a in check(self.ops)]


def clean_ledger() -> History:
    h = History()
    for i in range(3):
        h.add("w1", "7", f"p{i}", i, float(i))
    h.add("w1", "7", "p3", None, 3.0, UNKNOWN)
    h.op("w1", "ledger.close", "7", None, 4.0, 4.5, OK, {"last": 2})
    for t, lac in ((1.0, 0), (2.0, 1), (3.0, 1)):
        h.op("r1", "ledger.lac", "7", None, t, t + 0.1, OK, {"lac": lac})
    h.read_all("7", ["p0", "p1", "p2"], 5.0)
    return h


def clean_stream() -> History:
    h = History()
    for n in range(3):
        h.write("w1", "k", f"k:{n}", float(n))
    h.write("w1", "k", "k:3", 3.0, UNKNOWN)  # never read: allowed
    for n in range(3):
        h.read("r1", f"k:{n}", 1, 10 * n, 4.0 + n)
    h.done(8.0)
    for t, length in ((1.0, 10), (2.0, 20), (2.2, 20)):
        h.op("probe", "segment.length", "sc/st/1", {"host": "a"}, t, t + 0.1, OK,
             {"length": length})
    return h


def test_clean_histories_have_no_anomaly() -> None:
    assert clean_ledger().kinds() == []
    assert clean_stream().kinds() == []


def test_a_lost_acknowledgement_is_reported() -> None:
    h = History()
    for i in range(3):
        h.add("w1", "7", f"p{i}", i, float(i))
    h.read_all("7", ["p0", "p1"], 5.0)  # entry 2 was acknowledged, recovery closed at 1
    assert h.kinds() == ["closed below an acknowledged entry"]

    h = clean_stream()
    h.write("w2", "j", "j:0", 0.0)  # acknowledged, never read by the group that is done
    anomalies = check(h.ops)
    assert [a.kind for a in anomalies] == ["lost acknowledged event"]
    assert anomalies[0].ops[0].arg("payload") == "j:0"


def test_an_entry_overwritten_at_its_id_is_a_lost_acknowledgement() -> None:
    h = History()
    h.add("w1", "7", "p0", 0, 0.0)
    h.add("w1", "7", "p1", 1, 1.0)
    h.read_all("7", ["p0", "other"], 5.0)
    assert h.kinds() == ["lost acknowledged entry"]


def test_a_duplicate_is_reported() -> None:
    h = clean_stream()
    h.read("r1", "k:1", 1, 40, 7.5)  # k:1 again, at a second position: written twice
    assert h.kinds() == ["event written twice"]

    h = clean_stream()
    h.read("r1", "k:1", 1, 10, 7.5)  # the same position again, the reader alive
    assert h.kinds() == ["event read twice"]

    h = History()
    h.add("w1", "7", "p0", 0, 0.0)
    h.add("w1", "7", "p1", None, 1.0, UNKNOWN)
    h.read_all("7", ["p0", "p1", "p1"], 5.0)  # an unknown add may appear, not twice
    assert h.kinds() == ["duplicate entry"]


def test_a_reader_that_failed_may_hand_its_unreleased_events_over() -> None:
    h = clean_stream()
    h.op("r1", "reader.release", "sc/st", {"group": "g"}, 4.5, 4.5, OK, {"segment": 1})
    h.op("r1", "reader.fail", "sc/st", {"group": "g"}, 6.5, 6.6, OK)
    h.read("r2", "k:2", 1, 20, 7.0)  # read after the release, before the failure: again
    assert h.kinds() == []
    h.read("r2", "k:0", 1, 0, 7.5)  # released before the failure: must not come again
    assert h.kinds() == ["event read twice"]


def test_a_reordering_is_reported() -> None:
    h = clean_stream()
    h.write("w1", "k", "k:4", 4.0)
    h.write("w1", "k", "k:5", 4.1)
    h.read("r1", "k:5", 1, 30, 7.0)
    h.read("r1", "k:4", 1, 40, 7.1)
    h.ops.sort(key=lambda o: o.invoked)
    done = next(o for o in h.ops if o.f == "group.done")
    done.invoked = done.completed = 9.0
    assert h.kinds() == ["reordered"]

    h = History()
    h.add("w1", "7", "p0", 0, 0.0)
    h.add("w1", "7", "p1", None, 1.0, UNKNOWN)
    h.add("w1", "7", "p2", 1, 2.0)
    h.read_all("7", ["p0", "p2", "p1"], 5.0)  # the unknown add landed after a later one
    assert h.kinds() == ["reordered"]


def test_lac_moving_backwards_is_reported() -> None:
    h = clean_ledger()
    h.op("r1", "ledger.lac", "7", None, 3.5, 3.6, OK, {"lac": 0})
    anomalies = check(h.ops)
    assert [a.kind for a in anomalies] == ["LAC moved backwards"]
    assert [o.res("lac") for o in anomalies[0].ops] == [1, 0]
    h = clean_ledger()
    h.op("r2", "ledger.lac", "7", None, 3.5, 3.6, OK, {"lac": 0})  # another reader: fine
    assert h.kinds() == []


def test_a_stale_read_is_reported() -> None:
    h = clean_stream()
    # after a read completed with length 20, another host answers 10
    h.op("probe", "segment.length", "sc/st/1", {"host": "b"}, 2.5, 2.6, OK, {"length": 10})
    assert h.kinds() == ["stale read"]
    h = clean_stream()
    # overlapping the read of 20 (invoked before it completed): not ordered, fine
    h.op("probe", "segment.length", "sc/st/1", {"host": "b"}, 2.05, 2.3, OK, {"length": 10})
    assert h.kinds() == []


def test_a_fenced_writers_entry_read_past_the_close_is_reported() -> None:
    h = clean_ledger()
    h.op("r1", "ledger.read", "7", {"from": 3}, 6.0, 6.1, OK, {"entries": [[3, "p3"]]})
    assert h.kinds() == ["fenced write visible"]


def test_failed_writes_must_not_appear_and_unverified_objects_are_reported() -> None:
    h = clean_stream()
    h.write("w1", "k", "k:9", 3.5, FAIL)
    h.read("r1", "k:9", 1, 30, 7.8)
    assert h.kinds() == ["failed write visible"]
    h = History()
    h.add("w1", "7", "p0", 0, 0.0)
    h.write("w1", "k", "k:0", 0.0)
    assert h.kinds() == ["unchecked", "unchecked"]


def test_files_written_by_recorders_load_report_and_set_the_exit_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer = Recorder(tmp_path / "w1.jsonl", "w1")
    harness = Recorder(tmp_path / "harness.jsonl", "harness")
    fault = harness.invoke("fault", "partition", {"targets": ["ss-1", "zk-1"]})
    for i in range(2):
        op = writer.invoke("ledger.add", "7", {"payload": f"p{i}"})
        writer.ok(op, {"entry": i})
    writer.invoke("ledger.add", "7", {"payload": "p2"})  # the writer was killed here
    harness.ok(fault)
    read = harness.invoke("ledger.recover", "7")
    harness.ok(read, {"last": 0})
    writer.close()
    harness.close()
    ops = load([tmp_path / "w1.jsonl", tmp_path / "harness.jsonl"])
    assert [(o.f, o.outcome) for o in ops if o.f == "ledger.add"] == \
        [("ledger.add", OK), ("ledger.add", OK), ("ledger.add", UNKNOWN)]
    anomalies = check(ops)
    text = report(ops, anomalies)
    assert "fault partition" in text and "closed below an acknowledged entry" in text
    assert 'w1#2 ledger.add 7 {"payload": "p1"}' in text
    assert main([str(tmp_path / "w1.jsonl"), str(tmp_path / "harness.jsonl")]) == 1
    assert "anomalies: 2" in capsys.readouterr().out  # also: never read completely
    (tmp_path / "clean.jsonl").write_text("\n".join(json.dumps(line) for line in [
        {"process": "w", "id": 1, "type": "invoke", "f": "ledger.add", "obj": "1",
         "value": {"payload": "a"}, "time": 1.0},
        {"process": "w", "id": 1, "type": "fail", "error": "no", "time": 2.0}]))
    assert main([str(tmp_path / "clean.jsonl")]) == 0
    assert main([]) == 2
