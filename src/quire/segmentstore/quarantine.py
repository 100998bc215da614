"""Quarantine: a user segment tier-2 refuses for good, set aside so the rest flows.

A storage writer retries a failed flush for as long as its container is
owned; a segment that tier-2 *refuses* (a definite, non-transient answer,
:class:`~quire.errors.Tier2RefusedError`: an S3 access denial or invalid
key under its name, a file system refusing its path) would hold back every
later flush of the container (PDP-40 flushes user segments before system
ones) and tier-1 would never be truncated again.  So once a user segment's
flush has been refused ``quarantine_after_refusals`` times in a row, and a
probe chunk under the segment's quarantine path (:func:`quarantine_path`)
is accepted (so the refusal is the segment's, not all of tier-2's), the
writer quarantines it:

* the container marks it (:data:`~quire.segmentstore.types.QUARANTINED_ATTRIBUTE`,
  a durable attribute, so a reopened or recovered container knows) and
  seals it: new appends are refused with
  :class:`~quire.errors.SegmentQuarantinedError`, every byte acknowledged
  stays;
* its chunks from then on are written under its quarantine path,
  ``_system/containers/quarantine_<container>/<segment id>`` (the layout
  keeps its real name), so its tier-1 bytes reach tier-2 and stop holding
  back the container: the rest keeps flushing and tier-1 keeps being
  truncated;
* it is reported: ``quire segmentstore status`` and the segment store's
  ``/health`` name it, with its cause, and the writer logs it.

System and container-metadata segments are never quarantined (the
controller's tables live there): a refusal of one keeps the container
degraded and retrying.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from quire.segmentstore.names import SYSTEM_SCOPE

log = logging.getLogger("quire.segmentstore.storage_writer")


def quarantine_path(container_id: int, segment_id: int) -> str:
    """The name tier-2 chunks of quarantined segment ``segment_id`` are named after."""
    return f"{SYSTEM_SCOPE}/containers/quarantine_{container_id}/{segment_id}"


@dataclass(frozen=True)
class Quarantined:
    """A quarantined segment, as the status shows it."""

    segment: str
    segment_id: int
    since_ms: int
    cause: str


class QuarantineWatch:
    """Counts each user segment's refusals in a row (see the module docstring)."""

    def __init__(self, after_refusals: int) -> None:
        self.after_refusals = after_refusals
        self._refusals: dict[str, int] = {}
        self.quarantined: dict[str, Quarantined] = {}
        """Quarantined segments by name."""

    def refused(self, segment: str) -> bool:
        """Note a refusal of ``segment``'s flush; whether it is due for quarantine."""
        count = self._refusals.get(segment, 0) + 1
        self._refusals[segment] = count
        return count >= self.after_refusals and segment not in self.quarantined

    def flushed(self, segment: str) -> None:
        """``segment`` was flushed: its refusals in a row start again."""
        self._refusals.pop(segment, None)

    def add(self, found: Quarantined, quiet: bool = False) -> None:
        self._refusals.pop(found.segment, None)
        if found.segment not in self.quarantined and not quiet:
            log.error("segment %r quarantined: %s; it is sealed and refuses appends, its bytes "
                      "go to tier-2 under its quarantine path", found.segment, found.cause)
        self.quarantined[found.segment] = found

    def probe_failed(self, segment: str, cause: str) -> None:
        """Tier-2 refused the quarantine path too: the refusal is not
        ``segment``'s own, so it is not quarantined (tried again later)."""
        self._refusals[segment] = 0
        log.warning("segment %r: tier-2 refuses its quarantine path too (%s): not "
                    "quarantined, the container stays degraded", segment, cause)

    def forget(self, segment: str) -> None:
        """``segment`` was deleted."""
        self.quarantined.pop(segment, None)
        self._refusals.pop(segment, None)
