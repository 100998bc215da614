"""How the previous run of a bookie's storage ended (BP-46 unclean-shutdown
detection).

The engine keeps a *running mark* in the index (``meta`` key ``running``,
see :mod:`~quire.bookie.storage.index`): committed durably when the engine
opens, recording whether that run writes add data to the journal, and
deleted durably as the very last step of a clean close, after the final
checkpoint and the journal's last sync.  A crash at any earlier point leaves
the mark in place, so finding it at open means the last shutdown was not
clean.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ShutdownKind(enum.Enum):
    FIRST_START = "first-start"
    """The index was created by this open: there was no previous run."""
    CLEAN = "clean"
    """The previous run closed cleanly (final checkpoint, then mark cleared)."""
    UNCLEAN = "unclean"
    """The previous run crashed or was killed: its running mark is still set."""


@dataclass(frozen=True, slots=True)
class LastShutdown:
    """What the engine found at open about the run before it."""

    kind: ShutdownKind
    crashed_run_journal_write_data: bool | None = None
    """For UNCLEAN: whether the run that crashed wrote adds to the journal
    (False means acknowledged entries may be lost).  None otherwise."""

    @property
    def unclean(self) -> bool:
        return self.kind is ShutdownKind.UNCLEAN

    @property
    def may_have_lost_acknowledged_entries(self) -> bool:
        """True when BP-46's phase one must run: the previous run crashed
        while acknowledging adds that only the write cache held."""
        return self.kind is ShutdownKind.UNCLEAN and self.crashed_run_journal_write_data is False

    def describe(self) -> str:
        if self.kind is ShutdownKind.UNCLEAN:
            mode = "on" if self.crashed_run_journal_write_data else "off"
            return f"unclean (the run that crashed had journal_write_data {mode})"
        return str(self.kind.value)

    @classmethod
    def from_mark(cls, mark: bool | None, *, index_created: bool) -> LastShutdown:
        """From the index's running mark as found at open (before this run
        sets its own)."""
        if mark is not None:
            return cls(ShutdownKind.UNCLEAN, mark)
        return cls(ShutdownKind.FIRST_START if index_created else ShutdownKind.CLEAN)
