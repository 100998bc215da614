"""Quire's stream client on real bookies (3 bookie processes, E3 W3 A2):
the controller (its tables over the wire) and the segment server on a
SegmentStore of named tier-1 logs; a writer's events over 3 segments read
back once each, in order per routing key, and the controller's state
still there for a second client."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

from quire.client import Client
from quire.streams import StreamReader, StreamWriter
from tests.support.cluster import Cluster
from tests.support.streams import start_system


async def test_streams_on_bookies_round_trip_in_key_order(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    system = await start_system(await connect(cluster))
    try:
        c = system.controller_client()
        segments = system.segments(c)
        assert await c.create_scope("sc")
        assert await c.create_stream("sc", "st", 3)
        writer = StreamWriter(c, segments, "sc", "st")
        await writer.start()
        keys = [f"key-{k}" for k in range(10)]
        await asyncio.gather(*(writer.write_event(f"{k}:{n}".encode(), k)
                               for n in range(30) for k in keys))
        await writer.close()

        other = system.controller_client()
        assert await other.list_streams("sc") == ["st"]
        reader = StreamReader(other, system.segments(other), "sc", "st")
        per_key: dict[str, list[int]] = collections.defaultdict(list)
        seen_segments = set()
        async for event in reader.events():
            key, n = event.data.decode().split(":")
            per_key[key].append(int(n))
            seen_segments.add(event.segment_id)
        assert {k: per_key[k] for k in keys} == {k: list(range(30)) for k in keys}
        assert len(seen_segments) == 3
    finally:
        await system.close()
