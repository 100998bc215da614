"""Quire's own questions to a controller, beside Pravega's interface: a
gRPC service ``quire.controller.Admin`` whose requests and answers are
JSON objects (UTF-8), for ``quire stream info``, ``quire txn`` and
``quire readergroup``.

* ``describeStream {"scope", "stream"}`` -> the stream's configuration,
  state, head, epochs (each ``{"epoch", "created_ms", "reason",
  "segments": [{"id", "min_key", "max_key"}]}``: its scaling history), cold
  segments and the number of cuts recorded for retention;
* ``listTransactions {"scope", "stream"}`` -> ``[{"id" (32 hex), "state",
  "epoch", "lease_expiry_ms", "completed_ms", "segments"}]``;
* ``listReaderGroups {"scope"}`` -> ``[{"name", ...its record}]``;
* ``cluster {}`` -> ``{"member", "leader"}``.

Errors are gRPC statuses, as for the Pravega interface.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from quire.controller.core import ControllerCore
from quire.controller.model import txn_epoch
from quire.controller.records import config_json
from quire.controller.service import definite

ADMIN_SERVICE = "quire.controller.Admin"


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _decode(data: bytes) -> Any:
    return json.loads(data or b"{}")


class AdminService:
    """The Admin methods over a :class:`ControllerCore`."""

    def __init__(self, core: ControllerCore) -> None:
        self.core = core

    async def describeStream(self, request: dict[str, Any]) -> dict[str, Any]:
        record = await self.core.stream(request["scope"], request["stream"])
        return {
            "config": config_json(record.config), "state": record.state.value,
            "head": sorted(record.head_cut().items()), "truncated_ms": record.truncated_ms,
            "sealed_bytes": record.sealed_bytes,
            "epochs": [{"epoch": e.epoch, "created_ms": e.created_ms, "reason": e.reason,
                        "segments": [{"id": s.id, "min_key": s.min_key, "max_key": s.max_key}
                                     for s in e.segments]} for e in record.epochs],
            "cold": sorted(record.cold),
            "retention_cuts": len(record.retention_cuts),
            "scaling": record.scale is not None or record.roll is not None,
        }

    async def listTransactions(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        scope, stream = request["scope"], request["stream"]
        await self.core.stream(scope, stream)
        return [{"id": f"{t.txn_id:032x}", "state": t.state.value, "epoch": txn_epoch(t.txn_id),
                 "lease_expiry_ms": t.lease_expiry_ms, "completed_ms": t.completed_ms,
                 "segments": list(t.segments)}
                for t, _v in await self.core.state.txns(scope, stream)]

    async def listReaderGroups(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": name, **doc}
                for name, doc in await self.core.reader_groups(request["scope"])]

    async def cluster(self, _request: dict[str, Any]) -> dict[str, Any]:
        cluster = self.core.cluster
        return {"member": cluster.member, "leader": cluster.is_leader}

    METHODS = ("describeStream", "listTransactions", "listReaderGroups", "cluster")

    def handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for name in self.METHODS:
            call: Callable[[Any], Awaitable[Any]] = getattr(self, name)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                definite(f"admin.{name}", call, self.core.metrics),
                request_deserializer=_decode, response_serializer=_encode)
        return grpc.method_handlers_generic_handler(ADMIN_SERVICE, handlers)
