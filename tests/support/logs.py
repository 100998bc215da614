"""Helpers for tests of named logs (quire.log), against any cluster."""

from __future__ import annotations

from quire.log import LogStore, Position


async def read_all(logs: LogStore, name: str, start: Position | None = None
                   ) -> list[tuple[Position, bytes]]:
    """Every record of log ``name`` from ``start`` (the beginning: None),
    without following the tail."""
    reader = await logs.open_reader(name, start, follow=False)
    try:
        return [(r.position, r.payload) async for r in reader]
    finally:
        await reader.close()
