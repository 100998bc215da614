"""The tier-2 seam: :class:`ChunkStorage`, named immutable byte sequences.

A segment in tier-2 is a list of chunks (its layout, kept by the caller);
this module knows nothing of segments.  The contract is written for storage
where an object is immutable once written (S3) and for file systems alike:
a chunk is created whole, with its bytes, in one call, and never changes
after; there is no append, no overwrite, no rename.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from quire.errors import ChunkNotFoundError, ChunkTooLargeError, InvalidChunkNameError

ChunkData = bytes | bytearray | memoryview
"""What a chunk is written from (it must not change until the write returns)."""

MAX_CHUNK_NAME_BYTES = 512
MAX_NAME_COMPONENT_BYTES = 200
"""File systems allow 255 bytes per path component; 200 leaves room."""
_NAME_CHARACTERS = re.compile(r"[A-Za-z0-9._\-$#=+@,~/]+")


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk as listed: its name and its length in bytes."""

    name: str
    length: int


class ChunkStorage(Protocol):
    """Tier-2 storage of chunks.  Every method is a coroutine.

    **Names.**  A chunk name is 1 to 512 ASCII characters from
    ``A-Z a-z 0-9 . _ - $ # = + @ , ~ /``; ``/`` separates path components,
    none of which may be empty, longer than 200 characters, or start with
    ``.`` (drivers keep their own files under such names).  Any other name raises
    :class:`~quire.errors.InvalidChunkNameError`.  Callers never reuse a
    name: names carry the writer's container epoch and a counter, so a
    fenced old owner still running can neither overwrite nor delete a chunk
    the new owner wrote (storage does not remember deleted names; the rule
    is the caller's).

    **write_chunk(name, data)** creates a NEW chunk holding exactly ``data``,
    exclusively: if a chunk of that name exists with other bytes it raises
    :class:`~quire.errors.ChunkExistsError` and changes nothing.  If it
    exists with exactly these bytes the call returns normally: that is a
    retry of a write whose outcome was unknown (a timeout, a failed
    response), and the chunk is what the caller wanted.  When it returns,
    the chunk is durable: it survives a crash of this process and of the
    machine (file driver: the file and its directory are fsynced) and every
    later call of any process sees it whole.  A chunk is never seen partly
    written.  ``len(data)`` over the configured ``max_chunk_bytes`` raises
    :class:`~quire.errors.ChunkTooLargeError`.  On any other failure
    (:class:`~quire.errors.Tier2Error`) the chunk may or may not exist.

    **read(name, offset, length)** returns the chunk's bytes from ``offset``:
    ``length`` of them, fewer only where the chunk ends (``b""`` when
    ``offset`` is its length).  An offset past the end raises
    :class:`~quire.errors.ChunkRangeError`; negative arguments raise
    ``ValueError``.

    **length(name)** is the chunk's length in bytes; **exists(name)** says
    whether it exists now.

    **delete(name)** removes the chunk; deleting a chunk that does not exist
    is not an error (idempotent).  A delete is not promised durable on
    return: after a machine crash a deleted chunk may be back (an orphan no
    layout names; it never replaces a chunk under another name).

    **list_chunks(prefix)** lists every chunk whose name starts with
    ``prefix`` (a plain string prefix, ``""`` for all), sorted by name, with
    its length.  It sees every chunk whose write returned before the call.

    **close()** releases connections and files; nothing may be called after.

    **Errors.**  ``read``, ``length`` of a chunk that does not exist (never
    written, deleted, or vanished under a reader) raise
    :class:`~quire.errors.ChunkNotFoundError`.  Every failure is a
    :class:`~quire.errors.Tier2Error` (never a bare library or OS exception);
    one that would come back the same however often the call is made (a
    name or size outside this contract, access denied, a path the file
    system will not take) is a :class:`~quire.errors.Tier2RefusedError`.

    Calls may run concurrently, on distinct or the same chunks.
    """

    uri: str
    """The URI this storage was opened with (for messages)."""

    async def write_chunk(self, name: str, data: ChunkData) -> None: ...

    async def read(self, name: str, offset: int, length: int) -> bytes: ...

    async def length(self, name: str) -> int: ...

    async def exists(self, name: str) -> bool: ...

    async def delete(self, name: str) -> None: ...

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]: ...

    async def close(self) -> None: ...


def check_chunk_name(name: str) -> None:
    """Raise :class:`InvalidChunkNameError` unless ``name`` keeps the contract."""
    if (not isinstance(name, str) or not name or len(name) > MAX_CHUNK_NAME_BYTES
            or _NAME_CHARACTERS.fullmatch(name) is None):
        raise InvalidChunkNameError(
            f"chunk name {name!r}: expected 1 to {MAX_CHUNK_NAME_BYTES} characters "
            "from A-Z a-z 0-9 . _ - $ # = + @ , ~ /")
    for component in name.split("/"):
        if not component or component.startswith(".") \
                or len(component) > MAX_NAME_COMPONENT_BYTES:
            raise InvalidChunkNameError(
                f"chunk name {name!r}: every '/'-separated part must have 1 to "
                f"{MAX_NAME_COMPONENT_BYTES} characters and must not start with '.'")


def check_chunk_size(name: str, size: int, max_chunk_bytes: int) -> None:
    """Raise :class:`ChunkTooLargeError` if a chunk of ``size`` bytes is over the limit."""
    if size > max_chunk_bytes:
        raise ChunkTooLargeError(
            f"chunk {name}: {size} bytes is over max_chunk_bytes ({max_chunk_bytes})")


def check_read_arguments(offset: int, length: int) -> None:
    if offset < 0 or length < 0:
        raise ValueError(f"read: offset ({offset}) and length ({length}) must not be negative")


async def exists_by_length(storage: ChunkStorage, name: str) -> bool:
    """:meth:`ChunkStorage.exists` for a driver with no cheaper way to ask:
    the chunk exists if :meth:`ChunkStorage.length` finds it (a stat, a
    HEAD), and not if that raises :class:`~quire.errors.ChunkNotFoundError`
    (every other failure is raised)."""
    try:
        await storage.length(name)
    except ChunkNotFoundError:
        return False
    return True


async def concat_chunks(storage: ChunkStorage, target: str, sources: list[str]) -> int:
    """Create the new chunk ``target`` holding the bytes of ``sources`` one
    after another, and return its length.  The sources are left as they
    are: the caller records the new layout first and deletes them later (a
    reader of the old layout still finds them meanwhile).  A missing source
    raises :class:`~quire.errors.ChunkNotFoundError` and creates nothing;
    ``target`` follows :meth:`ChunkStorage.write_chunk` (exclusive, durable,
    at most ``max_chunk_bytes``).

    This copies through memory on every driver: it is meant for merging
    chunks smaller than ``max_chunk_bytes`` into one, which S3's server-side
    copy cannot do (its parts must be 5 MiB or more).
    """
    check_chunk_name(target)
    pieces = []
    for source in sources:
        pieces.append(await storage.read(source, 0, await storage.length(source)))
    data = b"".join(pieces)
    await storage.write_chunk(target, data)
    return len(data)
