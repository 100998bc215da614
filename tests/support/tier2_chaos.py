"""Crash chaos over tier-2: owners of one container killed with ``kill -9``
under heavy flushing, each kill followed by PDP-40's check over tier-2 and
a new owner whose state must hold every acknowledged operation.

Shared by ``tests/integration/test_segmentstore_tier2_chaos.py`` (a few
kills, hypothesis-drawn) and ``benchmarks/soak_tier2_chaos.py`` (many).

One :class:`Chaos` is one container (its own tier-1 log on a cluster of real
bookies, its own tier-2: any URI, ``file://`` or ``s3://``) and one workload sequence
(:mod:`tests.support.tier2_workload`).  Each :meth:`Chaos.round` starts a
new owner process (:mod:`tests.support.tier2_chaos_driver`: it fences the
previous owner's log and replays it over tier-2), compares its state with
the model (:meth:`Chaos.adopt`), has it run the next operations of the
sequence, and kills it at the round's :class:`KillPoint`: after ``n``
acknowledgements (the test sends SIGKILL: the writer is wherever it is), or
before the writer's n-th flush step of a kind (the driver's hook sends
SIGKILL to itself there: an exact point of an iteration).  Then
:func:`~quire.segmentstore.tier2_check.check` reads tier-2 alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from quire.client import Client
from quire.sandbox import LineReader, parent_death_prefix
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX
from quire.segmentstore.tier2_check import Violation, check
from quire.segmentstore.tier2_reader import read_storage_metadata
from quire.tier2 import open_chunk_storage, parse_tier2_uri, read_segment
from quire.tier2.config import FileLocation, S3Location
from tests.support.tier2_workload import Model, Op, generate

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 90.0
STEP_GRACE_S = 20.0
COPY_CONCURRENCY = 16
"""S3 copies in flight at once when :func:`tier2_copy` copies a prefix."""
"""How long a round waits for its kill step once its operations are all answered."""

CHAOS_CONFIG: dict[str, Any] = {
    "segments": 200, "flush_threshold_bytes": 1024, "flush_threshold_ms": 300,
    "iteration_interval_ms": 50, "max_chunk_bytes": 256 << 10, "checkpoint_every_bytes": 16384,
    "flush_order": "pdp40"}
"""Small thresholds: many segments eligible in every iteration, chunks roll
and concatenate, tier-1 is checkpointed and truncated often."""


@dataclass(frozen=True)
class KillPoint:
    """Where a round's owner dies: ``kind`` "acks" (after ``n`` answers),
    "step" (before the ``n``-th flush step starting with ``match``) or
    "gap" (between a metadata flush and the data flush it depends on)."""

    kind: str
    n: int = 0
    match: str = ""

    def rule(self) -> dict[str, Any] | None:
        if self.kind == "step":
            return {"kind": "step", "match": self.match, "nth": self.n}
        if self.kind == "gap":
            return {"kind": "gap"}
        return None


class ChaosOwner:
    """One driver process owning the container (ends with the test process:
    a parent-death SIGKILL)."""

    def __init__(self, metadata_uri: str, tier2_uri: str, log_name: str,
                 config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [*parent_death_prefix(signal.SIGKILL), sys.executable, "-m",
             "tests.support.tier2_chaos_driver", metadata_uri, tier2_uri, log_name,
             json.dumps(config)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
        assert self.proc.stdout is not None
        self.stdout = LineReader(self.proc.stdout)
        self.events: list[dict[str, Any]] = []
        try:
            ready = self.expect("ready")
            assert ready is not None, f"the owner did not open (exit {self.proc.poll()})"
            self.epoch = int(ready["epoch"])
        except BaseException:
            self.close()
            raise

    def line(self, deadline: float, quiet: bool = False) -> dict[str, Any] | None:
        """The next line (None at the end of the output; ``{}`` at the
        deadline if ``quiet``, else AssertionError)."""
        while (raw := self.stdout.line(max(0.0, deadline - time.monotonic()))) is None:
            if self.stdout.ended:
                return None
            if time.monotonic() >= deadline:
                if quiet:
                    return {}
                raise AssertionError(f"no answer from the owner (exit {self.proc.poll()})")
        if not raw.endswith(b"\n"):  # its last line, cut short by its death
            return None
        return dict(json.loads(raw))

    def expect(self, key: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any] | None:
        """Lines until one with ``key`` (None at the end of the output);
        the others are kept in :attr:`events`."""
        deadline = time.monotonic() + timeout_s
        while (got := self.line(deadline)) is not None:
            if key in got:
                return got
            self.events.append(got)
        return None

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()

    def state(self) -> dict[str, Any]:
        self.send({"op": "state"})
        got = self.expect("state")
        assert got is not None, f"the owner ended (exit {self.proc.poll()})"
        return dict(got["state"])

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill9(self) -> None:
        """``kill -9``, then read what it had printed before it died."""
        self.proc.send_signal(signal.SIGKILL)
        self.drain()

    def drain(self) -> None:
        """Wait for the process to end; keep its last lines in :attr:`events`."""
        self.proc.wait(timeout=TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while (got := self.line(deadline)) is not None:
            self.events.append(got)
        self.close()

    def close_cleanly(self) -> None:
        self.send({"op": "close"})
        assert self.expect("closed") is not None, f"close failed (exit {self.proc.poll()})"
        self.proc.wait(timeout=TIMEOUT_S)
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=TIMEOUT_S)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


@dataclass
class RoundReport:
    kill: KillPoint
    killed_at: str
    """The flush step the owner died before ("" : killed from outside)."""
    acked: int
    """Operations acknowledged in the round."""
    landed: int
    """Operations unanswered at the previous kill that this round's owner shows."""
    violations: list[Violation]
    seconds: float


