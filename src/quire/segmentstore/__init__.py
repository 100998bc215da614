"""The segment store (Pravega's model): segments in containers on tier-1 logs.

::

    from quire.segmentstore import SegmentStore, SegmentType, AttributeUpdate, UpdateType
    store = await SegmentStore.open(client, container_ids=range(4))
    await store.create_segment("sc/st/0.#epoch.0", SegmentType.STREAM)
    r = await store.append("sc/st/0.#epoch.0", b"event", writer=(writer_id, 1))
    data = await store.read("sc/st/0.#epoch.0", 0, 1024, wait_ms=0)

Modules, each importing only those listed before it:

* :mod:`~quire.segmentstore.types` -- public value types;
  :mod:`~quire.segmentstore.names` -- names and their containers;
* :mod:`~quire.segmentstore.operations` -- the log's operations and codec;
  :mod:`~quire.segmentstore.frames` -- many operations per tier-1 record;
  :mod:`~quire.segmentstore.futures` -- helpers for the store's futures;
* :mod:`~quire.segmentstore.metadata` -- container metadata, checkpoints;
* :mod:`~quire.segmentstore.operation_log` -- operations to frames to the
  :class:`~quire.log.DurableDataLog`, acknowledged once durable, and when
  to checkpoint;
  :mod:`~quire.segmentstore.read_index` -- committed data in memory;
  :mod:`~quire.segmentstore.tables` -- table segments' entries and index;
* :mod:`~quire.segmentstore.container_tables` -- a container's table
  requests and indexes;
* :mod:`~quire.segmentstore.committed_side` -- a container's committed
  state: replay, commits, checkpoints in the log, its truncation;
* :mod:`~quire.segmentstore.container` -- one container;
* :mod:`~quire.segmentstore.storage_records` -- codecs of the tier-2
  attribute and index batches and system-journal snapshots;
* :mod:`~quire.segmentstore.tier2_reader` -- what tier-2 alone records
  (:func:`read_layout`, :func:`read_records`, :class:`Tier2Reader`);
* :mod:`~quire.segmentstore.writer_source` -- :class:`WriterSource`, all a
  storage writer sees of its container;
  :mod:`~quire.segmentstore.recorded_layouts` -- the layouts a writer
  records, its system journal;
  :mod:`~quire.segmentstore.flush_plan` -- which segments an iteration takes;
* :mod:`~quire.segmentstore.storage_writer` -- a container's flushes to
  tier-2 in PDP-40's order;
* :mod:`~quire.segmentstore.store` -- :class:`SegmentStore`, routing;
* :mod:`~quire.segmentstore.tier2_check` -- PDP-40's consistency check of
  tier-2 alone; :mod:`~quire.segmentstore.disaster_recovery` -- every
  container rebuilt from tier-2 alone onto fresh tier-1 logs.
"""

import importlib
from typing import TYPE_CHECKING, Any

from quire.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerClosedError,
    ContainerFencedError,
    ContainerNotOwnedError,
    CorruptRecordError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.segmentstore.tables import NOT_EXISTS, TableDelta, TableEntry, TableIteratorPage
from quire.segmentstore.types import (
    NULL_ATTRIBUTE_VALUE,
    AppendResult,
    AttributeUpdate,
    MergeResult,
    ReadResult,
    SegmentInfo,
    SegmentType,
    UpdateType,
)

if TYPE_CHECKING:
    from quire.segmentstore.container import ContainerConfig, SegmentContainer
    from quire.segmentstore.ownership import ContainerOwnership, OwnershipSettings, owner_address
    from quire.segmentstore.store import SegmentStore, SegmentStoreConfig

_LAZY = {
    "ContainerConfig": "container", "SegmentContainer": "container",
    "ContainerOwnership": "ownership", "OwnershipSettings": "ownership",
    "owner_address": "ownership",
    "SegmentStore": "store", "SegmentStoreConfig": "store",
}
"""Names loaded on first use (PEP 562): the container and the store bring in
the ledger client and the log layer, which a user of the value types (the
stream client, the Spark data source's planner and tasks) does not need."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'quire.segmentstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"quire.segmentstore.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "NOT_EXISTS",
    "NULL_ATTRIBUTE_VALUE",
    "AppendResult",
    "AttributeUpdate",
    "BadAttributeUpdateError",
    "BadOffsetError",
    "ContainerClosedError",
    "ContainerConfig",
    "ContainerFencedError",
    "ContainerNotOwnedError",
    "ContainerOwnership",
    "CorruptRecordError",
    "MergeResult",
    "OwnershipSettings",
    "ReadResult",
    "SegmentContainer",
    "SegmentExistsError",
    "SegmentInfo",
    "SegmentNotFoundError",
    "SegmentSealedError",
    "SegmentStore",
    "SegmentStoreConfig",
    "SegmentStoreError",
    "SegmentTruncatedError",
    "SegmentType",
    "TableDelta",
    "TableEntry",
    "TableIteratorPage",
    "TableKeyBadVersionError",
    "TableKeyNotFoundError",
    "UpdateType",
    "owner_address",
]
