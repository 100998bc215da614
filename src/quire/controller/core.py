"""The controller's operations on scopes, streams, segments and transactions.

:class:`ControllerCore` is the controller without gRPC: plain arguments and
results, typed errors from :mod:`quire.errors` (the service turns each into
one gRPC status).  Its state is :class:`~quire.controller.state.ControllerState`;
the segments it manages are created, sealed, merged, truncated and deleted
through the :class:`~quire.controller.state.ControllerSegmentStore` seam.
It is assembled from parts that share one state
(:class:`~quire.controller.base.CoreBase`, whose docstring gives the rules
every change follows): scopes and streams here,
:mod:`~quire.controller.scaling`, :mod:`~quire.controller.transactions`,
:mod:`~quire.controller.retention`.

Any number of controllers serve one cluster.  Every RPC works on any of
them; the background duties are the leader's
(:class:`~quire.controller.cluster.ControllerCluster`): :meth:`sweep`
(expired leases, and the workflows a dead controller left half done),
:meth:`~quire.controller.retention.RetentionOps.enforce_retention` and
:meth:`autoscale` (the segment stores' requests).
"""

from __future__ import annotations

import contextlib
import logging

from quire.clock import SYSTEM_CLOCK, Clock
from quire.controller.base import ControllerConfig, segment_policy
from quire.controller.cluster import ControllerCluster, SoloCluster, member_name
from quire.controller.metrics import ControllerMetrics
from quire.controller.model import (
    Epoch,
    SegmentRange,
    StreamConfig,
    StreamRecord,
    StreamState,
    TxnState,
    segment_name,
)
from quire.controller.retention import RetentionOps
from quire.controller.scaling import ScalingOps
from quire.controller.state import (
    ControllerSegmentStore,
    create_if_missing,
    delete_if_present,
    subscribers_table,
    txns_table,
)
from quire.controller.transactions import TxnOps
from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ControllerPreconditionError,
    ScopeNotFoundError,
    SegmentSealedError,
)
from quire.segmentstore import NOT_EXISTS, SegmentType
from quire.segmentstore.names import check_name
from quire.segmentstore.scale_requests import ScaleRequests

log = logging.getLogger("quire.controller")

__all__ = ["ControllerConfig", "ControllerCore"]


