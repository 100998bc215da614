"""Events of one segment through a segment store process's wire port:
:func:`append` numbered events once its container is open, :func:`read_events`
them back (for tests of a store restarted with new settings)."""

from __future__ import annotations

import asyncio

from quire.pravega_wire import (
    AppendSetup,
    CreateSegment,
    DataAppended,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    WrongHost,
)
from tests.support.pravega_wire_client import WireClient, block, events_of

SEGMENT = "sc/st/0.#epoch.0"
WRITER = 0x5E


async def wire(address: str) -> WireClient:
    host, port = address.rsplit(":", 1)
    return await WireClient.connect(host, int(port))


async def append(address: str, first: int, events: list[bytes]) -> None:
    """Append ``events`` (numbered from ``first``) once the container is open."""
    async with asyncio.timeout(60):
        while True:
            client = await wire(address)
            try:
                created = await client.request(CreateSegment(1, SEGMENT, 0, 0, ""))
                if not isinstance(created, WrongHost):
                    break
            finally:
                await client.close()
            await asyncio.sleep(0.05)  # the container is not open yet
    assert isinstance(created, SegmentCreated) or first > 1
    client = await wire(address)
    try:
        setup = await client.request(SetupAppend(2, WRITER, SEGMENT, ""))
        assert isinstance(setup, AppendSetup)
        assert setup.last_event_number == first - 1 if first > 1 else \
            setup.last_event_number < 0
        await client.send(block(WRITER, first + len(events) - 1, 3, *events))
        appended = await client.recv()
        assert isinstance(appended, DataAppended)
        assert appended.event_number == first + len(events) - 1
    finally:
        await client.close()


async def read_events(address: str) -> list[bytes]:
    client = await wire(address)
    try:
        read = await client.request(ReadSegment(SEGMENT, 0, 1 << 20, "", 4))
        assert isinstance(read, SegmentRead)
        return events_of(read.data)
    finally:
        await client.close()
