"""A process owning one segment container with a tier-2 storage writer, for
the chaos tests: ``python -m tests.support.tier2_chaos_driver METADATA_URI
TIER2_URI LOG_NAME CONFIG_JSON``.

Opens a :class:`~quire.segmentstore.SegmentStore` hosting container 0 on
the :class:`~quire.log.NamedDataLog` ``LOG_NAME`` (fencing any previous
owner, replaying its log) with tier-2 ``TIER2_URI`` and small flush
thresholds (CONFIG_JSON: ``seed`` and ``segments`` of the workload,
:mod:`tests.support.tier2_workload`; ``flush_order``: "pdp40", or "unordered"
for a writer whose order is broken, shuffled by ``unordered_seed``;
``flush_threshold_bytes``, ``flush_threshold_ms``, ``iteration_interval_ms``,
``max_chunk_bytes``, ``checkpoint_every_bytes``, ``read_index_budget_bytes``),
prints ``{"ready": true, "epoch": E}`` and reads requests from stdin, one JSON object a line:

* ``{"op": "state"}``: ``{"state": {name: rendered}}``, every segment as
  :meth:`~tests.support.tier2_workload.Model.render` shows it (bytes read
  through the store: older ones come from tier-2);
* ``{"op": "run", "from": k, "to": n, "window": w, "kill": rule}``: calls
  operations k..n-1 of the workload in order, up to ``w`` unanswered,
  printing ``{"ack": i}`` or ``{"err": i, "name": ErrorClass}`` as each is
  answered (no new call after an error), then ``{"done": n}``.  ``rule``
  (optional) is where the storage writer's test hook acts, counting from
  this request: ``{"kind": "step", "match": prefix, "nth": m}`` kills the
  process with SIGKILL before the m-th flush step starting with ``prefix``
  (``"data:"``, ``"index:"``, ``"attributes:"``, ``"metadata"``, ``""``);
  ``{"kind": "gap"}`` kills it before the data flush of a segment whose
  ``$attributes`` batch, recorded by a metadata flush earlier in the same
  iteration, names a length of it tier-2 does not hold (the window PDP-40
  closes: only ``"unordered"`` opens it); ``{"kind": "hold"}`` holds the
  writer before the first data flush with bytes to write (prints
  ``{"held": step}``) until ``{"op": "release"}``;
* ``{"op": "flushed"}``: once the writer has no backlog and two more
  iterations ran: ``{"flushed": iterations}``;
* ``{"op": "close"}``: closes the store, prints ``{"closed": true}``, exits.

Before a self-kill it prints ``{"killing": step}``; if the writer stops on
a failure, ``{"writer_failed": ErrorClass}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from quire.client import Client
from quire.errors import QuireError
from quire.log import NamedDataLog
from quire.segmentstore import (
    AttributeUpdate,
    ContainerConfig,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.names import ATTRIBUTES_SUFFIX
from quire.segmentstore.storage_records import decode_attribute_batches
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
from quire.testing.chaos_writer import ChaosStorageWriter
from quire.tier2 import Tier2Config, read_segment
from tests.support.tier2_workload import Op, digest, generate

OPEN_TIMEOUT_S = 60.0
KINDS = {"user": SegmentType.STREAM, "txn": SegmentType.STREAM, "system": SegmentType.STREAM,
         "table": SegmentType.TABLE}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def call(store: SegmentStore, op: Op) -> asyncio.Future[Any]:
    kind = op["op"]
    if kind == "create":
        return store.create_segment(op["name"], KINDS[op["kind"]])
    if kind == "append":
        return store.append(op["name"], bytes.fromhex(op["data"]),
                            [AttributeUpdate(k, UpdateType.REPLACE, v) for k, v in op["attrs"]])
    if kind == "update_attributes":
        return store.update_attributes(op["name"], [AttributeUpdate(k, UpdateType.REPLACE, v)
                                                    for k, v in op["attrs"]])
    if kind == "seal":
        return store.seal(op["name"])
    if kind == "truncate":
        return store.truncate(op["name"], op["offset"])
    if kind == "delete":
        return store.delete(op["name"])
    if kind == "merge":
        return store.merge(op["target"], op["source"])
    if kind == "table_put":
        return store.table_put(op["name"], [(bytes.fromhex(k), bytes.fromhex(v), None)
                                            for k, v in op["entries"]])
    if kind == "table_remove":
        return store.table_remove(op["name"], [(bytes.fromhex(k), None) for k in op["keys"]])
    raise ValueError(kind)


async def state(store: SegmentStore) -> dict[str, Any]:
    container = store.container(0)
    out: dict[str, Any] = {}
    for name in sorted(container.committed.by_name):
        if name.startswith("_system/containers/"):
            continue
        s = container.committed.get(name)
        assert s is not None
        if s.type is SegmentType.TABLE:
            table = container.tables.committed.get(s.segment_id)
            keys = sorted(table.entries) if table is not None else []
            got = await store.table_get(name, keys)
            out[name] = {"table": sorted([e.key.hex(), (e.value or b"").hex()]
                                         for e in got if e is not None)}
            continue
        info = await store.get_info(name)
        data = b""
        while info.start_offset + len(data) < info.length:
            offset = info.start_offset + len(data)
            piece = (await store.read(name, offset, info.length - offset)).data
            assert piece, f"{name}: no bytes at {offset} of {info.length}"
            data += piece
        out[name] = {"length": info.length, "start": info.start_offset, "sealed": info.sealed,
                     "digest": digest(data),
                     "attrs": sorted([k, v] for k, v in dict(info.attributes).items())}
    return out


class Hook:
    """The storage writer's ``before_step`` for the ``kill`` rules."""

    def __init__(self, writer: ChaosStorageWriter) -> None:
        self.writer = writer
        self.rule: dict[str, Any] | None = None
        self.matched = 0
        self.iteration = -1
        self.steps: list[str] = []
        self.release = asyncio.Event()

    def arm(self, rule: dict[str, Any] | None) -> None:
        self.rule, self.matched = rule, 0

    async def __call__(self, step: str) -> None:
        writer = self.writer
        if writer.iterations != self.iteration:
            self.iteration, self.steps = writer.iterations, []
        self.steps.append(step)
        if os.environ.get("CHAOS_DEBUG"):
            print(writer.iterations, step, file=sys.stderr, flush=True)
        rule = self.rule
        if rule is None:
            return
        if rule["kind"] == "step":
            if step.startswith(rule["match"]):
                self.matched += 1
                if self.matched >= rule["nth"]:
                    self.kill(step)
        elif rule["kind"] == "gap":
            if step.startswith("data:") and await self._gap(step[5:]):
                self.kill(step)
        elif rule["kind"] == "hold" and step.startswith("data:") and self._unflushed(step[5:]):
            self.rule = None
            send({"held": step})
            await self.release.wait()

    def _unflushed(self, name: str) -> bool:
        s = self.writer.source.segment(name)
        layout = self.writer.layouts.get(name)
        return s is not None and s.length > (layout.length if layout is not None else 0)

    async def _gap(self, name: str) -> bool:
        """Whether an ``$attributes`` footer of ``name`` recorded (flushed
        by a metadata step of this iteration after the attributes step) is
        past the data length tier-2 records for ``name``."""
        steps = self.steps
        attributes = f"attributes:{name}"
        if attributes not in steps or "metadata" not in steps[steps.index(attributes):]:
            return False
        layout = self.writer.layouts.get(name + ATTRIBUTES_SUFFIX)
        if layout is None or layout.start_offset != 0:
            return False
        raw = await read_segment(self.writer.storage, layout, 0, layout.length)
        batches = decode_attribute_batches(raw)
        data = self.writer.layouts.get(name)
        flushed = data.length if data is not None else 0
        return bool(batches) and batches[-1].data_length > flushed

    def kill(self, step: str) -> None:
        send({"killing": step})
        os.kill(os.getpid(), signal.SIGKILL)


