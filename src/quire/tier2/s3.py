"""``s3://bucket/prefix?...``: each chunk is one object, through aiobotocore.

Chunk ``name`` is the object ``prefix/name``.  S3 objects are immutable and
written whole by one PUT, which is exactly the chunk contract: a successful
PUT is durable and (since 2020, on AWS and on the servers Quire is tested
with) strongly read-after-write consistent, including LIST.

**Exclusive create.**  By default ``write_chunk`` is a conditional PUT with
``If-None-Match: *``: the server refuses it (412) if the key exists, so two
writers of one name can never both succeed.  Servers that ignore that
header need ``create=head-then-put`` in the URI: a HEAD, then a plain PUT
if the key is absent.  That is not atomic, and it is still safe for
Quire's chunks because no two writers ever race on one name: a chunk name
carries the container epoch of its writer and a counter unique within that
epoch, only the holder of an epoch writes names of that epoch (a fenced
owner writes only names of its own, older epoch, which the new owner never
uses), and one owner never writes a name twice except when it retries its
own write whose outcome it does not know, one at a time.  So the HEAD only
ever sees that owner's earlier attempt, with the same bytes.

**Retries and "exists".**  botocore retries a PUT whose answer was lost; if
the first attempt had landed, the retry is refused as existing.  So a
refused create reads the object back and returns normally when it holds
exactly the bytes being written (the contract's retry rule), and raises
:class:`~quire.errors.ChunkExistsError` only when the bytes differ.

Every botocore, aiohttp and socket failure becomes a
:class:`~quire.errors.Tier2Error` carrying the server's error code; one
that repeats however often it is asked (access denied, an invalid key, no
such bucket) a :class:`~quire.errors.Tier2RefusedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import BotoCoreError, ClientError

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
from .config import S3Location, Tier2Config

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_EXISTS_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
_RANGE_CODES = frozenset({"InvalidRange", "416"})
_REFUSED_CODES = frozenset({"AccessDenied", "403", "InvalidObjectName", "KeyTooLongError",
                            "EntityTooLarge", "NoSuchBucket", "InvalidBucketName",
                            "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
"""Answers that come back the same however often the request is made
(:class:`~quire.errors.Tier2RefusedError`); everything else (5xx, 503
SlowDown, timeouts, connections refused) may pass."""


@functools.cache
def _session() -> AioSession:
    """The process's one botocore session, made on first use: a session
    caches the S3 service model, which costs about half a second to load."""
    return get_session()


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "")) or str(
        error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


class S3ChunkStorage:
    """A :class:`~quire.tier2.ChunkStorage` on an S3-compatible server.  Make
    one with :meth:`open`."""

    def __init__(self, uri: str, location: S3Location, config: Tier2Config,
                 client: Any, exit_stack: contextlib.AsyncExitStack) -> None:
        self.uri = uri
        self._location = location
        self._bucket = location.bucket
        self._max_chunk_bytes = config.max_chunk_bytes
        self._client = client
        self._exit_stack = exit_stack
        self._deadline_s = config.s3_request_deadline_ms / 1000

    @classmethod
    async def open(cls, uri: str, location: S3Location, config: Tier2Config) -> S3ChunkStorage:
        """Connect (lazily: the first request opens the connection pool)."""
        timeout_s = config.s3_timeout_ms / 1000
        client_config = AioConfig(connect_timeout=timeout_s, read_timeout=timeout_s,
                                  retries={"max_attempts": config.s3_max_attempts,
                                           "mode": "standard"})
        exit_stack = contextlib.AsyncExitStack()
        try:
            client = await exit_stack.enter_async_context(_session().create_client(
                "s3", region_name=location.region, endpoint_url=location.endpoint_url,
                config=client_config))
        except (BotoCoreError, ValueError) as e:
            await exit_stack.aclose()
            raise Tier2Error(f"{uri}: cannot make an S3 client: {e}") from e
        return cls(uri, location, config, client, exit_stack)

    @contextlib.asynccontextmanager
    async def _request(self, name: str, doing: str) -> AsyncIterator[None]:
        """Turn every failure inside into a typed error about chunk ``name``;
        and fail what takes longer than ``s3_request_deadline_ms``."""
        try:
            async with asyncio.timeout(self._deadline_s):
                yield
        except ClientError as e:
            code = _error_code(e)
            if code in _NOT_FOUND_CODES:
                raise ChunkNotFoundError(f"{self.uri}: no chunk {name}") from e
            kind = Tier2RefusedError if code in _REFUSED_CODES else Tier2Error
            raise kind(f"{self.uri}: {doing} chunk {name}: S3 error {code}: {e}") from e
        except (BotoCoreError, aiohttp.ClientError, OSError) as e:  # OSError: timeouts too
            raise Tier2Error(f"{self.uri}: {doing} chunk {name}: {e!r}") from e

    def _key(self, name: str) -> str:
        return self._location.key_of(name)

    def _refuse_range(self, name: str, offset: int, size: int) -> NoReturn:
        raise ChunkRangeError(f"{self.uri}: read of chunk {name} at {offset}, past its end "
                              f"({size})", offset, size)

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        check_chunk_name(name)
        check_chunk_size(name, len(data), self._max_chunk_bytes)
        body = bytes(data)
        conditional = self._location.create_mode == "if-none-match"
        if not conditional and await self.exists(name):
            await self._check_same_bytes(name, body)
            return
        async with self._request(name, "writing"):
            extra = {"IfNoneMatch": "*"} if conditional else {}
            try:
                await self._client.put_object(Bucket=self._bucket, Key=self._key(name),
                                              Body=body, **extra)
                return
            except ClientError as e:
                if _error_code(e) not in _EXISTS_CODES:
                    raise
        await self._check_same_bytes(name, body)

    async def _check_same_bytes(self, name: str, body: bytes) -> None:
        """The chunk exists: return if it holds ``body``, else refuse."""
        try:
            existing = await self.read(name, 0, len(body) + 1)
        except ChunkNotFoundError:
            existing = None  # 409: a conflicting write in flight that did not land
        if existing != body:
            raise ChunkExistsError(f"{self.uri}: chunk {name} exists already")

    async def read(self, name: str, offset: int, length: int) -> bytes:
        check_chunk_name(name)
        check_read_arguments(offset, length)
        if length == 0:
            size = await self.length(name)
            if offset > size:
                self._refuse_range(name, offset, size)
            return b""
        async with self._request(name, "reading"):
            try:
                response = await self._client.get_object(
                    Bucket=self._bucket, Key=self._key(name),
                    Range=f"bytes={offset}-{offset + length - 1}")
            except ClientError as e:
                if _error_code(e) not in _RANGE_CODES:
                    raise
            else:
                async with response["Body"] as stream:
                    data: bytes = await stream.read()
                return data
        size = await self.length(name)  # the range starts at or past the end
        if offset > size:
            self._refuse_range(name, offset, size)
        return b""

    async def length(self, name: str) -> int:
        check_chunk_name(name)
        async with self._request(name, "stat of"):
            response = await self._client.head_object(Bucket=self._bucket, Key=self._key(name))
            return int(response["ContentLength"])

    async def exists(self, name: str) -> bool:
        return await exists_by_length(self, name)

    async def delete(self, name: str) -> None:
        check_chunk_name(name)
        async with self._request(name, "deleting"):
            await self._client.delete_object(Bucket=self._bucket, Key=self._key(name))

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        key_prefix = self._key(prefix)
        strip = len(self._key(""))
        found = []
        async with self._request(prefix + "*", "listing"):
            paginator = self._client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self._bucket, Prefix=key_prefix):
                for item in page.get("Contents", ()):
                    found.append(ChunkInfo(str(item["Key"])[strip:], int(item["Size"])))
        found.sort(key=lambda info: info.name)
        return found

    async def close(self) -> None:
        await self._exit_stack.aclose()
