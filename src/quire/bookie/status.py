"""Whether the bookie takes writes, and who is told when that changes."""

from __future__ import annotations

import logging
from typing import Protocol

from quire.bookie.metrics import BookieMetrics
from quire.types import BookieState

log = logging.getLogger("quire.bookie")


class StatePublisher(Protocol):
    """Where the bookie's writable/read-only state is announced (the node
    registers it in the metadata store, so that clients place no new
    ensembles on a read-only bookie).

    ``publish`` is called on the event loop's thread each time the state
    changes.  It must not block: it schedules the announcement and returns;
    a failure to announce is the publisher's to log, never the caller's."""

    def publish(self, state: BookieState) -> None: ...


class BookieStatus:
    """The bookie's read-only flag: set by a failed journal write (for good:
    the durability of what it held is unknown) or by a full ledger disk
    (until it drains below the low-water mark), or by the operator
    (:meth:`set_by_operator`, the admin API's ``readonly`` toggle: until
    the operator clears it)."""

    def __init__(self, metrics: BookieMetrics, publisher: StatePublisher) -> None:
        self._metrics = metrics
        self._publisher = publisher
        self.read_only = False
        self._journal_failed = False
        self._disk_full = False
        self.by_operator = False
        """The operator asked for read-only."""

    @property
    def state(self) -> BookieState:
        return BookieState.READ_ONLY if self.read_only else BookieState.WRITABLE

    def _set(self, read_only: bool) -> None:
        self.read_only = read_only
        self._metrics.read_only.set(1 if read_only else 0)
        self._publisher.publish(self.state)

    def journal_failed(self, error: BaseException) -> None:
        """A journal write or fsync failed: what it held has unknown
        durability, so the bookie takes no more writes."""
        self._journal_failed = True
        if not self.read_only:
            log.error("journal write failed (%s): turning read-only", error)
            self._set(True)

    def disk_used(self, fraction: float, high_water: float, low_water: float) -> None:
        """The ledger disk's used fraction: read-only above ``high_water``,
        writable again below ``low_water`` (unless the journal failed)."""
        if fraction > high_water:
            self._disk_full = True
        elif fraction < low_water:
            self._disk_full = False
        if not self.read_only and fraction > high_water:
            log.warning("ledger disk %.1f%% used: turning read-only", fraction * 100)
            self._set(True)
        elif self.read_only and fraction < low_water and not self._journal_failed \
                and not self.by_operator:
            log.info("ledger disk %.1f%% used: writable again", fraction * 100)
            self._set(False)

    def set_by_operator(self, read_only: bool) -> bool:
        """The operator's toggle: read-only now, or writable again unless
        the journal failed or the disk is full (the answer: read-only or not)."""
        self.by_operator = read_only
        if read_only and not self.read_only:
            log.warning("read-only at the operator's request")
            self._set(True)
        elif not read_only and self.read_only and not self._journal_failed \
                and not self._disk_full:
            log.info("writable again at the operator's request")
            self._set(False)
        return self.read_only