async def run_ops(store: SegmentStore, ops: list[Op], start: int, end: int,
                  window: int) -> None:
    free = asyncio.Semaphore(window)
    failed = False
    pending: set[asyncio.Future[Any]] = set()

    def answered(i: int, future: asyncio.Future[Any]) -> None:
        nonlocal failed
        free.release()
        pending.discard(future)
        error = future.exception()
        if error is None:
            send({"ack": i})
        else:
            failed = True
            send({"err": i, "name": type(error).__name__ if isinstance(error, QuireError)
                  else repr(error)})

    for i in range(start, end):
        await free.acquire()
        if failed:
            break
        future = call(store, ops[i])
        pending.add(future)
        future.add_done_callback(lambda f, i=i: answered(i, f))  # type: ignore[misc]
    while pending:
        await asyncio.wait(list(pending))
    send({"done": end})


async def watch(writer: StorageWriter) -> None:
    while writer.failure is None:
        await asyncio.sleep(0.02)
    send({"writer_failed": type(writer.failure).__name__})


async def flushed(writer: StorageWriter) -> int:
    while writer.backlog_bytes() > 0:
        await asyncio.sleep(0.02)
    target = writer.iterations + 2
    while writer.iterations < target:
        await asyncio.sleep(0.02)
    return writer.iterations


