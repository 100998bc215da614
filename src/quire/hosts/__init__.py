"""The stream tier's processes: a segment store host and a controller host.

Each assembles the layers below it into one process, as
:mod:`quire.node` does for a bookie: :class:`SegmentStoreHost` is a
:class:`~quire.segmentstore.SegmentStore` (its containers' tier-1 logs on
the bookies), its part in container ownership and the Pravega wire server;
``quire segmentstore start`` runs one (:func:`run_segment_store`).
:class:`ControllerHost` is the gRPC controller, reaching its ``_system``
tables and the streams' segments in whatever segment store hosts them;
``quire controller start`` runs it (:func:`run_controller`).
"""

from quire.hosts.controller_host import ControllerHost, ControllerHostConfig, run_controller
from quire.hosts.segmentstore_host import (
    SegmentStoreHost,
    SegmentStoreHostConfig,
    run_segment_store,
)

__all__ = [
    "ControllerHost",
    "ControllerHostConfig",
    "SegmentStoreHost",
    "SegmentStoreHostConfig",
    "run_controller",
    "run_segment_store",
]