class ControllerCore(ScalingOps, TxnOps, RetentionOps):
    """The controller's operations (see the module docstring); ``start()``
    before the first one.  ``clock`` is the wall clock of leases, epochs
    and retention; ``cluster`` the other controllers (none: this is the
    only one); ``requests`` the auto-scaling requests (none: not served)."""

    def __init__(self, store: ControllerSegmentStore, config: ControllerConfig,
                 clock: Clock = SYSTEM_CLOCK, metrics: ControllerMetrics | None = None,
                 cluster: ControllerCluster | None = None,
                 requests: ScaleRequests | None = None) -> None:
        super().__init__(store, config, clock, metrics or ControllerMetrics(),
                         cluster or SoloCluster(member_name("solo")))
        self.requests = requests
        self._client_groups: set[tuple[str, str]] = set()

    async def start(self) -> None:
        """Create the controller's tables if needed; join the cluster; if
        it leads already (the only controller), finish what the last one
        left half done (until then writers could find sealed segments
        without successors)."""
        await self.state.start()
        await self.cluster.start()
        await self.sweep()

    async def close(self) -> None:
        await self.cluster.close()

    # --- scopes ----------------------------------------------------------------

    async def create_scope(self, scope: str) -> bool:
        """Create ``scope``; False if it exists (ControllerInvalidArgumentError
        for a bad name)."""
        check_name("scope", scope)
        async with self._scope_lock(scope):
            return await self.state.add_scope(scope)

    async def delete_scope(self, scope: str) -> None:
        """ScopeNotFoundError; ControllerPreconditionError if it has streams."""
        async def delete() -> None:
            version = await self.state.scope_version(scope)
            if version is None:
                raise ScopeNotFoundError(f"no scope {scope!r}")
            streams, _ = await self.state.streams(scope, "", 1)
            if streams:
                raise ControllerPreconditionError(f"scope {scope!r} has streams")
            await self.state.remove_scope(scope, version)
        async with self._scope_lock(scope):
            await self.retrying(delete)

    async def list_scopes(self, token: str) -> tuple[list[str], str]:
        return await self.state.scopes(token, self.config.list_page_size)

    async def list_streams(self, scope: str, token: str, tag: str | None = None
                           ) -> tuple[list[str], str]:
        """A page of the scope's streams (with ``tag`` only, if given)."""
        if not await self.scope_exists(scope):
            raise ScopeNotFoundError(f"no scope {scope!r}")
        while True:  # an empty answer ends the client's listing: skip empty pages
            streams, token = await self.state.streams(scope, token, self.config.list_page_size)
            names = [name for name, r in streams if r.state is not StreamState.CREATING
                     and (tag is None or tag in r.config.tags)]
            if names or not streams:
                return names, token

    # --- streams ---------------------------------------------------------------

    async def stream(self, scope: str, stream: str) -> StreamRecord:
        """The stream's record (ScopeNotFoundError / StreamNotFoundError)."""
        return (await self._stream(scope, stream))[0]

    async def stream_exists(self, scope: str, stream: str) -> bool:
        try:
            await self._stream(scope, stream)
        except ControllerNotFoundError:
            return False
        return True

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> bool:
        """Create the stream with ``config.min_segments`` segments; False if it
        exists (ScopeNotFoundError; ControllerInvalidArgumentError)."""
        check_name("stream", stream)

        async def create() -> bool:
            if not await self.scope_exists(scope):
                raise ScopeNotFoundError(f"no scope {scope!r}")
            found = await self.state.stream(scope, stream)
            now, me = self.now_ms(), self.cluster.member
            if found is None:
                record = StreamRecord.new(config, now)
                record.creator, record.creator_ms = me, now
                version = await self.state.put_stream(scope, stream, record, NOT_EXISTS)
            elif found[0].state is StreamState.CREATING:
                record, version = found  # an interrupted creation: finish it...
                await self._check_creator(scope, stream, record, now)
                record.creator, record.creator_ms = me, now  # ...as its one creator
                version = await self.state.put_stream(scope, stream, record, version)
            else:
                return False
            await self._create_segments(scope, stream, record)
            record.state, record.creator, record.creator_ms = StreamState.ACTIVE, "", 0
            await self.state.put_stream(scope, stream, record, version)
            return True

        async with self._scope_lock(scope), self.changing(scope, stream):
            return await self.retrying(create)

    async def _check_creator(self, scope: str, stream: str, record: StreamRecord,
                             now_ms: int) -> None:
        """ControllerConcurrentUpdateError while another live controller
        makes the stream's first segments (its claim not stale).  Two at once,
        the one finished and the stream moved on (scaled, truncated: its
        first segments deleted), the other's late create made a deleted
        segment again, unsealed, and a writer's events acknowledged there
        were in no epoch (the stream simulation, seed 108706)."""
        creator = record.creator
        if creator and creator != self.cluster.member \
                and now_ms - record.creator_ms < self.config.stale_workflow_ms \
                and await self.cluster.alive(creator):
            raise ControllerConcurrentUpdateError(
                f"stream {scope}/{stream}: controller {creator} is creating it")

    async def _create_segments(self, scope: str, stream: str, record: StreamRecord) -> None:
        await create_if_missing(self.store, txns_table(scope, stream), SegmentType.TABLE)
        policy = segment_policy(record.config)
        for s in record.current.segments:
            await create_if_missing(self.store, segment_name(scope, stream, s.id),
                                    SegmentType.STREAM, policy)

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Replace the stream's configuration; a changed scaling policy goes to
        its segments, a changed fixed count (or a minimum above the current
        count) scales it."""
        async def update() -> StreamConfig:
            await self.settle(scope, stream)
            record, version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is sealed")
            old, record.config = record.config, config
            await self.state.put_stream(scope, stream, record, version)
            return old

        async with self._stream_lock(scope, stream):
            old = await self.retrying(update)
        await self.apply_config(scope, stream, old, config)

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Seal every active segment (open transactions are aborted first)."""
        async def seal() -> None:
            record, _version = await self._stream(scope, stream)
            if record.state is StreamState.SEALED:
                return
            await self.settle(scope, stream, abort_open=True)
            record, version = await self._stream(scope, stream)
            for s in record.current.segments:
                with contextlib.suppress(SegmentSealedError):
                    await self.store.seal(segment_name(scope, stream, s.id))
            record.state = StreamState.SEALED
            await self.state.put_stream(scope, stream, record, version)

        async with self._stream_lock(scope, stream):
            await self.retrying(seal)

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Delete a sealed stream: its segments, transactions and record
        (ControllerPreconditionError if it is not sealed)."""
        async def delete() -> None:
            record, version = await self._stream(scope, stream)
            if record.state is not StreamState.SEALED:
                raise ControllerPreconditionError(f"stream {scope}/{stream} is not sealed")
            for txn, _v in await self.state.txns(scope, stream):
                if not txn.state.completed:
                    await self._delete_txn_segments(scope, stream, txn)
            for sid in sorted(record.all_segments()):
                await delete_if_present(self.store, segment_name(scope, stream, sid))
            await delete_if_present(self.store, txns_table(scope, stream))
            await delete_if_present(self.store, subscribers_table(scope, stream))
            await self.state.remove_stream(scope, stream, version)

        async with self._stream_lock(scope, stream):
            await self.retrying(delete)

    async def truncate_stream(self, scope: str, stream: str, cut: dict[int, int]) -> None:
        """Make ``cut`` the stream's head: truncate each of its segments at its
        offset and delete the segments wholly before it."""
        async def truncate() -> None:
            await self.settle(scope, stream)
            record, version = await self._stream(scope, stream)
            before = await self.truncate_at(scope, stream, record, cut)
            await self.state.put_stream(scope, stream, record, version)
            await self.drop_segments(scope, stream, before)

        async with self._stream_lock(scope, stream):
            await self.retrying(truncate)

    async def finish_epoch_change(self, scope: str, stream: str) -> None:
        """See :meth:`CoreBase.finish_epoch_change` (the stream's lock held)."""
        await self.finish_scale(scope, stream)
        await self.finish_roll(scope, stream)

    async def settle(self, scope: str, stream: str, *, abort_open: bool = False) -> None:
        """See :meth:`CoreBase.settle`; the caller holds the stream's lock."""
        await self.finish_epoch_change(scope, stream)
        for txn, _v in await self.state.txns(scope, stream):
            if txn.state in (TxnState.COMMITTING, TxnState.ABORTING) or \
                    (abort_open and txn.state is TxnState.OPEN):
                await self.finish_txn(scope, stream, txn.txn_id,
                                      "stream sealed" if txn.state is TxnState.OPEN
                                      else "request")

    # --- segments --------------------------------------------------------------

    async def current_segments(self, scope: str, stream: str) -> Epoch:
        return (await self.stream(scope, stream)).current

    async def epoch_segments(self, scope: str, stream: str, epoch: int) -> Epoch:
        if epoch < 0:
            raise ControllerInvalidArgumentError(f"epoch {epoch} < 0")
        record = await self.stream(scope, stream)
        if epoch >= len(record.epochs):
            raise ControllerNotFoundError(f"stream {scope}/{stream} has no epoch {epoch}")
        return record.epochs[epoch]

    async def segments_at(self, scope: str, stream: str, timestamp_ms: int
                          ) -> dict[int, int]:
        """Where readers starting at ``timestamp_ms`` begin (0 or a time
        before the last truncation: the stream's head): segment id -> offset."""
        record = await self.stream(scope, stream)
        head = record.head_cut()
        if timestamp_ms <= 0 or (record.head and timestamp_ms < record.truncated_ms):
            return head
        return {s.id: head.get(s.id, 0) for s in record.epoch_at(timestamp_ms).segments}

    async def successors(self, scope: str, stream: str, sid: int
                         ) -> list[tuple[SegmentRange, list[int]]]:
        record = await self.stream(scope, stream)
        if record.find(sid) is None:
            raise ControllerNotFoundError(f"stream {scope}/{stream} has no segment {sid}")
        return record.successors(sid)

    async def located(self, scope: str, stream: str) -> None:
        """A client asked where a segment of ``scope/stream`` is: note the
        reader groups it uses (their ``<group>_kvtable`` state tables)."""
        if stream.endswith("_kvtable") and (scope, stream) not in self._client_groups:
            self._client_groups.add((scope, stream))
            await self.note_client_group(scope, stream.removesuffix("_kvtable"))

    # --- the leader's duties -------------------------------------------------------

    async def sweep(self) -> None:
        """Finish the workflows of dead controllers (and stale ones, and its
        own that failed), then pass over the streams with transactions;
        nothing unless leading."""
        if not self.cluster.is_leader:
            return
        now = self.now_ms()
        busy = set()
        for scope, stream, member, since, version in await self.state.works():
            if member == self.cluster.member:
                if self._stream_lock(scope, stream).locked():
                    busy.add((scope, stream))  # under way in this process
                    continue
                # this controller's own, left by a workflow that failed here: finish it
            elif await self.cluster.alive(member) and \
                    now - since < self.config.stale_workflow_ms:
                busy.add((scope, stream))
                continue
            log.info("stream %s/%s: finishing what controller %s left", scope, stream, member)
            async with self._stream_lock(scope, stream):
                await self._settle_retrying(scope, stream)
            found = await self.state.stream(scope, stream)
            if found is not None and found[0].state is StreamState.CREATING:
                try:
                    await self.create_stream(scope, stream, found[0].config)
                except ControllerConcurrentUpdateError as e:
                    log.info("stream %s/%s: %s; the next pass looks again", scope, stream, e)
                    continue
            await self.state.end_work(scope, stream, member, version)
            self.metrics.workflows_taken_over.inc()
        for scope, stream, version in await self.state.txn_streams():
            if (scope, stream) not in busy:
                await self.sweep_transactions(scope, stream, version)

    async def _settle_retrying(self, scope: str, stream: str) -> None:
        async def settle() -> None:
            found = await self.state.stream(scope, stream)
            if found is not None and found[0].state is not StreamState.CREATING:
                await self.settle(scope, stream)
        await self.retrying(settle)

    async def retain(self) -> None:
        """The retention pass, if leading."""
        if self.cluster.is_leader:
            await self.enforce_retention()

    async def autoscale(self) -> None:
        """Act on the segment stores' auto-scaling requests, if leading."""
        if self.requests is None or not self.cluster.is_leader:
            return
        for request, version in await self.requests.pending():
            try:
                outcome = await self.handle_scale_request(request)
            except ControllerPreconditionError as e:
                outcome = "refused"
                log.info("auto-scaling %s/%s segment %d refused: %s", request.scope,
                         request.stream, request.segment_id, e)
            self.metrics.autoscale_requests.labels("up" if request.up else "down",
                                                   outcome).inc()
            await self.requests.done(request, version)