async def main(metadata_uri: str, tier2_uri: str, log_name: str, cfg: dict[str, Any]) -> None:
    ops: list[Op] = []
    debug = os.environ.get("CHAOS_DEBUG")
    began = time.monotonic()
    client = await Client.connect(metadata_uri)
    try:
        config = SegmentStoreConfig(
            container_count=1,
            container=ContainerConfig(checkpoint_every_bytes=cfg["checkpoint_every_bytes"],
                                      read_index_budget_bytes=cfg.get("read_index_budget_bytes",
                                                                      64 << 10)),
            storage_writer=StorageWriterConfig(
                flush_threshold_bytes=cfg["flush_threshold_bytes"],
                flush_threshold_ms=cfg["flush_threshold_ms"],
                iteration_interval_ms=cfg["iteration_interval_ms"]))
        if cfg["flush_order"] not in ("pdp40", "unordered"):
            raise ValueError(f"flush_order is pdp40 or unordered, got {cfg['flush_order']!r}")
        unordered = cfg["flush_order"] == "unordered"
        store = await asyncio.wait_for(SegmentStore.open(
            client, [0], Tier2Config(uri=tier2_uri, max_chunk_bytes=cfg["max_chunk_bytes"]),
            config=config,
            open_log=lambda _cid: NamedDataLog(client, log_name, password=LEGACY_LOG_PASSWORD),
            start_writer=ChaosStorageWriter.starter(
                cfg.get("unordered_seed", 0) if unordered else None)),
            OPEN_TIMEOUT_S)
    except BaseException:  # the test sees the exit and this on stderr
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if debug:
        print(f"driver: opened in {time.monotonic() - began:.1f} s", file=sys.stderr)
    writer = store.writers[0]
    assert isinstance(writer, ChaosStorageWriter)
    hook = Hook(writer)
    writer.before_step = hook
    watcher = asyncio.ensure_future(watch(writer))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    send({"ready": True, "epoch": store.container(0).epoch})
    tasks: set[asyncio.Task[Any]] = set()
    while line := await reader.readline():
        request = json.loads(line)
        op = request["op"]
        if op == "state":
            send({"state": await state(store)})
        elif op == "run":
            hook.arm(request.get("kill"))
            if len(ops) < request["to"]:
                ops = generate(cfg["seed"], request["to"], cfg["segments"])
            task = asyncio.ensure_future(run_ops(store, ops, request["from"], request["to"],
                                                 request["window"]))
            tasks.add(task)
        elif op == "release":
            hook.release.set()
        elif op == "flushed":
            send({"flushed": await flushed(writer)})
        elif op == "close":
            watcher.cancel()
            await store.close()
            await client.close()
            send({"closed": True})
            return


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
