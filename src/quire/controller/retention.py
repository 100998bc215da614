"""Truncation, retention, reader groups and their subscriptions.

Retention is the leader's duty: every ``retention_interval_ms`` it records
a cut of each stream with a retention policy and truncates the stream as
:func:`~quire.controller.cuts.retention_cut` says, given the cuts its
subscribers reported.

A reader group registered with the controller (``createReaderGroup``, as
Pravega's Java client does; the Rust and Python clients keep their groups
in a table segment of their own and never call it) is a *subscriber* of
its streams when its retention type is MANUAL or AUTOMATIC: it reports
what it has read (``updateSubscriberStreamCut``), and a stream is not
truncated past what its subscribers have read (within ``retention_max``).
The controller also notes the groups it sees clients use, by their table
segments' ``getURI`` (``<group>_kvtable``), so ``quire readergroup list``
finds them.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

from quire.controller.base import CoreBase
from quire.controller.cuts import after_head, at_or_before, check_cut, is_cut, retention_cut
from quire.controller.model import (
    RecordedCut,
    RetentionType,
    StreamRecord,
    StreamState,
    segment_name,
)
from quire.controller.state import delete_if_present
from quire.errors import (
    ControllerConcurrentUpdateError,
    ControllerInvalidArgumentError,
    ControllerNotFoundError,
    ScopeNotFoundError,
    SegmentNotFoundError,
)
from quire.segmentstore import NOT_EXISTS
from quire.segmentstore.names import check_name

log = logging.getLogger("quire.controller")
RETENTION_TYPES = ("none", "manual", "automatic")
"""A reader group's retention type, as ``ReaderGroupConfiguration`` numbers them."""


def cut_of(pairs: Any) -> dict[int, int]:
    return {int(sid): int(offset) for sid, offset in pairs}


