"""Reopen after a crash from tier-1 + tier-2 loses no acknowledged
operation, on the file and on the S3 driver (a real moto server process).

A segment store process (``tests/support/segment_driver.py store:2`` with
``$QUIRE_DRIVER_TIER2``) on 3 real bookies flushes every change to tier-2
every 20 ms and truncates its tier-1 logs; appends with attribute updates
and table puts stream in without waiting, and the process is killed with
``kill -9`` while some are still in flight, after tier-1 was truncated (so
the older bytes are in tier-2 only).  tier-2 passes PDP-40's check, and a
new store opening the containers from tier-1 + tier-2 has every
acknowledged append (each segment is a prefix of what was sent, at least
up to the last acknowledged piece), the attributes that go with it and
every acknowledged table entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from quire.client import Client
from quire.log import LogStore, Position
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.names import container_log_name
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import read_layout
from quire.tier2 import open_chunk_storage
from tests.integration.test_segmentstore_cluster import OwnerGone, OwnerProcess
from tests.support.cluster import Cluster
from tests.support.segment_driver import TIER2_ENV

NAMES = [f"sc/k9/{i}" for i in range(4)]
TABLE = "sc/k9/table"
LAST_ROUNDS = 400
"""The last burst: 2,000 requests, more than the pipe holds, so the kill
always finds some unread, let alone answered."""


def piece(name: str, round_: int) -> bytes:
    return b"%s:%d;" % (name.encode(), round_)


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60
                ) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        assert loop.time() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.02)  # polling the condition, with a deadline


@pytest.mark.parametrize("driver", ["file", "s3"])
async def test_reopen_after_kill9_from_tier1_and_tier2_loses_no_acknowledged_operation(
        driver: str, cluster: Cluster, connect: Callable[..., Awaitable[Client]],
        tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"file://{tmp_path}/tier2" if driver == "file" else \
        request.getfixturevalue("s3_endpoint").uri(f"reopen-{tmp_path.name}")
    monkeypatch.setenv(TIER2_ENV, uri)
    client = await connect(cluster)
    owner = await OwnerProcess.start(cluster.metadata_uri, 2)
    sent: list[tuple[str, int, asyncio.Future[Any]]] = []
    keys: list[tuple[int, asyncio.Future[Any]]] = []
    try:
        await asyncio.gather(*(owner.call({"op": "create", "name": n}) for n in NAMES),
                             owner.call({"op": "create", "name": TABLE, "type": "TABLE"}))

        def burst(rounds: range) -> list[asyncio.Future[Any]]:
            out = []
            for round_ in rounds:
                for i, name in enumerate(NAMES):
                    f = owner.call({"op": "append", "name": name,
                                    "data": piece(name, round_).hex(),
                                    "updates": [[i, "REPLACE", round_, None]]})
                    sent.append((name, round_, f))
                    out.append(f)
                f = owner.call({"op": "table_put", "name": TABLE, "entries": [
                    [(b"k%d" % round_).hex(), (b"v%d" % round_).hex(), None]]})
                keys.append((round_, f))
                out.append(f)
            return out

        storage = await open_chunk_storage(uri)
        logs = LogStore(client)
        rounds = 0
        try:
            async def flushed_and_truncated() -> bool:
                """Tier-2 has bytes and each tier-1 log lost its first ledger;
                until then, more rounds (ledgers roll at 4 KiB)."""
                nonlocal rounds
                layout = await read_layout(storage, NAMES[0])
                heads = [(await logs.read_head(container_log_name(c))).value for c in (0, 1)]
                if layout is not None and layout.length > 0 and all(
                        h.truncated_before > Position.START for h in heads):
                    return True
                await asyncio.gather(*burst(range(rounds, rounds + 5)))
                rounds += 5
                return False
            await until(flushed_and_truncated, "flushed to tier-2 and tier-1 truncated")
        finally:
            await storage.close()
        last = burst(range(rounds, rounds + LAST_ROUNDS))
        pending = set(last)
        while len(last) - len(pending) < len(last) // 10:
            _done, pending = await asyncio.wait(pending, timeout=60,
                                                return_when=asyncio.FIRST_COMPLETED)
            assert _done, "no answer in 60 s"
    finally:
        await owner.kill9()
    assert any(not f.done() or isinstance(f.exception(), OwnerGone) for f in last), \
        "every operation was answered before the kill: nothing was in flight"

    assert await check(uri) == []
    store = await SegmentStore.open(client, range(2), uri,
                                    config=SegmentStoreConfig(container_count=2))
    landed = 0
    try:
        for i, name in enumerate(NAMES):
            sent_rounds = [r for n, r, _f in sent if n == name]
            acked = [r for n, r, f in sent if n == name and f.done() and not f.exception()]
            info = await store.get_info(name)
            data = b""
            while len(data) < info.length:
                data += (await store.read(name, len(data), 1 << 20)).data
            present = 0
            while present < len(sent_rounds) and data.startswith(
                    b"".join(piece(name, r) for r in sent_rounds[:present + 1])):
                present += 1
            assert data == b"".join(piece(name, r) for r in sent_rounds[:present]), name
            assert present >= len(acked), (name, present, len(acked))
            landed += present - rounds
            assert await store.get_attributes(name, [i]) == {i: sent_rounds[present - 1]}
        assert landed > 0  # some of the last burst came back
        acked_keys = [r for r, f in keys if f.done() and not f.exception()]
        entries = await store.table_get(TABLE, [b"k%d" % r for r in acked_keys])
        assert [e.value if e else None for e in entries] == [b"v%d" % r for r in acked_keys]
    finally:
        await store.close()
