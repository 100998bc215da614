"""Table requests on one connection: updates, removals and the table reads."""

from __future__ import annotations

from quire.pravega_wire import (
    KEY_NO_VERSION,
    KEY_NOT_EXISTS,
    OperationUnsupported,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    TableEntriesDeltaRead,
    TableEntriesRead,
    TableEntriesUpdated,
    TableKey,
    TableKeysRead,
    TableKeysRemoved,
    TableRead,
    TableValue,
    UpdateTableEntries,
    WireCommand,
)
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.replies import ClientConnection
from quire.segmentstore import NOT_EXISTS, SegmentStore


def _expected_version(key_version: int) -> int | None:
    """A wire key version as the store's expected version."""
    if key_version == KEY_NO_VERSION:
        return None
    if key_version == KEY_NOT_EXISTS:
        return NOT_EXISTS
    return key_version


class TableRequests:
    """The table requests of one connection (creating, sealing and deleting
    a table are segment requests)."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig,
                 connection: ClientConnection) -> None:
        self._store = store
        self._config = config
        self._connection = connection

    def update_entries(self, c: UpdateTableEntries) -> None:
        if c.table_segment_offset != -1:
            self._connection.answer(OperationUnsupported(
                c.request_id, "conditional table segment offset", ""))
            return
        entries = [(k.data, v.data, _expected_version(k.key_version))
                   for k, v in c.table_entries]
        self._connection.reply(lambda: self._store.table_put(c.segment, entries),
                               lambda versions: TableEntriesUpdated(c.request_id,
                                                                    tuple(versions)),
                               c.request_id, c.segment,
                               cost=sum(len(k) + len(v) for k, v, _ in entries))

    def remove_keys(self, c: RemoveTableKeys) -> None:
        if c.table_segment_offset != -1:
            self._connection.answer(OperationUnsupported(
                c.request_id, "conditional table segment offset", ""))
            return
        keys = [(k.data, _expected_version(k.key_version)) for k in c.keys]
        self._connection.reply(lambda: self._store.table_remove(c.segment, keys),
                               lambda _: TableKeysRemoved(c.request_id, c.segment),
                               c.request_id, c.segment)

    def read_table(self, c: ReadTable) -> None:
        async def read() -> WireCommand:
            found = await self._store.table_get(c.segment, [k.data for k in c.keys])
            entries = tuple(
                (TableKey(k.data, KEY_NOT_EXISTS), TableValue(b"")) if e is None
                else (TableKey(e.key, e.version), TableValue(e.value or b""))
                for k, e in zip(c.keys, found, strict=True))
            return TableRead(c.request_id, c.segment, entries)
        self._connection.reply(read, lambda reply: reply, c.request_id, c.segment,
                               cost=self._config.max_read_bytes, reads_only=True)

    def _count(self, suggested: int) -> int:
        return min(max(1, suggested), self._config.max_table_entries_per_read)

    def read_keys(self, c: ReadTableKeys) -> None:
        async def read() -> WireCommand:
            page = await self._store.table_iterate(c.segment, True, c.continuation_token or None,
                                                   self._count(c.suggested_key_count))
            keys = tuple(TableKey(e.key, e.version) for e in page.entries)
            return TableKeysRead(c.request_id, c.segment, keys,
                                 keys[-1].data if keys else c.continuation_token)
        self._connection.reply(read, lambda reply: reply, c.request_id, c.segment,
                               cost=self._config.max_read_bytes, reads_only=True)

    def read_entries(self, c: ReadTableEntries) -> None:
        async def read() -> WireCommand:
            page = await self._store.table_iterate(c.segment, False,
                                                   c.continuation_token or None,
                                                   self._count(c.suggested_entry_count))
            entries = tuple((TableKey(e.key, e.version), TableValue(e.value or b""))
                            for e in page.entries)
            return TableEntriesRead(c.request_id, c.segment, entries,
                                    entries[-1][0].data if entries else c.continuation_token)
        self._connection.reply(read, lambda reply: reply, c.request_id, c.segment,
                               cost=self._config.max_read_bytes, reads_only=True)

    def read_delta(self, c: ReadTableEntriesDelta) -> None:
        async def read() -> WireCommand:
            delta = await self._store.table_read_delta(c.segment, c.from_position,
                                                       self._count(c.suggested_entry_count))
            entries: list[tuple[TableKey, TableValue]] = []
            last_position = delta.last_position
            size = 0
            for e in delta.entries:
                value = e.value or b""
                size += len(e.key) + len(value) + 24
                if entries and size > self._config.max_read_bytes:
                    last_position = e.version  # the next read starts at this entry
                    break
                entries.append((TableKey(e.key, e.version), TableValue(value)))
            length = (await self._store.get_info(c.segment)).length
            return TableEntriesDeltaRead(c.request_id, c.segment, tuple(entries),
                                         delta.should_clear, last_position >= length,
                                         last_position)
        self._connection.reply(read, lambda reply: reply, c.request_id, c.segment,
                               cost=self._config.max_read_bytes, reads_only=True)
