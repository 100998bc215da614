"""Reader groups as the official (Rust) Pravega client keeps them, read-only.

For the REST API and the cluster page.

The client keeps a reader group's state in its own table segment,
``<scope>/<group>_kvtable/0.#epoch.0``, which the controller never sees
created; its records and their decoding are
:mod:`quire.pravega_wire.reader_group_state`.

:class:`ReaderGroups` lists a scope's groups through a
:data:`SegmentLister` (the segment stores' ``/api/v1/segments``), reads a
group's state through the :class:`ControllerSegmentStore` seam, and
deletes a group by deleting its table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quire.controller.state import ControllerSegmentStore
from quire.errors import SegmentNotFoundError
from quire.pravega_wire.reader_group_state import (
    ReaderGroupState,
    group_of,
    parse_state,
    state_table,
)

SegmentLister = Callable[[str], Awaitable[list[str]]]
"""The names of the live segments starting with a prefix, cluster-wide."""


class ReaderGroups:
    """The reader groups of the cluster (module docstring); ``lister`` None:
    groups are found by name only (an in-process stack)."""

    def __init__(self, store: ControllerSegmentStore,
                 lister: SegmentLister | None = None) -> None:
        self.store = store
        self.lister = lister

    async def names(self, scope: str) -> list[str]:
        if self.lister is None:
            return []
        found = {group_of(s, scope) for s in await self.lister(f"{scope}/")}
        return sorted(g for g in found if g is not None)

    async def state(self, scope: str, name: str) -> ReaderGroupState | None:
        """The group's state; None if it has no table (ProtocolError if the
        table is not the client's format)."""
        table = state_table(scope, name)
        entries: list[tuple[bytes, bytes]] = []
        token: bytes | None = None
        try:
            while True:
                page = await self.store.table_iterate(table, False, token, 1000)
                entries.extend((e.key, e.value) for e in page.entries if e.value is not None)
                if page.token is None or not page.entries:
                    break
                token = page.token
        except SegmentNotFoundError:
            return None
        return parse_state(scope, name, entries)

    async def delete(self, scope: str, name: str) -> bool:
        """Delete the group's table; False if there was none."""
        try:
            await self.store.delete(state_table(scope, name))
        except SegmentNotFoundError:
            return False
        return True