@dataclass
class Chaos:
    """One container's chaos (see the module docstring)."""

    metadata_uri: str
    tier2_uri: str
    """Any tier-2 URI, empty (``file:///dir`` or ``s3://bucket/prefix?...``)."""
    seed: int
    config: dict[str, Any] = field(default_factory=lambda: dict(CHAOS_CONFIG))
    ops_per_round: int = 1500
    window: int = 32

    def __post_init__(self) -> None:
        self.log_name = f"tier2-chaos-{uuid.uuid4().hex}"
        self.config = {**self.config, "seed": self.seed}
        self.ops: list[Op] = []
        self.model = Model()
        self.applied = 0
        """The model is the state after this many operations of the sequence."""
        self.acked_up_to = 0
        """One past the last acknowledged operation (the new owner must show at least these)."""
        self.sent = 0
        """Operations called so far (the last owner may have applied any up to here)."""
        self.epochs: list[int] = []

    def owner(self) -> ChaosOwner:
        owner = ChaosOwner(self.metadata_uri, self.tier2_uri, self.log_name, self.config)
        self.epochs.append(owner.epoch)
        return owner

    def adopt(self, shown: dict[str, Any]) -> int:
        """Find the prefix of the sequence whose model the owner shows: at
        least every acknowledged operation, at most the ones called; adopt
        it (AssertionError if there is none).  Returns how many operations
        past the last acknowledged one it shows (called, unanswered, landed)."""
        model = self.model
        for i in range(self.applied, self.acked_up_to):
            model.apply(self.ops[i])
        rendered = model.render()
        candidates = [self.acked_up_to]
        if rendered != shown:
            candidates = []
            trial = model.copy()
            for i in range(self.acked_up_to, self.sent):
                for name in trial.apply(self.ops[i]):
                    rendered[name] = trial.render_one(name)
                    if rendered[name] is None:
                        del rendered[name]
                if rendered == shown:
                    candidates.append(i + 1)
                    break
            if not candidates:
                differ = dict(list({n: (rendered.get(n), shown.get(n))
                                    for n in {*rendered, *shown}
                                    if rendered.get(n) != shown.get(n)}.items())[:5])
                raise AssertionError(
                    f"seed {self.seed}: the new owner's state is the model after no prefix of "
                    f"{self.acked_up_to}..{self.sent} operations (every acknowledged one at "
                    f"least); differences from the longest prefix: {differ}")
            model = trial
        self.model, self.applied = model, candidates[0]
        landed = self.applied - self.acked_up_to
        self.acked_up_to = self.sent = self.applied
        return landed

    def round(self, kill: KillPoint, *, check_tier2: bool = True) -> RoundReport:
        """One owner's life: open, compare, run, die at ``kill``; then check tier-2."""
        began = time.monotonic()
        owner = self.owner()
        opened = time.monotonic()
        try:
            landed = self.adopt(owner.state())
            if os.environ.get("CHAOS_DEBUG"):
                print(f"open {opened - began:.1f} s, state {time.monotonic() - opened:.1f} s",
                      file=sys.stderr)
            end = self.applied + self.ops_per_round
            if len(self.ops) < end:
                self.ops = generate(self.seed, end, self.config["segments"])
            owner.send({"op": "run", "from": self.applied, "to": end, "window": self.window,
                        "kill": kill.rule()})
            self.sent = end
            acks = 0
            killed_at = ""
            deadline = time.monotonic() + TIMEOUT_S
            done = False
            while True:
                got = owner.line(deadline, quiet=done)
                if got == {}:  # the flush step never came: kill it now
                    owner.kill9()
                    break
                if got is None:  # the driver killed itself at a flush step
                    owner.drain()
                    break
                if "ack" in got:
                    self.acked_up_to = max(self.acked_up_to, got["ack"] + 1)
                    acks += 1
                    if kill.kind == "acks" and acks >= kill.n:
                        owner.kill9()
                        break
                elif "err" in got:
                    raise AssertionError(f"seed {self.seed}: operation {got['err']} "
                                         f"{self.ops[got['err']]} failed: {got['name']}")
                elif "done" in got:  # the run ended before the kill point
                    if kill.kind == "acks":
                        owner.kill9()
                        break
                    done = True  # the writer flushes on: give its step a while
                    deadline = time.monotonic() + STEP_GRACE_S
                elif "killing" in got:
                    killed_at = str(got["killing"])
                elif "writer_failed" in got:
                    raise AssertionError(f"seed {self.seed}: the writer failed: {got}")
            for got in owner.events:
                if "ack" in got:
                    self.acked_up_to = max(self.acked_up_to, got["ack"] + 1)
                    acks += 1
                elif "killing" in got:
                    killed_at = str(got["killing"])
                elif "err" in got or "writer_failed" in got:
                    raise AssertionError(f"seed {self.seed}: {got}")
        finally:
            owner.close()
        violations = asyncio.run(check(self.tier2_uri)) if check_tier2 else []
        return RoundReport(kill, killed_at, acks, landed, violations, time.monotonic() - began)

    def finish(self) -> int:
        """A last owner: its state must hold every acknowledged operation;
        closed cleanly.  How many unanswered operations it shows."""
        owner = self.owner()
        try:
            landed = self.adopt(owner.state())
            owner.close_cleanly()
        finally:
            owner.close()
        return landed


