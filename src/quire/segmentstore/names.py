"""Segment names and the containers they belong to.

A segment's container is a stable hash of its *primary* name, so a
segment, its attribute segment (``<segment>$attributes``), its table index
(``<segment>$index``), its transaction segments
(``<segment>#transaction.<id>``) and its transient segments
(``<segment>#transient.<id>``) all land in one container, in every process
and every run (blake2b, not Python's salted ``hash``).  As in Pravega, a
stream segment's epoch is not part of it (``scope/stream/3.#epoch.7`` is
hashed as ``scope/stream/3``): the segments of one number in every epoch,
the duplicates a rolling transaction creates among them, share the
container of the transaction segments merged into them.
"""

from __future__ import annotations

import hashlib

ATTRIBUTES_SUFFIX = "$attributes"
INDEX_SUFFIX = "$index"
TRANSACTION_DELIMITER = "#transaction."
TRANSIENT_DELIMITER = "#transient."
EPOCH_DELIMITER = ".#epoch."
SYSTEM_SCOPE = "_system"
CONTAINER_COUNT_KEY = "segmentstore/container_count"
"""The metadata record holding the cluster's container count (fixed once set)."""


def base_segment_name(name: str) -> str:
    """The segment ``name`` belongs with (itself for a plain segment)."""
    for suffix in (ATTRIBUTES_SUFFIX, INDEX_SUFFIX):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    for delimiter in (TRANSACTION_DELIMITER, TRANSIENT_DELIMITER):
        at = name.find(delimiter)
        if at > 0:
            name = name[:at]
    return name


def primary_segment_name(name: str) -> str:
    """``name``'s base name without a stream segment's epoch."""
    base = base_segment_name(name)
    at = base.rfind(EPOCH_DELIMITER)
    return base[:at] if at > 0 else base


def container_of(name: str, container_count: int) -> int:
    """The id (0 .. container_count - 1) of the container holding ``name``."""
    digest = hashlib.blake2b(primary_segment_name(name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % container_count


def container_log_name(container_id: int) -> str:
    """The named log that is container ``container_id``'s tier-1 log."""
    return f"_segmentstore.container-{container_id}"
