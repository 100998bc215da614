"""A process owning one segment container, driven over JSON lines:
``python -m tests.support.segment_driver URI LOG_NAME CONFIG_JSON``.

Opens :class:`~quire.segmentstore.SegmentContainer` 0 on the
:class:`~quire.log.NamedDataLog` ``LOG_NAME`` (fencing any previous owner,
replaying its log) -- or, with ``LOG_NAME`` ``store:N``, a
:class:`~quire.segmentstore.SegmentStore` of ``container_count`` N hosting
every container (the requests go to it; with ``$QUIRE_DRIVER_TIER2`` set,
flushing to that tier-2 URI) -- prints ``{"ready": true}``, then reads requests from
stdin, one JSON object a line, ``{"id": n, "op": ..., ...}``, and calls each
*as soon as it is read* (so requests are ordered as sent, and many may be in
flight); each answer is printed when it is known, in any order:
``{"id": n, "ok": result}`` or ``{"id": n, "err": "ErrorClassName"}``.

Bytes travel as hex; attribute updates as ``[key, type, value, comparison]``;
attribute maps as sorted ``[[key, value], ...]``.  Requests: ``create``
(name, type, attrs), ``append`` (name, data, updates, expected, writer),
``seal``, ``truncate`` (name, offset), ``delete``, ``merge`` (target,
source), ``update_attributes`` (name, updates), ``table_put`` (name,
entries ``[[key, value, expected], ...]``), ``table_remove`` (name, keys
``[[key, expected], ...]``), ``read`` (name, offset, size), ``state``
(every committed segment: its info, data and, for a table, its entries and
delta), ``close``.  A test kills it with ``kill -9`` at any point.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import traceback
from typing import Any

from quire.client import Client
from quire.errors import QuireError
from quire.log import NamedDataLog, WriterOptions
from quire.segmentstore import (
    AppendResult,
    AttributeUpdate,
    ContainerConfig,
    MergeResult,
    SegmentContainer,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.store import LEGACY_LOG_PASSWORD

OPEN_TIMEOUT_S = 45.0
TIER2_ENV = "QUIRE_DRIVER_TIER2"
"""In ``store:N`` mode: a tier-2 URI to flush to (storage writers flushing
every change every 20 ms, tier-1 ledgers of 4 KiB), if set in the environment."""
FLUSH_OFTEN = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                                  iteration_interval_ms=20)
SMALL_LEDGERS = WriterOptions(roll_bytes=4096)
"""Tier-1 ledgers roll often, so truncation (whole ledgers) happens soon."""


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def plain(result: Any) -> Any:
    """A result as JSON."""
    if isinstance(result, AppendResult):
        return [result.length, result.event_number, result.previous_event_number,
                result.duplicate]
    if isinstance(result, MergeResult):
        return result.target_length
    return result


def updates(raw: list[list[Any]]) -> list[AttributeUpdate]:
    return [AttributeUpdate(k, UpdateType[t], v, c) for k, t, v, c in raw]


def attributes(attrs: dict[int, int]) -> list[list[int]]:
    return [[k, v] for k, v in sorted(attrs.items())]


async def state(container: SegmentContainer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(container.committed.by_name):
        s = container.committed.get(name)
        assert s is not None
        info = await container.get_info(name)
        data = (await container.read(name, info.start_offset, info.length)).data
        seg: dict[str, Any] = {"length": info.length, "start": info.start_offset,
                               "sealed": info.sealed,
                               "attrs": attributes(dict(info.attributes)),
                               "data": data.hex()}
        if s.type is SegmentType.TABLE:
            table = container.tables.committed.get(s.segment_id)
            keys = sorted(table.entries) if table is not None else []
            got = await container.tables.get(name, keys)
            seg["table"] = [[e.key.hex(), e.version, (e.value or b"").hex()]
                            for e in got if e is not None]
            delta = await container.tables.read_delta(name, 0, 1000)
            seg["delta"] = [[e.key.hex(), e.version] for e in delta.entries]
            seg["delta_end"] = delta.last_position
        out[name] = seg
    return out


def call(container: SegmentContainer | SegmentStore, r: dict[str, Any]) -> asyncio.Future[Any]:
    """The request's future, called now."""
    op = r["op"]
    if op == "create":
        return container.create_segment(r["name"], SegmentType[r.get("type", "STREAM")],
                                        {k: v for k, v in r.get("attrs", [])})
    if op == "append":
        writer = r.get("writer")
        return container.append(r["name"], bytes.fromhex(r["data"]),
                                updates(r.get("updates", [])), r.get("expected"),
                                None if writer is None else (writer[0], writer[1]))
    if op == "seal":
        return container.seal(r["name"])
    if op == "truncate":
        return container.truncate(r["name"], r["offset"])
    if op == "delete":
        return container.delete(r["name"])
    if op == "merge":
        return container.merge(r["target"], r["source"])
    if op == "update_attributes":
        return container.update_attributes(r["name"], updates(r["updates"]))
    if op == "table_put":
        put = container.tables.put if isinstance(container, SegmentContainer) \
            else container.table_put
        return put(r["name"], [(bytes.fromhex(k), bytes.fromhex(v), e)
                               for k, v, e in r["entries"]])
    if op == "table_remove":
        remove = container.tables.remove if isinstance(container, SegmentContainer) \
            else container.table_remove
        return remove(r["name"], [(bytes.fromhex(k), e) for k, e in r["keys"]])
    if op == "read":
        async def read() -> Any:
            got = await container.read(r["name"], r["offset"], r["size"])
            return [got.data.hex(), got.at_tail]
        return asyncio.ensure_future(read())
    if op == "state":
        assert isinstance(container, SegmentContainer)
        return asyncio.ensure_future(state(container))
    raise ValueError(f"unknown request {op!r}")


def answer(n: int, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        send({"id": n, "err": "cancelled"})
    elif isinstance(future.exception(), QuireError):
        send({"id": n, "err": type(future.exception()).__name__})
    elif future.exception() is not None:
        send({"id": n, "err": repr(future.exception())})
    else:
        send({"id": n, "ok": plain(future.result())})


async def main(uri: str, log_name: str, config: dict[str, int]) -> None:
    client = await Client.connect(uri)
    container: SegmentContainer | SegmentStore
    try:
        if log_name.startswith("store:"):
            count = int(log_name.removeprefix("store:"))
            tier2 = os.environ.get(TIER2_ENV) or None
            container = await asyncio.wait_for(SegmentStore.open(
                client, range(count), tier2, config=SegmentStoreConfig(
                    container_count=count, container=ContainerConfig(**config),
                    **({} if tier2 is None else
                       {"storage_writer": FLUSH_OFTEN, "tier1": SMALL_LEDGERS}))),
                OPEN_TIMEOUT_S)
        else:
            container = await asyncio.wait_for(SegmentContainer.open(
                0, NamedDataLog(client, log_name, password=LEGACY_LOG_PASSWORD),
                ContainerConfig(**config)), OPEN_TIMEOUT_S)
    except BaseException:  # the test sees the exit and this on stderr
        traceback.print_exc()
        for task in asyncio.all_tasks():
            task.print_stack()
        sys.stderr.flush()
        os._exit(1)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    send({"ready": True})
    while line := await reader.readline():
        request = json.loads(line)
        if request["op"] == "close":
            await container.close()
            await client.close()
            send({"id": request["id"], "ok": None})
            return
        call(container, request).add_done_callback(functools.partial(answer, request["id"]))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