@dataclass
class RecoveryCheck:
    segments: int
    """Live data segments tier-2 records (the storage-metadata table not)."""
    bytes: int
    compared_with_model: int
    """Of those, how many the model holds too (their common bytes compared)."""
    seconds: float


def file_tier2(path: Path) -> str:
    """The ``file://`` tier-2 URI of directory ``path``."""
    return f"file://{path}"


@contextlib.asynccontextmanager
async def tier2_copy(uri: str) -> AsyncIterator[str]:
    """A copy of tier-2 ``uri`` as it is now, at a fresh location of the same
    kind; removed on exit.  ``file://``: the directory copied beside it.
    ``s3://``: every object under the prefix copied server-side
    (``CopyObject``) to the prefix ``<prefix>-recovered-<hex>`` in the same
    bucket (credentials and endpoint as the driver's).  A copy, not the
    original, because recovery and the recovered owner write to the tier-2
    they recover from (a new journal and chunks at a new epoch) while the
    chaos goes on with the original."""
    location = parse_tier2_uri(uri)
    if isinstance(location, FileLocation):
        copy = location.root.with_name(location.root.name + "-recovered")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(location.root, copy)
        try:
            yield file_tier2(copy)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        return
    assert isinstance(location, S3Location), f"no copy for tier-2 {uri}"
    parts = urlsplit(uri)
    source = location.key_of("")
    prefix = f"{location.prefix}-recovered-{uuid.uuid4().hex[:8]}"
    target = S3Location(location.bucket, prefix, location.endpoint_url, location.region,
                        location.create_mode)
    async with _s3_client(location) as s3:
        async def copy(key: str) -> None:
            async with requests:
                await s3.copy_object(Bucket=location.bucket,
                                     Key=target.key_of(key[len(source):]),
                                     CopySource={"Bucket": location.bucket, "Key": key})

        requests = asyncio.Semaphore(COPY_CONCURRENCY)
        try:
            await asyncio.gather(*(copy(key) for key in await _s3_keys(s3, location)))
            yield urlunsplit(parts._replace(path="/" + prefix))
        finally:
            await _s3_delete_all(s3, target)  # the recovered owner's chunks too


