"""Reader groups: those of the Pravega client, read from their state table
(read-only), and those registered with the controller, whose reports of
what they have read hold retention back (subscribers).

**The Pravega client's groups** keep their state in the table segment
``<scope>/<group>_kvtable/0.#epoch.0`` (the Rust client's
``TableSynchronizer``; the controller never hears of them).  Each key is a
CBOR text ``<2-digit length of the outer key><outer key>[/<inner key>]``;
each value a CBOR map ``{"type_id": <type>, "data": [byte, ...]}`` whose
bytes are CBOR again::

    config/default                 ReaderGroupConfigVersioned
                                   {"V1": {"starting_stream_cuts": ...}}
    assigned_segments/<reader>     HashMap<ScopedSegment, Offset> {segment: {"read": off}}
    unassigned_segments/<segment>  Offset {"read": offset}
    future_segments/<segment>      (the segments it waits for)
    distance_to_tail/<reader>      u64
    <outer key>                    blob (the outer key exists)

A ScopedSegment is ``{"scope": {"name"}, "stream": {"name"}, "segment":
{"number": id, "tx_id"}}``; a value of type ``tombstone`` is a deleted key.

**Groups registered with the controller** (:func:`create_reader_group`):
with retention MANUAL or AUTOMATIC each is a subscriber of its streams,
named ``<scope>/<group>``; :func:`report_read` tells the controller what it
has read (a stream cut), and retention never truncates past it (within the
stream's maximum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quire.controller_api import Controller_pb2 as pb
from quire.errors import (
    ControllerNotFoundError,
    ControllerPreconditionError,
    ControllerUnavailableError,
    ProtocolError,
    ScopeNotFoundError,
    StreamNotFoundError,
)
from quire.segmentstore import TableEntry
from quire.streams import cbor
from quire.streams.controller import ControllerClient
from quire.streams.segments import RemoteSegmentStore

RETENTION_TYPES = ("none", "manual", "automatic")


def state_table(scope: str, group: str) -> str:
    """The table segment holding the Pravega client's group ``group``."""
    return f"{scope}/{group}_kvtable/0.#epoch.0"


@dataclass
class ClientGroup:
    """A Pravega client's reader group as its state table says."""

    scope: str
    name: str
    streams: list[str] = field(default_factory=list)
    readers: dict[str, dict[str, int]] = field(default_factory=dict)
    """Online reader -> segment it holds -> offset read (as last saved)."""
    unassigned: dict[str, int] = field(default_factory=dict)
    """Segments no reader holds -> offset read."""
    future: list[str] = field(default_factory=list)
    """Segments waiting for their predecessors to be read."""


def _segment(key: Any) -> str:
    value = key.value if isinstance(key, cbor.FrozenKey) else key
    if isinstance(value, str):
        return value
    sid = int(value["segment"]["number"])
    return (f"{value['scope']['name']}/{value['stream']['name']}/"
            f"{sid & 0xFFFF_FFFF}.#epoch.{sid >> 32}")


def _stream(key: Any) -> str:
    value = key.value if isinstance(key, cbor.FrozenKey) else key
    return f"{value['scope']['name']}/{value['stream']['name']}"


def parse_client_group(scope: str, name: str, entries: list[TableEntry]) -> ClientGroup:
    """The group in ``entries`` of its state table (ProtocolError if they
    are not the Pravega client's)."""
    group = ClientGroup(scope, name)
    for entry in entries:
        if entry.value is None:
            continue
        key = cbor.loads(entry.key)
        envelope: Any = cbor.loads(entry.value)
        if not isinstance(key, str) or not isinstance(envelope, dict) or \
                len(key) < 2 or not key[:2].isdigit():
            raise ProtocolError(f"{name}: not a reader group's state entry: {entry.key!r}")
        outer_length = int(key[:2])
        outer, inner = key[2:2 + outer_length], key[3 + outer_length:]
        kind = envelope.get("type_id")
        if kind in ("tombstone", "blob") or not inner:
            continue
        data: Any = cbor.loads(bytes(envelope.get("data", [])))
        if outer == "config":
            versioned: dict[str, Any] = next(iter(data.values()), {})
            cuts = versioned.get("starting_stream_cuts", {})
            group.streams = sorted(_stream(k) for k in cuts)
        elif outer == "assigned_segments":
            group.readers[inner] = {_segment(k): int(v["read"]) for k, v in data.items()}
        elif outer == "unassigned_segments":
            group.unassigned[inner] = int(data["read"])
        elif outer == "future_segments":
            group.future.append(inner)
    return group


