"""Segment operations on remote segment stores: :class:`RemoteSegmentStore`.

Each operation goes to the segment's owner, which a resolver names
(``async resolve(segment_name) -> "host:port"``, see
:mod:`quire.streams.resolvers`); the answer is cached per segment until
that owner answers ``WrongHost`` or cannot be reached.  Then the segment is
resolved again and the request sent again, after a backoff (doubling from
``retry_backoff_ms`` to ``max_backoff_ms``), until ``retry_deadline_ms``:
both mean the request was not applied there.  A connection that breaks
*after* a request was sent leaves its outcome unknown: reads and other
queries are simply retried, a mutation fails with
:class:`~quire.errors.SegmentStoreConnectionError` (never with a "no").

Replies become the segment store's own errors (SegmentNotFoundError,
SegmentExistsError, SegmentSealedError, SegmentTruncatedError,
BadOffsetError for a failed conditional append, TableKeyBadVersionError,
TableKeyNotFoundError; a refused delegation token PermissionDeniedError),
so code written against the in-process
:class:`~quire.segmentstore.SegmentStore` (the controller's
``ControllerSegmentStore`` seam) works unchanged over the wire
(:mod:`quire.streams.refusals`).

Connections: one shared connection per segment store carries every
request but reads (the server answers a connection's requests in order,
and a read at the tail of a segment waits there for data); each segment
being read gets a connection of its own.  A broken connection is replaced
by a new one on the next request.  Mutations start when called, as tasks
in call order, and while the owner is known and its connection is up each
is on the wire before its task first waits, so calls made in one go reach
the store in call order.

Security: with ``tls`` (a client context) every connection is TLS, checking
the owner's host name; ``tokens`` (:mod:`quire.streams.tokens`) gives the
delegation token each request carries, fetched again once when the store
answers that it expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard, TypeVar

from quire.errors import (
    ConfigError,
    ContainerNotOwnedError,
    ProtocolError,
    SegmentNotFoundError,
    SegmentStoreConnectionError,
    SegmentStoreError,
)
from quire.pravega_wire import (
    KEY_NO_VERSION,
    KEY_NOT_EXISTS,
    NO_EVENT_NUMBER,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
    ConditionalBlockEnd,
    CreateSegment,
    CreateTableSegment,
    DataAppended,
    DeleteSegment,
    GetStreamSegmentInfo,
    MergeSegments,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SegmentCreated,
    SegmentDeleted,
    SegmentPolicyUpdated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    StreamSegmentInfo,
    TableEntriesDeltaRead,
    TableEntriesRead,
    TableEntriesUpdated,
    TableKey,
    TableKeysRead,
    TableKeysRemoved,
    TableRead,
    TableValue,
    TruncateSegment,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
    WrongHost,
)
from quire.segmentstore import (
    AppendResult,
    MergeResult,
    ReadResult,
    SegmentInfo,
    SegmentType,
    TableDelta,
    TableEntry,
    TableIteratorPage,
)
from quire.segmentstore.futures import retrieve
from quire.segmentstore.segment_rates import SCALE_POLICY_RATE_KEY, SCALE_POLICY_TYPE_KEY
from quire.streams.connection import SegmentConnection, next_request_id
from quire.streams.refusals import expect, wire_version
from quire.streams.tokens import NO_TOKENS, TOKEN_EXPIRED_CODE, TokenSource

log = logging.getLogger(__name__)

T = TypeVar("T")
Resolver = Callable[[str], Awaitable[str]]
"""``await resolve(segment_name)``: the ``host:port`` of the segment store
that owns the segment's container.  Raises ContainerNotOwnedError while no
owner is known (the caller retries), never a "no such segment"."""


@dataclass(frozen=True)
class SegmentClientConfig:
    connect_timeout_ms: int = 5_000
    """Connecting and exchanging Hellos with one segment store."""
    request_timeout_ms: int = 30_000
    """Waiting for one reply once sent (a tail read is answered within the
    server's tail wait, 5 s by default); past it the outcome is unknown."""
    retry_deadline_ms: int = 30_000
    """How long one operation keeps re-resolving its segment and resending
    after WrongHost or an unreachable owner."""
    retry_backoff_ms: int = 10
    """First pause before such a retry; doubles each time."""
    max_backoff_ms: int = 500
    read_length_bytes: int = 1024 * 1024
    """Bytes asked for by one ReadSegment."""

    def __post_init__(self) -> None:
        for name in ("connect_timeout_ms", "request_timeout_ms", "retry_deadline_ms",
                     "retry_backoff_ms", "max_backoff_ms", "read_length_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")


class RemoteSegmentStore:
    """Segment operations against the segment stores owning them (module
    docstring).  Satisfies the controller's ``ControllerSegmentStore``
    seam; :meth:`close` drops every connection."""

    def __init__(self, resolve: Resolver, config: SegmentClientConfig | None = None, *,
                 tls: ssl.SSLContext | None = None, tokens: TokenSource = NO_TOKENS) -> None:
        self.resolve = resolve
        self.config = config or SegmentClientConfig()
        self.tls = tls
        self.tokens = tokens
        self._owners: dict[str, str] = {}
        """Segment name -> owner address, as last resolved and not refuted."""
        self._shared: dict[str, SegmentConnection] = {}
        """Address -> the shared connection to it."""
        self._opening: dict[str, asyncio.Future[SegmentConnection]] = {}
        self._readers: dict[str, SegmentConnection] = {}
        """Segment name -> the connection its reads use."""
        self._append_lock = asyncio.Lock()
        self.retries = 0
        """Requests resent after WrongHost or an unreachable owner (for tests and metrics)."""

    # --- plumbing ------------------------------------------------------------------

    async def owner(self, segment: str) -> str:
        """The segment's owner address (cached until refuted)."""
        address = self._owners.get(segment)
        if address is None:
            address = self._owners[segment] = await self.resolve(segment)
        return address

    def refute(self, segment: str, address: str) -> None:
        """``address`` does not serve ``segment`` now: resolve it again."""
        if self._owners.get(segment) == address:
            del self._owners[segment]

    async def open_connection(self, address: str) -> SegmentConnection:
        """A new connection of the caller's own (a writer's, a reader's)."""
        return await SegmentConnection.open(address, self.config.connect_timeout_ms, self.tls)

    async def authorized(self, segment: str, send: Callable[[str], Awaitable[WireCommand]]
                         ) -> WireCommand:
        """``await send(token)`` with ``segment``'s token; once more with a
        new token if the store answers that it expired."""
        token = await self.tokens.token(segment)
        reply = await send(token)
        if isinstance(reply, AuthTokenCheckFailed) and reply.error_code == TOKEN_EXPIRED_CODE:
            self.tokens.expired(segment, token)
            reply = await send(await self.tokens.token(segment))
        return reply

    def _cached_connection(self, address: str) -> SegmentConnection | None:
        connection = self._shared.get(address)
        if connection is not None and connection.broken:
            del self._shared[address]
            return None
        return connection

    async def _shared_connection(self, address: str) -> SegmentConnection:
        connection = self._cached_connection(address)
        if connection is not None:
            return connection
        opening = self._opening.get(address)
        if opening is None:
            opening = self._opening[address] = asyncio.ensure_future(
                self._open_shared(address))

            def opened(task: asyncio.Future[SegmentConnection]) -> None:
                self._opening.pop(address, None)
                # callers still waiting see its error themselves; with none left
                # it must not be logged as never retrieved (seed 107540)
                retrieve(task)
            opening.add_done_callback(opened)
        return await asyncio.shield(opening)

    async def _open_shared(self, address: str) -> SegmentConnection:
        """Open the shared connection to ``address`` and keep it, whether or
        not its callers still wait (all of them cancelled, it would be open
        and nobody's)."""
        connection = await self.open_connection(address)
        if not connection.broken:
            self._shared[address] = connection
        return connection

    async def _read_connection(self, name: str, address: str) -> SegmentConnection:
        """The connection ``name``'s reads use, to ``address``: the one kept
        for it, or a new one.  Concurrent reads of one segment (two readers
        of a stream reaching its new segments together) may both open one;
        whatever is not kept is aborted, never dropped open (the month soak's
        segment stores gained a socket for each one dropped)."""
        def usable(c: SegmentConnection | None) -> TypeGuard[SegmentConnection]:
            return c is not None and not c.broken and c.address == address

        kept = self._readers.get(name)
        if usable(kept):
            return kept
        try:
            opened = await self.open_connection(address)
        except SegmentStoreConnectionError as e:
            raise NotSent(e) from e
        kept = self._readers.get(name)  # another read of it may have opened one meanwhile
        if usable(kept):
            opened.abort()
            return kept
        if kept is not None:
            kept.abort()  # broken, or to a store that no longer owns the segment
        self._readers[name] = opened
        return opened

    async def retrying(self, segment: str, attempt: Callable[[str], Awaitable[T]]) -> T:
        """``await attempt(owner_address)``, again (re-resolved, after a
        backoff) while it raises ContainerNotOwnedError or a
        SegmentStoreConnectionError meaning *not sent*, until the deadline;
        then the last such error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.retry_deadline_ms / 1000
        backoff_s = self.config.retry_backoff_ms / 1000
        while True:
            address = ""
            try:
                address = await self.owner(segment)
                return await attempt(address)
            except (ContainerNotOwnedError, NotSent) as e:
                if address:
                    self.refute(segment, address)
                error: Exception = e.cause if isinstance(e, NotSent) else e
                if loop.time() + backoff_s > deadline:
                    raise error from None
                log.debug("segment %r at %r: %s; retrying", segment, address, error)
                self.retries += 1
                await asyncio.sleep(backoff_s)  # a backoff, not a wait for an event
                backoff_s = min(2 * backoff_s, self.config.max_backoff_ms / 1000)

    async def _send(self, connection: SegmentConnection, command: WireCommand,
                    request_id: int) -> WireCommand:
        """One request on ``connection``; NotSent if it never left, a
        SegmentStoreConnectionError if its outcome is unknown, ContainerNotOwnedError
        for WrongHost."""
        try:
            future = connection.request(command, request_id)
        except SegmentStoreConnectionError as e:
            raise NotSent(e) from e
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                reply = await future
        except TimeoutError:
            connection.abort()  # its other requests' outcomes are unknown too
            raise SegmentStoreConnectionError(
                f"no reply from segment store {connection.address} in "
                f"{self.config.request_timeout_ms} ms") from None
        if isinstance(reply, WrongHost):
            raise ContainerNotOwnedError(
                f"segment store {connection.address} does not serve {reply.segment!r} now")
        return reply

    async def _call(self, segment: str, make: Callable[[int, str], WireCommand],
                    idempotent: bool = False) -> WireCommand:
        """Send ``make(request_id, token)`` to ``segment``'s owner on the
        shared connection, retrying as the module docstring says."""
        async def attempt(address: str) -> WireCommand:
            try:
                connection = await self._shared_connection(address)
            except SegmentStoreConnectionError as e:
                raise NotSent(e) from e

            async def send(token: str) -> WireCommand:
                request_id = next_request_id()
                return await self._send(connection, make(request_id, token), request_id)
            try:
                return await self.authorized(segment, send)
            except SegmentStoreConnectionError as e:
                if idempotent and not isinstance(e, NotSent):
                    raise NotSent(e) from e
                raise
        return await self.retrying(segment, attempt)

    def _now(self, call: Awaitable[T]) -> asyncio.Future[T]:
        """``call`` as a task started now, so mutations keep call order."""
        return asyncio.ensure_future(call)

    # --- segments ------------------------------------------------------------------

    def create_segment(self, name: str, segment_type: SegmentType = SegmentType.STREAM,
                       attributes: Mapping[int, int] | None = None) -> asyncio.Future[None]:
        """Create a segment; ``attributes``: at most a stream segment's scaling
        policy (:func:`~quire.segmentstore.segment_rates.policy_attributes`),
        all the wire carries."""
        attributes = dict(attributes or {})
        scale_type = attributes.pop(SCALE_POLICY_TYPE_KEY, 0)
        target_rate = attributes.pop(SCALE_POLICY_RATE_KEY, 0)

        async def go() -> None:
            if attributes or (scale_type and segment_type is not SegmentType.STREAM):
                raise SegmentStoreError("only a stream segment's scaling policy can be set "
                                        "when creating a segment over the wire")
            if segment_type is SegmentType.TABLE:
                reply = await self._call(name, lambda r, t: CreateTableSegment(r, name, t))
            else:
                reply = await self._call(name, lambda r, t: CreateSegment(
                    r, name, target_rate, scale_type, t))
            expect(reply, SegmentCreated, name)
        return self._now(go())

    def update_segment_policy(self, name: str, scale_type: int,
                              target_rate: int) -> asyncio.Future[None]:
        async def go() -> None:
            expect(await self._call(name, lambda r, t: UpdateSegmentPolicy(
                r, name, target_rate, scale_type, t), idempotent=True),
                SegmentPolicyUpdated, name)
        return self._now(go())

    def seal(self, name: str) -> asyncio.Future[int]:
        """Seal ``name``; its final length."""
        async def go() -> int:
            expect(await self._call(name, lambda r, t: SealSegment(r, name, t)), SegmentSealed,
                   name)
            return (await self.get_info(name)).length
        return self._now(go())

    def merge(self, target: str, source: str) -> asyncio.Future[MergeResult]:
        async def go() -> MergeResult:
            reply = await self._call(target, lambda r, t: MergeSegments(r, target, source, t))
            return MergeResult(expect(reply, SegmentsMerged, source).new_target_write_offset)
        return self._now(go())

    def truncate(self, name: str, offset: int) -> asyncio.Future[None]:
        async def go() -> None:
            expect(await self._call(name, lambda r, t: TruncateSegment(r, name, offset, t)),
                   SegmentTruncated, name)
        return self._now(go())

    def delete(self, name: str) -> asyncio.Future[None]:
        async def go() -> None:
            expect(await self._call(name, lambda r, t: DeleteSegment(r, name, t)),
                   SegmentDeleted, name)
        return self._now(go())

    async def get_info(self, name: str) -> SegmentInfo:
        """The segment's state.  The wire carries neither its type nor its
        attributes nor its tier-2 length: ``type`` is STREAM, ``attributes``
        empty and ``storage_length`` 0 here."""
        reply = expect(await self._call(name, lambda r, t: GetStreamSegmentInfo(r, name, t),
                                        idempotent=True), StreamSegmentInfo, name)
        if not reply.exists or reply.is_deleted:
            raise SegmentNotFoundError(f"no such segment {name!r}")
        return SegmentInfo(name, reply.write_offset, reply.start_offset, 0, reply.is_sealed,
                           reply.is_deleted, SegmentType.STREAM, {}, reply.last_modified)

    async def request(self, name: str, make: Callable[[int, str], WireCommand]) -> WireCommand:
        """One idempotent request on ``name`` (``make(request_id, token)``), its
        reply: the requests with no method here (:mod:`quire.streams.append_times`)."""
        return await self._call(name, make, idempotent=True)

    def append(self, name: str, data: bytes, writer_id: int, event_number: int,
               event_count: int = 1, expected_offset: int | None = None
               ) -> asyncio.Future[AppendResult]:
        """Append ``data`` (``event_count`` whole events, already framed)
        as writer ``writer_id``'s event ``event_number``: a number not above
        the writer's stored one is a duplicate, acknowledged unwritten.
        ``expected_offset``: only if the segment's length is that
        (BadOffsetError otherwise).  For a stream of events use a
        :class:`~quire.streams.writer.StreamWriter`, which pipelines."""
        async def attempt(address: str) -> AppendResult:
            try:
                connection = await self._shared_connection(address)
            except SegmentStoreConnectionError as e:
                raise NotSent(e) from e
            async with self._append_lock:  # one writer's setup must precede its block
                if connection.writers.get(writer_id) != name:
                    async def set_up(token: str) -> WireCommand:
                        setup_id = next_request_id()
                        return await self._send(connection,
                                                SetupAppend(setup_id, writer_id, name, token),
                                                setup_id)
                    try:
                        setup = await self.authorized(name, set_up)
                    except NotSent:
                        raise
                    except SegmentStoreConnectionError as e:  # the block was not sent
                        raise NotSent(e) from e
                    expect(setup, AppendSetup, name)
                    connection.writers[writer_id] = name
                return await self._append_on(connection, name, data, writer_id, event_number,
                                             event_count, expected_offset)
        return self._now(self.retrying(name, attempt))

    async def _append_on(self, connection: SegmentConnection, name: str, data: bytes,
                         writer_id: int, event_number: int, event_count: int,
                         expected_offset: int | None) -> AppendResult:
        request_id = next_request_id()
        command: WireCommand
        if expected_offset is None:
            command = AppendBlockEnd(writer_id, len(data), data, event_count, event_number,
                                     request_id)
        else:
            command = ConditionalBlockEnd(writer_id, event_number, expected_offset, data,
                                          request_id)
        reply = expect(await self._send(connection, command, request_id), DataAppended,
                       name)
        previous = None if reply.previous_event_number == NO_EVENT_NUMBER \
            else reply.previous_event_number
        return AppendResult(reply.current_segment_write_offset, event_number, previous,
                            previous is not None and previous >= event_number)

    async def read(self, name: str, offset: int, max_length: int | None = None) -> ReadResult:
        """Bytes of ``name`` from ``offset``; at the tail of an unsealed
        segment the server waits for data (up to its tail wait) and may
        answer none (``at_tail``).  Each segment read has a connection of
        its own; :meth:`done_reading` drops it."""
        length = max_length or self.config.read_length_bytes

        async def attempt(address: str) -> ReadResult:
            reader = await self._read_connection(name, address)

            async def send(token: str) -> WireCommand:
                request_id = next_request_id()
                return await self._send(reader, ReadSegment(name, offset, length, token,
                                                            request_id), request_id)
            try:
                reply = await self.authorized(name, send)
            except NotSent:
                raise
            except SegmentStoreConnectionError as e:
                raise NotSent(e) from e  # a read: safe to send again
            r = expect(reply, SegmentRead, name)
            if r.offset != offset:
                raise ProtocolError(f"read of {name!r} at {offset} answered at {r.offset}")
            return ReadResult(offset, r.data, r.at_tail, r.end_of_segment)
        return await self.retrying(name, attempt)

    def done_reading(self, name: str) -> None:
        connection = self._readers.pop(name, None)
        if connection is not None:
            connection.abort()

    # --- tables --------------------------------------------------------------------

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> asyncio.Future[list[int]]:
        """Set ``(key, value, expected_version)`` entries, all or nothing
        (expected None: any; NOT_EXISTS: must not exist); their new versions."""
        wire = tuple((TableKey(k, wire_version(v)), TableValue(value)) for k, value, v in entries)

        async def go() -> list[int]:
            reply = await self._call(name, lambda r, t: UpdateTableEntries(r, name, t, wire, -1))
            return list(expect(reply, TableEntriesUpdated, name).updated_versions)
        return self._now(go())

    def table_remove(self, name: str, keys_with_versions: Sequence[tuple[bytes, int | None]]
                     ) -> asyncio.Future[None]:
        keys = tuple(TableKey(k, wire_version(v)) for k, v in keys_with_versions)

        async def go() -> None:
            expect(await self._call(name, lambda r, t: RemoveTableKeys(r, name, t, keys, -1)),
                   TableKeysRemoved, name)
        return self._now(go())

    async def table_get(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        wire = tuple(TableKey(k, KEY_NO_VERSION) for k in keys)
        reply = expect(await self._call(name, lambda r, t: ReadTable(r, name, t, wire),
                                        idempotent=True), TableRead, name)
        return [None if key.key_version == KEY_NOT_EXISTS
                else TableEntry(key.data, value.data, key.key_version)
                for key, value in reply.entries]

    async def table_iterate(self, name: str, keys_only: bool = False,
                            token: bytes | None = None,
                            max_entries: int = 1000) -> TableIteratorPage:
        """A page of entries (keys only: values None) in key order after
        ``token``; its ``token`` (None once a page comes back empty)
        resumes after it."""
        start = token or b""
        if keys_only:
            keys = expect(await self._call(
                name, lambda r, t: ReadTableKeys(r, name, t, max_entries, start),
                idempotent=True),
                TableKeysRead, name)
            found = [TableEntry(k.data, None, k.key_version) for k in keys.keys]
            next_token = keys.continuation_token
        else:
            read = expect(await self._call(
                name, lambda r, t: ReadTableEntries(r, name, t, max_entries, start),
                idempotent=True), TableEntriesRead, name)
            found = [TableEntry(k.data, v.data, k.key_version) for k, v in read.entries]
            next_token = read.continuation_token
        return TableIteratorPage(found, next_token if found else None)

    async def table_read_delta(self, name: str, from_position: int,
                               max_entries: int) -> TableDelta:
        reply = expect(await self._call(
            name, lambda r, t: ReadTableEntriesDelta(r, name, t, from_position, max_entries),
            idempotent=True), TableEntriesDeltaRead, name)
        return TableDelta([TableEntry(k.data, v.data, k.key_version) for k, v in reply.entries],
                          reply.last_position, reply.should_clear)

    # --- lifetime ------------------------------------------------------------------

    async def close(self) -> None:
        for opening in list(self._opening.values()):
            opening.cancel()
        connections = [*self._shared.values(), *self._readers.values()]
        self._shared.clear()
        self._readers.clear()
        for connection in connections:
            connection.abort()
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.closed.wait()


class NotSent(SegmentStoreConnectionError):
    """A request that did not reach (or, for a query, may be resent to) the
    store: safe to retry.  ``cause`` is the error to report when retries
    run out."""

    def __init__(self, cause: SegmentStoreConnectionError) -> None:
        super().__init__(str(cause))
        self.cause = cause
