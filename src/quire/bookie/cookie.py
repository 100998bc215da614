"""Cookies: a bookie's identity, written to every directory and to metadata.

A cookie is written on first boot to each journal and ledger directory
(file ``COOKIE``) and to the metadata store.  On every later boot all copies
must exist and agree; a directory whose cookie is missing while the
metadata store has one was emptied or swapped, and the bookie refuses to
start, saying which copy differs from which.  This keeps a bookie with lost
data from rejoining unnoticed (BP-46, "A note on cookies").
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from quire.errors import CookieMismatchError, MetadataNotFoundError
from quire.metadata import MetadataStore

COOKIE_FILE = "COOKIE"


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"format_version": 1, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Cookie:
        try:
            raw = json.loads(data)
            return cls(str(raw["bookie_id"]), str(raw["instance_id"]),
                       tuple(raw["journal_dirs"]), tuple(raw["ledger_dirs"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CookieMismatchError(f"cookie in {where} is unreadable: {e}") from e


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _describe(cookie: Cookie) -> str:
    return f"bookie {cookie.bookie_id} instance {cookie.instance_id}"


async def validate_or_create_cookie(
    store: MetadataStore, bookie_id: str, journal_dirs: tuple[Path, ...],
    ledger_dirs: tuple[Path, ...],
) -> Cookie:
    """Check every copy of this bookie's cookie; write them all on first boot.

    Raises :class:`CookieMismatchError` naming what differs when some copies
    exist and others are missing or disagree.
    """
    dirs = sorted({*journal_dirs, *ledger_dirs})
    expected = Cookie(bookie_id, "", tuple(map(str, journal_dirs)), tuple(map(str, ledger_dirs)))
    found: dict[str, Cookie | None] = {}
    for directory in dirs:
        path = directory / COOKIE_FILE
        found[str(directory)] = (Cookie.from_bytes(path.read_bytes(), str(path))
                                 if path.exists() else None)
    try:
        stored = await store.read_cookie(bookie_id)
        meta: Cookie | None = Cookie.from_bytes(stored.value, "the metadata store")
    except MetadataNotFoundError:
        meta = None

    if meta is None and all(c is None for c in found.values()):
        cookie = Cookie(bookie_id, uuid.uuid4().hex, expected.journal_dirs, expected.ledger_dirs)
        for directory in dirs:
            _write_file(directory / COOKIE_FILE, cookie.to_bytes())
        await store.write_cookie(bookie_id, cookie.to_bytes(), None)
        return cookie

    reference = meta or next(c for c in found.values() if c is not None)
    where_ref = "the metadata store" if meta else "the directories"
    problems = []
    if meta is None:
        problems.append(f"the metadata store has no cookie for {bookie_id} "
                        f"but the directories do ({_describe(reference)})")
    if reference.bookie_id != bookie_id:
        problems.append(f"cookie belongs to bookie {reference.bookie_id}, "
                        f"this bookie is configured as {bookie_id}")
    for where, copy in found.items():
        if copy is None:
            problems.append(f"directory {where} has no cookie while {where_ref} has "
                            f"{_describe(reference)}: was it emptied or replaced?")
        elif copy != reference:
            problems.append(f"directory {where} has {_describe(copy)} "
                            f"(journal {list(copy.journal_dirs)}, ledgers "
                            f"{list(copy.ledger_dirs)}) but {where_ref} has "
                            f"{_describe(reference)} (journal {list(reference.journal_dirs)}, "
                            f"ledgers {list(reference.ledger_dirs)})")
    if (reference.journal_dirs, reference.ledger_dirs) != (expected.journal_dirs,
                                                           expected.ledger_dirs):
        problems.append(f"configured directories (journal {list(expected.journal_dirs)}, "
                        f"ledgers {list(expected.ledger_dirs)}) differ from the cookie's "
                        f"(journal {list(reference.journal_dirs)}, "
                        f"ledgers {list(reference.ledger_dirs)})")
    if problems:
        raise CookieMismatchError("cookie check failed: " + "; ".join(problems))
    return reference
