"""Tier-2 (long-term) storage: the :class:`ChunkStorage` seam and its drivers.

``quire.tier2`` sits beside ``quire.log`` (it imports only ``quire.errors``
and ``quire.config``): the segment store's storage writer, the consistency
checker and disaster recovery all use it.  Open a driver by URI:

    storage = await open_chunk_storage("file:///var/lib/quire/tier2")
    await storage.write_chunk("scope/stream/0.E3.17", data)

See :class:`ChunkStorage` for the contract and :mod:`quire.tier2.config`
for the URIs.
"""

from __future__ import annotations

from .chunk_storage import ChunkData, ChunkInfo, ChunkStorage, check_chunk_name, concat_chunks
from .config import (
    DEFAULT_MAX_CHUNK_BYTES,
    FileLocation,
    MemoryLocation,
    Tier2Config,
    parse_tier2_uri,
)
from .file import FileChunkStorage
from .layout import (
    ChunkNamer,
    ChunkRef,
    SegmentLayout,
    chunk_path,
    decode_layout,
    encode_layout,
    parse_chunk_name,
    read_segment,
)
from .memory import MemoryChunkStorage

__all__ = [
    "DEFAULT_MAX_CHUNK_BYTES",
    "ChunkData",
    "ChunkInfo",
    "ChunkNamer",
    "ChunkRef",
    "ChunkStorage",
    "FileChunkStorage",
    "MemoryChunkStorage",
    "SegmentLayout",
    "Tier2Config",
    "check_chunk_name",
    "chunk_path",
    "concat_chunks",
    "decode_layout",
    "encode_layout",
    "open_chunk_storage",
    "parse_chunk_name",
    "parse_tier2_uri",
    "read_segment",
]


async def open_chunk_storage(config: Tier2Config | str) -> ChunkStorage:
    """Open the driver a :class:`Tier2Config` (or a bare URI, with default
    settings) names.  Close it with ``await storage.close()``."""
    if isinstance(config, str):
        config = Tier2Config(uri=config)
    location = config.location
    if isinstance(location, FileLocation):
        return FileChunkStorage(config.uri, location.root, config)
    if isinstance(location, MemoryLocation):
        return MemoryChunkStorage(config.uri, location.name, config.max_chunk_bytes)
    from .s3 import S3ChunkStorage  # aiobotocore is imported only by those who use S3

    return await S3ChunkStorage.open(config.uri, location, config)
