"""The official (Rust) Pravega client's reader-group state records, decoded (sans-IO).

The client keeps a reader group's state in its own table segment,
``<scope>/<group>_kvtable/0.#epoch.0`` (:func:`state_table`; the client's
"table synchronizer"), which the controller never sees created.  One
record (table entry) of it::

    key    CBOR text  NN<outer>[/<inner>]      NN: the outer key's length, two digits
    value  CBOR map   {"type_id": text, "data": [byte, ...]}
                      data (bytes as an array of ints) is CBOR again: a value of type_id

CBOR is :mod:`quire.pravega_wire.cbor`.  The records, by key::

    config/default                 ReaderGroupConfigVersioned
                                   {"V1": {"starting_stream_cuts": {ScopedStream: cut}, ...}}
                                   -> the streams the group reads
    assigned_segments/<reader>     HashMap<ScopedSegment, Offset>  {segment: {"read": n}}
                                   -> an online reader, each segment it holds, its read offset
    unassigned_segments/<segment>  Offset {"read": n}
                                   -> a segment nobody holds, and where reading resumes
    future_segments/<segment>      -> a successor waiting for its predecessors to be read
    distance_to_tail/<reader>      u64 (not read)
    <outer>                        type "blob": the outer key exists (versions only)

    ScopedStream   {"scope": {"name": text}, "stream": {"name": text}}
    ScopedSegment  {"scope": {"name"}, "stream": {"name"}, "segment": {"number", "tx_id"}}
                   number: epoch << 32 | segment number (or the segment's name as text);
                   as a map key it is the tuple of its (field, value) pairs

A record of type ``tombstone`` (a removal not yet cleaned up) or ``blob``,
and an outer key alone, are skipped.  Records not in this layout are a
:class:`~quire.errors.ProtocolError`.

How the records are reached is each reader's own: the controller's
:class:`quire.controller.reader_groups.ReaderGroups` and the client's
:func:`quire.streams.reader_groups.read_client_group`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quire.errors import ProtocolError
from quire.pravega_wire.cbor import decode
from quire.security.resources import READER_GROUP_TABLE_SUFFIX

TOMBSTONE = "tombstone"
BLOB = "blob"
_TABLE_SEGMENT = f"{READER_GROUP_TABLE_SUFFIX}/0.#epoch.0"


def state_table(scope: str, group: str) -> str:
    """The segment holding ``group``'s state."""
    return f"{scope}/{group}{_TABLE_SEGMENT}"


def group_of(segment: str, scope: str) -> str | None:
    """The reader group whose state table ``segment`` is (in ``scope``), or None."""
    prefix = f"{scope}/"
    if segment.startswith(prefix) and segment.endswith(_TABLE_SEGMENT):
        group = segment[len(prefix):-len(_TABLE_SEGMENT)]
        return group if group and "/" not in group else None
    return None


def split_key(key: str) -> tuple[str, str | None]:
    """``NN<outer>[/<inner>]`` -> (outer, inner or None); ProtocolError if malformed."""
    if len(key) < 2 or not key[:2].isdigit():
        raise ProtocolError(f"table key {key!r} does not start with its outer key's length")
    length = int(key[:2])
    outer = key[2:2 + length]
    if len(outer) != length:
        raise ProtocolError(f"table key {key!r} is shorter than its outer key's length")
    rest = key[2 + length:]
    if not rest:
        return outer, None
    if not rest.startswith("/"):
        raise ProtocolError(f"table key {key!r}: no '/' after the outer key")
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


def _name(value: Any, part: str) -> str:
    name = _field(_field(value, part), "name")
    if not isinstance(name, str):
        raise ProtocolError(f"no {part} name in {value!r}")
    return name


def scoped_segment_name(value: Any) -> str:
    """``scope/stream/n.#epoch.e`` of a decoded ScopedSegment (or its string form)."""
    if isinstance(value, str):
        return value
    number = _field(_field(value, "segment"), "number")
    if not isinstance(number, int) or isinstance(number, bool):
        raise ProtocolError(f"not a ScopedSegment: {value!r}")
    return (f"{_name(value, 'scope')}/{_name(value, 'stream')}/"
            f"{number & 0xFFFF_FFFF}.#epoch.{number >> 32}")


def _read(offset: Any) -> int:
    """The read offset of a decoded Offset."""
    read = _field(offset, "read")
    if not isinstance(read, int) or isinstance(read, bool):
        raise ProtocolError(f"not an Offset: {offset!r}")
    return read


def _offsets(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ProtocolError(f"not a map of segments to offsets: {value!r}")
    return {scoped_segment_name(k): _read(v) for k, v in value.items()}


def _streams(config: Any) -> list[str]:
    """``scope/stream`` of each stream a ReaderGroupConfigVersioned reads."""
    if isinstance(config, dict) and len(config) == 1 and "starting_stream_cuts" not in config:
        config = next(iter(config.values()))  # the enum's one variant: {"V1": config}
    cuts = _field(config, "starting_stream_cuts")
    if cuts is None:
        return []
    if not isinstance(cuts, Mapping):
        raise ProtocolError(f"not a map of streams to cuts: {cuts!r}")
    return [f"{_name(s, 'scope')}/{_name(s, 'stream')}" for s in cuts]


def _payload(wrapper: Any) -> tuple[Any, Any]:
    """The ``type_id`` of a record's value and its ``data``, decoded."""
    if not isinstance(wrapper, dict):
        raise ProtocolError(f"a record's value is not a map: {wrapper!r}")
    type_id, data = wrapper.get("type_id"), wrapper.get("data")
    if type_id in (TOMBSTONE, BLOB):
        return type_id, None
    try:
        raw = bytes(data) if isinstance(data, list) else data
    except (TypeError, ValueError):
        raise ProtocolError(f"{type_id}: data is not an array of bytes") from None
    if not isinstance(raw, bytes):
        raise ProtocolError(f"{type_id}: no data in {wrapper!r}")
    return type_id, decode(raw)


@dataclass
class ReaderGroupState:
    """One reader group as its table holds it."""

    scope: str
    name: str
    streams: list[str] = field(default_factory=list)
    """``scope/stream`` of each stream the group reads."""
    readers: dict[str, dict[str, int]] = field(default_factory=dict)
    """Online reader -> segment it holds -> read offset (as last saved)."""
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


def parse_state(scope: str, name: str, entries: Iterable[tuple[bytes, bytes]]
                ) -> ReaderGroupState:
    """The state in a group's table entries (key, value); ProtocolError if
    they are not the client's format."""
    state = ReaderGroupState(scope, name)
    for raw_key, raw_value in entries:
        key = decode(raw_key)
        if not isinstance(key, str):
            raise ProtocolError(f"table key {raw_key!r} is not a CBOR text string")
        outer, inner = split_key(key)
        if not inner:
            continue  # a map's version record
        type_id, payload = _payload(decode(raw_value))
        if type_id in (TOMBSTONE, BLOB):
            continue
        if outer == "config":
            state.streams.extend(_streams(payload))
        elif outer == "assigned_segments":
            state.readers[inner] = _offsets(payload)
        elif outer == "unassigned_segments":
            state.unassigned[inner] = _read(payload)
        elif outer == "future_segments":
            state.future.append(inner)
    state.streams.sort()
    return state