def _s3_client(location: S3Location) -> Any:
    from aiobotocore.session import get_session  # only the S3 chaos needs it

    return get_session().create_client("s3", region_name=location.region,
                                       endpoint_url=location.endpoint_url)


async def _s3_keys(s3: Any, location: S3Location) -> list[str]:
    return [str(item["Key"]) async for page in
            s3.get_paginator("list_objects_v2").paginate(Bucket=location.bucket,
                                                         Prefix=location.key_of(""))
            for item in page.get("Contents", ())]


async def _s3_delete_all(s3: Any, location: S3Location) -> None:
    left = await _s3_keys(s3, location)
    for at in range(0, len(left), 1000):  # DeleteObjects takes up to 1000 keys
        await s3.delete_objects(Bucket=location.bucket, Delete={
            "Objects": [{"Key": key} for key in left[at:at + 1000]], "Quiet": True})


async def remove_tier2(uri: str) -> None:
    """Delete every chunk of tier-2 ``uri`` (an ``s3://`` prefix: the moto
    server keeps every object in memory, and a long-lived bucket's LIST
    gets slower with each object in it; a ``file://`` directory)."""
    location = parse_tier2_uri(uri)
    if isinstance(location, FileLocation):
        shutil.rmtree(location.root, ignore_errors=True)
        return
    assert isinstance(location, S3Location), f"no removal for tier-2 {uri}"
    async with _s3_client(location) as s3:
        await _s3_delete_all(s3, location)


async def recover_and_compare(metadata_uri: str, tier2_uri: str, model: Model) -> RecoveryCheck:
    """Disaster recovery from a copy of tier-2 ``tier2_uri`` (:func:`tier2_copy`)
    alone onto fresh tier-1 logs (``container_log_name(0)`` on the same
    cluster, replaced each time): every live segment tier-2 records must
    come back with its recorded length, start offset, sealed state and
    bytes, and those bytes must be the model's where both hold them (a
    segment's bytes only grow at its end, and names are never reused, so an
    older or newer prefix agrees)."""
    began = time.monotonic()
    async with tier2_copy(tier2_uri) as uri:
        return await _recover_and_compare(metadata_uri, uri, model, began)


async def _recover_and_compare(metadata_uri: str, uri: str, model: Model,
                               began: float) -> RecoveryCheck:
    client = await Client.connect(metadata_uri)
    storage = await open_chunk_storage(uri)
    try:
        layouts = {name: layout for name, layout in
                   (await read_storage_metadata(storage, 0)).items()
                   if not layout.deleted and not name.startswith("_system/containers/")
                   and not name.endswith((ATTRIBUTES_SUFFIX, INDEX_SUFFIX))}
        report = await recover(client, uri, replace_logs=True)
        (container,) = report.containers
        assert container.segments == len(layouts), (container, sorted(layouts))
        assert not container.index_mismatches, container.index_mismatches
        store = await SegmentStore.open(client, [0], uri,
                                        config=SegmentStoreConfig(container_count=1))
        compared = total = 0
        try:
            for name, layout in sorted(layouts.items()):
                info = await store.get_info(name)
                assert (info.length, info.start_offset, info.sealed) == \
                    (layout.length, layout.start_offset, layout.sealed), (name, info, layout)
                data = b""
                while layout.start_offset + len(data) < layout.length:
                    at = layout.start_offset + len(data)
                    piece = (await store.read(name, at, layout.length - at)).data
                    assert piece, f"{name}: recovered, nothing to read at {at}"
                    data += piece
                recorded = await read_segment(storage, layout, layout.start_offset,
                                              layout.length - layout.start_offset)
                assert data == recorded, f"{name}: recovered bytes differ from tier-2's"
                total += len(data)
                seg = model.segs.get(name)
                if seg is not None and seg.kind != "table":
                    lo = max(layout.start_offset, seg.start)
                    hi = min(layout.length, len(seg.data))
                    if hi > lo:
                        assert data[lo - layout.start_offset:hi - layout.start_offset] == \
                            bytes(seg.data[lo:hi]), f"{name}: recovered bytes differ from " \
                            f"the model's at {lo}..{hi}"
                    compared += 1
        finally:
            await store.close()
    finally:
        await storage.close()
        await client.close()
    return RecoveryCheck(len(layouts), total, compared, time.monotonic() - began)
