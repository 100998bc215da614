"""BP-14 sync cursor: what a bookie knows to be persisted of one VD ledger.

A VD_JOURNAL add is acknowledged before its journal fsync, so the bookie
tracks separately which entries are durable:

* ``candidate``: the highest entry id such that every entry up to it has
  been fsynced here (by a journal fsync, or a checkpoint's entry-log
  fsync), or is at or below a LastAddConfirmed the writer
  piggy-backed (the LAC means "persisted on an ack quorum", BP-14);
* ``ahead``: entry ids fsynced out of order above ``candidate + 1``
  (BP-14's "list of entry id ranges"), folded in as the gap closes;
* ``reported``: the LastAddSynced the bookie may tell clients.  It only
  moves to a candidate once a journal record holding that candidate is
  itself durable, so after any restart (clean, ``kill -9`` or power loss)
  the bookie never reports less than it reported before.  This is where
  Quire departs from upstream, which dropped BP-14's cursor because it could
  not be rebuilt.

The cursor is pure bookkeeping: the server feeds it fsync results and LACs
and persists ``encode(candidate)`` through the storage engine.
"""

from __future__ import annotations

import struct
from collections import deque

_FORMAT_VERSION = 1
_CURSOR = struct.Struct(">Bq")


def encode_cursor(last_add_synced: int) -> bytes:
    return _CURSOR.pack(_FORMAT_VERSION, last_add_synced)


def decode_cursor(data: bytes) -> int:
    """The persisted LastAddSynced (-1 for an empty or unknown blob)."""
    if len(data) != _CURSOR.size or data[0] != _FORMAT_VERSION:
        return -1
    return int(_CURSOR.unpack(data)[1])


class SyncCursor:
    __slots__ = (
        "ahead",
        "candidate",
        "persist_seq",
        "persisted_request",
        "reported",
        "unsynced_ids",
        "unsynced_seqs",
    )

    def __init__(self, last_add_synced: int = -1) -> None:
        self.reported = last_add_synced
        self.candidate = last_add_synced
        self.persisted_request = last_add_synced
        """Highest candidate already journaled (durable or on its way)."""
        self.persist_seq = 0
        """Journal seq of the latest cursor record (0: none pending)."""
        self.ahead: set[int] = set()
        self.unsynced_seqs: deque[int] = deque()
        self.unsynced_ids: deque[int] = deque()
        """Journal seq and entry id of each add not yet covered by an fsync,
        side by side: two deques of ints, not one of tuples, because a VD
        ledger never synced piles up every add here until a checkpoint, and
        the garbage collector walks tuples, not ints."""

    def has_unsynced_through(self, durable_seq: int) -> bool:
        """Whether an fsync through ``durable_seq`` covers a noted add."""
        seqs = self.unsynced_seqs
        return bool(seqs) and seqs[0] <= durable_seq

    def learn(self, adds: list[tuple[int, int, int]]) -> bool:
        """Note a run of adds in arrival order, as ``(journal seq, entry id,
        piggy-backed LAC)``: each add above the candidate waits for an fsync,
        and the highest LAC is :meth:`confirmed`; return True if the
        candidate moved.  An add at or below a LAC of the same run is still
        noted as unsynced: harmless, :meth:`synced_through` skips it."""
        candidate = self.candidate
        note_seq, note_id = self.unsynced_seqs.append, self.unsynced_ids.append
        top_lac = -1
        for seq, entry_id, lac in adds:
            if entry_id > candidate:
                note_seq(seq)
                note_id(entry_id)
            if lac > top_lac:
                top_lac = lac
        return self.confirmed(top_lac)

    def _advance(self) -> None:
        ahead = self.ahead
        while self.candidate + 1 in ahead:
            self.candidate += 1
            ahead.discard(self.candidate)

    def synced_through(self, durable_seq: int) -> bool:
        """Every add with journal seq <= ``durable_seq`` is fsynced; return
        True if the candidate moved."""
        before = candidate = self.candidate
        seqs, ahead = self.unsynced_seqs, self.ahead
        pop_seq, pop_id = seqs.popleft, self.unsynced_ids.popleft
        while seqs and seqs[0] <= durable_seq:
            pop_seq()
            entry_id = pop_id()
            if entry_id == candidate + 1:  # in order, the usual case: no set
                candidate = entry_id
            elif entry_id > candidate:
                ahead.add(entry_id)
        self.candidate = candidate
        if ahead:
            self._advance()
        return self.candidate != before

    def confirmed(self, lac: int) -> bool:
        """The writer says entries up to ``lac`` are persisted on an ack
        quorum; return True if the candidate moved."""
        if lac <= self.candidate:
            return False
        self.candidate = lac
        self.ahead = {e for e in self.ahead if e > lac}
        self._advance()
        return True

    def needs_persisting(self) -> bool:
        return self.candidate > self.persisted_request

    def persisted(self, value: int) -> None:
        """A cursor record holding ``value`` is durable: it may be reported."""
        if value > self.reported:
            self.reported = value
