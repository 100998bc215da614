"""The model-based test of one segment container, with ``kill -9`` of its owner.

A subprocess (``tests/support/segment_driver.py``) owns container 0 on a
:class:`~quire.log.NamedDataLog` of 3 real bookie processes (shared by the
examples; each example has its own log) and executes the requests this
hypothesis state machine sends it; the model is plain dicts of bytes,
attributes and one table's entries.  Every mutating operation kind comes in
random order, alone (awaited) or in bursts sent without waiting; a burst
may end with ``kill -9`` of the owner after some of its answers came back.
A new process then opens the container (fencing the dead one's ledger,
replaying the log) and its whole state must be the model's after some
prefix of the calls: every acknowledged operation there (the prefix reaches
past the last one answered with success), each operation wholly or not at
all, never a later one without an earlier one, refusals and conditions
(expected offsets, attribute compare-and-set, writer dedup, table versions)
as the model says.  Operations in flight at the kill may go either way;
the test adopts what the container shows.

``QUIRE_SEGMENT_SOAK_EXAMPLES=N`` runs N examples instead of the suite's few.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from quire.segmentstore import NOT_EXISTS, AttributeUpdate, UpdateType
from quire.segmentstore.tables import encode_batch
from tests.support.cluster import Cluster
from tests.support.segment_model import (
    KEYS,
    NAMES,
    TABLE,
    TABLE_KEYS,
    WRITERS,
    Seg,
    model_updates,
    updates_st,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = {"checkpoint_every_bytes": 300, "read_index_budget_bytes": 200,
          "max_frame_bytes": 256, "max_frames_in_flight": 4}
TIMEOUT_S = 60.0
SOAK = int(os.environ.get("QUIRE_SEGMENT_SOAK_EXAMPLES", "0"))
KILLS: list[tuple[int, int, int]] = []
"""Per kill: calls in flight, the last answered with success, the last that happened."""


@pytest.fixture(scope="module")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster(tmp_path_factory.mktemp("segment-model"), 3).start()
    yield started
    started.close()


# --- the model ---------------------------------------------------------------------


@dataclass
class Model:
    segs: dict[str, Seg] = field(default_factory=dict)
    table: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    table_length: int = 0

    def render(self) -> dict[str, Any]:
        """The state as the driver's ``state`` request shows it."""
        out: dict[str, Any] = {}
        for name, s in self.segs.items():
            out[name] = {"length": len(s.data), "start": s.start, "sealed": s.sealed,
                         "attrs": [[k, v] for k, v in sorted(s.attrs.items())],
                         "data": bytes(s.data[s.start:]).hex()}
        by_version = sorted(self.table.items(), key=lambda kv: kv[1][0])
        out[TABLE] = {"length": self.table_length, "start": 0, "sealed": False, "attrs": [],
                      "data": None,
                      "table": [[k.hex(), v, value.hex()]
                                for k, (v, value) in sorted(self.table.items())],
                      "delta": [[k.hex(), v] for k, (v, _value) in by_version],
                      "delta_end": self.table_length}
        return dict(sorted(out.items()))


def ok(value: Any = None) -> dict[str, Any]:
    return {"ok": value}


def err(name: str) -> dict[str, Any]:
    return {"err": name}


def table_refusal(m: Model, conditions: list[tuple[bytes, int | None]]) -> str | None:
    for key, expected in conditions:
        current = m.table.get(key)
        if expected is None:
            continue
        if expected == NOT_EXISTS:
            if current is not None:
                return "TableKeyBadVersionError"
        elif current is None:
            return "TableKeyNotFoundError"
        elif current[0] != expected:
            return "TableKeyBadVersionError"
    return None


