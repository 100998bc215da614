"""A secured controller and segment server in one child process, for tests with
the real Pravega client (whose blocking calls hold the GIL) and with raw wire
clients: TLS on both ports, users in the metadata store's user database,
delegation tokens checked on the wire.

``python -m tests.support.secure_stack SPEC``: SPEC is a JSON file::

    {"cert": PATH, "key": PATH, "ca": PATH, "secret": PATH,
     "users": [{"name": ..., "password": ..., "acl": ...}, ...],
     "wire": {SegmentServerConfig keys...}, "rpc": {ControllerRpcConfig keys...}}

It serves a SegmentStore on the in-memory tier-1 twin (2 containers) with a
:class:`SegmentServer` and a :class:`Controller`, both on 127.0.0.1, the
controller's getURI answering ``localhost`` (what the certificate covers);
prints one JSON line ``{"controller": port, "segments": port, "pid": pid}``,
then serves until stdin closes.  A line ``metrics`` on stdin is answered with
one JSON line of the refusal counters (wire replies, connection limits,
controller calls).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import uvloop
from prometheus_client import CollectorRegistry

from quire.auth import ServerSecurity, UserAuthenticator, UserDatabase
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.controller.interceptor import ControllerRpcConfig
from quire.metadata import open_store
from quire.security import Acl, ServerTls, TokenSigner
from quire.segmentserver import (
    SegmentServer,
    SegmentServerConfig,
    SegmentServerMetrics,
    WireAuth,
)
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.testing.memory_data_log import MemoryDataLogs


def counters(registry: CollectorRegistry) -> dict[str, float]:
    """Every ``*_total`` sample with labels, as ``name{label=value}`` -> value."""
    out: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


async def serve(spec: dict[str, Any]) -> None:
    metadata = await open_store("memory://secure-stack")
    users = UserDatabase(metadata)
    for user in spec.get("users", []):
        await users.add(user["name"], user["password"], Acl.parse(user["acl"]))
    signer = TokenSigner.from_file(spec["secret"])
    logs = MemoryDataLogs()
    store = await SegmentStore.open(None, range(2), metadata_store=metadata,
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=2))
    wire_metrics = SegmentServerMetrics(CollectorRegistry())
    wire_tls = ServerTls(spec["cert"], spec["key"])
    server = SegmentServer(store, SegmentServerConfig(tail_read_wait_ms=500,
                                                      **spec.get("wire", {})),
                           wire_metrics, tls=wire_tls,
                           auth=WireAuth(signer))
    await server.start("127.0.0.1", 0)
    security = ServerSecurity(ServerTls(spec["cert"], spec["key"]),
                              UserAuthenticator(users, signer))
    controller = Controller(store, ControllerConfig(),
                            fixed_locator(("localhost", server.port)), security=security,
                            tokens=signer, rpc=ControllerRpcConfig(**spec.get("rpc", {})))
    port = await controller.start("127.0.0.1", 0)
    print(json.dumps({"controller": port, "segments": server.port, "pid": os.getpid()}),
          flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):  # until stdin closes
            if line.strip() == "metrics":
                print(json.dumps({**counters(wire_metrics.registry),
                                  **counters(controller.core.metrics.registry)}), flush=True)
    finally:
        await controller.close()
        await server.close()
        await store.close()
        await metadata.close()


if __name__ == "__main__":
    uvloop.run(serve(json.loads(Path(sys.argv[1]).read_text())))
