"""BP-62 batched reads on the client: one request, many entries.

:func:`batch_read` follows the BP's loose limits: it returns 1 to
``max_count`` entries in order from ``start``, never past ``last_allowed``
(the LAC, or a closed ledger's last entry; anything a bookie sends beyond it
is dropped), and exceeds ``max_size`` only because of the first entry.  A
short batch says nothing about the next entry: callers just ask again from
where it ended.

Which bookie: the replicas of ``start``'s write set, healthy ones first.  An
error, a timeout, a NO_SUCH_ENTRY (a bookie that missed the add when A < W),
or a bad digest on the first entry moves to the next replica; a bad digest
later in a batch returns the verified prefix.  A bookie that answers
UNSUPPORTED (an old bookie, or ``batch_read_enabled = false``) is remembered
and read entry by entry from then on.  Striped ledgers (ensemble > write
quorum) have no bookie holding a run of entries, so they are read entry by
entry too (BP-62, "Not supporting striped Ledger"), as is everything when
the client's ``batch_read_enabled`` is off.
"""

from __future__ import annotations

from quire.client.context import ClientContext
from quire.client.reads import LedgerEntry, ReplicaLookup, ledger_entries, read_range
from quire.errors import QuireError, UnsupportedError
from quire.protocol import DigestManager, batch_read_room

_FALLBACK_WINDOW = 64
"""Entries read per entry-by-entry fallback call (pipelined)."""


def _trim_to_size(entries: list[LedgerEntry], max_size: int) -> list[LedgerEntry]:
    total = 0
    for i, entry in enumerate(entries):
        total += len(entry.data)
        if i and total > max_size:
            return entries[:i]
    return entries


async def batch_read(ctx: ClientContext, digest: DigestManager, replicas: ReplicaLookup,
                     start: int, max_count: int, max_size: int, last_allowed: int, *,
                     batchable: bool, fragment_end: int) -> list[LedgerEntry]:
    """Entries from ``start`` (which must be <= ``last_allowed``); see the
    module docstring.  ``fragment_end`` is the last entry of ``start``'s
    fragment (a batch never crosses an ensemble change); ``batchable`` is
    False for striped fragments."""
    last = min(last_allowed, fragment_end)
    if max_count > 0:
        last = min(last, start + max_count - 1)
    max_size = batch_read_room(ctx.config.max_frame_bytes, ctx.config.batch_read_max_bytes,
                               max_size)
    if batchable and ctx.config.batch_read_enabled:
        for bookie in replicas(start):
            if bookie in ctx.batch_unsupported:
                continue
            entries = await _from_bookie(ctx, digest, bookie, start, last, max_size)
            if entries:
                return entries
    # entry by entry: a window, trimmed to the size limit (the first is kept)
    window_last = min(last, start + _FALLBACK_WINDOW - 1)
    return _trim_to_size(await read_range(ctx, digest, replicas, start, window_last), max_size)


async def _from_bookie(ctx: ClientContext, digest: DigestManager, bookie: str, start: int,
                       last: int, max_size: int) -> list[LedgerEntry] | None:
    """One BATCH_READ_ENTRY to ``bookie``: the verified entries, or None to
    try elsewhere."""
    try:
        answer = await ctx.pool.client(bookie).batch_read(
            digest.ledger_id, start, last - start + 1, max_size, ctx.read_timeout_s)
    except UnsupportedError:
        ctx.batch_unsupported.add(bookie)
        return None
    except QuireError:
        return None
    # anything beyond the LAC (or the count asked for) is dropped; a digest
    # failure ends the batch at the verified prefix, possibly empty
    return ledger_entries(start, digest.verify_records(answer.records, start,
                                                      last - start + 1)) or None

