"""A small asyncio client of the controller: :class:`ControllerClient`.

It speaks Pravega's gRPC ``ControllerService`` (grpc.aio over the stubs
generated in :mod:`quire.controller_api`) to Quire's controller or
Pravega's.  Answers come back as plain values; refusals as the controller
errors of :mod:`quire.errors`:

- a status enum in the reply (SCOPE_NOT_FOUND, STREAM_NOT_SEALED,
  TRANSACTION_NOT_FOUND, ...) as the matching error (ScopeNotFoundError,
  ControllerPreconditionError, TransactionNotFoundError, ...);
- gRPC INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION and ABORTED as
  ControllerInvalidArgumentError, ControllerNotFoundError,
  ControllerPreconditionError and ControllerConcurrentUpdateError;
- PERMISSION_DENIED as PermissionDeniedError (wrong credentials too: Quire's
  controller answers them so), UNAUTHENTICATED as AuthenticationError;
- every other status (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN...)
  as ControllerUnavailableError: the outcome is unknown, never a "no".

Several controllers serve one cluster: give them all, comma-separated
(``tcp://h1:9090,h2:9090``).  Calls go to one until it answers UNAVAILABLE
(it is down, or its connection broke), then to the next, round after
round with a short backoff, within the call's timeout.

Security: a ``tls://host:port[,host:port...]`` URI speaks TLS, trusting
``tls_ca`` (PEM; none: the system's CAs) and checking that the certificate
covers each host; ``credentials`` are sent as Basic ``authorization``
metadata on every call.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from quire.controller_api import Controller_pb2 as pb
from quire.controller_api.Controller_pb2_grpc import ControllerServiceStub
from quire.errors import (
    AuthenticationError,
    ConfigError,
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ControllerPreconditionError,
    ControllerUnavailableError,
    PermissionDeniedError,
    QuireError,
    ScopeNotFoundError,
    StreamNotFoundError,
    TransactionNotFoundError,
)
from quire.security import Credentials, basic_authorization, grpc_channel_credentials
from quire.streams.model import Segment

T = TypeVar("T")
DEFAULT_CONTROLLER_URI = "tcp://127.0.0.1:9090"
CONTROLLER_ENV = "QUIRE_CONTROLLER"
"""The environment variable naming the controller when none is given."""
_U64 = (1 << 64) - 1


def controller_uri(given: str | None) -> str:
    """The controller to use: ``given``, else ``$QUIRE_CONTROLLER``, else
    :data:`DEFAULT_CONTROLLER_URI` (as the CLI and Spark's options do)."""
    return given or os.environ.get(CONTROLLER_ENV) or DEFAULT_CONTROLLER_URI

_STATUS_ERRORS: dict[grpc.StatusCode, type[QuireError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: ControllerInvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: ControllerNotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: ControllerPreconditionError,
    grpc.StatusCode.ABORTED: ControllerConcurrentUpdateError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
}
_NAMED_ERRORS: dict[str, type[QuireError]] = {
    kind.__name__: kind for kind in (ScopeNotFoundError, StreamNotFoundError,
                                     TransactionNotFoundError)}
"""The errors a status's details name first (Quire's controller says
``<error class>: <message>``), raised as themselves."""
TLS_SCHEMES = ("tls://", "ssl://", "tcps://", "pravegas://")
"""URI schemes of a controller spoken to over TLS (the Pravega client's)."""


def controller_uses_tls(uri: str) -> bool:
    return uri.startswith(TLS_SCHEMES)


def controller_targets(uri: str) -> list[str]:
    """``tcp://host:port[,host:port...]`` or ``tls://...`` (the scheme
    optional, on each or the first) as gRPC targets ``host:port``."""
    targets = []
    for part in uri.split(","):
        rest = part.strip()
        for scheme in ("tcp://", *TLS_SCHEMES):
            rest = rest.removeprefix(scheme)
        host, sep, port = rest.rpartition(":")
        if "://" in rest or not sep or not host or not port.isdigit():
            raise ConfigError("a controller URI is tcp://host:port[,host:port...] or "
                              f"tls://host:port[,...], got {uri!r}")
        targets.append(rest)
    return targets


def controller_target(uri: str) -> str:
    """The first gRPC target of ``uri`` (all of them checked)."""
    return controller_targets(uri)[0]


ADMIN_SERVICE = "quire.controller.Admin"
"""Quire's JSON-over-gRPC questions (``quire.controller.admin``)."""


class TxnState(enum.Enum):
    UNKNOWN = pb.TxnState.UNKNOWN
    OPEN = pb.TxnState.OPEN
    COMMITTING = pb.TxnState.COMMITTING
    COMMITTED = pb.TxnState.COMMITTED
    ABORTING = pb.TxnState.ABORTING
    ABORTED = pb.TxnState.ABORTED


@dataclass(frozen=True)
class StreamConfiguration:
    """A stream's configuration as the controller keeps it."""

    scope: str
    stream: str
    segments: int
    """The scaling policy's (minimum) segment count."""
    retention: str = "none"
    """``none``, ``time`` or ``size``."""
    retention_param: int = 0
    """The least to keep (ms or bytes)."""
    tags: tuple[str, ...] = ()
    scaling: str = "fixed"
    """``fixed``, ``events`` (events/s per segment) or ``kbytes`` (KiB/s)."""
    target_rate: int = 0
    scale_factor: int = 0
    retention_max: int = 0
    """The most to keep however far behind subscribers are (0: no maximum)."""

    def message(self) -> pb.StreamConfig:
        kinds = {v: k for k, v in _RETENTION.items()}
        if self.retention not in kinds:
            raise ControllerInvalidArgumentError(f"retention is none, time or size, not "
                                                 f"{self.retention!r}")
        if self.scaling not in _SCALING:
            raise ControllerInvalidArgumentError(f"scaling is fixed, events or kbytes, not "
                                                 f"{self.scaling!r}")
        return pb.StreamConfig(
            streamInfo=pb.StreamInfo(scope=self.scope, stream=self.stream),
            scalingPolicy=pb.ScalingPolicy(scaleType=_SCALING[self.scaling],  # type: ignore[arg-type]
                                           targetRate=self.target_rate,
                                           scaleFactor=self.scale_factor,
                                           minNumSegments=self.segments),
            retentionPolicy=pb.RetentionPolicy(retentionType=kinds[self.retention],
                                               retentionParam=self.retention_param,
                                               retentionMax=self.retention_max or _NO_MAXIMUM),
            tags=pb.Tags(tag=list(self.tags)))


_SCALING = {"fixed": 0, "kbytes": 1, "events": 2}
_NO_MAXIMUM = (1 << 63) - 1


@dataclass(frozen=True)
class Transaction:
    """An open transaction: its 128-bit id and the segments it writes to."""

    id: int
    segments: tuple[Segment, ...]


_RETENTION = {pb.RetentionPolicy.UNKNOWN: "none", pb.RetentionPolicy.TIME: "time",
              pb.RetentionPolicy.SIZE: "size"}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def txn_id_message(txn_id: int) -> pb.TxnId:
    return pb.TxnId(highBits=_signed(txn_id >> 64), lowBits=_signed(txn_id & _U64))


def txn_id_of(message: pb.TxnId) -> int:
    return ((message.highBits & _U64) << 64) | (message.lowBits & _U64)


class ControllerClient:
    """The controller(s) at ``uri`` (``tcp://host:port[,host:port...]``,
    ``tls://...``); :meth:`close` when done (failover and security in the
    module docstring).

    Every call waits at most ``timeout_ms`` for its answer."""

    def __init__(self, uri: str = DEFAULT_CONTROLLER_URI, timeout_ms: int = 30_000, *,
                 tls_ca: str | Path | None = None,
                 credentials: Credentials | None = None,
                 tls_cert: str | Path | None = None,
                 tls_key: str | Path | None = None) -> None:
        self.uri = uri
        self.timeout_ms = timeout_ms
        self._targets = controller_targets(uri)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = 0
        self._trust: grpc.ChannelCredentials | None = None
        if controller_uses_tls(uri):
            self._trust = (grpc_channel_credentials(tls_ca, tls_cert, tls_key) if tls_ca
                           else grpc.ssl_channel_credentials())
        self._metadata: tuple[tuple[str, str], ...] | None = None
        if credentials is not None:
            self._metadata = (("authorization", basic_authorization(
                credentials.username, credentials.password)),)

    def _channel(self) -> grpc.aio.Channel:
        target = self._targets[self._current]
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = (
                grpc.aio.secure_channel(target, self._trust) if self._trust is not None
                else grpc.aio.insecure_channel(target))
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def call(self, method: str, request: Any) -> Any:
        """``ControllerService`` method ``method`` on ``request`` (a message);
        its answer (errors as the module docstring says)."""
        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> Any:
            stub: Any = ControllerServiceStub(channel)  # type: ignore[no-untyped-call]
            return await getattr(stub, method)(request, timeout=timeout_s,
                                                metadata=self._metadata)
        return await self._failing_over(method, attempt)

    async def admin(self, method: str, request: dict[str, Any]) -> Any:
        """Quire's ``Admin`` question ``method`` (see ``quire.controller.admin``)."""
        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> Any:
            ask = channel.unary_unary(f"/{ADMIN_SERVICE}/{method}",
                                      request_serializer=lambda r: json.dumps(r).encode(),
                                      response_deserializer=json.loads)
            return await ask(request, timeout=timeout_s, metadata=self._metadata)
        return await self._failing_over(method, attempt)

    async def _failing_over(self, method: str,
                            call: Callable[[grpc.aio.Channel, float], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_ms / 1000
        tried = 0
        while True:
            try:
                return await call(self._channel(), max(0.001, deadline - loop.time()))
            except grpc.aio.AioRpcError as e:
                tried += 1
                if e.code() is grpc.StatusCode.UNAVAILABLE and loop.time() < deadline and \
                        tried < 3 * len(self._targets):
                    self._current = (self._current + 1) % len(self._targets)
                    if tried % len(self._targets) == 0:
                        await asyncio.sleep(min(0.1 * tried, 1.0))  # before the next round
                    continue
                kind = _STATUS_ERRORS.get(e.code(), ControllerUnavailableError)
                named = _NAMED_ERRORS.get((e.details() or "").split(":", 1)[0])
                if named is not None and issubclass(named, kind):
                    kind = named
                raise kind(f"controller {self._targets[self._current]}: {method}: "
                           f"{e.code().name}: {e.details()}") from None

    @staticmethod
    def _info(scope: str, stream: str) -> pb.StreamInfo:
        return pb.StreamInfo(scope=scope, stream=stream)

    def _segments(self, ranges: Any) -> list[Segment]:
        found = [Segment(r.segmentId.streamInfo.scope, r.segmentId.streamInfo.stream,
                         r.segmentId.segmentId, r.minKey, r.maxKey) for r in ranges]
        return sorted(found, key=lambda s: (s.min_key, s.id))

    # --- scopes --------------------------------------------------------------------

    async def create_scope(self, scope: str) -> bool:
        """Create ``scope``; False if it exists already."""
        answer = await self.call("createScope", pb.ScopeInfo(scope=scope))
        if answer.status == pb.CreateScopeStatus.INVALID_SCOPE_NAME:
            raise ControllerInvalidArgumentError(f"invalid scope name {scope!r}")
        if answer.status == pb.CreateScopeStatus.FAILURE:
            raise ControllerUnavailableError(f"controller failed to create scope {scope!r}")
        return bool(answer.status == pb.CreateScopeStatus.SUCCESS)

    async def delete_scope(self, scope: str) -> None:
        """Delete an empty scope (ScopeNotFoundError, or
        ControllerPreconditionError while it has streams)."""
        answer = await self.call("deleteScope", pb.ScopeInfo(scope=scope))
        status = answer.status
        if status == pb.DeleteScopeStatus.SCOPE_NOT_FOUND:
            raise ScopeNotFoundError(f"no scope {scope!r}")
        if status == pb.DeleteScopeStatus.SCOPE_NOT_EMPTY:
            raise ControllerPreconditionError(f"scope {scope!r} has streams")
        if status != pb.DeleteScopeStatus.SUCCESS:
            raise ControllerUnavailableError(f"controller failed to delete scope {scope!r}")

    async def scope_exists(self, scope: str) -> bool:
        return bool((await self.call("checkScopeExists", pb.ScopeInfo(scope=scope))).exists)

    async def _pages(self, fetch: Callable[[str], Awaitable[tuple[list[T], str]]]
                     ) -> AsyncIterator[T]:
        token = ""
        while True:
            items, token = await fetch(token)
            if not items:
                return
            for item in items:
                yield item

    async def list_scopes(self) -> list[str]:
        async def page(token: str) -> tuple[list[str], str]:
            answer = await self.call("listScopes", pb.ScopesRequest(
                continuationToken=pb.ContinuationToken(token=token)))
            return list(answer.scopes), answer.continuationToken.token
        return [scope async for scope in self._pages(page)]

    # --- streams -------------------------------------------------------------------

    async def list_streams(self, scope: str, tag: str | None = None) -> list[str]:
        """The scope's streams (those tagged ``tag`` only, if given)."""
        async def page(token: str) -> tuple[list[str], str]:
            if tag is None:
                answer = await self.call("listStreamsInScope", pb.StreamsInScopeRequest(
                    scope=pb.ScopeInfo(scope=scope),
                    continuationToken=pb.ContinuationToken(token=token)))
            else:
                answer = await self.call("listStreamsInScopeForTag",
                                          pb.StreamsInScopeWithTagRequest(
                                              scope=pb.ScopeInfo(scope=scope), tag=tag,
                                              continuationToken=pb.ContinuationToken(
                                                  token=token)))
            if answer.status == pb.StreamsInScopeResponse.SCOPE_NOT_FOUND:
                raise ScopeNotFoundError(f"no scope {scope!r}")
            return [s.stream for s in answer.streams], answer.continuationToken.token
        return [stream async for stream in self._pages(page)]

    async def create_stream(self, scope: str, stream: str, segments: int,
                            retention: str = "none", retention_param: int = 0,
                            tags: tuple[str, ...] = (), **policy: Any) -> bool:
        """Create a stream of ``segments`` segments; ``retention`` is none,
        time (ms) or size (bytes) with its parameter; ``policy``: the other
        fields of :class:`StreamConfiguration` (``scaling``, ``target_rate``,
        ``scale_factor``, ``retention_max``).  False if it exists already."""
        config = StreamConfiguration(scope, stream, segments, retention, retention_param, tags,
                                     **policy)
        answer = await self.call("createStream", config.message())
        status = answer.status
        if status == pb.CreateStreamStatus.SCOPE_NOT_FOUND:
            raise ScopeNotFoundError(f"no scope {scope!r}")
        if status == pb.CreateStreamStatus.INVALID_STREAM_NAME:
            raise ControllerInvalidArgumentError(f"invalid stream name {stream!r}")
        if status == pb.CreateStreamStatus.FAILURE:
            raise ControllerUnavailableError(f"controller failed to create {scope}/{stream}")
        return bool(status == pb.CreateStreamStatus.SUCCESS)

    async def update_stream(self, config: StreamConfiguration) -> None:
        """Replace a stream's configuration (a changed fixed count scales it)."""
        self._updated(await self.call("updateStream", config.message()), config.scope,
                      config.stream)

    async def stream_exists(self, scope: str, stream: str) -> bool:
        return bool((await self.call("checkStreamExists", self._info(scope, stream))).exists)

    async def stream_config(self, scope: str, stream: str) -> StreamConfiguration:
        c = await self.call("getStreamConfiguration", self._info(scope, stream))
        policy = c.scalingPolicy
        scaling = {v: k for k, v in _SCALING.items()}.get(policy.scaleType, "fixed")
        maximum = c.retentionPolicy.retentionMax
        return StreamConfiguration(
            scope, stream, policy.minNumSegments,
            _RETENTION.get(c.retentionPolicy.retentionType, "none"),
            c.retentionPolicy.retentionParam, tuple(c.tags.tag), scaling, policy.targetRate,
            policy.scaleFactor, 0 if maximum == _NO_MAXIMUM else maximum)

    def _updated(self, answer: Any, scope: str, stream: str) -> None:
        status = answer.status
        if status == pb.UpdateStreamStatus.SCOPE_NOT_FOUND:
            raise ScopeNotFoundError(f"no scope {scope!r}")
        if status == pb.UpdateStreamStatus.STREAM_NOT_FOUND:
            raise StreamNotFoundError(f"no stream {scope}/{stream}")
        if status != pb.UpdateStreamStatus.SUCCESS:
            raise ControllerUnavailableError(f"controller failed to update {scope}/{stream}")

    async def seal_stream(self, scope: str, stream: str) -> None:
        self._updated(await self.call("sealStream", self._info(scope, stream)), scope, stream)

    async def truncate_stream(self, scope: str, stream: str, cut: dict[int, int]) -> None:
        """Drop everything before ``cut`` (segment id -> offset)."""
        self._updated(await self.call("truncateStream", pb.StreamCut(
            streamInfo=self._info(scope, stream), cut=cut)), scope, stream)

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Delete a sealed stream (StreamNotFoundError; ControllerPreconditionError
        unless sealed)."""
        status = (await self.call("deleteStream", self._info(scope, stream))).status
        if status == pb.DeleteStreamStatus.STREAM_NOT_FOUND:
            raise StreamNotFoundError(f"no stream {scope}/{stream}")
        if status == pb.DeleteStreamStatus.STREAM_NOT_SEALED:
            raise ControllerPreconditionError(f"stream {scope}/{stream} is not sealed "
                                              "(seal it first)")
        if status != pb.DeleteStreamStatus.SUCCESS:
            raise ControllerUnavailableError(f"controller failed to delete {scope}/{stream}")

    # --- segments ------------------------------------------------------------------

    async def current_segments(self, scope: str, stream: str) -> list[Segment]:
        """The current epoch's segments with their key ranges, in key order
        (of a sealed stream: its last ones, sealed)."""
        answer = await self.call("getCurrentSegments", self._info(scope, stream))
        return self._segments(answer.segmentRanges)

    async def epoch_segments(self, scope: str, stream: str, epoch: int) -> list[Segment]:
        answer = await self.call("getEpochSegments", pb.GetEpochSegmentsRequest(
            streamInfo=self._info(scope, stream), epoch=epoch))
        return self._segments(answer.segmentRanges)

    async def head_cut(self, scope: str, stream: str) -> dict[int, int]:
        """Where the stream starts: segment id -> offset (after truncation)."""
        answer = await self.call("getSegments", pb.GetSegmentsRequest(
            streamInfo=self._info(scope, stream), timestamp=0))
        return {s.segmentId.segmentId: s.offset for s in answer.segments}

    async def successors(self, scope: str, stream: str, segment_id: int
                         ) -> list[tuple[Segment, list[int]]]:
        """The segments following a sealed one, each with all its
        predecessors' ids; empty when the stream is sealed."""
        answer = await self.call("getSegmentsImmediatelyFollowing", pb.SegmentId(
            streamInfo=self._info(scope, stream), segmentId=segment_id))
        return [(self._segments([e.segment])[0], list(e.value)) for e in answer.segments]

    async def delegation_token(self, scope: str, stream: str) -> str:
        """A token for the segment stores' requests on ``scope/stream``
        ("" from a controller without auth)."""
        answer = await self.call("getDelegationToken", self._info(scope, stream))
        return str(answer.delegationToken)

    async def segment_uri(self, scope: str, stream: str, segment_id: int) -> str:
        """The ``host:port`` of the segment store serving the segment."""
        answer = await self.call("getURI", pb.SegmentId(streamInfo=self._info(scope, stream),
                                                         segmentId=segment_id))
        return f"{answer.endpoint}:{answer.port}"

    async def scale(self, scope: str, stream: str, sealed: list[int],
                    new_ranges: list[tuple[float, float]]) -> int:
        """Seal ``sealed`` and create segments over ``new_ranges`` (which must
        cover exactly the sealed ones' keys); the epoch the scale started
        from (see :meth:`scale_done`).  ControllerPreconditionError if refused."""
        answer = await self.call("scale", pb.ScaleRequest(
            streamInfo=self._info(scope, stream), sealedSegments=sealed,
            newKeyRanges=[pb.ScaleRequest.KeyRangeEntry(start=a, end=b) for a, b in new_ranges]))
        if answer.status == pb.ScaleResponse.PRECONDITION_FAILED:
            raise ControllerPreconditionError(
                f"scale of {scope}/{stream} refused (segments not current, or ranges that do "
                "not cover them)")
        if answer.status != pb.ScaleResponse.STARTED:
            raise ControllerUnavailableError(f"controller failed to scale {scope}/{stream}")
        return int(answer.epoch)

    async def scale_done(self, scope: str, stream: str, epoch: int) -> bool:
        answer = await self.call("checkScale", pb.ScaleStatusRequest(
            streamInfo=self._info(scope, stream), epoch=epoch))
        if answer.status == pb.ScaleStatusResponse.INVALID_INPUT:
            raise ControllerInvalidArgumentError(f"{scope}/{stream} has no scale from epoch "
                                                 f"{epoch}")
        if answer.status == pb.ScaleStatusResponse.INTERNAL_ERROR:
            raise ControllerUnavailableError(f"scale of {scope}/{stream} failed")
        return bool(answer.status == pb.ScaleStatusResponse.SUCCESS)

    # --- transactions --------------------------------------------------------------

    async def create_transaction(self, scope: str, stream: str, lease_ms: int = 30_000
                                 ) -> Transaction:
        answer = await self.call("createTransaction", pb.CreateTxnRequest(
            streamInfo=self._info(scope, stream), lease=lease_ms))
        return Transaction(txn_id_of(answer.txnId),
                           tuple(self._segments(answer.activeSegments)))

    def _txn_request(self, scope: str, stream: str, txn_id: int) -> pb.TxnRequest:
        return pb.TxnRequest(streamInfo=self._info(scope, stream), txnId=txn_id_message(txn_id))

    async def _end_transaction(self, method: str, scope: str, stream: str, txn_id: int) -> None:
        status = (await self.call(method, self._txn_request(scope, stream, txn_id))).status
        if status == pb.TxnStatus.TRANSACTION_NOT_FOUND:
            raise TransactionNotFoundError(f"no transaction {txn_id:032x} on {scope}/{stream}")
        if status == pb.TxnStatus.STREAM_NOT_FOUND:
            raise StreamNotFoundError(f"no stream {scope}/{stream}")
        if status != pb.TxnStatus.SUCCESS:
            raise ControllerUnavailableError(f"{method} of {txn_id:032x} failed")

    async def commit_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        await self._end_transaction("commitTransaction", scope, stream, txn_id)

    async def abort_transaction(self, scope: str, stream: str, txn_id: int) -> None:
        await self._end_transaction("abortTransaction", scope, stream, txn_id)

    async def transaction_state(self, scope: str, stream: str, txn_id: int) -> TxnState:
        answer = await self.call("checkTransactionState",
                                  self._txn_request(scope, stream, txn_id))
        return TxnState(answer.state)

    async def ping_transaction(self, scope: str, stream: str, txn_id: int,
                               lease_ms: int) -> bool:
        """Extend an open transaction's lease; False if it is no longer open."""
        answer = await self.call("pingTransaction", pb.PingTxnRequest(
            streamInfo=self._info(scope, stream), txnId=txn_id_message(txn_id), lease=lease_ms))
        if answer.status == pb.PingTxnStatus.LEASE_TOO_LARGE:
            raise ControllerInvalidArgumentError(f"lease of {lease_ms} ms is too long")
        return bool(answer.status == pb.PingTxnStatus.OK)
