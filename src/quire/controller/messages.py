"""The controller's values as messages of Pravega's gRPC interface, and back."""

from __future__ import annotations

from typing import Any, cast

from quire.controller.model import (
    Epoch,
    RetentionType,
    ScaleType,
    SegmentRange,
    StreamConfig,
    StreamRecord,
)
from quire.controller.retention import RETENTION_TYPES
from quire.controller_api import Controller_pb2 as pb
from quire.errors import ControllerInvalidArgumentError
from quire.segmentstore.names import check_name


def names(info: pb.StreamInfo) -> tuple[str, str]:
    check_name("scope", info.scope)
    check_name("stream", info.stream)
    return info.scope, info.stream


def range_message(scope: str, stream: str, s: SegmentRange) -> pb.SegmentRange:
    return pb.SegmentRange(segmentId=pb.SegmentId(streamInfo=pb.StreamInfo(scope=scope,
                                                                           stream=stream),
                                                  segmentId=s.id),
                           minKey=s.min_key, maxKey=s.max_key)


def ranges_message(scope: str, stream: str, epoch: Epoch) -> pb.SegmentRanges:
    return pb.SegmentRanges(segmentRanges=[range_message(scope, stream, s)
                                           for s in epoch.segments])


_RETENTION_IN = {pb.RetentionPolicy.UNKNOWN: RetentionType.NONE,
                 pb.RetentionPolicy.TIME: RetentionType.TIME,
                 pb.RetentionPolicy.SIZE: RetentionType.SIZE}
_RETENTION_OUT = {v: k for k, v in _RETENTION_IN.items()}
_NO_MAXIMUM = (1 << 63) - 1
"""Pravega's "no maximum" (Long.MAX_VALUE), which clients send as the max."""


def config_of(request: pb.StreamConfig) -> StreamConfig:
    """A StreamConfig message as a StreamConfig (ControllerInvalidArgumentError
    for bad numbers)."""
    scaling = request.scalingPolicy
    try:
        scale_type = ScaleType(scaling.scaleType)
    except ValueError:
        raise ControllerInvalidArgumentError(
            f"unknown scaling policy type {scaling.scaleType}") from None
    retention = request.retentionPolicy
    kind = _RETENTION_IN.get(retention.retentionType)
    if kind is None:
        raise ControllerInvalidArgumentError(
            f"unknown retention type {retention.retentionType}")
    maximum = 0 if retention.retentionMax in (0, _NO_MAXIMUM) else retention.retentionMax
    return StreamConfig(scaling.minNumSegments, kind, retention.retentionParam, maximum,
                        tuple(request.tags.tag), scale_type,
                        scaling.targetRate if scale_type is not ScaleType.FIXED else 0,
                        scaling.scaleFactor if scale_type is not ScaleType.FIXED else 0)


def config_message(scope: str, stream: str, record: StreamRecord) -> pb.StreamConfig:
    c = record.config
    return pb.StreamConfig(
        streamInfo=pb.StreamInfo(scope=scope, stream=stream),
        scalingPolicy=pb.ScalingPolicy(scaleType=cast(Any, c.scale_type.value),
                                       targetRate=c.target_rate, scaleFactor=c.scale_factor,
                                       minNumSegments=c.min_segments),
        retentionPolicy=pb.RetentionPolicy(retentionType=_RETENTION_OUT[c.retention],
                                           retentionParam=c.retention_param,
                                           retentionMax=c.retention_max or _NO_MAXIMUM),
        tags=pb.Tags(tag=list(c.tags)))


def group_of(request: pb.ReaderGroupConfiguration) -> dict[str, Any]:
    """A reader group's configuration as the controller keeps it."""
    if not 0 <= request.retentionType < len(RETENTION_TYPES):
        raise ControllerInvalidArgumentError(f"unknown retention type {request.retentionType}")
    streams = {}
    for cut in request.startingStreamCuts:
        check_name("stream", cut.streamInfo.stream)
        if cut.streamInfo.scope != request.scope:
            raise ControllerInvalidArgumentError("a reader group reads streams of its scope")
        streams[cut.streamInfo.stream] = sorted(cut.cut.items())
    return {"retention": RETENTION_TYPES[request.retentionType], "streams": streams,
            "id": request.readerGroupId,
            "end": {c.streamInfo.stream: sorted(c.cut.items())
                    for c in request.endingStreamCuts},
            "refresh_ms": request.groupRefreshTimeMillis,
            "checkpoint_ms": request.automaticCheckpointIntervalMillis,
            "max_outstanding_checkpoints": request.maxOutstandingCheckpointRequest}


def group_message(scope: str, name: str, doc: dict[str, Any]) -> pb.ReaderGroupConfiguration:
    def cut(stream: str, pairs: list[list[int]]) -> pb.StreamCut:
        return pb.StreamCut(streamInfo=pb.StreamInfo(scope=scope, stream=stream),
                            cut={int(s): int(o) for s, o in pairs})
    return pb.ReaderGroupConfiguration(
        scope=scope, readerGroupName=name,
        groupRefreshTimeMillis=int(doc.get("refresh_ms", 0)),
        automaticCheckpointIntervalMillis=int(doc.get("checkpoint_ms", 0)),
        maxOutstandingCheckpointRequest=int(doc.get("max_outstanding_checkpoints", 0)),
        retentionType=RETENTION_TYPES.index(doc.get("retention", "none")),
        generation=int(doc.get("generation", 0)), readerGroupId=str(doc.get("id", "")),
        startingStreamCuts=[cut(s, c) for s, c in doc.get("streams", {}).items()],
        endingStreamCuts=[cut(s, c) for s, c in doc.get("end", {}).items()])
