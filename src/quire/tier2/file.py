"""``file:///abs/path``: each chunk is a file under the root directory.

A chunk name's ``/`` separates directories.  ``write_chunk`` makes a chunk
durable before it returns, in this order:

1. its directory exists durably: each directory this process has not yet
   seen is created if missing and its parent fsynced (once per directory
   per process);
2. the bytes go to a temporary file ``.tmp-<random>`` in that
   directory, which is fsynced (``fdatasync``: the new size is part of it);
3. the temporary file is hard-linked to the chunk's name, which fails if
   the name exists (an exclusive create: two writers never both succeed),
   and the temporary name is unlinked;
4. the directory is fsynced, so the new name survives a power cut.

A chunk is therefore never seen under its name partly written, and one that
``write_chunk`` returned survives power loss (the tests in
``tests/unit/test_tier2_file_durability.py`` show both fsyncs are needed).  A temporary
file left by a crash between steps 2 and 3 is garbage under a ``.`` name
that listing skips.  Deletes are plain unlinks, not fsynced (see the
contract: a deleted chunk may come back after a machine crash as an orphan).

File operations run in worker threads (``asyncio.to_thread``): a 16 MiB write
and its fsync must not hold the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
import uuid
from pathlib import Path
from typing import NoReturn

from quire.errors import (
    ChunkExistsError,
    ChunkNotFoundError,
    ChunkRangeError,
    Tier2Error,
    Tier2RefusedError,
)

from .chunk_storage import (
    ChunkData,
    ChunkInfo,
    check_chunk_name,
    check_chunk_size,
    check_read_arguments,
    exists_by_length,
)
from .config import Tier2Config
from .sync_tracking import SyncTracker

TEMPORARY_PREFIX = ".tmp-"
_REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EINVAL,
                             errno.EROFS, errno.ENOTDIR, errno.EISDIR})
"""Write failures that repeat however often they are tried
(:class:`~quire.errors.Tier2RefusedError`); a full disk (ENOSPC), an I/O
error or a lost mount may pass."""


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileChunkStorage:
    """A :class:`~quire.tier2.ChunkStorage` in a local directory."""

    def __init__(self, uri: str, root: Path, config: Tier2Config) -> None:
        self.uri = uri
        self._root = root
        self._max_chunk_bytes = config.max_chunk_bytes
        self._fsync_files = not config.test_skip_file_fsync
        self._fsync_directories = not config.test_skip_directory_fsync
        self._directories_lock = threading.Lock()
        self._durable_directories: set[Path] = set()
        """Directories this process made sure exist and are durably named."""
        self._tracker: SyncTracker | None = None
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            self._ensure_directory(root)
        except OSError as e:
            raise Tier2Error(f"{uri}: cannot create the tier-2 directory: {e}") from e
        if config.power_loss_tracking:
            self._tracker = SyncTracker(root)

    # --- helpers (worker threads) --------------------------------------------

    def _relative(self, path: Path) -> str:
        return str(path.relative_to(self._root)) if path != self._root else "."

    def _sync_directory(self, directory: Path) -> None:
        if self._fsync_directories:
            _fsync_directory(directory)
            if self._tracker is not None and directory.is_relative_to(self._root):
                self._tracker.synced_directory(self._relative(directory))

    def _ensure_directory(self, directory: Path) -> None:
        """Make ``directory`` (the root or below it) exist with a durable name."""
        with self._directories_lock:
            missing: list[Path] = []
            walk = directory
            while walk not in self._durable_directories and walk != walk.parent:
                missing.append(walk)
                if walk == self._root:
                    break
                walk = walk.parent
            for path in reversed(missing):
                try:
                    path.mkdir()
                    created = True
                except FileExistsError:
                    created = False  # possibly by another process that crashed before its fsync
                if created and self._tracker is not None and path != self._root:
                    self._tracker.created_directory(self._relative(path))
                self._sync_directory(path.parent)
                self._durable_directories.add(path)

    def _fail(self, name: str, doing: str, error: OSError) -> NoReturn:
        """Raise the typed error for ``error``: a missing file (or a directory
        where the chunk would be) is no chunk, anything else an I/O failure."""
        if isinstance(error, FileNotFoundError | NotADirectoryError | IsADirectoryError):
            raise ChunkNotFoundError(f"{self.uri}: no chunk {name}") from error
        raise Tier2Error(f"{self.uri}: {doing} chunk {name}: {error}") from error

    def _write(self, name: str, data: memoryview) -> None:
        final = self._root / name
        directory = final.parent
        self._ensure_directory(directory)
        temporary = directory / f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                if self._fsync_files:
                    os.fdatasync(fd)
                    if self._tracker is not None:
                        self._tracker.synced_chunk(name, len(data))
            finally:
                os.close(fd)
            try:
                os.link(temporary, final)
            except FileExistsError:
                if self._read(name, 0, len(data) + 1) != data:
                    raise ChunkExistsError(f"{self.uri}: chunk {name} exists already") from None
                # the same bytes: a retry of a write whose outcome was unknown
            else:
                if self._tracker is not None:
                    self._tracker.linked(name)
        finally:
            os.unlink(temporary)
        self._sync_directory(directory)

    def _read(self, name: str, offset: int, length: int) -> bytes:
        fd = os.open(self._root / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if offset > size:
                raise ChunkRangeError(f"{self.uri}: read of chunk {name} at {offset}, past "
                                      f"its end ({size})", offset, size)
            wanted = min(length, size - offset)
            pieces = []
            while wanted:
                piece = os.pread(fd, wanted, offset)
                if not piece:
                    break  # cannot shrink (immutable), but never loop forever
                pieces.append(piece)
                offset += len(piece)
                wanted -= len(piece)
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        finally:
            os.close(fd)

    def _length(self, name: str) -> int:
        status = os.stat(self._root / name)
        if not stat.S_ISREG(status.st_mode):
            raise IsADirectoryError(name)
        return status.st_size

    def _delete(self, name: str) -> None:
        try:
            os.unlink(self._root / name)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return  # no such chunk (a directory of that name is no chunk either)
        if self._tracker is not None:
            self._tracker.unlinked(name)

    def _list(self, prefix: str) -> list[ChunkInfo]:
        start = self._root / prefix.rpartition("/")[0]
        found = []
        for directory, subdirectories, files in os.walk(start):
            subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
            for file_name in files:
                if file_name.startswith("."):
                    continue
                path = Path(directory, file_name)
                name = str(path.relative_to(self._root))
                if name.startswith(prefix):
                    try:
                        found.append(ChunkInfo(name, path.stat().st_size))
                    except FileNotFoundError:
                        continue  # deleted while listing
        found.sort(key=lambda info: info.name)
        return found

    # --- ChunkStorage ----------------------------------------------------------

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        check_chunk_name(name)
        check_chunk_size(name, len(data), self._max_chunk_bytes)
        try:
            await asyncio.to_thread(self._write, name, memoryview(data).cast("B"))
        except OSError as e:
            kind = Tier2RefusedError if e.errno in _REFUSED_ERRNOS else Tier2Error
            raise kind(f"{self.uri}: writing chunk {name}: {e}") from e

    async def read(self, name: str, offset: int, length: int) -> bytes:
        check_chunk_name(name)
        check_read_arguments(offset, length)
        try:
            return await asyncio.to_thread(self._read, name, offset, length)
        except OSError as e:
            self._fail(name, "reading", e)

    async def length(self, name: str) -> int:
        check_chunk_name(name)
        try:
            return await asyncio.to_thread(self._length, name)
        except OSError as e:
            self._fail(name, "stat of", e)

    async def exists(self, name: str) -> bool:
        return await exists_by_length(self, name)

    async def delete(self, name: str) -> None:
        check_chunk_name(name)
        try:
            await asyncio.to_thread(self._delete, name)
        except OSError as e:
            self._fail(name, "deleting", e)

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        try:
            return await asyncio.to_thread(self._list, prefix)
        except OSError as e:
            raise Tier2Error(f"{self.uri}: listing chunks under {prefix!r}: {e}") from e

    async def close(self) -> None:
        if self._tracker is not None:
            self._tracker.close()