class RetentionOps(CoreBase):
    """The retention part of ControllerCore."""

    async def truncate_at(self, scope: str, stream: str, record: StreamRecord,
                          cut: dict[int, int]) -> None:
        """Truncate at ``cut`` and make it ``record``'s head (written by the caller)."""
        before = check_cut(record, cut)
        for sid, offset in sorted(cut.items()):  # every offset checked before any change
            try:
                length = (await self.store.get_info(segment_name(scope, stream, sid))).length
            except SegmentNotFoundError as e:
                raise ControllerInvalidArgumentError(
                    f"segment {sid} of the cut was deleted") from e
            if offset > length:
                raise ControllerInvalidArgumentError(
                    f"segment {sid}: offset {offset} is past its length {length}")
        for sid, offset in sorted(cut.items()):
            await self.store.truncate(segment_name(scope, stream, sid), offset)
        for sid in before:
            await delete_if_present(self.store, segment_name(scope, stream, sid))
        record.head = dict(cut)
        record.truncated_ms = self.now_ms()
        record.retention_cuts = [r for r in record.retention_cuts if after_head(record, r.cut)]

    async def enforce_retention(self) -> None:
        """One retention pass (the module docstring)."""
        async for scope, stream in self.state.all_streams():
            found = await self.state.stream(scope, stream)
            if found is None or found[0].state is not StreamState.ACTIVE or \
                    found[0].config.retention is RetentionType.NONE:
                continue
            async with self._stream_lock(scope, stream):
                await self._retain(scope, stream)

    async def _retain(self, scope: str, stream: str) -> None:
        async def retain() -> None:
            await self._retain_once(scope, stream)
        await self.retrying(retain)

    async def _retain_once(self, scope: str, stream: str) -> None:
        await self.settle(scope, stream)
        record, version = await self._stream(scope, stream)
        now = self.now_ms()
        cut = {s.id: (await self.store.get_info(segment_name(scope, stream, s.id))).length
               for s in record.current.segments}
        size = record.sealed_bytes + sum(cut.values())
        last = record.retention_cuts[-1] if record.retention_cuts else None
        if (last is None or last.cut != cut) and after_head(record, cut):
            record.retention_cuts.append(RecordedCut(now, size, cut))
            del record.retention_cuts[:-self.config.max_retention_cuts]
        subscribers = [cut_of(doc["cut"]) or record.head_cut()
                       for _name, doc, _v in await self.state.subscribers(scope, stream)]
        chosen = retention_cut(record, now, size, subscribers)
        if chosen is not None:
            log.info("stream %s/%s: retention truncates at %s", scope, stream, chosen.cut)
            await self.truncate_at(scope, stream, record, dict(chosen.cut))
            self.metrics.retention_truncations.inc()
        await self.state.put_stream(scope, stream, record, version)

    # --- reader groups and subscribers ---------------------------------------------

    async def create_reader_group(self, scope: str, name: str, group: dict[str, Any]
                                  ) -> dict[str, Any]:
        """Register a reader group (``group``: its configuration: ``retention``,
        ``streams`` {stream: cut pairs}, ...); the stored one if it exists
        (:class:`~quire.errors.InvalidNameError` for a name outside the rule)."""
        check_name("reader group", name)
        if not await self.scope_exists(scope):
            raise ScopeNotFoundError(f"no scope {scope!r}")
        found = await self.state.reader_group(scope, name)
        if found is not None and found[0].get("id"):
            return found[0]
        doc = {**group, "id": group.get("id") or str(uuid.uuid4()), "generation": 0}
        await self.state.put_reader_group(scope, name, doc, None)
        await self._subscribe(scope, name, doc, {})
        return doc

    async def reader_group(self, scope: str, name: str) -> dict[str, Any]:
        found = await self.state.reader_group(scope, name)
        if found is None or not found[0].get("id"):
            raise ControllerNotFoundError(f"no reader group {scope}/{name}")
        return found[0]

    async def update_reader_group(self, scope: str, name: str, group: dict[str, Any]
                                  ) -> dict[str, Any]:
        """Replace the group's configuration (its generation goes up)."""
        async def update() -> dict[str, Any]:
            found = await self.state.reader_group(scope, name)
            if found is None or not found[0].get("id"):
                raise ControllerNotFoundError(f"no reader group {scope}/{name}")
            old, version = found
            doc = {**group, "id": old["id"], "generation": int(old["generation"]) + 1}
            await self.state.put_reader_group(scope, name, doc, version)
            await self._subscribe(scope, name, doc, old)
            return doc
        return await self.retrying(update)

    async def delete_reader_group(self, scope: str, name: str) -> None:
        found = await self.state.reader_group(scope, name)
        if found is None:
            raise ControllerNotFoundError(f"no reader group {scope}/{name}")
        for stream in found[0].get("streams", {}):
            await self.state.remove_subscriber(scope, stream, f"{scope}/{name}")
        await self.state.remove_reader_group(scope, name)

    async def reader_groups(self, scope: str) -> list[tuple[str, dict[str, Any]]]:
        return await self.state.reader_groups(scope)

    async def note_client_group(self, scope: str, name: str) -> None:
        """A client uses reader group ``name`` (seen by its table's getURI)."""
        with contextlib.suppress(ControllerConcurrentUpdateError, SegmentNotFoundError):
            await self.state.put_reader_group(scope, name, {"client": True}, NOT_EXISTS)

    async def _subscribe(self, scope: str, name: str, doc: dict[str, Any],
                         old: dict[str, Any]) -> None:
        subscriber = f"{scope}/{name}"
        streams = doc.get("streams", {}) if doc.get("retention", "none") != "none" else {}
        for stream in old.get("streams", {}):
            if stream not in streams:
                await self.state.remove_subscriber(scope, stream, subscriber)
        for stream, cut in streams.items():
            found = await self.state.subscriber(scope, stream, subscriber)
            record = {"generation": doc["generation"], "group_id": doc["id"],
                      "cut": found[0]["cut"] if found else cut}
            await self.state.put_subscriber(scope, stream, subscriber, record,
                                            found[1] if found else NOT_EXISTS)

    async def subscribers(self, scope: str, stream: str) -> list[str]:
        await self._stream(scope, stream)
        return [name for name, _doc, _v in await self.state.subscribers(scope, stream)]

    async def update_subscriber_cut(self, scope: str, stream: str, subscriber: str,
                                    group_id: str, generation: int, cut: dict[int, int]) -> str:
        """Record what ``subscriber`` has read of the stream; a status of
        ``UpdateSubscriberStatus`` (SUCCESS, SUBSCRIBER_NOT_FOUND,
        GENERATION_MISMATCH, STREAM_CUT_NOT_VALID)."""
        async def update() -> str:
            record, _version = await self._stream(scope, stream)
            found = await self.state.subscriber(scope, stream, subscriber)
            if found is None:
                return "SUBSCRIBER_NOT_FOUND"
            doc, version = found
            if int(doc["generation"]) != generation or (group_id and doc["group_id"] != group_id):
                return "GENERATION_MISMATCH"
            if not is_cut(record, cut):
                return "STREAM_CUT_NOT_VALID"
            previous = cut_of(doc["cut"])
            if previous and not at_or_before(record, previous, cut):
                return "SUCCESS"  # older news: what it read does not go back
            doc["cut"] = sorted(cut.items())
            await self.state.put_subscriber(scope, stream, subscriber, doc, version)
            return "SUCCESS"
        return await self.retrying(update)
