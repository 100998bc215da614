"""The ``zk://`` driver's znode layout, and its transaction ops as kazoo
requests.

Layout under the chroot (versions are the znodes' ``stat.version``)::

    /ledgers/<ledger id, 10+ digits>   serialized LedgerMetadata
    /idgen/id-<sequence>               short-lived sequential nodes: ledger ids
    /bookies/available/<bookie id>     ephemeral, JSON BookieInfo
    /cookies/<bookie id>               cookie bytes
    /records/<key>/.value              a record's value; the key's segments are
                                       nested znodes, so a key may have sub-keys
                                       and no children list holds a whole log;
                                       ephemeral for a leased record
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quire.metadata import _names
from quire.metadata.model import (
    CheckRecord,
    CreateLedger,
    CreateRecord,
    DeleteLedger,
    DeleteRecord,
    Op,
    UpdateLedger,
    UpdateRecord,
    serialize,
)

VALUE = ".value"
"""Name of the znode holding a record's value (key segments never start with '.')."""
ANY_VERSION = -1
_TOP_LEVEL = ("ledgers", "idgen", "bookies/available", "cookies", "records")


@dataclass(frozen=True)
class Znodes:
    """The paths of the layout under one chroot (``root``: ``""`` or
    ``"/a/b"``)."""

    root: str

    def top_level(self) -> list[str]:
        """The parents every store needs (created at open)."""
        return [f"{self.root}/{path}" for path in _TOP_LEVEL]

    def own_roots(self) -> list[str]:
        """The tops of the znodes Quire owns: the chroot, or without one
        the layout's top-level nodes (``/`` is ZooKeeper's)."""
        if self.root:
            return [self.root]
        return list(dict.fromkeys(f"/{path.partition('/')[0]}" for path in _TOP_LEVEL))

    @property
    def above_root(self) -> str:
        """The chroot's parent (``""``: none to make, the chroot is ``/``'s child or absent)."""
        return self.root.rpartition("/")[0]

    @property
    def ledgers(self) -> str:
        return f"{self.root}/ledgers"

    def ledger(self, ledger_id: int) -> str:
        return f"{self.root}/ledgers/{_names.ledger_name(ledger_id)}"

    @property
    def ledger_id_prefix(self) -> str:
        """Where sequential nodes numbering new ledger ids are created."""
        return f"{self.root}/idgen/id-"

    def record_dir(self, key: str) -> str:
        """The znode of ``key``'s last segment (``""``: the records' top)."""
        return f"{self.root}/records/{key}" if key else f"{self.root}/records"

    def record(self, key: str) -> str:
        """The znode holding ``key``'s value."""
        return f"{self.record_dir(key)}/{VALUE}"

    @property
    def cookies(self) -> str:
        return f"{self.root}/cookies"

    def cookie(self, bookie_id: str) -> str:
        return f"{self.root}/cookies/{bookie_id}"

    @property
    def bookies(self) -> str:
        return f"{self.root}/bookies/available"

    def bookie(self, bookie_id: str) -> str:
        return f"{self.root}/bookies/available/{bookie_id}"

    def add_op(self, request: Any, op: Op) -> None:
        """Add ``op`` to a kazoo transaction ``request``."""
        match op:
            case CreateLedger(ledger_id=ledger_id, metadata=metadata):
                request.create(self.ledger(ledger_id), serialize(metadata))
            case UpdateLedger(ledger_id=ledger_id, metadata=metadata, expected_version=expected):
                request.set_data(self.ledger(ledger_id), serialize(metadata), expected)
            case DeleteLedger(ledger_id=ledger_id, expected_version=expected):
                request.delete(self.ledger(ledger_id), znode_version(expected))
            case CreateRecord(key=key, value=value):
                request.create(self.record(key), value)
            case UpdateRecord(key=key, value=value, expected_version=expected):
                request.set_data(self.record(key), value, expected)
            case DeleteRecord(key=key, expected_version=expected):
                request.delete(self.record(key), znode_version(expected))
            case CheckRecord(key=key, expected_version=expected):
                request.check(self.record(key), expected)


def znode_version(expected: int | None) -> int:
    """The znode version a request expects (``None``: any)."""
    return ANY_VERSION if expected is None else expected


def subject(op: Op) -> str:
    """What ``op`` works on, as errors name it."""
    if isinstance(op, CreateLedger | UpdateLedger | DeleteLedger):
        return f"ledger {op.ledger_id}"
    return f"record {op.key}"


def new_version(op: Op, result: Any) -> int | None:
    """The version ``op`` left (None for deletions and checks), from its
    result in a committed transaction."""
    if isinstance(op, CreateLedger | CreateRecord):
        return 0
    if isinstance(op, UpdateLedger | UpdateRecord):
        return int(result.version)
    return None