async def read_client_group(segments: RemoteSegmentStore, scope: str, name: str
                            ) -> ClientGroup:
    """Read group ``name``'s state table (SegmentNotFoundError if there is none)."""
    entries: list[TableEntry] = []
    token = None
    while True:
        page = await segments.table_iterate(state_table(scope, name), token=token)
        entries += page.entries
        if page.token is None or not page.entries:
            break
        token = page.token
    return parse_client_group(scope, name, entries)


# --- groups registered with the controller -------------------------------------------


def _cut(scope: str, stream: str, cut: dict[int, int]) -> pb.StreamCut:
    return pb.StreamCut(streamInfo=pb.StreamInfo(scope=scope, stream=stream), cut=cut)


async def create_reader_group(controller: ControllerClient, scope: str, name: str,
                              streams: dict[str, dict[int, int]],
                              retention: str = "manual") -> dict[str, Any]:
    """Register group ``name`` reading ``streams`` (stream -> starting cut, {}:
    the head); with retention ``manual`` or ``automatic`` it subscribes to
    them.  Its ``{"id", "generation"}`` (the stored one if it exists)."""
    answer = await controller.call("createReaderGroup", pb.ReaderGroupConfiguration(
        scope=scope, readerGroupName=name, retentionType=RETENTION_TYPES.index(retention),
        startingStreamCuts=[_cut(scope, s, c) for s, c in streams.items()]))
    if answer.status == pb.CreateReaderGroupResponse.SCOPE_NOT_FOUND:
        raise ScopeNotFoundError(f"no scope {scope!r}")
    if answer.status != pb.CreateReaderGroupResponse.SUCCESS:
        raise ControllerPreconditionError(f"reader group {scope}/{name} refused")
    return {"id": answer.config.readerGroupId, "generation": answer.config.generation}


async def delete_reader_group(controller: ControllerClient, scope: str, name: str) -> None:
    answer = await controller.call("deleteReaderGroup", pb.ReaderGroupInfo(
        scope=scope, readerGroup=name))
    if answer.status == pb.DeleteReaderGroupStatus.RG_NOT_FOUND:
        raise ControllerNotFoundError(f"no reader group {scope}/{name}")


async def list_subscribers(controller: ControllerClient, scope: str, stream: str) -> list[str]:
    answer = await controller.call("listSubscribers", pb.StreamInfo(scope=scope,
                                                                      stream=stream))
    if answer.status == pb.SubscribersResponse.STREAM_NOT_FOUND:
        raise StreamNotFoundError(f"no stream {scope}/{stream}")
    return list(answer.subscribers)


async def report_read(controller: ControllerClient, scope: str, stream: str, group: str,
                      group_id: str, generation: int, cut: dict[int, int]) -> None:
    """Tell the controller that group ``group`` (of ``scope``) has read
    ``stream`` up to ``cut``."""
    answer = await controller.call("updateSubscriberStreamCut", pb.SubscriberStreamCut(
        subscriber=f"{scope}/{group}", generation=generation, readerGroupId=group_id,
        streamCut=_cut(scope, stream, cut)))
    status = answer.status
    if status == pb.UpdateSubscriberStatus.STREAM_NOT_FOUND:
        raise StreamNotFoundError(f"no stream {scope}/{stream}")
    if status != pb.UpdateSubscriberStatus.SUCCESS:
        name = pb.UpdateSubscriberStatus.Status.Name(status)
        if status == pb.UpdateSubscriberStatus.FAILURE:
            raise ControllerUnavailableError(f"subscriber {scope}/{group}: {name}")
        raise ControllerPreconditionError(f"subscriber {scope}/{group}: {name}")
