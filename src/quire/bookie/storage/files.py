"""Small file-system helpers shared by the journal and the entry logger.

Every fsync of a journal file or an entry log goes through :func:`sync_file`
(or, for a journal write that is its own fsync, :func:`write_synced`), which
is also where the power-loss test seam records the synced length: the
record is made only after the real call returned, in the same function, so
the two cannot drift apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import sys
from pathlib import Path

from quire.bookie.storage.sync_tracker import SyncTracker
from quire.errors import StorageError


def sync_file(fd: int, tracker: SyncTracker | None, name: str, length: int) -> None:
    """``fdatasync`` ``fd`` and, when tracking, record that ``name``'s first
    ``length`` bytes are durable."""
    os.fdatasync(fd)
    if tracker is not None:
        tracker.synced(name, length)


RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)
"""The ``pwritev2`` flag that makes one write durable as ``fdatasync`` would
(0 where the platform has none)."""


def write_synced(fd: int, data: bytes | bytearray | memoryview, offset: int,
                 tracker: SyncTracker | None, name: str, synced_length: int, *,
                 pad_to_page: bool = False) -> int:
    """``pwrite`` all of ``data`` at ``offset`` with ``RWF_DSYNC``, so that it
    is durable once this returns, and, when tracking, record that
    ``name``'s first ``synced_length`` bytes are (the other way to sync,
    besides :func:`sync_file`; the record again follows the real call).
    Returns the offset just after ``data``; ``pad_to_page`` as for
    :func:`pwrite_all`."""
    end = pwrite_all(fd, data, offset, RWF_DSYNC, pad_to_page=pad_to_page)
    if tracker is not None:
        tracker.synced(name, synced_length)
    return end


CAN_DROP_PAGES = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")
"""Whether this platform lets the journal and entry logs drop their pages
from the page cache (:func:`drop_cached_pages`)."""
_FADV_DONTNEED: int = getattr(os, "POSIX_FADV_DONTNEED", 0)


def whole_pages(length: int) -> int:
    """``length`` rounded down to whole pages: a partly written last page
    stays cached, or the next write into it would read it back from disk."""
    return length - length % mmap.PAGESIZE


def drop_cached_pages(fd: int, offset: int, length: int) -> None:
    """Advise the kernel to drop ``fd``'s pages from ``offset`` on,
    ``length`` bytes of them (0: to the end of the file): dirty pages are
    handed to writeback, clean ones freed.  Advisory only: an error changes
    nothing but the page cache."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, _FADV_DONTNEED)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (file creations) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_ZERO_PAGE = bytes(mmap.PAGESIZE)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int,
               flags: int = 0, *, pad_to_page: bool = False) -> int:
    """``pwrite`` all of ``data`` at ``offset`` (retrying short writes);
    returns the offset just after it.  ``flags``: ``pwritev2`` flags such
    as ``os.RWF_DSYNC``.

    ``pad_to_page``: in the same call, also write zeros from the end of
    ``data`` to the next page boundary.  A write that covers only part of
    a page the page cache does not hold makes the kernel read that page
    from disk first, inside the write; in a reused file whose pages were
    dropped that was one device read per journal group.  The padding
    carries nothing (the next write overwrites it, and the returned offset
    is still the end of ``data``)."""
    view = memoryview(data)
    pad = -(offset + len(view)) % mmap.PAGESIZE if pad_to_page else 0
    if pad and view:
        end = offset + len(view)
        n = os.pwritev(fd, [view, _ZERO_PAGE[:pad]], offset, flags)
        if n >= len(view):
            return end  # (a short write of the padding alone loses nothing)
        view = view[n:]
        offset += n
    while view:
        n = os.pwritev(fd, [view], offset, flags) if flags else os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover - pwrite raises rather than returning 0
            raise StorageError("pwrite wrote nothing")
        view = view[n:]
        offset += n
    return offset


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """``pread`` exactly ``length`` bytes or raise :class:`StorageError`."""
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    chunks = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise StorageError(f"short read: wanted {length} bytes at {offset}, got {got}")
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def lock_directory(directory: Path) -> int:
    """Take an exclusive ``flock`` on ``<directory>/LOCK``; returns the fd
    (close it to release).  The file then names its holder (pid and command
    line, see :func:`lock_holder`).  Raises :class:`StorageError`, naming
    the holder, if another process (or another open engine in this one)
    holds it."""
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = lock_holder(directory) or "a process that did not say who it is"
        raise StorageError(f"{directory} is in use by another storage engine: held by "
                           f"{holder}") from None
    owner = json.dumps({"pid": os.getpid(), "command": _own_command()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, owner, 0)
    return fd


def lock_holder(directory: Path) -> str | None:
    """Who holds ``<directory>/LOCK`` now: ``"pid N (command line)"`` as the
    holder recorded it, or a note that it did not; None if nobody holds it
    (or there is no such file).  Takes and drops the lock to find out."""
    try:
        fd = os.open(directory / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return None  # closing the fd drops the lock we just took
        try:
            owner = json.loads(os.pread(fd, 64 * 1024, 0))
            return f"pid {int(owner['pid'])} ({owner['command']})"
        except (ValueError, KeyError, TypeError):
            return "a process that did not record its pid"
    finally:
        os.close(fd)


def _own_command() -> str:
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return " ".join(sys.argv)
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
