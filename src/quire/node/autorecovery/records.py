"""What autorecovery keeps in the metadata store.

=====================================================  ==========================
key                                                    value
=====================================================  ==========================
``autorecovery/underreplicated/<ledger id, 20 digits>``  JSON :class:`UnderReplicated`
``autorecovery/locks/<ledger id, 20 digits>``            worker id (a leased record:
                                                       it ends with the worker's
                                                       lease, so a worker that dies
                                                       leaves the ledger to others)
``autorecovery/auditor``                               the auditor's election
=====================================================  ==========================

A ledger is marked once, with the set of bookies to replace in its
ensembles: *lost* ones (gone from the registry; never read from) and
*leaving* ones (being decommissioned while still up; read from like any
replica).  Marking again merges the sets.  The mark is deleted by the worker
that finished the ledger, only after the ensembles no longer name any of
them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from quire.errors import MetadataError, MetadataExistsError, MetadataNotFoundError
from quire.metadata import MetadataStore

UNDERREPLICATED = "autorecovery/underreplicated/"
LOCKS = "autorecovery/locks/"
AUDITOR_GROUP = "autorecovery/auditor"


def _key(prefix: str, ledger_id: int) -> str:
    return f"{prefix}{ledger_id:020d}"


def ledger_of(key: str) -> int:
    return int(key.rpartition("/")[2])


@dataclass(frozen=True)
class UnderReplicated:
    """One marked ledger."""

    ledger_id: int
    lost: frozenset[str] = field(default_factory=frozenset)
    leaving: frozenset[str] = field(default_factory=frozenset)
    marked_ms: int = 0
    """When it was first marked (wall clock, ms): the grace period of an
    open ledger runs from here."""

    @property
    def bookies(self) -> frozenset[str]:
        return self.lost | self.leaving

    def to_bytes(self) -> bytes:
        return json.dumps({"lost": sorted(self.lost), "leaving": sorted(self.leaving),
                           "marked_ms": self.marked_ms}).encode()

    @classmethod
    def from_bytes(cls, ledger_id: int, data: bytes) -> UnderReplicated:
        try:
            raw = json.loads(data)
            return cls(ledger_id, frozenset(raw["lost"]), frozenset(raw["leaving"]),
                       int(raw["marked_ms"]))
        except (ValueError, KeyError, TypeError) as e:
            raise MetadataError(f"unreadable under-replication mark of ledger {ledger_id}: "
                                f"{e}") from e

    def merged(self, other: UnderReplicated) -> UnderReplicated:
        return UnderReplicated(self.ledger_id, self.lost | other.lost,
                               (self.leaving | other.leaving) - (self.lost | other.lost),
                               min(self.marked_ms, other.marked_ms) or self.marked_ms)


class UnderReplication:
    """The marks and locks, over a metadata store."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def mark(self, mark: UnderReplicated) -> None:
        """Mark the ledger, merging with a mark already there."""
        key = _key(UNDERREPLICATED, mark.ledger_id)
        for _ in range(10):
            try:
                await self._store.create_record(key, mark.to_bytes())
                return
            except MetadataExistsError:
                pass
            try:
                current = await self._store.read_record(key)
            except MetadataNotFoundError:
                continue
            merged = UnderReplicated.from_bytes(mark.ledger_id, current.value).merged(mark)
            try:
                await self._store.write_record(key, merged.to_bytes(), current.version)
                return
            except MetadataError:
                continue
        raise MetadataError(f"ledger {mark.ledger_id}: its mark kept changing")

    async def marked(self) -> list[int]:
        """The marked ledgers, in id order."""
        return [ledger_of(k) for k in await self._store.list_records(UNDERREPLICATED)]

    async def read(self, ledger_id: int) -> UnderReplicated | None:
        try:
            record = await self._store.read_record(_key(UNDERREPLICATED, ledger_id))
        except MetadataNotFoundError:
            return None
        return UnderReplicated.from_bytes(ledger_id, record.value)

    async def unmark(self, ledger_id: int) -> None:
        with contextlib.suppress(MetadataNotFoundError):
            await self._store.delete_record(_key(UNDERREPLICATED, ledger_id))

    async def lock(self, ledger_id: int, worker_id: str) -> bool:
        """Take the ledger's lock (leased); False if another worker holds it."""
        try:
            await self._store.create_leased_record(_key(LOCKS, ledger_id), worker_id.encode())
            return True
        except MetadataExistsError:
            return False

    async def unlock(self, ledger_id: int) -> None:
        with contextlib.suppress(MetadataNotFoundError):
            await self._store.delete_record(_key(LOCKS, ledger_id))

    async def holder(self, ledger_id: int) -> str | None:
        try:
            return (await self._store.read_record(_key(LOCKS, ledger_id))).value.decode()
        except MetadataNotFoundError:
            return None
