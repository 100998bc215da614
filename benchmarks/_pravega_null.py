"""A Pravega endpoint with no storage, for measuring the real client's own
ceiling: a stub controller (grpc.aio, the few calls a writer needs) and a
wire server (the ``quire.pravega_wire`` codec) that answers every
``AppendBlockEnd`` with ``DataAppended`` as soon as it is decoded.

Run as its own process (the client's blocking calls hold the GIL):

    python benchmarks/_pravega_null.py

prints one JSON line ``{"controller": "tcp://127.0.0.1:P", "wire_port": W}``
on stdout, then serves until stdin closes.  Each line ``stats`` on stdin
is answered with one JSON line: blocks and events taken since the last
``stats`` and this process's CPU seconds over the same span.

Only the writer's path is served: ``createScope``, ``createStream``,
``getCurrentSegments`` (N segments over key ranges covering (0, 1]) and
``getURI``; any other gRPC call answers UNIMPLEMENTED, and any wire
request other than Hello, SetupAppend and AppendBlockEnd closes the
connection.  Nothing is stored: this is a measuring instrument, not a
server."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import uvloop

from quire.controller_api import Controller_pb2 as pb
from quire.controller_api import Controller_pb2_grpc as pb_grpc
from quire.pravega_wire import (
    NO_EVENT_NUMBER,
    OLDEST_COMPATIBLE_VERSION,
    REQUEST_TYPES,
    WIRE_VERSION,
    AppendBlockEnd,
    AppendSetup,
    DataAppended,
    Decoder,
    Hello,
    SetupAppend,
)


class Counters:
    def __init__(self) -> None:
        self.blocks = 0
        self.events = 0
        self.cpu_s = time.process_time()

    def take(self) -> dict[str, Any]:
        now = time.process_time()
        taken = {"blocks": self.blocks, "events": self.events, "cpu_s": now - self.cpu_s}
        self.blocks = self.events = 0
        self.cpu_s = now
        return taken


class NullWire(asyncio.Protocol):
    """Hello, SetupAppend (an unknown writer) and AppendBlockEnd (acknowledged
    at once, the segment's offset counted per writer) on one connection."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self._decoder = Decoder(REQUEST_TYPES)
        self._transport: asyncio.Transport | None = None
        self._offsets: dict[int, int] = {}
        self._last: dict[int, int] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION).encode())

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._decoder.feed(data)
        out = []
        for c in self._decoder:
            if type(c) is AppendBlockEnd:
                offset = self._offsets.get(c.writer_id, 0) + len(c.data)
                self._offsets[c.writer_id] = offset
                previous = self._last.get(c.writer_id, NO_EVENT_NUMBER)
                self._last[c.writer_id] = c.last_event_number
                self._counters.blocks += 1
                self._counters.events += c.num_event
                out.append(DataAppended(c.writer_id, c.last_event_number, previous,
                                        c.request_id, offset).encode())
            elif type(c) is SetupAppend:
                out.append(AppendSetup(c.request_id, c.segment, c.writer_id,
                                       self._last.get(c.writer_id, NO_EVENT_NUMBER)).encode())
            elif type(c) is not Hello:
                self._transport.close()
                return
        if out:
            self._transport.write(b"".join(out))


class StubController(pb_grpc.ControllerServiceServicer):
    """The controller calls a writer makes; every segment lives at the null
    wire server."""

    def __init__(self, wire_port: int) -> None:
        self._wire_port = wire_port
        self._segments: dict[tuple[str, str], int] = {}

    async def createScope(self, request: pb.ScopeInfo, context: Any) -> pb.CreateScopeStatus:
        return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SUCCESS)

    async def createStream(self, request: pb.StreamConfig, context: Any
                           ) -> pb.CreateStreamStatus:
        info = request.streamInfo
        self._segments[info.scope, info.stream] = max(
            1, request.scalingPolicy.minNumSegments)
        return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SUCCESS)

    async def getCurrentSegments(self, request: pb.StreamInfo, context: Any
                                 ) -> pb.SegmentRanges:
        n = self._segments.get((request.scope, request.stream))
        if n is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such stream")
        assert n is not None
        info = pb.StreamInfo(scope=request.scope, stream=request.stream)
        return pb.SegmentRanges(segmentRanges=[
            pb.SegmentRange(segmentId=pb.SegmentId(streamInfo=info, segmentId=i),
                            minKey=i / n, maxKey=(i + 1) / n) for i in range(n)])

    async def getURI(self, request: pb.SegmentId, context: Any) -> pb.NodeUri:
        return pb.NodeUri(endpoint="127.0.0.1", port=self._wire_port)


async def serve() -> None:
    loop = asyncio.get_running_loop()
    counters = Counters()
    wire = await loop.create_server(lambda: NullWire(counters), "127.0.0.1", 0)
    wire_port = wire.sockets[0].getsockname()[1]
    server = grpc.aio.server()
    pb_grpc.add_ControllerServiceServicer_to_server(StubController(wire_port), server)
    controller_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"controller": f"tcp://127.0.0.1:{controller_port}",
                      "wire_port": wire_port}), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"stats":
            print(json.dumps(counters.take()), flush=True)
    wire.close()
    await server.stop(0)


if __name__ == "__main__":
    uvloop.run(serve())