def apply(m: Model, r: dict[str, Any]) -> tuple[dict[str, Any], list[Model]]:
    """The answer to request ``r`` as the model says it, applying it to ``m``;
    and the states it passes through on the way (a merge of an unsealed
    source seals it first, as its own operation)."""
    op = r["op"]
    name: str = r.get("name", "")
    seg = m.segs.get(name)
    if op == "create":
        if name in m.segs:
            return err("SegmentExistsError"), []
        m.segs[name] = Seg(attrs={k: v for k, v in r["attrs"]})
        return ok(), []
    if op == "append":
        if seg is None:
            return err("SegmentNotFoundError"), []
        if seg.sealed:
            return err("SegmentSealedError"), []
        writer = r["writer"]
        previous = None
        if writer is not None:
            previous = seg.attrs.get(writer[0])
            if previous is not None and writer[1] <= previous:
                return ok([len(seg.data), writer[1], previous, True]), []
        if r["expected"] is not None and r["expected"] != len(seg.data):
            return err("BadOffsetError"), []
        attrs = model_updates(seg.attrs, decode_updates(r["updates"]))
        if attrs is None:
            return err("BadAttributeUpdateError"), []
        if writer is not None:
            attrs[writer[0]] = writer[1]
        seg.attrs = attrs
        seg.data += bytes.fromhex(r["data"])
        return ok([len(seg.data), None if writer is None else writer[1], previous, False]), []
    if op == "seal":
        if seg is None:
            return err("SegmentNotFoundError"), []
        if seg.sealed:
            return err("SegmentSealedError"), []
        seg.sealed = True
        return ok(len(seg.data)), []
    if op == "truncate":
        if seg is None:
            return err("SegmentNotFoundError"), []
        if r["offset"] > len(seg.data):
            return err("BadOffsetError"), []
        seg.start = max(seg.start, r["offset"])
        return ok(), []
    if op == "delete":
        if seg is None:
            return err("SegmentNotFoundError"), []
        del m.segs[name]
        return ok(), []
    if op == "merge":
        t, src = m.segs.get(r["target"]), m.segs.get(r["source"])
        if t is None:
            return err("SegmentNotFoundError"), []
        if t.sealed:
            return err("SegmentSealedError"), []
        if src is None:
            return err("SegmentNotFoundError"), []
        if src is t:
            return err("SegmentStoreError"), []
        if src.start:
            return err("SegmentTruncatedError"), []
        passed = []
        if not src.sealed:
            src.sealed = True
            passed.append(copy.deepcopy(m))
        t.data += src.data
        del m.segs[r["source"]]
        return ok(len(t.data)), passed
    if op == "update_attributes":
        if seg is None:
            return err("SegmentNotFoundError"), []
        if seg.sealed:
            return err("SegmentSealedError"), []
        attrs = model_updates(seg.attrs, decode_updates(r["updates"]))
        if attrs is None:
            return err("BadAttributeUpdateError"), []
        seg.attrs = attrs
        return ok(), []
    if op == "table_put":
        entries = [(bytes.fromhex(k), bytes.fromhex(v), e) for k, v, e in r["entries"]]
        refusal = table_refusal(m, [(k, e) for k, _v, e in entries])
        if refusal is not None:
            return err(refusal), []
        if not entries:
            return ok([]), []
        data, offsets = encode_batch([(k, v) for k, v, _e in entries])
        versions = [m.table_length + o for o in offsets]
        m.table_length += len(data)
        for (k, v, _e), version in zip(entries, versions, strict=True):
            m.table[k] = (version, v)
        return ok(versions), []
    if op == "table_remove":
        keys = [(bytes.fromhex(k), e) for k, e in r["keys"]]
        refusal = table_refusal(m, keys)
        if refusal is not None:
            return err(refusal), []
        present = [(k, None) for k, _e in keys if k in m.table]
        if present:
            m.table_length += len(encode_batch(present)[0])
        for k, _e in keys:
            m.table.pop(k, None)
        return ok(), []
    raise AssertionError(op)


def decode_updates(raw: list[list[Any]]) -> list[AttributeUpdate]:
    return [AttributeUpdate(k, UpdateType[t], v, c) for k, t, v, c in raw]


def encode_updates(updates: list[AttributeUpdate]) -> list[list[Any]]:
    return [[u.key, u.update_type.name, u.value, u.comparison_value] for u in updates]


# --- requests, drawn abstract and made concrete against the model ------------------

name_st = st.sampled_from(NAMES)
append_st = st.tuples(st.just("append"), name_st, st.binary(min_size=1, max_size=40), updates_st,
                      st.sampled_from(["none", "none", "right", "wrong"]),
                      st.none() | st.tuples(st.sampled_from(WRITERS), st.integers(0, 6)))
