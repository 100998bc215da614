"""Argument checks shared by every driver, so all of them accept the same names.

Bad arguments are programming errors and raise :class:`ValueError`.
"""

from __future__ import annotations

import re

from quire.metadata.model import (
    CheckRecord,
    CreateLedger,
    CreateRecord,
    DeleteLedger,
    DeleteRecord,
    Op,
    UpdateLedger,
    UpdateRecord,
)

# Characters ZooKeeper refuses in a node name; refused by every driver alike.
_BAD_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


def ledger_name(ledger_id: int) -> str:
    """The zero-padded form of a ledger id used where it forms a path."""
    check_ledger_id(ledger_id)
    return f"{ledger_id:010d}"


def check_ledger_id(ledger_id: int) -> None:
    if type(ledger_id) is not int or ledger_id < 0:
        raise ValueError(f"ledger id must be an int >= 0, got {ledger_id!r}")


def check_version(version: int) -> None:
    if type(version) is not int or version < 0:
        raise ValueError(f"expected version must be an int >= 0, got {version!r}")


def check_optional_version(version: int | None) -> None:
    if version is not None:
        check_version(version)


def check_segment(segment: str, what: str) -> None:
    """One path segment: non-empty, no '/', not starting with '.' (reserved
    for the drivers' own names), and no character ZooKeeper refuses."""
    if (not isinstance(segment, str) or not segment or "/" in segment
            or segment.startswith(".") or _BAD_CHARS.search(segment)):
        raise ValueError(f"invalid {what} {segment!r}")


def check_bookie_id(bookie_id: str) -> None:
    check_segment(bookie_id, "bookie id")


def check_record_key(key: str) -> None:
    """A record key: '/'-separated segments, each valid per :func:`check_segment`."""
    if not isinstance(key, str):
        raise ValueError(f"invalid record key {key!r}")
    for segment in key.split("/"):
        check_segment(segment, f"segment in record key {key!r}:")


def is_record_key(key: str) -> bool:
    try:
        check_record_key(key)
    except ValueError:
        return False
    return True


def check_op(op: Op) -> None:
    """Check a transaction op's names and versions."""
    if isinstance(op, CreateLedger | UpdateLedger | DeleteLedger):
        check_ledger_id(op.ledger_id)
    elif isinstance(op, CreateRecord | UpdateRecord | DeleteRecord | CheckRecord):
        check_record_key(op.key)
    else:
        raise ValueError(f"not a transaction op: {op!r}")
    if not isinstance(op, CreateLedger | CreateRecord):
        check_optional_version(op.expected_version)
