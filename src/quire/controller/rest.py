"""The controller's REST API v1, Pravega's (``/v1/scopes``...), on the controller's HTTP port.

Paths, request and response shapes are those of Pravega's controller REST
API (its swagger ``Controller.yaml``); the OpenAPI document describing
exactly what is served here is :data:`quire.controller.openapi.OPENAPI`,
served at ``/v1/openapi.json``.  The handlers call
:class:`~quire.controller.core.ControllerCore`, and stream configurations
go through the gRPC service's own conversions (REST JSON -> the
``StreamConfig`` message -> :func:`~quire.controller.service.config_of`,
and back with :func:`~quire.controller.service.config_message`), so the
two APIs accept and describe a configuration alike.

Statuses as Pravega's: 201 created, 204 deleted, 404 no such scope,
stream or reader group, 409 exists already, 412 a scope with streams or
a stream not sealed (delete), 400 a bad body or name (with a message: a
refusal is always ``{"error": ...}``).  Authorization is the HTTP
server's: READ on ``prn::/`` to read, READ_UPDATE to change.

Reader groups are read from the official client's state tables
(:mod:`quire.controller.reader_groups`); a group's answer adds Quire's
``positions`` (segment -> read offset) and ``readers`` (reader -> the
segments it holds) to Pravega's fields.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from quire.controller.core import ControllerCore
from quire.controller.messages import config_message, config_of
from quire.controller.model import Epoch, StreamRecord, StreamState
from quire.controller.openapi import OPENAPI, OPENAPI_PATH
from quire.controller.reader_groups import ReaderGroups
from quire.controller_api import Controller_pb2 as pb
from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ControllerPreconditionError,
    HttpRequestError,
    ProtocolError,
)
from quire.http import Route, json_response, read_json
from quire.segmentstore.names import check_name

if TYPE_CHECKING:
    from aiohttp import web

DAY_MS = 86_400_000
MIB = 1 << 20
_SCALING = {"FIXED_NUM_SEGMENTS": pb.ScalingPolicy.FIXED_NUM_SEGMENTS,
            "BY_RATE_IN_KBYTES_PER_SEC": pb.ScalingPolicy.BY_RATE_IN_KBYTES_PER_SEC,
            "BY_RATE_IN_EVENTS_PER_SEC": pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC}
_SCALING_OUT = {v: k for k, v in _SCALING.items()}


def _int(doc: dict[str, Any], key: str, default: int = 0) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HttpRequestError(400, f"{key} must be a non-negative integer, not {value!r}")
    return value


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise HttpRequestError(400, f"{key} must be an object")
    return value


def _time_ms(value: int, time_based: dict[str, Any]) -> int:
    if time_based:
        return (_int(time_based, "days") * DAY_MS + _int(time_based, "hours") * 3_600_000
                + _int(time_based, "minutes") * 60_000)
    return value * DAY_MS


def config_request(scope: str, stream: str, body: dict[str, Any]) -> pb.StreamConfig:
    """A REST stream configuration (CreateStreamRequest, UpdateStreamRequest)
    as the gRPC StreamConfig message (HttpRequestError 400 if malformed)."""
    scaling = _object(body, "scalingPolicy")
    kind = scaling.get("type", "FIXED_NUM_SEGMENTS")
    if kind not in _SCALING:
        raise HttpRequestError(400, f"scalingPolicy.type {kind!r} is not one of "
                                    f"{', '.join(_SCALING)}")
    retention = _object(body, "retentionPolicy")
    r_type, param, maximum = pb.RetentionPolicy.UNKNOWN, 0, 0
    if retention:
        value, max_value = _int(retention, "value"), _int(retention, "maxValue")
        if retention.get("type") == "LIMITED_DAYS":
            r_type = pb.RetentionPolicy.TIME
            param = _time_ms(value, _object(retention, "timeBasedRetention"))
            maximum = _time_ms(max_value, _object(retention, "maxTimeBasedRetention"))
        elif retention.get("type") == "LIMITED_SIZE_MB":
            r_type, param, maximum = pb.RetentionPolicy.SIZE, value * MIB, max_value * MIB
        else:
            raise HttpRequestError(400, "retentionPolicy.type must be LIMITED_DAYS or "
                                        "LIMITED_SIZE_MB")
    tags = body.get("streamTags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise HttpRequestError(400, "streamTags must be a list of strings")
    return pb.StreamConfig(
        streamInfo=pb.StreamInfo(scope=scope, stream=stream),
        scalingPolicy=pb.ScalingPolicy(scaleType=_SCALING[kind],
                                       targetRate=_int(scaling, "targetRate"),
                                       scaleFactor=_int(scaling, "scaleFactor"),
                                       minNumSegments=_int(scaling, "minSegments", 1)),
        retentionPolicy=pb.RetentionPolicy(retentionType=r_type, retentionParam=param,
                                           retentionMax=maximum),
        tags=pb.Tags(tag=tags))


def _time_based(ms: int) -> dict[str, int]:
    return {"days": ms // DAY_MS, "hours": ms % DAY_MS // 3_600_000,
            "minutes": ms % 3_600_000 // 60_000}


def stream_property(scope: str, stream: str, record: StreamRecord) -> dict[str, Any]:
    """Pravega's StreamProperty of a stream."""
    message = config_message(scope, stream, record)
    scaling, retention = message.scalingPolicy, message.retentionPolicy
    out: dict[str, Any] = {
        "scopeName": scope, "streamName": stream,
        "scalingPolicy": {"type": _SCALING_OUT[scaling.scaleType],
                          "targetRate": scaling.targetRate, "scaleFactor": scaling.scaleFactor,
                          "minSegments": scaling.minNumSegments},
        "tags": list(message.tags.tag)}
    if retention.retentionType == pb.RetentionPolicy.TIME:
        out["retentionPolicy"] = {
            "type": "LIMITED_DAYS", "value": retention.retentionParam // DAY_MS,
            "timeBasedRetention": _time_based(retention.retentionParam),
            "maxValue": retention.retentionMax // DAY_MS,
            "maxTimeBasedRetention": _time_based(retention.retentionMax)}
    elif retention.retentionType == pb.RetentionPolicy.SIZE:
        out["retentionPolicy"] = {"type": "LIMITED_SIZE_MB",
                                  "value": retention.retentionParam // MIB,
                                  "maxValue": retention.retentionMax // MIB}
    return out


def scaling_events(record: StreamRecord, from_ms: int, to_ms: int) -> list[dict[str, Any]]:
    """Pravega's ScaleMetadata of each epoch active between ``from_ms`` and
    ``to_ms``: its segments, and the splits and merges that began it."""
    events = []
    previous: Epoch | None = None
    for i, epoch in enumerate(record.epochs):
        ends = record.epochs[i + 1].created_ms if i + 1 < len(record.epochs) else None
        if epoch.created_ms <= to_ms and (ends is None or ends > from_ms):
            splits = merges = 0
            if previous is not None:
                gone = [s for s in previous.segments if s.id not in epoch.ids()]
                new = [s for s in epoch.segments if s.id not in previous.ids()]
                splits = sum(sum(n.overlaps(g) for n in new) > 1 for g in gone)
                merges = sum(sum(g.overlaps(n) for g in gone) > 1 for n in new)
            events.append({"timestamp": epoch.created_ms, "splits": splits, "merges": merges,
                           "segmentList": [{"number": s.id, "startTime": epoch.created_ms,
                                            "keyStart": s.min_key, "keyEnd": s.max_key}
                                           for s in epoch.segments]})
        previous = epoch
    return events


def _status(error: ControllerError) -> int:
    if isinstance(error, ControllerNotFoundError):
        return 404
    if isinstance(error, ControllerInvalidArgumentError):
        return 400
    if isinstance(error, ControllerPreconditionError):
        return 412
    if isinstance(error, ControllerConcurrentUpdateError):
        return 409
    return 500


Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]