request_st = st.one_of(
    append_st, append_st, append_st,
    st.tuples(st.just("create"), name_st,
              st.dictionaries(st.sampled_from(KEYS), st.integers(0, 3), max_size=2)),
    st.tuples(st.just("seal"), name_st),
    st.tuples(st.just("truncate"), name_st, st.floats(0, 1.2)),
    st.tuples(st.just("delete"), name_st),
    st.tuples(st.just("merge"), name_st, name_st),
    st.tuples(st.just("update_attributes"), name_st, updates_st),
    st.tuples(st.just("table_put"), st.dictionaries(st.sampled_from(TABLE_KEYS), st.tuples(
        st.binary(max_size=8), st.sampled_from(["any", "absent", "current", "current",
                                                "wrong"])), max_size=2)),
    st.tuples(st.just("table_remove"), st.dictionaries(
        st.sampled_from(TABLE_KEYS), st.sampled_from(["any", "current", "current", "wrong"]),
        max_size=2)),
)


def expected_version(m: Model, key: bytes, kind: str) -> int | None:
    current = m.table.get(key)
    return {"any": None, "absent": NOT_EXISTS,
            "current": current[0] if current else None,
            "wrong": (current[0] + 1) if current else 10_001}[kind]


def concrete(m: Model, drawn: tuple[Any, ...]) -> dict[str, Any]:
    """The request ``drawn`` stands for, against the model's state now."""
    op = drawn[0]
    if op == "append":
        _op, name, data, updates, offset, writer = drawn
        seg = m.segs.get(name)
        length = len(seg.data) if seg is not None else 0
        return {"op": op, "name": name, "data": data.hex(), "updates": encode_updates(updates),
                "expected": {"none": None, "right": length, "wrong": length + 1}[offset],
                "writer": None if writer is None else list(writer)}
    if op == "create":
        return {"op": op, "name": drawn[1], "attrs": [[k, v] for k, v in drawn[2].items()]}
    if op in ("seal", "delete"):
        return {"op": op, "name": drawn[1]}
    if op == "truncate":
        seg = m.segs.get(drawn[1])
        return {"op": op, "name": drawn[1],
                "offset": int(drawn[2] * len(seg.data)) if seg is not None else 0}
    if op == "merge":
        return {"op": op, "target": drawn[1], "source": drawn[2]}
    if op == "update_attributes":
        return {"op": op, "name": drawn[1], "updates": encode_updates(drawn[2])}
    if op == "table_put":
        return {"op": op, "name": TABLE,
                "entries": [[k.hex(), v.hex(), expected_version(m, k, kind)]
                            for k, (v, kind) in drawn[1].items()]}
    if op == "table_remove":
        return {"op": op, "name": TABLE,
                "keys": [[k.hex(), expected_version(m, k, kind)] for k, kind in drawn[1].items()]}
    raise AssertionError(op)


# --- the owner process -------------------------------------------------------------


