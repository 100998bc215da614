"""Disaster recovery from tier-2 alone, on the file and the S3 driver (a
real moto server process), with real bookies.

A segment store on one cluster (3 bookie processes, its own metadata store)
writes segments of every kind -- user segments with attributes, a table, a
``_system`` segment of type SYSTEM, the controller's ``_system`` tables (a
scope and a stream), a transient segment, sealed, truncated, merged and
deleted segments -- and flushes them all to tier-2.  Then the cluster and
its metadata store are thrown away, an orphan chunk is put in tier-2, and
recovery (the library call, or ``quire segmentstore recover``) rebuilds
every container onto a fresh cluster: every segment comes
back with its bytes, length, start offset, sealed state, type, attributes
and table entries; the deleted and merged-away ones do not; the controller
sees its scope and stream; the orphan is listed and still there; the
recovered store goes on flushing (new epochs: no chunk name is reused).
``quire tier2 check`` exits 0 on the result and 1, naming the segment, once
a recorded chunk is removed by hand.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quire.cli.main import cli
from quire.client import Client
from quire.controller.core import ControllerConfig, ControllerCore
from quire.controller.model import StreamConfig
from quire.errors import RecoveryError, SegmentNotFoundError, SegmentTruncatedError
from quire.log import LogCatalog
from quire.segmentstore import (
    AttributeUpdate,
    ContainerConfig,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import container_log_name
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_reader import read_layout
from quire.tier2 import open_chunk_storage
from tests.support.cluster import Cluster
from tests.support.s3_server import S3Endpoint

CONFIG = SegmentStoreConfig(
    container_count=3,
    container=ContainerConfig(read_index_budget_bytes=4096),
    storage_writer=StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                                       iteration_interval_ms=20))
ORPHAN = "sc/st/u3.E1.999999"
GONE = ("sc/st/gone", "sc/st/u2#transaction.1")


async def workload(store: SegmentStore) -> list[str]:
    """Segments of every kind; the names of those that stay."""
    users = [f"sc/st/u{i}" for i in range(6)]
    for name in users:
        await store.create_segment(name, attributes={100: 1})
    await store.create_segment("_system/sys/log", SegmentType.SYSTEM)
    await store.create_segment("sc/st/table", SegmentType.TABLE)
    await store.create_segment(GONE[0])
    await store.create_segment(GONE[1])
    for round_ in range(6):
        futures: list[asyncio.Future[Any]] = []
        for i, name in enumerate(users):
            futures.append(store.append(name, b"%s:%d;" % (name.encode(), round_) * (i + 1), [
                AttributeUpdate(i, UpdateType.REPLACE, round_),
                AttributeUpdate(1 << 100, UpdateType.ACCUMULATE, 1)]))
        futures.append(store.append("_system/sys/log", b"sys%d" % round_))
        futures.append(store.append(GONE[0], b"x" * 50))
        futures.append(store.append(GONE[1], b"txn%d" % round_))
        futures.append(store.table_put("sc/st/table", [(b"k%d" % round_, b"v" * round_, None)]))
        await asyncio.gather(*futures)
    await store.table_remove("sc/st/table", [(b"k3", None)])
    await store.seal("sc/st/u0")
    await store.truncate("sc/st/u1", 100)
    await store.merge("sc/st/u2", GONE[1])
    await store.delete(GONE[0])
    transient = await store.create_transient_segment("sc/st/u5", 7)
    await store.append(transient, b"transient bytes")
    await store.update_attributes("sc/st/u4", [AttributeUpdate(5, UpdateType.REPLACE, -9)])
    controller = ControllerCore(store, ControllerConfig())
    await controller.start()
    await controller.create_scope("recovered")
    await controller.create_stream("recovered", "events", StreamConfig(min_segments=2))
    names = [n for n in await all_names(store)
             if not n.startswith("_system/containers/storage_metadata_")]
    assert {*users, "_system/sys/log", "sc/st/table", transient,
            "_system/_tables/scopes", "recovered/events/0.#epoch.0"} <= set(names)
    return names


async def all_names(store: SegmentStore) -> list[str]:
    return sorted({name for cid in store.container_ids
                   for name in store.container(cid).committed.by_name})


async def snapshot(store: SegmentStore, names: list[str]) -> dict[str, Any]:
    """Each segment as the store serves it."""
    out: dict[str, Any] = {}
    for name in sorted(set(names)):
        info = await store.get_info(name)
        data = b""
        while info.start_offset + len(data) < info.length:
            data += (await store.read(name, info.start_offset + len(data), 1 << 20)).data
        entries = None
        if info.type is SegmentType.TABLE:
            entries, token = [], None
            while True:
                page = await store.table_iterate(name, token=token, max_entries=100)
                entries += [(e.key, e.value, e.version) for e in page.entries]
                if page.token is None:
                    break
                token = page.token
        out[name] = (info.length, info.start_offset, info.sealed, info.type,
                     dict(info.attributes), data, entries)
    return out


async def flushed(store: SegmentStore) -> None:
    """Wait until every writer ran 3 whole iterations after now (with both
    thresholds at their minimum, everything is in tier-2 then, and the
    chunks dropped by deletes and merges are deleted)."""
    start = {cid: w.iterations for cid, w in store.writers.items()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while any(w.iterations < start[cid] + 3 for cid, w in store.writers.items()):
        assert all(w.failure is None for w in store.writers.values())
        assert loop.time() < deadline, "the storage writers did not iterate in 60 s"
        await asyncio.sleep(0.02)  # polling the condition, with a deadline


async def write_and_lose_cluster(connect: Callable[..., Awaitable[Client]], root: Path,
                                 uri: str) -> tuple[list[str], dict[str, Any], Cluster]:
    """Run the workload on a cluster that is then thrown away (bookies and
    metadata store): the names and state as they were served, and the fresh
    cluster to recover onto (started meanwhile, on a thread)."""
    fresh = Cluster(root / "fresh", 3)
    starting = asyncio.ensure_future(asyncio.to_thread(fresh.start))
    try:
        original = Cluster(root / "lost", 3).start()
        try:
            client = await connect(original)
            store = await SegmentStore.open(client, range(3), uri, config=CONFIG)
            try:
                names = await workload(store)
                expected = await snapshot(store, names)
                await flushed(store)
            finally:
                await store.close()
            await client.close()
        finally:
            original.close()
        storage = await open_chunk_storage(uri)
        try:
            await storage.write_chunk(ORPHAN, b"written, never recorded")
        finally:
            await storage.close()
        await starting
    except BaseException:
        await asyncio.wait([starting])
        fresh.close()
        raise
    return names, expected, fresh


async def assert_recovered(client: Client, uri: str, names: list[str],
                           expected: dict[str, Any]) -> None:
    store = await SegmentStore.open(client, range(3), uri, config=CONFIG)
    try:
        assert await snapshot(store, names) == expected
        for name in GONE:
            with pytest.raises(SegmentNotFoundError):
                await store.get_info(name)
        with pytest.raises(SegmentTruncatedError):
            await store.read("sc/st/u1", 99, 10)
        controller = ControllerCore(store, ControllerConfig())
        await controller.start()
        assert "recovered" in (await controller.list_scopes(""))[0]
        assert (await controller.list_streams("recovered", ""))[0] == ["events"]
        # the recovered owners go on flushing to the same tier-2 segments
        await store.append("sc/st/u3", b"after recovery")
        tier2 = store.tier2
        assert tier2 is not None
        want = expected["sc/st/u3"][0] + len(b"after recovery")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while (layout := await read_layout(tier2, "sc/st/u3")) is None \
                or layout.length != want:
            assert all(w.failure is None for w in store.writers.values())
            assert loop.time() < deadline, "not flushed after recovery in 30 s"
            await asyncio.sleep(0.02)  # polling the condition, with a deadline
        assert all(w.source.epoch > 1 for w in store.writers.values())
    finally:
        await store.close()
    storage = await open_chunk_storage(uri)
    try:
        assert await storage.exists(ORPHAN)
    finally:
        await storage.close()


async def quire(*args: str) -> tuple[int, str, str]:
    """Run the ``quire`` command (on a thread: it runs its own event loop):
    status, stdout, stderr."""
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args))
    return result.exit_code, result.stdout, result.stderr


async def test_recover_from_file_tier2_with_the_command(
        connect: Callable[..., Awaitable[Client]], tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/tier2"
    names, expected, fresh = await write_and_lose_cluster(connect, tmp_path, uri)
    try:
        status, out, err = await quire(
            "segmentstore", "recover", "--tier2", uri, "--metadata",
            fresh.metadata_uri, "--json")
        assert status == 0, err
        report = json.loads(out)
        assert report["container_count"] == 3
        assert [c["container"] for c in report["containers"]] == [0, 1, 2]
        assert report["segments"] == len(set(names))
        assert report["orphans"] == [{"chunk": ORPHAN, "bytes": 23}]
        assert sum(c["tables"] for c in report["containers"]) >= 4  # ours, the controller's
        assert all(c["index_mismatches"] == [] and c["dangling"] == []
                   for c in report["containers"])
        client = await connect(fresh)
        await assert_recovered(client, uri, names, expected)
        # the metadata store still has the logs (only the bookies were lost,
        # or a second run): refused, unless they are to be replaced
        args = ("segmentstore", "recover", "--tier2", uri, "--metadata", fresh.metadata_uri)
        status, out, err = await quire(*args, "--json")
        assert status == 1 and "tier-1 logs exist already" in json.loads(out)["error"]
        status, out, err = await quire(*args, "--replace-logs")
        assert status == 0, err
        assert f"{report['segments']} segment(s)" in out and "1 orphan chunk(s)" in out, out
        assert f"orphan chunk (no record names it, left in place): {ORPHAN}" in out, out
        # the replaced logs' ledgers are listed and left (only they may hold
        # what was acknowledged after the last flush)
        listed = out.split("the replaced tier-1 logs' ledgers are left as they were: ")[1]
        abandoned = [int(i) for i in listed.split(" (")[0].split()]
        assert abandoned and set(abandoned) <= set(await client.metadata_store.list_ledgers())
        catalog = LogCatalog(client.metadata_store)
        for c in report["containers"]:  # made again above the replaced logs' epochs
            head = await catalog.read_head(container_log_name(c["container"]))
            assert head.value.epoch > c["epoch"]
        store = await SegmentStore.open(client, range(3), uri, config=CONFIG)
        try:
            got = (await snapshot(store, ["sc/st/u3"]))["sc/st/u3"]
            assert got[5] == expected["sc/st/u3"][5] + b"after recovery"
        finally:
            await store.close()
        await client.close()
    finally:
        fresh.close()

    status, out, err = await quire("tier2", "check", uri)
    assert status == 0 and "consistent" in out, out + err
    status, out, err = await quire("tier2", "check", uri, "--json")
    assert status == 0 and json.loads(out)["consistent"] is True
    # remove one chunk a record names: check names the segment and exits 1
    storage = await open_chunk_storage(uri)
    try:
        layout = await read_layout(storage, "sc/st/u4")
        assert layout is not None and layout.chunks
        await storage.delete(layout.chunks[-1].name)
    finally:
        await storage.close()
    status, out, err = await quire("tier2", "check", uri, "--json")
    assert status == 1, out + err
    found = json.loads(out)
    assert found["consistent"] is False
    assert {(v["segment"], v["recorded_offset"]) for v in found["violations"]} >= {
        ("sc/st/u4", layout.length)}
    status, out, err = await quire("tier2", "check", uri)
    assert status == 1 and "sc/st/u4" in out, out + err


async def test_recover_from_s3_tier2(connect: Callable[..., Awaitable[Client]],
                                     tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    uri = s3_endpoint.uri("recover-test")
    names, expected, fresh = await write_and_lose_cluster(connect, tmp_path, uri)
    try:
        client = await connect(fresh)
        seen: list[tuple[int, int]] = []
        report = await recover(client, uri, progress=lambda done, total: seen.append(
            (done, total)))
        assert report.container_count == 3
        assert report.segments == len(set(names))
        assert report.bytes == sum(v[0] - v[1] for v in expected.values())
        assert [o.name for o in report.orphans] == [ORPHAN]
        assert all(not c.index_mismatches and not c.dangling for c in report.containers)
        assert seen[0] == (0, report.segments) and seen[-1] == (report.segments,) * 2
        with pytest.raises(RecoveryError, match="exist already"):
            await recover(client, uri)
        await assert_recovered(client, uri, names, expected)
    finally:
        fresh.close()
