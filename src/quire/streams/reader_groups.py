"""Reader groups: those of the Pravega client, read from their state table
(read-only), and those registered with the controller, whose reports of
what they have read hold retention back (subscribers).

**The Pravega client's groups** keep their state in the table segment
``<scope>/<group>_kvtable/0.#epoch.0`` (the Rust client's
``TableSynchronizer``; the controller never hears of them);
:func:`read_client_group` reads it from the segment stores, and
:mod:`quire.pravega_wire.reader_group_state` decodes its records.

**Groups registered with the controller** (:func:`create_reader_group`):
with retention MANUAL or AUTOMATIC each is a subscriber of its streams,
named ``<scope>/<group>``; :func:`report_read` tells the controller what it
has read (a stream cut), and retention never truncates past it (within the
stream's maximum).
"""

from __future__ import annotations

from typing import Any

from quire.controller_api import Controller_pb2 as pb
from quire.errors import (
    ControllerNotFoundError,
    ControllerPreconditionError,
    ControllerUnavailableError,
    ScopeNotFoundError,
    StreamNotFoundError,
)
from quire.pravega_wire.reader_group_state import ReaderGroupState, parse_state, state_table
from quire.streams.controller import ControllerClient
from quire.streams.segments import RemoteSegmentStore

RETENTION_TYPES = ("none", "manual", "automatic")


async def read_client_group(segments: RemoteSegmentStore, scope: str, name: str
                            ) -> ReaderGroupState:
    """Read group ``name``'s state table (SegmentNotFoundError if there is
    none, ProtocolError if it is not the client's format)."""
    entries: list[tuple[bytes, bytes]] = []
    token = None
    while True:
        page = await segments.table_iterate(state_table(scope, name), token=token)
        entries.extend((e.key, e.value) for e in page.entries if e.value is not None)
        if page.token is None or not page.entries:
            break
        token = page.token
    return parse_state(scope, name, entries)


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