def _no_content() -> web.StreamResponse:
    from aiohttp import web

    return web.Response(status=204)


class ControllerRest:
    """The routes of the REST API (module docstring)."""

    def __init__(self, core: ControllerCore, reader_groups: ReaderGroups) -> None:
        self.core = core
        self.reader_groups = reader_groups

    def routes(self) -> list[Route]:
        s = "/v1/scopes/{scopeName}"
        t = s + "/streams/{streamName}"
        g = s + "/readergroups/{readerGroupName}"
        table: list[tuple[str, str, Handler]] = [
            ("GET", "/v1/scopes", self.list_scopes),
            ("POST", "/v1/scopes", self.create_scope),
            ("GET", s, self.get_scope),
            ("DELETE", s, self.delete_scope),
            ("GET", s + "/streams", self.list_streams),
            ("POST", s + "/streams", self.create_stream),
            ("GET", t, self.get_stream),
            ("PUT", t, self.update_stream),
            ("DELETE", t, self.delete_stream),
            ("PUT", t + "/state", self.update_stream_state),
            ("GET", t + "/scaling-events", self.get_scaling_events),
            ("GET", s + "/readergroups", self.list_reader_groups),
            ("GET", g, self.get_reader_group),
            ("DELETE", g, self.delete_reader_group),
            ("GET", OPENAPI_PATH, self.openapi)]
        return [Route(method, path, self._answering(handler)) for method, path, handler in table]

    @staticmethod
    def _answering(handler: Handler) -> Handler:
        async def answer(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except ControllerError as e:
                raise HttpRequestError(_status(e), str(e)) from None
        return answer

    # --- scopes ----------------------------------------------------------------------

    async def list_scopes(self, _request: web.Request) -> web.StreamResponse:
        names, token = await self.core.list_scopes("")
        while True:
            more, token = await self.core.list_scopes(token)
            if not more:
                break
            names.extend(more)
        return json_response(200, {"scopes": [{"scopeName": n} for n in names]})

    async def create_scope(self, request: web.Request) -> web.StreamResponse:
        name = (await read_json(request)).get("scopeName")
        if not isinstance(name, str):
            raise HttpRequestError(400, "scopeName (a string) is required")
        if not await self.core.create_scope(name):
            raise HttpRequestError(409, f"scope {name!r} exists already")
        return json_response(201, {"scopeName": name})

    async def get_scope(self, request: web.Request) -> web.StreamResponse:
        scope = request.match_info["scopeName"]
        if not await self.core.scope_exists(scope):
            raise HttpRequestError(404, f"no scope {scope!r}")
        return json_response(200, {"scopeName": scope})

    async def delete_scope(self, request: web.Request) -> web.StreamResponse:
        await self.core.delete_scope(request.match_info["scopeName"])
        return _no_content()

    # --- streams ---------------------------------------------------------------------

    async def _stream_names(self, scope: str) -> list[str]:
        names, token = await self.core.list_streams(scope, "")
        while True:
            more, token = await self.core.list_streams(scope, token)
            if not more:
                return names
            names.extend(more)

    async def list_streams(self, request: web.Request) -> web.StreamResponse:
        scope = request.match_info["scopeName"]
        kind, value = request.query.get("filter_type"), request.query.get("filter_value")
        out = []
        for name in await self._stream_names(scope):
            internal = name.startswith("_")
            if internal != (kind == "showInternalStreams"):
                continue
            try:
                record = await self.core.stream(scope, name)
            except ControllerNotFoundError:
                continue  # deleted meanwhile
            if kind == "tag" and value not in record.config.tags:
                continue
            out.append(stream_property(scope, name, record))
        return json_response(200, {"streams": out})

    async def create_stream(self, request: web.Request) -> web.StreamResponse:
        scope = request.match_info["scopeName"]
        body = await read_json(request)
        name = body.get("streamName")
        if not isinstance(name, str):
            raise HttpRequestError(400, "streamName (a string) is required")
        config = config_of(config_request(scope, name, body))
        if not await self.core.create_stream(scope, name, config):
            raise HttpRequestError(409, f"stream {scope}/{name} exists already")
        return json_response(201, stream_property(scope, name,
                                                  await self.core.stream(scope, name)))

    async def get_stream(self, request: web.Request) -> web.StreamResponse:
        scope, name = request.match_info["scopeName"], request.match_info["streamName"]
        return json_response(200, stream_property(scope, name,
                                                  await self.core.stream(scope, name)))

    async def update_stream(self, request: web.Request) -> web.StreamResponse:
        scope, name = request.match_info["scopeName"], request.match_info["streamName"]
        body = await read_json(request)
        await self.core.stream(scope, name)  # 404 before a 400 about the body
        await self.core.update_stream(scope, name, config_of(config_request(scope, name, body)))
        return json_response(200, stream_property(scope, name,
                                                  await self.core.stream(scope, name)))

    async def delete_stream(self, request: web.Request) -> web.StreamResponse:
        await self.core.delete_stream(request.match_info["scopeName"],
                                      request.match_info["streamName"])
        return _no_content()

    async def update_stream_state(self, request: web.Request) -> web.StreamResponse:
        scope, name = request.match_info["scopeName"], request.match_info["streamName"]
        state = (await read_json(request)).get("streamState")
        if state != "SEALED":
            raise HttpRequestError(400, 'streamState must be "SEALED"')
        await self.core.seal_stream(scope, name)
        record = await self.core.stream(scope, name)
        return json_response(200, {"streamState": "SEALED" if record.state is
                                   StreamState.SEALED else record.state.value.upper()})

    async def get_scaling_events(self, request: web.Request) -> web.StreamResponse:
        scope, name = request.match_info["scopeName"], request.match_info["streamName"]
        try:
            from_ms, to_ms = int(request.query["from"]), int(request.query["to"])
        except (KeyError, ValueError):
            raise HttpRequestError(400, "from and to (ms since 1970) are required") from None
        if from_ms > to_ms:
            raise HttpRequestError(400, "from is after to")
        record = await self.core.stream(scope, name)
        return json_response(200, {"scalingEvents": scaling_events(record, from_ms, to_ms)})

    # --- reader groups ---------------------------------------------------------------

    async def _scope(self, scope: str) -> None:
        if not await self.core.scope_exists(scope):
            raise HttpRequestError(404, f"no scope {scope!r}")

    async def _group(self, request: web.Request) -> tuple[str, str]:
        """The route's scope (404 if none) and reader group name (400 outside
        the naming rule, :func:`~quire.segmentstore.names.check_name`)."""
        scope, name = request.match_info["scopeName"], request.match_info["readerGroupName"]
        check_name("reader group", name)
        await self._scope(scope)
        return scope, name

    async def list_reader_groups(self, request: web.Request) -> web.StreamResponse:
        scope = request.match_info["scopeName"]
        await self._scope(scope)
        names = await self.reader_groups.names(scope)
        return json_response(200, {"readerGroups": [{"readerGroupName": n} for n in names]})

    async def get_reader_group(self, request: web.Request) -> web.StreamResponse:
        scope, name = await self._group(request)
        try:
            state = await self.reader_groups.state(scope, name)
        except ProtocolError as e:
            raise HttpRequestError(500, f"reader group {scope}/{name}: unreadable state: "
                                        f"{e}") from None
        if state is None:
            raise HttpRequestError(404, f"no reader group {scope}/{name}")
        return json_response(200, {
            "scopeName": scope, "readerGroupName": name, "streamList": state.streams,
            "onlineReaderIds": sorted(state.readers), "positions": state.positions(),
            "readers": state.readers, "unassignedSegments": state.unassigned})

    async def delete_reader_group(self, request: web.Request) -> web.StreamResponse:
        scope, name = await self._group(request)
        if not await self.reader_groups.delete(scope, name):
            raise HttpRequestError(404, f"no reader group {scope}/{name}")
        return _no_content()

    async def openapi(self, _request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        return web.Response(text=json.dumps(OPENAPI), content_type="application/json")
