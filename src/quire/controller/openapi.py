"""The OpenAPI 3 document of the controller's REST API (:mod:`quire.controller.rest`), as data.

Served at ``/v1/openapi.json``.  It names exactly the routes served (a
test compares the two), with Pravega's schema names (StreamProperty,
ScalingConfig, RetentionConfig, ScaleMetadata, ReaderGroupProperty...).
Declarative data, so longer than a module of code would be allowed.
"""

from __future__ import annotations

from typing import Any

OPENAPI_PATH = "/v1/openapi.json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


def _path_params(*names: str) -> list[dict[str, Any]]:
    return [{"in": "path", "name": n, "required": True, "schema": {"type": "string"}}
            for n in names]


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_COMMON = {"401": _error("No credentials, or credentials not accepted"),
           "403": _error("The principal lacks the permission on prn::/")}


def _op(op_id: str, summary: str, responses: dict[str, Any],
        **extra: Any) -> dict[str, Any]:
    return {"operationId": op_id, "summary": summary, "responses": {**responses, **_COMMON},
            **extra}


_INT = {"type": "integer", "format": "int64"}
_STR = {"type": "string"}
_TIME_BASED = {"type": "object", "properties": {"days": _INT, "hours": _INT, "minutes": _INT}}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "properties": {"error": _STR}, "required": ["error"]},
    "ScopeProperty": {"type": "object", "properties": {"scopeName": _STR}},
    "ScopesList": {"type": "object",
                   "properties": {"scopes": {"type": "array", "items": _ref("ScopeProperty")}}},
    "ScalingConfig": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["FIXED_NUM_SEGMENTS", "BY_RATE_IN_KBYTES_PER_SEC",
                                            "BY_RATE_IN_EVENTS_PER_SEC"]},
        "targetRate": {"type": "integer"}, "scaleFactor": {"type": "integer"},
        "minSegments": {"type": "integer"}}},
    "RetentionConfig": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["LIMITED_DAYS", "LIMITED_SIZE_MB"]},
        "value": _INT, "timeBasedRetention": _TIME_BASED, "maxValue": _INT,
        "maxTimeBasedRetention": _TIME_BASED}},
    "TagsList": {"type": "array", "items": {"type": "string", "maxLength": 256}},
    "StreamProperty": {"type": "object", "properties": {
        "scopeName": _STR, "streamName": _STR, "scalingPolicy": _ref("ScalingConfig"),
        "retentionPolicy": _ref("RetentionConfig"), "tags": _ref("TagsList")}},
    "StreamsList": {"type": "object", "properties": {
        "streams": {"type": "array", "items": _ref("StreamProperty")}}},
    "CreateStreamRequest": {"type": "object", "required": ["streamName"], "properties": {
        "streamName": _STR, "scalingPolicy": _ref("ScalingConfig"),
        "retentionPolicy": _ref("RetentionConfig"), "streamTags": _ref("TagsList")}},
    "UpdateStreamRequest": {"type": "object", "properties": {
        "scalingPolicy": _ref("ScalingConfig"), "retentionPolicy": _ref("RetentionConfig"),
        "streamTags": _ref("TagsList")}},
    "StreamState": {"type": "object", "properties": {
        "streamState": {"type": "string", "enum": ["SEALED"]}}},
    "Segment": {"type": "object", "properties": {
        "number": _INT, "startTime": _INT, "keyStart": {"type": "number"},
        "keyEnd": {"type": "number"}}},
    "ScaleMetadata": {"type": "object", "properties": {
        "timestamp": _INT, "segmentList": {"type": "array", "items": _ref("Segment")},
        "splits": _INT, "merges": _INT}},
    "ScalingEventList": {"type": "object", "properties": {
        "scalingEvents": {"type": "array", "items": _ref("ScaleMetadata")}}},
    "ReaderGroupsList": {"type": "object", "properties": {"readerGroups": {
        "type": "array", "items": {"type": "object",
                                   "properties": {"readerGroupName": _STR}}}}},
    "ReaderGroupProperty": {"type": "object", "properties": {
        "scopeName": _STR, "readerGroupName": _STR,
        "streamList": {"type": "array", "items": _STR},
        "onlineReaderIds": {"type": "array", "items": _STR},
        "positions": {"type": "object", "additionalProperties": _INT,
                      "description": "Quire: segment -> read offset of the group"},
        "readers": {"type": "object", "description": "Quire: reader -> segment -> offset",
                    "additionalProperties": {"type": "object", "additionalProperties": _INT}},
        "unassignedSegments": {"type": "object", "additionalProperties": _INT}}},
}

