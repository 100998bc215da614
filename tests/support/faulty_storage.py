"""A tier-2 ChunkStorage wrapper for tests: faults on demand, and what was written.

* :attr:`FaultyStorage.fail_writes`: the next N chunk writes (and concats'
  writes) raise :class:`~quire.errors.Tier2Error` (an outage: nothing written);
* :attr:`FaultyStorage.refuse_prefixes`: writes of chunks whose name starts
  with one of them raise :class:`~quire.errors.Tier2RefusedError` (a
  definite refusal: an S3 policy or a path the file system will not take);
* :attr:`FaultyStorage.refuse_all`: every write is refused so;
* :meth:`FaultyStorage.hold` / :meth:`FaultyStorage.release`: writes wait
  (tier-2 hanging) until released;
* :attr:`FaultyStorage.written` counts the bytes written per chunk path
  (the chunk name without ``.E<epoch>.<n>``; a chunk sidecar's under the
  path with ``$sidecar`` after it).
"""

from __future__ import annotations

import asyncio
import collections

from quire.errors import Tier2Error, Tier2RefusedError
from quire.segmentstore.chunk_sidecars import SIDECAR_SUFFIX
from quire.tier2 import ChunkData, ChunkInfo, ChunkStorage, parse_chunk_name


class FaultyStorage:
    """See the module docstring."""

    def __init__(self, inner: ChunkStorage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.fail_writes = 0
        self.refuse_prefixes: list[str] = []
        self.refuse_all = False
        self.failures = 0
        self.written: collections.Counter[str] = collections.Counter()
        self._open = asyncio.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        await self._open.wait()
        if self.refuse_all or any(name.startswith(p) for p in self.refuse_prefixes):
            self.failures += 1
            raise Tier2RefusedError(f"{self.uri}: refused {name} (injected)")
        if self.fail_writes > 0:
            self.fail_writes -= 1
            self.failures += 1
            raise Tier2Error(f"{self.uri}: writing chunk {name}: injected outage")
        await self.inner.write_chunk(name, data)
        chunk = name.removesuffix(SIDECAR_SUFFIX)
        self.written[parse_chunk_name(chunk)[0] + name[len(chunk):]] += len(data)

    async def read(self, name: str, offset: int, length: int) -> bytes:
        return await self.inner.read(name, offset, length)

    async def length(self, name: str) -> int:
        return await self.inner.length(name)

    async def exists(self, name: str) -> bool:
        return await self.inner.exists(name)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        return await self.inner.list_chunks(prefix)

    async def close(self) -> None:
        await self.inner.close()
