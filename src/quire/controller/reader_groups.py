"""Reader groups as the official (Rust) Pravega client keeps them, read-only.

For the REST API and the cluster page.

The client keeps a reader group's state in its own table segment,
``<scope>/<group>_kvtable/0.#epoch.0`` (its "table synchronizer"), which
the controller never sees created.  Each table key is a CBOR text string
``NN<outer>[/<inner>]`` (``NN``: the outer key's length, two digits); each
value is CBOR (:mod:`quire.pravega_wire.cbor`) ``{"type_id": str, "data":
[bytes as an array of ints]}``, ``data`` itself CBOR of a value of type
``type_id``.  The outer keys:

* ``config/default``: ``ReaderGroupConfigVersioned`` ``{"V1":
  {"starting_stream_cuts": {ScopedStream: cut}, ...}}``: the streams read;
* ``assigned_segments/<reader>``: ``HashMap<ScopedSegment, Offset>``: an
  online reader and each segment it holds with its read offset
  (``{"read": n}``);
* ``unassigned_segments/<scope/stream/n.#epoch.e>``: ``Offset``: a segment
  nobody holds, and where reading resumes;
* ``future_segments/<segment>``: successors waiting for their predecessors;
* ``distance_to_tail/<reader>``: ``u64``.

A value of type ``tombstone`` is a removal not yet cleaned up: skipped.
Outer keys alone (``NN<outer>``) carry only versions: skipped.

:class:`ReaderGroups` lists a scope's groups through a
:data:`SegmentLister` (the segment stores' ``/api/v1/segments``), reads a
group's state through the :class:`ControllerSegmentStore` seam, and
deletes a group by deleting its table.  A second reader of this format
(``quire readergroup describe``) is meant to be folded into this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quire.controller.model import segment_name
from quire.controller.state import ControllerSegmentStore
from quire.errors import SegmentNotFoundError
from quire.pravega_wire.cbor import decode

TABLE_SUFFIX = "_kvtable"
TOMBSTONE = "tombstone"

SegmentLister = Callable[[str], Awaitable[list[str]]]
"""The names of the live segments starting with a prefix, cluster-wide."""


def state_table(scope: str, group: str) -> str:
    """The segment holding ``group``'s state."""
    return f"{scope}/{group}{TABLE_SUFFIX}/0.#epoch.0"


def group_of(segment: str, scope: str) -> str | None:
    """The reader group whose state table ``segment`` is (in ``scope``), or None."""
    prefix, suffix = f"{scope}/", f"{TABLE_SUFFIX}/0.#epoch.0"
    if segment.startswith(prefix) and segment.endswith(suffix):
        group = segment[len(prefix):-len(suffix)]
        return group if group and "/" not in group else None
    return None


def split_key(key: str) -> tuple[str, str | None]:
    """``NN<outer>[/<inner>]`` -> (outer, inner or None); ValueError if malformed."""
    length = int(key[:2])
    outer = key[2:2 + length]
    if len(outer) != length:
        raise ValueError(f"table key {key!r} is shorter than its outer key's length")
    rest = key[2 + length:]
    if not rest:
        return outer, None
    if not rest.startswith("/"):
        raise ValueError(f"table key {key!r}: no '/' after the outer key")
    return outer, rest[1:]


def _field(value: Any, name: str) -> Any:
    """A field of a decoded struct: a dict, or the tuple of pairs a struct
    becomes as a map key."""
    if isinstance(value, dict):
        return value.get(name)
    if isinstance(value, tuple):
        for item in value:
            if isinstance(item, tuple) and len(item) == 2 and item[0] == name:
                return item[1]
    return None


def scoped_segment_name(value: Any) -> str:
    """``scope/stream/n.#epoch.e`` of a decoded ScopedSegment (or its string form)."""
    if isinstance(value, str):
        return value
    scope = _field(_field(value, "scope"), "name")
    stream = _field(_field(value, "stream"), "name")
    number = _field(_field(value, "segment"), "number")
    if not isinstance(scope, str) or not isinstance(stream, str) or not isinstance(number, int):
        raise ValueError(f"not a ScopedSegment: {value!r}")
    return segment_name(scope, stream, number)


def _offsets(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ValueError(f"not a map of segments to offsets: {value!r}")
    return {scoped_segment_name(k): int(_field(v, "read") or 0) for k, v in value.items()}


@dataclass
class ReaderGroupState:
    """One reader group as its table holds it."""

    scope: str
    name: str
    streams: list[str] = field(default_factory=list)
    """``scope/stream`` of each stream the group reads."""
    readers: dict[str, dict[str, int]] = field(default_factory=dict)
    """Online reader -> segment it holds -> read offset."""
    unassigned: dict[str, int] = field(default_factory=dict)
    """Segment held by nobody -> where reading resumes."""
    future: list[str] = field(default_factory=list)
    """Successor segments waiting for their predecessors to be read."""

    def positions(self) -> dict[str, int]:
        """Every segment the group reads now -> its read offset."""
        found = dict(self.unassigned)
        for held in self.readers.values():
            found.update(held)
        return found


def parse_state(scope: str, name: str, entries: list[tuple[bytes, bytes]]) -> ReaderGroupState:
    """The state in a group's table entries (key, value); ValueError if they
    are not the client's format."""
    state = ReaderGroupState(scope, name)
    for raw_key, raw_value in entries:
        key = decode(raw_key)
        if not isinstance(key, str):
            raise ValueError(f"table key {raw_key!r} is not a CBOR text string")
        outer, inner = split_key(key)
        if inner is None:
            continue  # a map's version record
        wrapper = decode(raw_value)
        type_id, data = _field(wrapper, "type_id"), _field(wrapper, "data")
        if type_id == TOMBSTONE:
            continue
        payload = decode(bytes(data)) if isinstance(data, list) else \
            decode(data) if isinstance(data, bytes) else data
        if outer == "config":
            config = _field(payload, "V1") or payload
            cuts = _field(config, "starting_stream_cuts") or {}
            for stream in (cuts if isinstance(cuts, Mapping) else {}):
                s_scope = _field(_field(stream, "scope"), "name")
                s_name = _field(_field(stream, "stream"), "name")
                if isinstance(s_scope, str) and isinstance(s_name, str):
                    state.streams.append(f"{s_scope}/{s_name}")
        elif outer == "assigned_segments":
            state.readers[inner] = _offsets(payload)
        elif outer == "unassigned_segments":
            state.unassigned[inner] = int(_field(payload, "read") or 0)
        elif outer == "future_segments":
            state.future.append(inner)
    state.streams.sort()
    return state


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
        """The group's state; None if it has no table."""
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
