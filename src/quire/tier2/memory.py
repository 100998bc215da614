"""``memory://``: chunks in a dict, for unit tests.

``memory://NAME`` stores are kept per process by name, so a test can close
one and open it again (a reopened container finds its chunks);
``memory://`` is a fresh private store each time.  Writes are "durable" as
soon as they return, which is all a process-local store can promise.
"""

from __future__ import annotations

from quire.errors import ChunkExistsError, ChunkNotFoundError, ChunkRangeError

from .chunk_storage import (
    ChunkData,
    ChunkInfo,
    check_chunk_name,
    check_chunk_size,
    check_read_arguments,
)

_NAMED_STORES: dict[str, dict[str, bytes]] = {}


class MemoryChunkStorage:
    """A :class:`~quire.tier2.ChunkStorage` in this process's memory."""

    def __init__(self, uri: str, name: str, max_chunk_bytes: int) -> None:
        self.uri = uri
        self._chunks: dict[str, bytes] = _NAMED_STORES.setdefault(name, {}) if name else {}
        self._max_chunk_bytes = max_chunk_bytes

    def _get(self, name: str) -> bytes:
        check_chunk_name(name)
        try:
            return self._chunks[name]
        except KeyError:
            raise ChunkNotFoundError(f"{self.uri}: no chunk {name}") from None

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        check_chunk_name(name)
        check_chunk_size(name, len(data), self._max_chunk_bytes)
        content = bytes(data)
        existing = self._chunks.get(name)
        if existing is None:
            self._chunks[name] = content
        elif existing != content:
            raise ChunkExistsError(f"{self.uri}: chunk {name} exists already")

    async def read(self, name: str, offset: int, length: int) -> bytes:
        check_read_arguments(offset, length)
        content = self._get(name)
        if offset > len(content):
            raise ChunkRangeError(f"{self.uri}: read of chunk {name} at {offset}, past its "
                                  f"end ({len(content)})", offset, len(content))
        return content[offset:offset + length]

    async def length(self, name: str) -> int:
        return len(self._get(name))

    async def exists(self, name: str) -> bool:
        check_chunk_name(name)
        return name in self._chunks

    async def delete(self, name: str) -> None:
        check_chunk_name(name)
        self._chunks.pop(name, None)

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        return [ChunkInfo(name, len(content)) for name, content in sorted(self._chunks.items())
                if name.startswith(prefix)]

    async def close(self) -> None:
        """Nothing to release: a named store's chunks stay for the next open."""
