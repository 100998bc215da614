"""Ensemble change: a writer replaces the bookies that failed its adds.

A bookie that fails an add (any error but FENCED / UNAUTHORIZED), times out
or drops its connection is replaced: a new fragment from LAC+1 (or the last
fragment rewritten in place if it starts there) is written by
compare-and-set, then every pending add whose write set holds a replaced
bookie is sent to its replacement (an OK from the replaced bookie no longer
counts); no error reaches the caller.  Completions wait while an ensemble
change is in progress, so the LAC never passes the fragment boundary being
written.  A bookie that failed once is never chosen again by the same writer.

Ledgers that are not PD_JOURNAL refuse ensemble changes (BP-14), except in
recovery.  A recovery keeps its changes local until its close records them
with the ledger's end (see :meth:`EnsembleChange.replace`).

:class:`EnsembleChange` keeps the failures and chooses and records the new
ensemble; its :class:`~quire.client.write_handle.WriteHandle` runs one change
at a time and moves its pending adds to the new ensemble.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from quire.client.context import ClientContext
from quire.client.ledger_metadata import Fragment, with_fragment
from quire.errors import EnsembleChangeRefusedError, NotEnoughBookiesError
from quire.metadata import LedgerMetadata, Versioned
from quire.types import LedgerType

log = logging.getLogger("quire.client")

MetadataUpdate = Callable[[Callable[[LedgerMetadata], LedgerMetadata]],
                          Awaitable[Versioned[LedgerMetadata]]]
"""The writer's compare-and-set of a change to its ledger's metadata."""


class EnsembleChange:
    """The failed bookies of one writer of ledger ``ledger_id`` (of type
    ``ledger_type``; ``recovery``: the writer of a recovery) and their
    replacement."""

    def __init__(self, ctx: ClientContext, ledger_id: int, ledger_type: LedgerType, *,
                 recovery: bool) -> None:
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._ledger_type = ledger_type
        self._recovery = recovery
        self.failed: dict[int, str] = {}
        """Ensemble index -> the bookie there that failed and is not replaced yet."""
        self._ever_failed: set[str] = set()
        self._recovery_fragments: list[Fragment] = []
        """Recovery: the changes made while writing back, recorded only with
        the close."""

    def note_failed(self, index: int, bookie: str, reason: str) -> bool:
        """``bookie``, at ``index`` of the current ensemble, failed (``reason``);
        False if that index is already waiting for its replacement."""
        if index in self.failed:
            return False
        log.info("ledger %d: bookie %s failed (%s); replacing it", self._ledger_id, bookie,
                 reason)
        self.failed[index] = bookie
        return True

    async def replace(self, ensemble: tuple[str, ...], first: int, update: MetadataUpdate
                      ) -> tuple[tuple[str, ...], dict[int, str],
                                 Versioned[LedgerMetadata] | None]:
        """Replace the failed bookies of ``ensemble`` for the entries from
        ``first`` on, the new fragment written to the metadata by ``update``.
        Returns the new ensemble, the bookies it replaced (by index) and the
        metadata written (None in recovery: kept for the close).
        EnsembleChangeRefusedError for a ledger that is not PD_JOURNAL,
        NotEnoughBookiesError if no writable bookie is left, and what
        ``update`` raises."""
        failed = dict(self.failed)
        if self._ledger_type is not LedgerType.PD_JOURNAL and not self._recovery:
            raise EnsembleChangeRefusedError(
                f"ledger {self._ledger_id} ({self._ledger_type.value}) cannot replace failed "
                f"bookie(s) {', '.join(failed.values())}: ensemble changes are disabled for "
                "ledgers that are not PD_JOURNAL")
        exclude = self._ever_failed | set(failed.values())
        try:
            new = self._choose_replacements(ensemble, failed, exclude)
        except NotEnoughBookiesError:
            await self._ctx.pool.refresh()
            new = self._choose_replacements(ensemble, failed, exclude)
        if self._recovery:
            # Kept local until the close records it with the ledger's end, as
            # BookKeeper's recovery does.  Written now, it would say that
            # entries from ``first`` on live on bookies that do not hold
            # them yet; if this recovery then failed, the next one would read
            # there, be told "no such entry" and close the ledger short of
            # entries that were acknowledged (found by the simulator, seed 5702).
            self._recovery_fragments.append((first, new))
            versioned = None
            log.info("ledger %d: recovery writes entries from %d to %s (recorded with the "
                     "close)", self._ledger_id, first, ", ".join(new))
        else:
            versioned = await update(
                lambda md: md.with_(ensembles=with_fragment(md.ensembles, first, new)))
            log.info("ledger %d: ensemble from entry %d is now %s", self._ledger_id, first,
                     ", ".join(new))
        for index, bookie in failed.items():
            if self.failed.get(index) == bookie:
                del self.failed[index]
            self._ever_failed.add(bookie)
        return new, failed, versioned

    def _choose_replacements(self, ensemble: tuple[str, ...], failed: dict[int, str],
                             exclude: set[str]) -> tuple[str, ...]:
        writable = self._ctx.pool.writable_bookies()
        chosen = list(ensemble)
        for index in sorted(failed):
            chosen[index] = self._ctx.placement.replace_bookie(chosen, writable, exclude)
        return tuple(chosen)

    def recovery_fragments(self, last: int) -> list[Fragment]:
        """A recovery's changes of the entries up to ``last``, for the close
        to record (none for a writer that is not a recovery's)."""
        return [(first, bookies) for first, bookies in self._recovery_fragments
                if first <= last]
