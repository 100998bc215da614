"""The segment store's wire server: Pravega's WireCommands over TCP.

:class:`SegmentServer` serves one process's
:class:`~quire.segmentstore.SegmentStore` to Pravega clients (the official
``pravega`` client, or Quire's own) with the codec of
:mod:`quire.pravega_wire`.  Each connection is one
:class:`~quire.segmentserver.connection.WireConnection` (an
``asyncio.Protocol``: framing, the handshake, replies in order, flow
control), which hands appends, segment requests and table requests to
:mod:`~quire.segmentserver.appends`,
:mod:`~quire.segmentserver.segment_requests` and
:mod:`~quire.segmentserver.table_requests`; store errors become replies in
:mod:`~quire.segmentserver.replies`:

- The server says ``Hello`` (wire version 15, oldest compatible 5) as soon
  as a connection opens; the client's first command must be its ``Hello``,
  with a version range that meets ours, or the connection is closed.
- Every request is handed to the store **when it arrives**, in arrival
  order (the store's mutations are plain methods ordered at call time), and
  the replies leave in the same order, however the store's futures complete:
  appends pipeline, a read waiting at the tail holds back only what came
  after it on its connection (the client keeps one request in flight per
  connection, appends aside).
- Appends: ``SetupAppend`` answers the writer's last event number once
  every append accepted before it is durable, and drops the connection the
  same writer was set up on before, so that a block sent there and resent
  here cannot land twice; an ``AppendBlockEnd`` larger than one store append
  lands as several, split at event boundaries, each with its last event's
  number.
- Errors become the replies the client understands (NoSuchSegment,
  SegmentIsSealed, SegmentIsTruncated, SegmentAlreadyExists,
  TableKeyBadVersion, TableKeyDoesNotExist, TableSegmentNotEmpty,
  ConditionalCheckFailed, and WrongHost for a container this store does not
  host, has not finished opening, or has lost: never NoSuchSegment for
  those).  Anything else closes that connection, as Pravega's server does;
  so do malformed, oversized (refused from their header) and unknown
  frames.  Known commands this server does not implement are answered
  OperationUnsupported.
- Flow control: a connection with more than
  :attr:`SegmentServerConfig.max_outstanding_requests` unanswered requests,
  or more than :attr:`SegmentServerConfig.max_outstanding_bytes` held by
  them, stops being read until half are answered; so does one whose
  replies the client does not take (``max_buffered_reply_bytes``).
- Security: TLS, delegation tokens (:mod:`~quire.segmentserver.auth`) and
  connection limits, all optional (see :mod:`~quire.segmentserver.server`).
"""

from quire.segmentserver.auth import WireAuth
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.connection import WireConnection
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.server import SegmentServer

__all__ = ["SegmentServer", "SegmentServerConfig", "SegmentServerMetrics", "WireAuth",
           "WireConnection"]
