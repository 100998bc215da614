"""The stream tier's processes: a segment store host and a controller host.

Each assembles the layers below it into one process, as
:mod:`quire.node` does for a bookie: :class:`SegmentStoreHost` is a
:class:`~quire.segmentstore.SegmentStore` (its containers' tier-1 logs on
the bookies), its part in container ownership and the Pravega wire server;
``quire segmentstore start`` runs one (:func:`run_segment_store`).
"""

from quire.hosts.segmentstore_host import (
    SegmentStoreHost,
    SegmentStoreHostConfig,
    run_segment_store,
)

__all__ = ["SegmentStoreHost", "SegmentStoreHostConfig", "run_segment_store"]
