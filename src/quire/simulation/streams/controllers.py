"""Simulated controllers, and the clients' gRPC link to them.

:class:`SimController` assembles what ``quire controller start`` assembles
(:class:`~quire.hosts.controller_host.ControllerHost`): a metadata session,
the segment stores reached over the wire
(:class:`~quire.streams.RemoteSegmentStore` resolving owners in the
metadata store, as the host does: the controller talks to the segment
stores over the simulated network, never in-process, so that a partition
between a controller and a segment store, and a segment store's crash
under a workflow, are what they are in a cluster), the real
:class:`~quire.controller.ControllerCore` in a cluster of controllers
(:class:`~quire.controller.cluster.MetadataCluster`: members, the leader's
election) and the real :class:`~quire.controller.ControllerService`, whose
handlers answer gRPC requests; and the leader's duties every interval (the
sweep, retention, auto-scaling), as :class:`~quire.controller.Controller`
runs them.  Only grpc.aio's server is left out: it runs threads.

:class:`SimControllerClient` is the real
:class:`~quire.streams.ControllerClient` (its messages, statuses, fail-over
between controllers) whose every call is an exchange over the simulated
network with the controller it targets: the request, serialized, is served
there by the same handler gRPC would call; an unreachable controller, a
lost answer or a controller that died under the call is UNAVAILABLE, a
call past its deadline DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, cast

import grpc

from quire.controller.base import ControllerConfig
from quire.controller.cluster import MetadataCluster
from quire.controller.core import ControllerCore
from quire.controller.service import ControllerService, NodeAddress, definite
from quire.controller_api import Controller_pb2 as pb
from quire.segmentstore.ownership import owner_address
from quire.simulation.loop import VirtualClock
from quire.simulation.network import AnswerLost, SimNetwork, Unreachable
from quire.simulation.streams.nodes import Cluster, SimProcess
from quire.streams import ControllerClient, RemoteSegmentStore, SegmentClientConfig
from quire.streams.connection import split_address
from quire.streams.resolvers import metadata_resolver

log = logging.getLogger(__name__)

CONTROLLER_PORT = 9090
_METHODS = pb.DESCRIPTOR.services_by_name["ControllerService"].methods_by_name


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """What the handlers use of a ``grpc.aio.ServicerContext``: abort."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Aborted(code, details)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class SimController(SimProcess):
    """A controller process (module docstring)."""

    def __init__(self, name: str, cluster: Cluster, config: ControllerConfig) -> None:
        super().__init__(name, cluster)
        self.config = config
        self.clock = VirtualClock(cluster.loop, cluster.clock.start_ms)
        self.core: ControllerCore | None = None
        self.service: ControllerService | None = None
        self.segments: RemoteSegmentStore | None = None
        self._duties: list[asyncio.Task[None]] = []

    async def _boot(self) -> None:
        metadata = self.cluster.session()
        resolve = metadata_resolver(metadata, owner_address)

        async def locate(segment: str) -> NodeAddress:
            return split_address(await resolve(segment))

        self.segments = segments = RemoteSegmentStore(resolve, SegmentClientConfig(
            connect_timeout_ms=2000, request_timeout_ms=5000, retry_deadline_ms=5000))
        core = ControllerCore(segments, self.config, self.clock,
                              cluster=MetadataCluster(metadata, f"{self.name}:{CONTROLLER_PORT}"))
        await core.start()
        self.core, self.service = core, ControllerService(core, locate)
        loop = asyncio.get_running_loop()
        self._duties = [loop.create_task(self._every(interval_ms, duty)) for interval_ms, duty in (
            (self.config.txn_sweep_interval_ms, core.sweep),
            (self.config.retention_interval_ms, core.retain))]

    async def _every(self, interval_ms: int, duty: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)  # a period, as the controller's
            try:
                await duty()
            except Exception as e:  # the next pass retries (the controller logs it)
                log.info("controller duty failed: %r", e)

    def _forget(self) -> None:
        self.core = self.service = self.segments = None
        self._duties = []

    async def serve(self, method: str, request: bytes) -> bytes:
        """Answer one gRPC request (serialized) as the service would."""
        core, service = self.core, self.service
        if core is None or service is None:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.name} is starting")
        kind = _METHODS[method]
        message = getattr(pb, kind.input_type.name).FromString(request)
        handler = definite(method, getattr(service, method), core.metrics)
        try:
            answer = await handler(message, cast(grpc.aio.ServicerContext, _Context()))
        except _Aborted as e:
            raise rpc_error(e.code, e.details) from None
        return cast(bytes, answer.SerializeToString())


class SimControllerClient(ControllerClient):
    """The streams client's controller client over the simulated network
    (module docstring); ``controllers`` by node name."""

    def __init__(self, network: SimNetwork, controllers: dict[str, SimController],
                 timeout_ms: int = 30_000) -> None:
        super().__init__(",".join(f"tcp://{name}:{CONTROLLER_PORT}" for name in controllers),
                         timeout_ms)
        self._network = network
        self._controllers = controllers

    def _channel(self) -> grpc.aio.Channel:
        return cast(grpc.aio.Channel, self._targets[self._current])  # a node, not a channel

    async def close(self) -> None:
        """No channel to close."""

    async def call(self, method: str, request: Any) -> Any:
        data = request.SerializeToString()
        answer_type = getattr(pb, _METHODS[method].output_type.name)

        async def attempt(channel: grpc.aio.Channel, timeout_s: float) -> Any:
            node = str(channel).partition(":")[0]
            controller = self._controllers[node]
            try:
                async with asyncio.timeout(timeout_s):
                    answer = await self._network.exchange(
                        node, lambda: controller.serve(method, data), method)
            except TimeoutError:
                raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, method) from None
            except (Unreachable, AnswerLost) as e:
                raise rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)) from None
            return answer_type.FromString(answer)
        return await self._failing_over(method, attempt)

    async def admin(self, method: str, request: dict[str, Any]) -> Any:
        raise NotImplementedError("the simulation serves ControllerService only")

