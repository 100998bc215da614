"""A writer's changes to its ledger's metadata: compare-and-set with the
rules of who may still write (:func:`update_ledger_metadata`), the fragment
list of an ensemble change (:func:`with_fragment`) and the close
(:func:`closing_change`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quire.client.context import ClientContext
from quire.errors import (
    LedgerFencedError,
    MetadataError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from quire.metadata import LedgerMetadata, Versioned
from quire.metadata.model import Ensembles
from quire.types import LedgerState

Fragment = tuple[int, tuple[str, ...]]
"""(first entry id, ensemble) of one fragment."""


def with_fragment(ensembles: Ensembles, first: int, bookies: tuple[str, ...]) -> Ensembles:
    """``ensembles`` with a fragment ``bookies`` from ``first`` on (replacing the
    last fragment when it starts at ``first``: it holds no entry yet)."""
    last_first = ensembles[-1][0]
    if first == last_first:
        return (*ensembles[:-1], (first, bookies))
    if first < last_first:
        raise AssertionError(f"new fragment at {first} before the last one at {last_first}")
    return (*ensembles, (first, bookies))


def closing_change(last: int, length: int, fragments: list[Fragment]
                   ) -> Callable[[LedgerMetadata], LedgerMetadata]:
    """The metadata change that closes the ledger at entry ``last`` with
    ``length`` bytes, recording ``fragments`` (a recovery's ensemble changes,
    recorded only with its close: see :mod:`quire.client.ensemble_change`)."""
    def closed(md: LedgerMetadata) -> LedgerMetadata:
        ensembles = md.ensembles
        for first, bookies in fragments:
            ensembles = with_fragment(ensembles, first, bookies)
        return md.with_(ensembles=ensembles, state=LedgerState.CLOSED, last_entry_id=last,
                        length=length)
    return closed


async def update_ledger_metadata(
        ctx: ClientContext, ledger_id: int, current: Versioned[LedgerMetadata],
        change: Callable[[LedgerMetadata], LedgerMetadata], *, expected_state: LedgerState,
        adopt: Callable[[LedgerMetadata], bool] | None = None) -> Versioned[LedgerMetadata]:
    """Compare-and-set ``change(metadata)`` from ``current``.  On a version
    conflict, re-read: metadata that ``adopt`` (if given) accepts is returned
    as is; metadata that is no longer the writer's (state other than
    ``expected_state``, or fragments changed by someone else) raises
    LedgerFencedError; otherwise retry on the new version.  A store error
    leaves the outcome unknown: re-read and compare before retrying."""
    store = ctx.store
    attempts = 0
    while True:
        candidate = change(current.value)
        try:
            return await store.write_ledger(ledger_id, candidate, current.version)
        except MetadataVersionError:
            fresh = await store.read_ledger(ledger_id)
        except MetadataNotFoundError:
            raise
        except MetadataError:
            attempts += 1
            if attempts >= ctx.config.metadata_max_attempts:
                raise
            await asyncio.sleep(0.05 * attempts)
            try:
                fresh = await store.read_ledger(ledger_id)
            except MetadataNotFoundError:
                raise
            except MetadataError:
                continue
            if fresh.value == candidate:
                return fresh  # the write landed before the error
        if adopt is not None and adopt(fresh.value):
            return fresh
        _check_still_ours(ledger_id, fresh.value, current.value, expected_state)
        current = fresh


def _check_still_ours(ledger_id: int, fresh: LedgerMetadata, ours: LedgerMetadata,
                      expected_state: LedgerState) -> None:
    if fresh.state is not expected_state:
        raise LedgerFencedError(
            f"ledger {ledger_id} is {fresh.state.value}: another client is "
            "recovering or has closed it")
    if fresh.ensembles != ours.ensembles:
        raise LedgerFencedError(f"ledger {ledger_id}: another client changed its fragments")
