"""The gRPC face of the controller: ``ControllerService`` messages to
:class:`~quire.controller.core.ControllerCore` calls and back.

Every answer is definite.  Where the interface has a status enum for an
outcome (SCOPE_EXISTS, STREAM_NOT_SEALED, TRANSACTION_NOT_FOUND, ...) the
answer carries it, as Pravega's controller does; any other error becomes
one gRPC status by its family in :mod:`quire.errors` (:func:`grpc_status`),
never UNKNOWN (which the Pravega client retries for about a minute).
Methods not served are not registered, so gRPC answers UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from quire.controller.access import TokenIssuer
from quire.controller.core import ControllerCore
from quire.controller.messages import (
    config_message,
    config_of,
    group_message,
    group_of,
    names,
    range_message,
    ranges_message,
)
from quire.controller.metrics import ControllerMetrics
from quire.controller.model import TxnState, segment_name, txn_id_of, txn_id_parts
from quire.controller_api import Controller_pb2 as pb
from quire.errors import (
    ContainerClosedError,
    ContainerFencedError,
    ContainerNotOwnedError,
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ControllerPreconditionError,
    ScopeNotFoundError,
    StreamNotFoundError,
    TransactionNotFoundError,
)
from quire.segmentstore.names import check_name

log = logging.getLogger(__name__)

SERVICE_NAME = "io.pravega.controller.stream.api.grpc.v1.ControllerService"
NodeAddress = tuple[str, int]
"""``(host, port)`` of a segment store."""
SegmentLocator = Callable[[str], Awaitable[NodeAddress]]
"""``await locate(segment_name)``: the segment store that owns the segment
now (ContainerNotOwnedError while none does: getURI answers UNAVAILABLE,
which the client retries)."""

def fixed_locator(address: NodeAddress) -> SegmentLocator:
    """A locator that answers one segment store for every segment (a
    controller in front of a single segment store, as in tests)."""
    async def locate(_segment: str) -> NodeAddress:
        return address
    return locate


_STATUS_OF: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (ControllerInvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (ControllerNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ControllerPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (ControllerConcurrentUpdateError, grpc.StatusCode.ABORTED),
    (ContainerNotOwnedError, grpc.StatusCode.UNAVAILABLE),
    (ContainerClosedError, grpc.StatusCode.UNAVAILABLE),
    (ContainerFencedError, grpc.StatusCode.UNAVAILABLE),
)


def grpc_status(error: BaseException) -> grpc.StatusCode:
    """The status answering ``error``: by its family, else INTERNAL."""
    for kind, code in _STATUS_OF:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


_TXN_STATE = {TxnState.OPEN: pb.TxnState.OPEN, TxnState.COMMITTING: pb.TxnState.COMMITTING,
              TxnState.COMMITTED: pb.TxnState.COMMITTED, TxnState.ABORTING: pb.TxnState.ABORTING,
              TxnState.ABORTED: pb.TxnState.ABORTED}


class ControllerService:
    """The served methods, each ``async (request) -> response`` named as in
    the interface; :meth:`handler` registers them with a grpc.aio server."""

    def __init__(self, core: ControllerCore, locate: SegmentLocator) -> None:
        self.core = core
        self._locate = locate
        self.tokens: TokenIssuer | None = None
        """Issues delegation tokens (None: auth is off, tokens are "")."""

    # --- scopes ----------------------------------------------------------------

    async def createScope(self, request: pb.ScopeInfo) -> pb.CreateScopeStatus:
        try:
            created = await self.core.create_scope(request.scope)
        except ControllerInvalidArgumentError:
            return pb.CreateScopeStatus(status=pb.CreateScopeStatus.INVALID_SCOPE_NAME)
        return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SUCCESS if created
                                    else pb.CreateScopeStatus.SCOPE_EXISTS)

    async def deleteScope(self, request: pb.ScopeInfo) -> pb.DeleteScopeStatus:
        try:
            await self.core.delete_scope(request.scope)
        except ScopeNotFoundError:
            return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SCOPE_NOT_FOUND)
        except ControllerPreconditionError:
            return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SCOPE_NOT_EMPTY)
        return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SUCCESS)

    async def listScopes(self, request: pb.ScopesRequest) -> pb.ScopesResponse:
        scopes, token = await self.core.list_scopes(request.continuationToken.token)
        return pb.ScopesResponse(scopes=scopes,
                                 continuationToken=pb.ContinuationToken(token=token))

    async def checkScopeExists(self, request: pb.ScopeInfo) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=await self.core.scope_exists(request.scope))

    async def listStreamsInScope(self, request: pb.StreamsInScopeRequest
                                 ) -> pb.StreamsInScopeResponse:
        scope = request.scope.scope
        try:
            streams, token = await self.core.list_streams(scope,
                                                          request.continuationToken.token)
        except ScopeNotFoundError:
            return pb.StreamsInScopeResponse(status=pb.StreamsInScopeResponse.SCOPE_NOT_FOUND)
        return pb.StreamsInScopeResponse(
            streams=[pb.StreamInfo(scope=scope, stream=s) for s in streams],
            continuationToken=pb.ContinuationToken(token=token),
            status=pb.StreamsInScopeResponse.SUCCESS)

    async def listStreamsInScopeForTag(self, request: pb.StreamsInScopeWithTagRequest
                                       ) -> pb.StreamsInScopeResponse:
        scope = request.scope.scope
        try:
            streams, token = await self.core.list_streams(
                scope, request.continuationToken.token, request.tag)
        except ScopeNotFoundError:
            return pb.StreamsInScopeResponse(status=pb.StreamsInScopeResponse.SCOPE_NOT_FOUND)
        return pb.StreamsInScopeResponse(
            streams=[pb.StreamInfo(scope=scope, stream=s) for s in streams],
            continuationToken=pb.ContinuationToken(token=token),
            status=pb.StreamsInScopeResponse.SUCCESS)

    # --- streams ---------------------------------------------------------------

    async def checkStreamExists(self, request: pb.StreamInfo) -> pb.ExistsResponse:
        scope, stream = names(request)
        return pb.ExistsResponse(exists=await self.core.stream_exists(scope, stream))

    async def createStream(self, request: pb.StreamConfig) -> pb.CreateStreamStatus:
        info = request.streamInfo
        try:
            check_name("stream", info.stream)
        except ControllerInvalidArgumentError:
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.INVALID_STREAM_NAME)
        config = config_of(request)
        try:
            created = await self.core.create_stream(info.scope, info.stream, config)
        except ScopeNotFoundError:
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SCOPE_NOT_FOUND)
        return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SUCCESS if created
                                     else pb.CreateStreamStatus.STREAM_EXISTS)

    async def _update(self, change: Awaitable[None]) -> pb.UpdateStreamStatus:
        try:
            await change
        except ScopeNotFoundError:
            return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SCOPE_NOT_FOUND)
        except StreamNotFoundError:
            return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.STREAM_NOT_FOUND)
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    async def updateStream(self, request: pb.StreamConfig) -> pb.UpdateStreamStatus:
        scope, stream = names(request.streamInfo)
        return await self._update(self.core.update_stream(scope, stream, config_of(request)))

    async def getStreamConfiguration(self, request: pb.StreamInfo) -> pb.StreamConfig:
        scope, stream = names(request)
        return config_message(scope, stream, await self.core.stream(scope, stream))

    async def sealStream(self, request: pb.StreamInfo) -> pb.UpdateStreamStatus:
        scope, stream = names(request)
        return await self._update(self.core.seal_stream(scope, stream))

    async def truncateStream(self, request: pb.StreamCut) -> pb.UpdateStreamStatus:
        scope, stream = names(request.streamInfo)
        return await self._update(self.core.truncate_stream(scope, stream, dict(request.cut)))

    async def deleteStream(self, request: pb.StreamInfo) -> pb.DeleteStreamStatus:
        scope, stream = names(request)
        try:
            await self.core.delete_stream(scope, stream)
        except ControllerNotFoundError:
            return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.STREAM_NOT_FOUND)
        except ControllerPreconditionError:
            return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.STREAM_NOT_SEALED)
        return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.SUCCESS)

    # --- segments --------------------------------------------------------------

    async def getCurrentSegments(self, request: pb.StreamInfo) -> pb.SegmentRanges:
        scope, stream = names(request)
        return ranges_message(scope, stream, await self.core.current_segments(scope, stream))

    async def getEpochSegments(self, request: pb.GetEpochSegmentsRequest) -> pb.SegmentRanges:
        scope, stream = names(request.streamInfo)
        return ranges_message(scope, stream,
                       await self.core.epoch_segments(scope, stream, request.epoch))

    async def getSegments(self, request: pb.GetSegmentsRequest) -> pb.SegmentsAtTime:
        scope, stream = names(request.streamInfo)
        at = await self.core.segments_at(scope, stream, request.timestamp)
        info = pb.StreamInfo(scope=scope, stream=stream)
        return pb.SegmentsAtTime(segments=[
            pb.SegmentsAtTime.SegmentLocation(segmentId=pb.SegmentId(streamInfo=info,
                                                                     segmentId=sid),
                                              offset=offset)
            for sid, offset in sorted(at.items())])

    async def getSegmentsImmediatelyFollowing(self, request: pb.SegmentId
                                              ) -> pb.SuccessorResponse:
        scope, stream = names(request.streamInfo)
        successors = await self.core.successors(scope, stream, request.segmentId)
        return pb.SuccessorResponse(segments=[
            pb.SuccessorResponse.SegmentEntry(segment=range_message(scope, stream, s),
                                              value=preds)
            for s, preds in successors])

    async def getURI(self, request: pb.SegmentId) -> pb.NodeUri:
        # any segment, the client's own table segments (<group>_kvtable) too:
        # the owner of the container the segment's name hashes to
        # (no name rules here: tables such as _system/... are asked about too)
        info = request.streamInfo
        if not info.scope or not info.stream:
            raise ControllerInvalidArgumentError("getURI needs a scope and a stream")
        host, port = await self._locate(segment_name(info.scope, info.stream,
                                                     request.segmentId))
        await self.core.located(info.scope, info.stream)
        return pb.NodeUri(endpoint=host, port=port)

    async def getDelegationToken(self, request: pb.StreamInfo) -> pb.DelegationToken:
        # the caller's own permission on the stream (quire.controller.access)
        token = self.tokens.issue(request) if self.tokens is not None else ""
        return pb.DelegationToken(delegationToken=token)

    # --- scaling --------------------------------------------------------------------

    async def scale(self, request: pb.ScaleRequest) -> pb.ScaleResponse:
        scope, stream = names(request.streamInfo)
        try:
            created, from_epoch = await self.core.scale(
                scope, stream, list(request.sealedSegments),
                [(r.start, r.end) for r in request.newKeyRanges])
        except ControllerPreconditionError as e:
            log.info("scale of %s/%s refused: %s", scope, stream, e)
            return pb.ScaleResponse(status=pb.ScaleResponse.PRECONDITION_FAILED)
        return pb.ScaleResponse(status=pb.ScaleResponse.STARTED, epoch=from_epoch,
                                segments=[range_message(scope, stream, s) for s in created])

    async def checkScale(self, request: pb.ScaleStatusRequest) -> pb.ScaleStatusResponse:
        scope, stream = names(request.streamInfo)
        done = await self.core.scale_done(scope, stream, request.epoch)
        status = {True: pb.ScaleStatusResponse.SUCCESS,
                  False: pb.ScaleStatusResponse.IN_PROGRESS,
                  None: pb.ScaleStatusResponse.INVALID_INPUT}[done]
        return pb.ScaleStatusResponse(status=status)

    # --- transactions ---------------------------------------------------------------

    async def createTransaction(self, request: pb.CreateTxnRequest) -> pb.CreateTxnResponse:
        scope, stream = names(request.streamInfo)
        txn_id, epoch = await self.core.create_transaction(scope, stream, request.lease)
        high, low = txn_id_parts(txn_id)
        return pb.CreateTxnResponse(
            txnId=pb.TxnId(highBits=high, lowBits=low),
            activeSegments=[range_message(scope, stream, s) for s in epoch.segments])

    async def pingTransaction(self, request: pb.PingTxnRequest) -> pb.PingTxnStatus:
        scope, stream = names(request.streamInfo)
        if request.lease > self.core.config.txn_max_lease_ms:
            return pb.PingTxnStatus(status=pb.PingTxnStatus.LEASE_TOO_LARGE)
        state = await self.core.ping_transaction(
            scope, stream, txn_id_of(request.txnId.highBits, request.txnId.lowBits),
            request.lease)
        if state is TxnState.OPEN:
            return pb.PingTxnStatus(status=pb.PingTxnStatus.OK)
        if state in (TxnState.COMMITTING, TxnState.COMMITTED):
            return pb.PingTxnStatus(status=pb.PingTxnStatus.COMMITTED)
        return pb.PingTxnStatus(status=pb.PingTxnStatus.ABORTED)

    async def _end_txn(self, request: pb.TxnRequest, commit: bool) -> pb.TxnStatus:
        scope, stream = names(request.streamInfo)
        txn_id = txn_id_of(request.txnId.highBits, request.txnId.lowBits)
        try:
            await self.core.end_transaction(scope, stream, txn_id, commit=commit)
        except TransactionNotFoundError:
            return pb.TxnStatus(status=pb.TxnStatus.TRANSACTION_NOT_FOUND)
        except ControllerNotFoundError:
            return pb.TxnStatus(status=pb.TxnStatus.STREAM_NOT_FOUND)
        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)

    async def commitTransaction(self, request: pb.TxnRequest) -> pb.TxnStatus:
        return await self._end_txn(request, commit=True)

    async def abortTransaction(self, request: pb.TxnRequest) -> pb.TxnStatus:
        return await self._end_txn(request, commit=False)

    async def checkTransactionState(self, request: pb.TxnRequest) -> pb.TxnState:
        scope, stream = names(request.streamInfo)
        state = await self.core.transaction_state(
            scope, stream, txn_id_of(request.txnId.highBits, request.txnId.lowBits))
        return pb.TxnState(state=pb.TxnState.UNKNOWN if state is None else _TXN_STATE[state])

    # --- reader groups and subscribers -------------------------------------------------

    async def createReaderGroup(self, request: pb.ReaderGroupConfiguration
                                ) -> pb.CreateReaderGroupResponse:
        try:
            check_name("reader group", request.readerGroupName)
        except ControllerInvalidArgumentError:
            return pb.CreateReaderGroupResponse(
                status=pb.CreateReaderGroupResponse.INVALID_RG_NAME)
        try:
            doc = await self.core.create_reader_group(request.scope, request.readerGroupName,
                                                      group_of(request))
        except ScopeNotFoundError:
            return pb.CreateReaderGroupResponse(
                status=pb.CreateReaderGroupResponse.SCOPE_NOT_FOUND)
        return pb.CreateReaderGroupResponse(
            status=pb.CreateReaderGroupResponse.SUCCESS,
            config=group_message(request.scope, request.readerGroupName, doc))

    async def getReaderGroupConfig(self, request: pb.ReaderGroupInfo
                                   ) -> pb.ReaderGroupConfigResponse:
        try:
            doc = await self.core.reader_group(request.scope, request.readerGroup)
        except ControllerNotFoundError:
            return pb.ReaderGroupConfigResponse(status=pb.ReaderGroupConfigResponse.RG_NOT_FOUND)
        return pb.ReaderGroupConfigResponse(
            status=pb.ReaderGroupConfigResponse.SUCCESS,
            config=group_message(request.scope, request.readerGroup, doc))

    async def updateReaderGroup(self, request: pb.ReaderGroupConfiguration
                                ) -> pb.UpdateReaderGroupResponse:
        try:
            doc = await self.core.update_reader_group(request.scope, request.readerGroupName,
                                                      group_of(request))
        except ControllerNotFoundError:
            return pb.UpdateReaderGroupResponse(status=pb.UpdateReaderGroupResponse.RG_NOT_FOUND)
        return pb.UpdateReaderGroupResponse(status=pb.UpdateReaderGroupResponse.SUCCESS,
                                            generation=int(doc["generation"]))

    async def deleteReaderGroup(self, request: pb.ReaderGroupInfo) -> pb.DeleteReaderGroupStatus:
        try:
            await self.core.delete_reader_group(request.scope, request.readerGroup)
        except ControllerNotFoundError:
            return pb.DeleteReaderGroupStatus(status=pb.DeleteReaderGroupStatus.RG_NOT_FOUND)
        return pb.DeleteReaderGroupStatus(status=pb.DeleteReaderGroupStatus.SUCCESS)

    async def listSubscribers(self, request: pb.StreamInfo) -> pb.SubscribersResponse:
        scope, stream = names(request)
        try:
            found = await self.core.subscribers(scope, stream)
        except ControllerNotFoundError:
            return pb.SubscribersResponse(status=pb.SubscribersResponse.STREAM_NOT_FOUND)
        return pb.SubscribersResponse(subscribers=found, status=pb.SubscribersResponse.SUCCESS)

    async def updateSubscriberStreamCut(self, request: pb.SubscriberStreamCut
                                        ) -> pb.UpdateSubscriberStatus:
        scope, stream = names(request.streamCut.streamInfo)
        try:
            status = await self.core.update_subscriber_cut(
                scope, stream, request.subscriber, request.readerGroupId, request.generation,
                dict(request.streamCut.cut))
        except ControllerNotFoundError:
            return pb.UpdateSubscriberStatus(status=pb.UpdateSubscriberStatus.STREAM_NOT_FOUND)
        return pb.UpdateSubscriberStatus(status=getattr(pb.UpdateSubscriberStatus, status))

    # --- registration ---------------------------------------------------------------

    SERVED = ("createScope", "deleteScope", "listScopes", "checkScopeExists",
              "listStreamsInScope", "checkStreamExists", "createStream", "updateStream",
              "getStreamConfiguration", "sealStream", "truncateStream", "deleteStream",
              "getCurrentSegments", "getEpochSegments", "getSegments",
              "getSegmentsImmediatelyFollowing", "getURI", "getDelegationToken", "scale",
              "checkScale", "createTransaction", "pingTransaction", "commitTransaction",
              "abortTransaction", "checkTransactionState", "listStreamsInScopeForTag",
              "createReaderGroup", "getReaderGroupConfig", "updateReaderGroup",
              "deleteReaderGroup", "listSubscribers", "updateSubscriberStreamCut")

    def handler(self) -> grpc.GenericRpcHandler:
        """The served methods as one handler for a grpc.aio server."""
        methods = pb.DESCRIPTOR.services_by_name["ControllerService"].methods_by_name
        handlers = {}
        for name in self.SERVED:
            method = methods[name]
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                definite(name, getattr(self, name), self.core.metrics),
                request_deserializer=getattr(pb, method.input_type.name).FromString,
                response_serializer=getattr(pb, method.output_type.name).SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def definite(name: str, call: Callable[[Any], Awaitable[Any]], metrics: ControllerMetrics
              ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """``call`` as a handler whose every failure is a definite status, timed."""
    ok = metrics.rpc.labels(name, "OK")

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            answer = await call(request)
            ok.observe((time.perf_counter() - started) * 1000)
            return answer
        except Exception as e:  # every failure answered: the client retries UNKNOWN
            code = grpc_status(e)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("controller: %s failed", name)
            message = f"{type(e).__name__}: {e}"
        metrics.rpc.labels(name, code.name).observe((time.perf_counter() - started) * 1000)
        await context.abort(code, message)
    return handle
