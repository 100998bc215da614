"""Auto-scaling's requests, from the segment stores to the controller.

Pravega's segment stores write their hot and cold reports as events of an
internal request stream, which the controllers read.  Quire's keep them as
records of the metadata store every process shares, one per segment::

    autoscale/requests/<scope>/<stream>/<segment id>
        {"up": bool, "splits": n, "timestamp_ms": ms}

A newer report of a segment replaces the older one.  The controller that
leads reads them all (:meth:`ScaleRequests.pending`), acts on each and
removes it at the version it read (:meth:`ScaleRequests.done`), so a
report that arrives meanwhile is not lost, and one left by a controller
that died is acted on by the next leader.  :class:`AutoScaleReporter` runs
a store's :class:`~quire.segmentstore.segment_rates.AutoScaleMonitor`
every tick and posts what it finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable

from quire.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from quire.metadata import MetadataStore
from quire.segmentstore.segment_rates import (
    AutoScaleMonitor,
    AutoScalerConfig,
    RatedContainer,
    ScaleRequest,
)

log = logging.getLogger(__name__)
PREFIX = "autoscale/requests/"


class ScaleRequests:
    """The requests in a metadata store (module docstring)."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def post(self, request: ScaleRequest) -> None:
        key = f"{PREFIX}{request.scope}/{request.stream}/{request.segment_id}"
        value = json.dumps({"up": request.up, "splits": request.splits,
                            "timestamp_ms": request.timestamp_ms}).encode()
        while True:  # create, or replace an older one (each race is lost to a newer write)
            try:
                await self.metadata.create_record(key, value)
                return
            except MetadataExistsError:
                pass
            try:
                record = await self.metadata.read_record(key)
                await self.metadata.write_record(key, value, record.version)
                return
            except (MetadataNotFoundError, MetadataVersionError):
                continue

    async def pending(self) -> list[tuple[ScaleRequest, int]]:
        """Every request with its record's version, oldest first."""
        found = []
        for key in await self.metadata.list_records(PREFIX):
            try:
                record = await self.metadata.read_record(key)
            except MetadataNotFoundError:
                continue
            scope, stream, segment = key.removeprefix(PREFIX).split("/")
            doc = json.loads(record.value)
            found.append((ScaleRequest(scope, stream, int(segment), bool(doc["up"]),
                                       int(doc["splits"]), int(doc["timestamp_ms"])),
                          record.version))
        return sorted(found, key=lambda r: r[0].timestamp_ms)

    async def done(self, request: ScaleRequest, version: int) -> None:
        """Remove the request unless a newer one replaced it."""
        key = f"{PREFIX}{request.scope}/{request.stream}/{request.segment_id}"
        with contextlib.suppress(MetadataNotFoundError, MetadataError):
            await self.metadata.delete_record(key, version)


class AutoScaleReporter:
    """Every tick, the monitor over ``containers()``; its requests posted."""

    def __init__(self, containers: Callable[[], Iterable[RatedContainer]],
                 requests: ScaleRequests, config: AutoScalerConfig,
                 clock_ms: Callable[[], int]) -> None:
        self.monitor = AutoScaleMonitor(config)
        self._containers = containers
        self._requests = requests
        self._clock_ms = clock_ms
        self._task: asyncio.Task[None] | None = None
        self.posted = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="autoscale-reporter")

    async def tick(self) -> None:
        for request in self.monitor.tick(self._containers(), self._clock_ms()):
            log.info("auto-scaling: %s/%s segment %d is %s", request.scope, request.stream,
                     request.segment_id, f"hot ({request.splits} splits)" if request.up
                     else "cold")
            await self._requests.post(request)
            self.posted += 1

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.monitor.config.tick_ms / 1000)  # a period
            try:
                await self.tick()
            except Exception:  # the next tick tries again; the task must live on
                log.exception("auto-scaling: reporting failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
