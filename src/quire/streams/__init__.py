"""Quire's own asyncio client of streams: the controller and the segment
stores, over Pravega's gRPC controller interface and WireCommands.

::

    from quire.streams import (ControllerClient, RemoteSegmentStore, StreamReader,
                               StreamWriter, controller_resolver)
    controller = ControllerClient("tcp://127.0.0.1:9090")
    segments = RemoteSegmentStore(controller_resolver(controller))
    await controller.create_scope("sc")
    await controller.create_stream("sc", "st", segments=3)
    writer = StreamWriter(controller, segments, "sc", "st")
    await writer.start()
    await writer.write_event(b"hello", routing_key="k1")
    async for event in StreamReader(controller, segments, "sc", "st").events():
        ...

Modules, each importing only those listed before it:

* :mod:`~quire.streams.model` -- segment ids and names, key ranges,
  routing-key hashing, event framing (sans-IO);
* :mod:`~quire.streams.connection` -- one connection to a segment store
  (:class:`SegmentConnection`, an asyncio.Protocol over the codec);
* :mod:`~quire.streams.tokens` -- delegation tokens for segment-store
  requests (the :class:`TokenSource` seam);
* :mod:`~quire.streams.segments` -- :class:`RemoteSegmentStore`: segment
  and table operations routed to their owners, with retries;
* :mod:`~quire.streams.controller` -- :class:`ControllerClient` (grpc.aio);
* :mod:`~quire.streams.resolvers` -- owners from the controller or the
  metadata store;
* :mod:`~quire.streams.credentials` -- :class:`StreamAccess` (TLS and a
  user's credentials) and :class:`ControllerTokens`;
* :mod:`~quire.streams.writer` -- :class:`StreamWriter`;
  :mod:`~quire.streams.reader` -- :class:`StreamReader`;
* :mod:`~quire.streams.transactions` -- :class:`StreamTransaction`.

This package never imports the controller or the segment server (same
layer): it speaks to them over the wire only.
"""

from quire.streams.connection import SegmentConnection
from quire.streams.controller import (
    DEFAULT_CONTROLLER_URI,
    TLS_SCHEMES,
    ControllerClient,
    StreamConfiguration,
    Transaction,
    TxnState,
    controller_uri,
    controller_uses_tls,
)
from quire.streams.credentials import ControllerTokens, StreamAccess
from quire.streams.model import Segment, frame_event, key_hash, segment_name
from quire.streams.reader import Event, StreamReader, tail_cut
from quire.streams.resolvers import controller_resolver, metadata_resolver
from quire.streams.segments import RemoteSegmentStore, Resolver, SegmentClientConfig
from quire.streams.tokens import NO_TOKENS, InternalTokens, NoTokens, TokenSource
from quire.streams.transactions import StreamTransaction
from quire.streams.writer import StreamWriter, WriterConfig

__all__ = [
    "DEFAULT_CONTROLLER_URI",
    "NO_TOKENS",
    "TLS_SCHEMES",
    "ControllerClient",
    "ControllerTokens",
    "Event",
    "InternalTokens",
    "NoTokens",
    "RemoteSegmentStore",
    "Resolver",
    "Segment",
    "SegmentClientConfig",
    "SegmentConnection",
    "StreamAccess",
    "StreamConfiguration",
    "StreamReader",
    "StreamTransaction",
    "StreamWriter",
    "TokenSource",
    "Transaction",
    "TxnState",
    "WriterConfig",
    "controller_resolver",
    "controller_uri",
    "controller_uses_tls",
    "frame_event",
    "key_hash",
    "metadata_resolver",
    "segment_name",
    "tail_cut",
]
