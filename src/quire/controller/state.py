"""The controller's state in ``_system`` table segments, as Pravega keeps it.

Tables (TABLE segments in the segment store, so the state lives in tier-1
with everything else and survives a restart of the controller)::

    _system/_tables/scopes                          scope -> {}
    _system/_tables/<scope>/streams                 stream -> StreamRecord (JSON)
    _system/_tables/<scope>/<stream>/transactions   txn id (32 hex) -> TxnRecord (JSON)
    _system/_tables/<scope>/<stream>/subscribers    subscriber -> {"generation", "group_id",
                                                                   "cut": [[id, offset], ...]}
    _system/_tables/<scope>/readergroups            group -> {"id", "generation", "retention",
                                                              "streams": {stream: cut}}
    _system/_tables/txn_streams                     "<scope>/<stream>" -> {}: streams that
                                                    may hold transactions (the sweeper's list)
    _system/_tables/workflows                       "<scope>/<stream>/<controller>" -> {"since"}:
                                                    a controller is changing the stream

(record formats: :mod:`quire.controller.records`).

Every change is a conditional update: a new key must not exist, an existing
one must still be at the version it was read at.  A version that moved
means another controller wrote the key: ControllerConcurrentUpdateError.
Within one controller, changes to one scope or stream are serialised by
:class:`~quire.controller.core.ControllerCore`'s locks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, Protocol

from quire.controller.model import StreamRecord, TxnRecord
from quire.controller.records import (
    stream_from_json,
    stream_to_json,
    txn_from_json,
    txn_to_json,
)
from quire.errors import (
    ControllerConcurrentUpdateError,
    SegmentExistsError,
    SegmentNotFoundError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.segmentstore import (
    NOT_EXISTS,
    MergeResult,
    SegmentInfo,
    SegmentType,
    TableEntry,
    TableIteratorPage,
)

SCOPES_TABLE = "_system/_tables/scopes"
TXN_STREAMS_TABLE = "_system/_tables/txn_streams"
WORKFLOWS_TABLE = "_system/_tables/workflows"


def streams_table(scope: str) -> str:
    return f"_system/_tables/{scope}/streams"


def txns_table(scope: str, stream: str) -> str:
    return f"_system/_tables/{scope}/{stream}/transactions"


def subscribers_table(scope: str, stream: str) -> str:
    return f"_system/_tables/{scope}/{stream}/subscribers"


def reader_groups_table(scope: str) -> str:
    return f"_system/_tables/{scope}/readergroups"


class ControllerSegmentStore(Protocol):
    """What the controller asks of the segment store (the in-process
    :class:`~quire.segmentstore.SegmentStore` is one; a client of a remote
    segment store over the wire protocol will be another).

    Mutations are ordered when called and their awaitables fail with the
    segment store's errors: SegmentExistsError, SegmentNotFoundError,
    SegmentSealedError, BadOffsetError, TableKeyBadVersionError,
    TableKeyNotFoundError, and ContainerNotOwnedError / ContainerClosedError
    when the segment's container is not available (the outcome of a pending
    change is then unknown).  Table versions are as
    :meth:`~quire.segmentstore.SegmentStore.table_put` defines them.
    """

    def create_segment(self, name: str, segment_type: SegmentType = ...,
                       attributes: Mapping[int, int] | None = ...) -> Awaitable[None]:
        """``attributes``: the scaling policy's
        (:func:`~quire.segmentstore.segment_rates.policy_attributes`) or None."""
        ...

    def update_segment_policy(self, name: str, scale_type: int, target_rate: int
                              ) -> Awaitable[None]:
        """Set the segment's scaling policy (Pravega's UpdateSegmentPolicy)."""
        ...

    def seal(self, name: str) -> Awaitable[int]: ...

    def merge(self, target: str, source: str) -> Awaitable[MergeResult]: ...

    def truncate(self, name: str, offset: int) -> Awaitable[None]: ...

    def delete(self, name: str) -> Awaitable[None]: ...

    async def get_info(self, name: str) -> SegmentInfo: ...

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> Awaitable[list[int]]: ...

    def table_remove(self, name: str, keys_with_versions: Sequence[tuple[bytes, int | None]]
                     ) -> Awaitable[None]: ...

    async def table_get(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]: ...

    async def table_iterate(self, name: str, keys_only: bool = False,
                            token: bytes | None = None,
                            max_entries: int = 1000) -> TableIteratorPage: ...


async def create_if_missing(store: ControllerSegmentStore, name: str,
                            segment_type: SegmentType,
                            attributes: Mapping[int, int] | None = None) -> None:
    with contextlib.suppress(SegmentExistsError):
        await store.create_segment(name, segment_type, attributes)


async def delete_if_present(store: ControllerSegmentStore, name: str) -> None:
    with contextlib.suppress(SegmentNotFoundError):
        await store.delete(name)


class ControllerState:
    """Typed, conditional access to the controller's tables."""

    def __init__(self, store: ControllerSegmentStore) -> None:
        self.store = store

    async def start(self) -> None:
        for table in (SCOPES_TABLE, TXN_STREAMS_TABLE, WORKFLOWS_TABLE):
            await create_if_missing(self.store, table, SegmentType.TABLE)

    # --- generic ---------------------------------------------------------------

    async def _get(self, table: str, key: str) -> TableEntry | None:
        try:
            return (await self.store.table_get(table, [key.encode()]))[0]
        except SegmentNotFoundError:
            return None

    async def _put(self, table: str, key: str, value: bytes, version: int) -> int:
        """Write ``key`` if it is at ``version`` (NOT_EXISTS: absent); its new version."""
        try:
            return (await self.store.table_put(table, [(key.encode(), value, version)]))[0]
        except (TableKeyBadVersionError, TableKeyNotFoundError) as e:
            raise ControllerConcurrentUpdateError(
                f"{table}: {key!r} changed under this controller ({e})") from e

    async def _remove(self, table: str, key: str, version: int) -> None:
        try:
            await self.store.table_remove(table, [(key.encode(), version)])
        except (TableKeyBadVersionError, TableKeyNotFoundError) as e:
            raise ControllerConcurrentUpdateError(
                f"{table}: {key!r} changed under this controller ({e})") from e

    async def _page(self, table: str, token: str, limit: int
                    ) -> tuple[list[TableEntry], str]:
        """Up to ``limit`` entries after key ``token`` ('' : from the start) and
        the token after them (the same one when none are left)."""
        try:
            page = await self.store.table_iterate(table, False, token.encode() or None, limit)
        except SegmentNotFoundError:
            return [], token
        if not page.entries:
            return [], token
        return page.entries, page.entries[-1].key.decode()

    async def _all(self, table: str) -> AsyncIterator[TableEntry]:
        token = ""
        while True:
            entries, token = await self._page(table, token, 1000)
            if not entries:
                return
            for entry in entries:
                yield entry

    # --- scopes ----------------------------------------------------------------

    async def scope_version(self, scope: str) -> int | None:
        entry = await self._get(SCOPES_TABLE, scope)
        return None if entry is None else entry.version

    async def add_scope(self, scope: str) -> bool:
        """Create the scope (its streams table first); False if it exists."""
        if await self.scope_version(scope) is not None:
            return False
        await create_if_missing(self.store, streams_table(scope), SegmentType.TABLE)
        try:
            await self.store.table_put(SCOPES_TABLE, [(scope.encode(), b"{}", NOT_EXISTS)])
        except TableKeyBadVersionError:
            return False
        return True

    async def remove_scope(self, scope: str, version: int) -> None:
        await self._remove(SCOPES_TABLE, scope, version)
        await delete_if_present(self.store, streams_table(scope))
        await delete_if_present(self.store, reader_groups_table(scope))

    async def scopes(self, token: str, limit: int) -> tuple[list[str], str]:
        entries, token = await self._page(SCOPES_TABLE, token, limit)
        return [e.key.decode() for e in entries], token

    # --- streams ---------------------------------------------------------------

    async def stream(self, scope: str, stream: str) -> tuple[StreamRecord, int] | None:
        entry = await self._get(streams_table(scope), stream)
        if entry is None or entry.value is None:
            return None
        return stream_from_json(entry.value), entry.version

    async def put_stream(self, scope: str, stream: str, record: StreamRecord,
                         version: int) -> int:
        return await self._put(streams_table(scope), stream, stream_to_json(record), version)

    async def remove_stream(self, scope: str, stream: str, version: int) -> None:
        await self._remove(streams_table(scope), stream, version)

    async def streams(self, scope: str, token: str, limit: int
                      ) -> tuple[list[tuple[str, StreamRecord]], str]:
        entries, token = await self._page(streams_table(scope), token, limit)
        return [(e.key.decode(), stream_from_json(e.value or b"")) for e in entries], token

    async def all_streams(self) -> AsyncIterator[tuple[str, str]]:
        async for scope in self._all(SCOPES_TABLE):
            async for stream in self._all(streams_table(scope.key.decode())):
                yield scope.key.decode(), stream.key.decode()

    # --- transactions ------------------------------------------------------------

    async def txn(self, scope: str, stream: str, txn_id: int) -> tuple[TxnRecord, int] | None:
        entry = await self._get(txns_table(scope, stream), f"{txn_id:032x}")
        if entry is None or entry.value is None:
            return None
        return txn_from_json(entry.value), entry.version

    async def put_txn(self, scope: str, stream: str, record: TxnRecord, version: int) -> int:
        return await self._put(txns_table(scope, stream), f"{record.txn_id:032x}",
                               txn_to_json(record), version)

    async def remove_txn(self, scope: str, stream: str, txn_id: int, version: int) -> None:
        await self._remove(txns_table(scope, stream), f"{txn_id:032x}", version)

    async def txns(self, scope: str, stream: str) -> list[tuple[TxnRecord, int]]:
        return [(txn_from_json(e.value or b""), e.version)
                async for e in self._all(txns_table(scope, stream))]

    # --- indexes: streams with transactions, workflows under way -------------------

    async def mark_txn_stream(self, scope: str, stream: str) -> None:
        """Note that the stream may hold transactions (its key's version moves)."""
        await self.store.table_put(TXN_STREAMS_TABLE, [(f"{scope}/{stream}".encode(), b"{}",
                                                        None)])

    async def txn_streams(self) -> list[tuple[str, str, int]]:
        """``(scope, stream, version)`` of every stream marked."""
        out = []
        async for e in self._all(TXN_STREAMS_TABLE):
            scope, _, stream = e.key.decode().partition("/")
            out.append((scope, stream, e.version))
        return out

    async def unmark_txn_stream(self, scope: str, stream: str, version: int) -> None:
        """Drop the mark unless it was set again since ``version`` was read."""
        with contextlib.suppress(ControllerConcurrentUpdateError):
            await self._remove(TXN_STREAMS_TABLE, f"{scope}/{stream}", version)

    async def begin_work(self, scope: str, stream: str, member: str, now_ms: int) -> int:
        """Note that controller ``member`` changes the stream; the note's version."""
        key = f"{scope}/{stream}/{member}".encode()
        return (await self.store.table_put(WORKFLOWS_TABLE, [
            (key, json.dumps({"since": now_ms}).encode(), None)]))[0]

    async def end_work(self, scope: str, stream: str, member: str, version: int) -> None:
        with contextlib.suppress(ControllerConcurrentUpdateError, SegmentNotFoundError):
            await self._remove(WORKFLOWS_TABLE, f"{scope}/{stream}/{member}", version)

    async def works(self) -> list[tuple[str, str, str, int, int]]:
        """``(scope, stream, member, since_ms, version)`` of every workflow noted."""
        out = []
        async for e in self._all(WORKFLOWS_TABLE):
            scope, stream, member = e.key.decode().split("/", 2)
            since = int(json.loads(e.value or b"{}").get("since", 0))
            out.append((scope, stream, member, since, e.version))
        return out

    # --- subscribers and reader groups -----------------------------------------------

    async def subscribers(self, scope: str, stream: str
                          ) -> list[tuple[str, dict[str, Any], int]]:
        """``(name, record, version)`` of the stream's subscribers."""
        return [(e.key.decode(), json.loads(e.value or b"{}"), e.version)
                async for e in self._all(subscribers_table(scope, stream))]

    async def subscriber(self, scope: str, stream: str, name: str
                         ) -> tuple[dict[str, Any], int] | None:
        entry = await self._get(subscribers_table(scope, stream), name)
        if entry is None or entry.value is None:
            return None
        return json.loads(entry.value), entry.version

    async def put_subscriber(self, scope: str, stream: str, name: str,
                             record: dict[str, Any], version: int) -> int:
        table = subscribers_table(scope, stream)
        await create_if_missing(self.store, table, SegmentType.TABLE)
        return await self._put(table, name, json.dumps(record).encode(), version)

    async def remove_subscriber(self, scope: str, stream: str, name: str) -> None:
        with contextlib.suppress(SegmentNotFoundError):
            await self.store.table_remove(subscribers_table(scope, stream),
                                          [(name.encode(), None)])

    async def reader_group(self, scope: str, name: str
                           ) -> tuple[dict[str, Any], int] | None:
        entry = await self._get(reader_groups_table(scope), name)
        if entry is None or entry.value is None:
            return None
        return json.loads(entry.value), entry.version

    async def reader_groups(self, scope: str) -> list[tuple[str, dict[str, Any]]]:
        return [(e.key.decode(), json.loads(e.value or b"{}"))
                async for e in self._all(reader_groups_table(scope))]

    async def put_reader_group(self, scope: str, name: str, record: dict[str, Any],
                               version: int | None) -> int:
        """Write the group's record (``version`` None: whatever is there)."""
        table = reader_groups_table(scope)
        await create_if_missing(self.store, table, SegmentType.TABLE)
        if version is None:
            return (await self.store.table_put(table, [(name.encode(),
                                                        json.dumps(record).encode(), None)]))[0]
        return await self._put(table, name, json.dumps(record).encode(), version)

    async def remove_reader_group(self, scope: str, name: str) -> None:
        with contextlib.suppress(SegmentNotFoundError):
            await self.store.table_remove(reader_groups_table(scope), [(name.encode(), None)])
