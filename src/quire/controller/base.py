"""What the parts of :class:`~quire.controller.core.ControllerCore` share:
the configuration, the state, the locks and the rules of a change.

A change that touches both segments and records is written so that doing
it again finishes it (a stream is recorded CREATING before its segments
are created; a scale or a roll is recorded as pending before segments are
sealed and created; a transaction is COMMITTING or ABORTING before its
segments are merged or deleted), and so that two controllers doing it at
once do it once: creating a segment that exists, sealing a sealed one,
deleting a missing one and merging a source already merged count as done;
a merge never lands after its target is sealed, because whoever seals
merged every source first.  Records are written at the version they were
read: another controller's write in between is
ControllerConcurrentUpdateError, on which the whole operation is read and
done again (:meth:`CoreBase.retrying`).

Before a workflow (creating a stream, a scale, a commit or an abort)
writes its intent, the controller notes itself in the workflows table
(:meth:`CoreBase.changing`); the note goes once the workflow is done.  The
leader finishes the workflows whose note names a dead controller, or is
older than ``stale_workflow_ms``, and its own whose workflow failed (a note
of its own while it is not changing that stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from quire.clock import Clock
from quire.controller.cluster import ControllerCluster
from quire.controller.metrics import ControllerMetrics
from quire.controller.model import StreamConfig, StreamRecord, StreamState
from quire.controller.state import ControllerSegmentStore, ControllerState
from quire.errors import (
    ConfigError,
    ControllerConcurrentUpdateError,
    ScopeNotFoundError,
    StreamNotFoundError,
)
from quire.segmentstore.segment_rates import policy_attributes

log = logging.getLogger("quire.controller")
T = TypeVar("T")


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's settings (times in ms)."""

    txn_max_lease_ms: int = 600_000
    """The longest lease a transaction may ask for (Pravega's default
    maximum; the client asks for 90 s and pings)."""
    txn_sweep_interval_ms: int = 1_000
    """How often the leader looks for expired leases and half-done workflows."""
    completed_txn_retention_ms: int = 600_000
    """How long a committed or aborted transaction's state is kept for
    checkTransactionState and pings."""
    list_page_size: int = 1_000
    """Names per listScopes / listStreamsInScope answer."""
    retention_interval_ms: int = 60_000
    """How often a stream cut is recorded for each stream with a retention
    policy, and the stream truncated as the policy says."""
    max_retention_cuts: int = 1_000
    """Recorded cuts kept per stream (the oldest are dropped)."""
    autoscale_interval_ms: int = 1_000
    """How often the leader reads the segment stores' auto-scaling requests."""
    autoscale_request_validity_ms: int = 600_000
    """A request older than this is dropped; a segment reported cold stays
    marked cold this long (Pravega's 10 minutes)."""
    stale_workflow_ms: int = 60_000
    """A workflow noted this long ago by a controller still alive is
    finished by the leader too."""
    workflow_pause_ms: int = 0
    """Pause after each workflow's intent is written (tests and demos: a
    controller can be killed with the work half done)."""
    metrics_port: int = -1
    """HTTP port of ``/metrics``; 0 picks a free one, -1 disables it."""

    def __post_init__(self) -> None:
        for name in ("txn_max_lease_ms", "txn_sweep_interval_ms", "list_page_size",
                     "retention_interval_ms", "max_retention_cuts", "autoscale_interval_ms",
                     "autoscale_request_validity_ms", "stale_workflow_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller: {name} must be positive")
        if self.workflow_pause_ms < 0:
            raise ConfigError("controller: workflow_pause_ms must not be negative")


def segment_policy(config: StreamConfig) -> dict[int, int] | None:
    """The scaling policy attributes of the stream's segments."""
    if not config.auto_scaled:
        return None
    return policy_attributes(config.scale_type.value, config.target_rate)


class CoreBase:
    """The shared part (module docstring); see ControllerCore for the rest."""

    def __init__(self, store: ControllerSegmentStore, config: ControllerConfig, clock: Clock,
                 metrics: ControllerMetrics, cluster: ControllerCluster) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.cluster = cluster
        self.state = ControllerState(store)
        self._clock_ms = clock.wall_ms
        self._scope_locks: dict[str, asyncio.Lock] = {}
        self._stream_locks: dict[tuple[str, str], asyncio.Lock] = {}

    def now_ms(self) -> int:
        return self._clock_ms()

    def _scope_lock(self, scope: str) -> asyncio.Lock:
        return self._scope_locks.setdefault(scope, asyncio.Lock())

    def _stream_lock(self, scope: str, stream: str) -> asyncio.Lock:
        return self._stream_locks.setdefault((scope, stream), asyncio.Lock())

    async def scope_exists(self, scope: str) -> bool:
        return await self.state.scope_version(scope) is not None

    async def _stream(self, scope: str, stream: str) -> tuple[StreamRecord, int]:
        found = await self.state.stream(scope, stream)
        if found is None or found[0].state is StreamState.CREATING:
            if not await self.scope_exists(scope):
                raise ScopeNotFoundError(f"no scope {scope!r}")
            raise StreamNotFoundError(f"no stream {scope}/{stream}")
        return found

    async def retrying(self, call: Callable[[], Awaitable[T]], attempts: int = 20) -> T:
        """``call()``, read and done again while another controller's write
        gets in between (ControllerConcurrentUpdateError)."""
        for attempt in range(attempts):
            try:
                return await call()
            except ControllerConcurrentUpdateError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(random.uniform(0.005, 0.05) * (attempt + 1))  # backoff
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def changing(self, scope: str, stream: str) -> AsyncIterator[None]:
        """The stream's lock, with this controller noted as changing it
        (the note stays if the workflow fails: the leader finishes it)."""
        async with self._stream_lock(scope, stream):
            version = await self.state.begin_work(scope, stream, self.cluster.member,
                                                  self.now_ms())
            yield
            await self.state.end_work(scope, stream, self.cluster.member, version)

    async def pause(self, what: str) -> None:
        """The test hook ``workflow_pause_ms``, after an intent is written."""
        if self.config.workflow_pause_ms:
            log.info("controller %s: %s written; pausing %d ms", self.cluster.member, what,
                     self.config.workflow_pause_ms)
            await asyncio.sleep(self.config.workflow_pause_ms / 1000)  # the hook itself

    async def finish_epoch_change(self, scope: str, stream: str) -> None:
        """Finish the stream's pending scale and roll, if any: what every
        workflow does before its own, since its note replaces the note of
        one that failed half done.  Defined by ControllerCore."""
        raise NotImplementedError

    async def settle(self, scope: str, stream: str, *, abort_open: bool = False) -> None:
        """Finish whatever the stream has half done (a scale, a roll,
        commits and aborts; the open transactions are aborted too if
        ``abort_open``).  Defined by ControllerCore."""
        raise NotImplementedError