_SCOPE = "/v1/scopes/{scopeName}"
_STREAM = _SCOPE + "/streams/{streamName}"
_GROUP = _SCOPE + "/readergroups/{readerGroupName}"

PATHS: dict[str, Any] = {
    "/v1/scopes": {
        "get": _op("listScopes", "List the scopes",
                   {"200": _json(_ref("ScopesList"), "The scopes")}),
        "post": _op("createScope", "Create a scope",
                    {"201": _json(_ref("ScopeProperty"), "Created"),
                     "400": _error("A bad body or name"), "409": _error("The scope exists")},
                    requestBody=_body(_ref("ScopeProperty")))},
    _SCOPE: {
        "parameters": _path_params("scopeName"),
        "get": _op("getScope", "A scope", {"200": _json(_ref("ScopeProperty"), "The scope"),
                                           "404": _error("No such scope")}),
        "delete": _op("deleteScope", "Delete a scope", {
            "204": {"description": "Deleted"}, "404": _error("No such scope"),
            "412": _error("The scope has streams")})},
    _SCOPE + "/streams": {
        "parameters": _path_params("scopeName"),
        "get": _op("listStreams", "List a scope's streams", {
            "200": _json(_ref("StreamsList"), "The streams"), "404": _error("No such scope")},
            parameters=[{"in": "query", "name": "filter_type", "required": False,
                         "schema": {"type": "string", "enum": ["showInternalStreams", "tag"]}},
                        {"in": "query", "name": "filter_value", "required": False,
                         "schema": _STR}]),
        "post": _op("createStream", "Create a stream", {
            "201": _json(_ref("StreamProperty"), "Created"),
            "400": _error("A bad body, name or configuration"),
            "404": _error("No such scope"), "409": _error("The stream exists")},
            requestBody=_body(_ref("CreateStreamRequest")))},
    _STREAM: {
        "parameters": _path_params("scopeName", "streamName"),
        "get": _op("getStream", "A stream's properties", {
            "200": _json(_ref("StreamProperty"), "The stream"),
            "404": _error("No such scope or stream")}),
        "put": _op("updateStream", "Change a stream's configuration", {
            "200": _json(_ref("StreamProperty"), "Updated"),
            "400": _error("A bad body or configuration"),
            "404": _error("No such scope or stream"), "412": _error("The stream is sealed")},
            requestBody=_body(_ref("UpdateStreamRequest"))),
        "delete": _op("deleteStream", "Delete a sealed stream", {
            "204": {"description": "Deleted"}, "404": _error("No such stream"),
            "412": _error("The stream is not sealed")})},
    _STREAM + "/state": {
        "parameters": _path_params("scopeName", "streamName"),
        "put": _op("updateStreamState", "Seal a stream", {
            "200": _json(_ref("StreamState"), "Sealed"), "400": _error("A bad body"),
            "404": _error("No such scope or stream")},
            requestBody=_body(_ref("StreamState")))},
    _STREAM + "/scaling-events": {
        "parameters": _path_params("scopeName", "streamName"),
        "get": _op("getScalingEvents", "The epochs active between from and to", {
            "200": _json(_ref("ScalingEventList"), "The scaling events"),
            "400": _error("from or to missing or bad"),
            "404": _error("No such scope or stream")},
            parameters=[{"in": "query", "name": n, "required": True, "schema": _INT}
                        for n in ("from", "to")])},
    _SCOPE + "/readergroups": {
        "parameters": _path_params("scopeName"),
        "get": _op("listReaderGroups", "List a scope's reader groups", {
            "200": _json(_ref("ReaderGroupsList"), "The reader groups"),
            "404": _error("No such scope")})},
    _GROUP: {
        "parameters": _path_params("scopeName", "readerGroupName"),
        "get": _op("getReaderGroup", "A reader group, its readers and positions", {
            "200": _json(_ref("ReaderGroupProperty"), "The reader group"),
            "400": _error("A bad reader group name"),
            "404": _error("No such scope or reader group")}),
        "delete": _op("deleteReaderGroup", "Delete a reader group's state", {
            "204": {"description": "Deleted"}, "400": _error("A bad reader group name"),
            "404": _error("No such scope or reader group")})},
    OPENAPI_PATH: {
        "get": _op("getOpenApi", "This document", {"200": {"description": "OpenAPI 3"}})},
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Quire controller REST API", "version": "1",
             "description": "Pravega's controller REST API v1, served by Quire's controller"},
    "paths": PATHS,
    "components": {"schemas": SCHEMAS,
                   "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
    "security": [{}, {"basic": []}],
}