class Owner:
    """One driver process owning the container."""

    def __init__(self, uri: str, log_name: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.segment_driver", uri, log_name,
             json.dumps(CONFIG)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
        self.answers: dict[int, dict[str, Any]] = {}
        self.buffer = b""
        try:
            line = self._line(time.monotonic() + TIMEOUT_S)
            assert line == {"ready": True}, f"the owner did not open the container (exit " \
                f"{self.proc.poll()}; its stderr is above)"
        except BaseException:
            self.close()
            raise

    def _line(self, deadline: float) -> dict[str, Any] | None:
        """The next line (None at the end of the output)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise AssertionError(f"no answer from the owner (exit {self.proc.poll()})")
            ready, _, _ = select.select([fd], [], [], timeout)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return dict(json.loads(line))

    def send(self, n: int, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": n, **request}).encode() + b"\n")
        self.proc.stdin.flush()

    def wait(self, count: int) -> None:
        """Until at least ``count`` answers came."""
        deadline = time.monotonic() + TIMEOUT_S
        while len(self.answers) < count:
            line = self._line(deadline)
            assert line is not None, f"the owner ended (exit {self.proc.poll()})"
            self.answers[line.pop("id")] = line

    def ask(self, n: int, request: dict[str, Any]) -> dict[str, Any]:
        self.send(n, request)
        self.wait(len(self.answers) + 1)
        return self.answers.pop(n)

    def kill9(self) -> None:
        """``kill -9``, then read what it had answered before it died."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + TIMEOUT_S
        while (line := self._line(deadline)) is not None:
            self.answers[line.pop("id")] = line
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


# --- the state machine -------------------------------------------------------------


class CrashMachine(RuleBasedStateMachine):
    uri = ""

    def __init__(self) -> None:
        super().__init__()
        self.log_name = f"segment-model-{uuid.uuid4().hex}"
        self.owner = Owner(self.uri, self.log_name)
        self.next_id = 0
        self.model = Model()
        for name in NAMES:
            assert self.ask({"op": "create", "name": name, "attrs": []}) == ok()
            self.model.segs[name] = Seg()
        assert self.ask({"op": "create", "name": TABLE, "type": "TABLE", "attrs": []}) == ok()

    def teardown(self) -> None:
        self.owner.close()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        return self.owner.ask(self.next_id, request)

    def state(self) -> dict[str, Any]:
        got = self.ask({"op": "state"})
        assert "ok" in got, got
        shown = dict(got["ok"])
        shown[TABLE] = {**shown[TABLE], "data": None}
        return shown

    @rule(drawn=request_st)
    def one(self, drawn: tuple[Any, ...]) -> None:
        request = concrete(self.model, drawn)
        want, _passed = apply(self.model, request)
        assert self.ask(request) == want, request

    @rule(name=name_st, at=st.floats(0, 1), size=st.integers(0, 50))
    def read(self, name: str, at: float, size: int) -> None:
        seg = self.model.segs.get(name)
        if seg is None:
            assert self.ask({"op": "read", "name": name, "offset": 0, "size": 1}) == \
                err("SegmentNotFoundError")
            return
        offset = int(at * len(seg.data))
        got = self.ask({"op": "read", "name": name, "offset": offset, "size": size})
        if offset < seg.start:
            assert got == err("SegmentTruncatedError")
        else:
            data = bytes(seg.data[offset:offset + size])
            assert got == ok([data.hex(), offset + len(data) == len(seg.data)])

    @rule(drawn=st.lists(request_st, min_size=1, max_size=12),
          then=st.sampled_from(["wait", "kill", "kill"]), answers=st.integers(0, 12),
          pause_ms=st.sampled_from([0, 0, 1, 5]))
    def burst(self, drawn: list[tuple[Any, ...]], then: str, answers: int,
              pause_ms: int) -> None:
        """Requests sent without waiting; then all answers awaited, or
        ``kill -9`` after ``answers`` of them came (and ``pause_ms``)."""
        # states[j]: the model after the calls up to calls[j] (index j - 1 is the call's)
        states: list[tuple[int, Model]] = [(-1, copy.deepcopy(self.model))]
        calls: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
        for i, d in enumerate(drawn):
            request = concrete(self.model, d)
            want, passed = apply(self.model, request)
            states.extend((i - 1, p) for p in passed)  # part way: not yet the call's
            states.append((i, copy.deepcopy(self.model)))
            self.next_id += 1
            calls.append((self.next_id, request, want))
            self.owner.send(self.next_id, request)
        if then == "wait":
            self.owner.wait(len(calls))
            for n, request, want in calls:
                assert self.owner.answers.pop(n) == want, request
            return
        self.owner.wait(min(answers, len(calls)))
        time.sleep(pause_ms / 1000)
        self.owner.kill9()
        answered = self.owner.answers
        last_success = -1
        for i, (n, request, want) in enumerate(calls):
            got = answered.pop(n, None)
            if got is not None:
                assert got == want, request
                if "ok" in got:
                    last_success = i
        assert not answered
        self.owner = Owner(self.uri, self.log_name)
        shown = self.state()
        for i, candidate in states:
            if i >= last_success and candidate.render() == shown:
                self.model = copy.deepcopy(candidate)
                KILLS.append((len(calls), last_success, i))
                return
        raise AssertionError(
            f"after kill -9 with {len(calls)} calls in flight ({last_success + 1} acknowledged "
            f"with success): the container shows {shown}, the model allows "
            f"{[c.render() for i, c in states if i >= last_success]}; calls "
            f"{[request for _n, request, _w in calls]}")

    @invariant()
    def matches_the_model(self) -> None:
        assert self.state() == self.model.render()


@pytest.mark.timeout(120 + 30 * SOAK)
def test_acknowledged_operations_survive_kill9_of_the_owner(bookies: Cluster) -> None:
    CrashMachine.uri = bookies.metadata_uri
    KILLS.clear()
    run_state_machine_as_test(
        CrashMachine,
        settings=settings(max_examples=SOAK or 5, stateful_step_count=20, deadline=None,
                          suppress_health_check=list(HealthCheck), database=None))
    lost = sum(1 for calls, _acked, happened in KILLS if happened < calls - 1)
    print(f"\n{len(KILLS)} kills; in {lost} of them some calls in flight were lost; "
          f"per kill (calls, last answered with success, last there): {KILLS}")
    assert KILLS
