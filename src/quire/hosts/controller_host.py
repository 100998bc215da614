"""The controller process: ``quire controller start`` runs :func:`run_controller`.

The controller keeps its state in ``_system`` table segments, which live
in segment containers like any segment; it reaches them, wherever their
containers are hosted, through :class:`~quire.streams.RemoteSegmentStore`
over Pravega's wire protocol, and finds a segment's owner in the ownership
records of the metadata store (the same records that ``getURI`` answers
from), so it follows containers as they move between segment stores.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from quire.controller import Controller, ControllerConfig, NodeAddress
from quire.errors import ConfigError
from quire.hosts.process import run
from quire.metadata import MetadataStore, open_leased_store
from quire.segmentstore import owner_address
from quire.streams import RemoteSegmentStore, SegmentClientConfig, metadata_resolver
from quire.streams.connection import split_address

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerHostConfig:
    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    host: str = "127.0.0.1"
    port: int = 9090
    """The gRPC port (Pravega's default; 0: any free one)."""
    metrics_port: int = -1
    """``/metrics`` (Prometheus) on this port; 0: any free one; -1: off."""
    lease_ms: int = 0
    """The metadata session's lease: the embedded drivers' lease, or
    ZooKeeper's session timeout (0: the driver's default)."""
    retention_interval_ms: int = 60_000
    """How often streams with a retention policy are truncated."""
    segment_request_timeout_ms: int = 30_000
    """How long one segment-store request may take (then its outcome is unknown)."""

    def __post_init__(self) -> None:
        if self.segment_request_timeout_ms <= 0:
            raise ConfigError("segment_request_timeout_ms must be positive")


class ControllerHost:
    """See the module docstring."""

    def __init__(self, config: ControllerHostConfig) -> None:
        self.config = config
        self.metadata: MetadataStore | None = None
        self.segments: RemoteSegmentStore | None = None
        self.controller: Controller | None = None
        self.address = ""
        self.metrics_address: str | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        try:
            self.metadata = await open_leased_store(cfg.metadata_uri, cfg.lease_ms)
            resolve = metadata_resolver(self.metadata, owner_address)

            async def locate(segment: str) -> NodeAddress:
                return split_address(await resolve(segment))

            self.segments = RemoteSegmentStore(resolve, SegmentClientConfig(
                request_timeout_ms=cfg.segment_request_timeout_ms,
                retry_deadline_ms=cfg.segment_request_timeout_ms))
            self.controller = Controller(self.segments, self._controller_config(), locate)
            port = await self.controller.start(cfg.host, cfg.port)
            self.address = f"{cfg.host}:{port}"
            if self.controller.metrics_port is not None:
                self.metrics_address = f"{cfg.host}:{self.controller.metrics_port}"
        except BaseException:
            await self.stop()
            raise

    def _controller_config(self) -> ControllerConfig:
        cfg = self.config
        return ControllerConfig(metrics_port=cfg.metrics_port,
                                retention_interval_ms=cfg.retention_interval_ms)

    async def stop(self) -> None:
        """Stop serving, then drop the segment-store connections and the
        metadata session (idempotent)."""
        if self.controller is not None:
            await self.controller.close()
            self.controller = None
        if self.segments is not None:
            await self.segments.close()
            self.segments = None
        if self.metadata is not None:
            await self.metadata.close()
            self.metadata = None
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def ready_event(self) -> dict[str, Any]:
        return {"address": self.address, "uri": f"tcp://{self.address}",
                "metrics": self.metrics_address}


def run_controller(config: ControllerHostConfig) -> None:
    """Blocking entry point of ``quire controller start``."""
    run(lambda: ControllerHost(config))
