"""Cookies: a bookie's identity, written to every directory and to metadata.

A cookie is written on first boot to each journal and ledger directory
(file ``COOKIE``) and to the metadata store.  On every later boot all copies
must exist and agree: a copy that differs makes the bookie refuse to start,
saying which copy differs from which.  A directory whose cookie is missing
while the metadata store has one was emptied or swapped: a *cookie failure*
(BP-46, "A note on cookies").  :func:`check_cookies` reports it rather than
raising, so the caller decides: refuse to start
(:func:`missing_cookies_error`), or, with
``data_integrity_stamp_missing_cookies`` or ``quire cookie fix``, fence and
limbo the bookie's open ledgers first and then
:func:`stamp_missing_cookies`.  Either way a bookie with lost data never
rejoins unnoticed.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from quire.errors import CookieMismatchError, CookieMissingError, MetadataNotFoundError
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


@dataclass(frozen=True)
class CookieCheck:
    """What :func:`check_cookies` found, for the caller to decide on."""

    cookie: Cookie
    """The reference cookie: the metadata store's (the new one on first boot)."""
    missing_dirs: tuple[Path, ...]
    """Directories without a ``COOKIE`` file while the metadata store holds
    this bookie's cookie: emptied or replaced disks (BP-46 cookie failure)."""
    first_boot: bool
    """No copy existed anywhere: this check wrote them all."""

    @property
    def failed(self) -> bool:
        return bool(self.missing_dirs)


def _read_dir_cookies(dirs: list[Path]) -> dict[Path, Cookie | None]:
    found: dict[Path, Cookie | None] = {}
    for directory in dirs:
        path = directory / COOKIE_FILE
        found[directory] = (Cookie.from_bytes(path.read_bytes(), str(path))
                            if path.exists() else None)
    return found


async def check_cookies(
    store: MetadataStore, bookie_id: str, journal_dirs: tuple[Path, ...],
    ledger_dirs: tuple[Path, ...],
) -> CookieCheck:
    """Check every copy of this bookie's cookie; write them all on first boot.

    Directories whose cookie is missing while the metadata store holds this
    bookie's cookie are returned in :attr:`CookieCheck.missing_dirs`, not
    raised: the caller refuses to start (:func:`missing_cookies_error`) or
    protects the bookie's ledgers and then :func:`stamp_missing_cookies`.
    Raises :class:`CookieMismatchError` naming what differs for every other
    problem: copies that disagree, a cookie of another bookie, configured
    directories that differ from the cookie's, or directories holding a
    cookie while the metadata store has none.
    """
    dirs = sorted({*journal_dirs, *ledger_dirs})
    expected = Cookie(bookie_id, "", tuple(map(str, journal_dirs)), tuple(map(str, ledger_dirs)))
    found = _read_dir_cookies(dirs)
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
        return CookieCheck(cookie, (), first_boot=True)

    reference = meta or next(c for c in found.values() if c is not None)
    where_ref = "the metadata store" if meta else "the directories"
    missing = tuple(d for d, copy in found.items() if copy is None)
    problems = []
    if meta is None:
        problems.append(f"the metadata store has no cookie for {bookie_id} "
                        f"but the directories do ({_describe(reference)})")
    if reference.bookie_id != bookie_id:
        problems.append(f"cookie belongs to bookie {reference.bookie_id}, "
                        f"this bookie is configured as {bookie_id}")
    for where, copy in found.items():
        if copy is not None and copy != reference:
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
        problems.extend(_missing_problem(d, reference, where_ref) for d in missing)
        raise CookieMismatchError("cookie check failed: " + "; ".join(problems))
    return CookieCheck(reference, missing, first_boot=False)


def _missing_problem(directory: Path, reference: Cookie, where_ref: str) -> str:
    return (f"directory {directory} has no cookie while {where_ref} has "
            f"{_describe(reference)}: was it emptied or replaced?")


def missing_cookies_error(check: CookieCheck) -> CookieMissingError:
    """The refusal to start for a failed ``check``: names each directory
    without its cookie and says how to proceed."""
    bookie_id = check.cookie.bookie_id
    missing = "; ".join(_missing_problem(d, check.cookie, "the metadata store")
                        for d in check.missing_dirs)
    return CookieMissingError(
        f"cookie check failed: {missing}. The bookie may have lost data it acknowledged, so "
        f"it does not start: set data_integrity_stamp_missing_cookies = true (the bookie "
        f"then fences and limbos its open ledgers and stamps the missing cookies itself), "
        f"or, with the bookie stopped, run `quire cookie fix {bookie_id} --config bookie.toml` "
        f"(bookie.toml: this bookie's config file)")


def stamp_missing_cookies(check: CookieCheck) -> None:
    """Write the reference cookie into each of ``check.missing_dirs``, the
    file and its directory fsynced.  Only after BP-46's phase one protected
    the bookie's ledgers: a stamped directory no longer reveals its loss."""
    data = check.cookie.to_bytes()
    for directory in check.missing_dirs:
        _write_file(directory / COOKIE_FILE, data)
