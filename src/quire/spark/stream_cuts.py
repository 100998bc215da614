"""The streams of a read and where each starts and ends (on the Spark driver).

A read names its streams (``stream``, ``streams``) or a pattern
(``stream_pattern``): :func:`selected_streams` lists them now, so a stream
created while a query runs joins it at the next micro-batch.  Each stream is
planned alone (:class:`~quire.spark.stream_plan.CutPlanner`); its start and
end come from the options (:func:`start_cut`, :func:`end_cut`): the head,
the tail, a cut, or a time, found with the segment store's
``LocateAppendTime`` (a binary search over the tier-2 sidecars and the
container's append-time index: no event is read, :func:`time_cut`).

A streaming query's offset holds a cut per stream, :class:`Offsets`::

    {"streams": {"scope/a": {"<segment id>": offset, ...}, ...},
     "joined": {"scope/c": {...}},    streams new in this batch: where they start
     "subscriber": "spark-1f2e..."}    the retention hold's name (or absent)

An older checkpoint's offset, a bare cut, is read as the one stream's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quire.spark.stream_options import (
    EARLIEST,
    LATEST,
    Cut,
    StreamOptions,
    cut_from_json,
    cut_to_json,
)
from quire.spark.stream_plan import CutPlanner
from quire.spark.stream_read import stream_clients
from quire.streams.append_times import locate_append_time
from quire.streams.model import segment_name


def stream_key(scope: str, stream: str) -> str:
    return f"{scope}/{stream}"


def split_key(key: str) -> tuple[str, str]:
    scope, _, stream = key.partition("/")
    return scope, stream


async def selected_streams(opts: StreamOptions) -> list[tuple[str, str]]:
    """The streams the options name, or those the pattern matches now (sorted)."""
    if opts.pattern is None:
        return list(opts.streams)
    controller, _segments = await stream_clients(opts.access, opts.read_bytes)
    scope = opts.pattern[0]
    return [(scope, name) for name in sorted(await controller.list_streams(scope))
            if opts.matches(scope, name)]


async def planner(opts: StreamOptions, scope: str, stream: str) -> CutPlanner:
    controller, segments = await stream_clients(opts.access, opts.read_bytes)
    return CutPlanner(controller, segments, scope, stream,
                      fail_on_data_loss=opts.fail_on_data_loss, read_bytes=opts.read_bytes)


async def time_cut(plan: CutPlanner, time_ms: int) -> Cut:
    """Where appends at or after ``time_ms`` start, from the stream's head:
    each segment at its first such append; a sealed segment with none gives
    way to its successors (once all their predecessors did)."""
    cut: Cut = {}
    ended: set[int] = set()
    queue = sorted(await plan.head_cut())
    seen = set(queue)
    while queue:
        sid = queue.pop(0)
        name = segment_name(plan.scope, plan.stream, sid)
        info, offset = await asyncio.gather(plan.segments.get_info(name),
                                            locate_append_time(plan.segments, name, time_ms))
        if offset >= info.length and info.sealed:
            successors = await plan.controller.successors(plan.scope, plan.stream, sid)
            if successors:
                ended.add(sid)
                for successor, predecessors in successors:
                    if successor.id not in seen and all(p in ended for p in predecessors):
                        seen.add(successor.id)
                        queue.append(successor.id)
                continue
        cut[sid] = offset
    return cut


async def start_cut(plan: CutPlanner, opts: StreamOptions) -> Cut:
    """Where reading starts (``start_stream_cut`` or ``start_time``)."""
    if opts.start_time_ms is not None:
        return await time_cut(plan, opts.start_time_ms)
    if opts.start == EARLIEST:
        return await plan.head_cut()
    if opts.start == LATEST:
        return await plan.tail_cut()
    assert isinstance(opts.start, dict)
    return dict(opts.start)


async def end_cut(plan: CutPlanner, opts: StreamOptions) -> Cut:
    """Where a batch read ends (``end_stream_cut`` or ``end_time``)."""
    if opts.end_time_ms is not None:
        return await time_cut(plan, opts.end_time_ms)
    if opts.end == LATEST:
        return await plan.tail_cut()
    assert isinstance(opts.end, dict)
    return dict(opts.end)


async def bytes_between(plan: CutPlanner, start: Cut, end: Cut) -> int:
    """How many bytes of the stream lie between two cuts."""
    spans, _ = await plan.plan_between(start, end)
    return sum(s.last - s.first for s in spans)


@dataclass
class Offsets:
    """A streaming query's offset (module docstring)."""

    streams: dict[str, Cut] = field(default_factory=dict)
    joined: dict[str, Cut] = field(default_factory=dict)
    subscriber: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"streams": {k: cut_to_json(v)
                                           for k, v in sorted(self.streams.items())}}
        if self.joined:
            doc["joined"] = {k: cut_to_json(v) for k, v in sorted(self.joined.items())}
        if self.subscriber is not None:
            doc["subscriber"] = self.subscriber
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], opts: StreamOptions) -> Offsets:
        if "streams" not in doc:  # a bare cut: an older checkpoint of one stream's query
            scope, stream = opts.streams[0]
            return cls({stream_key(scope, stream): cut_from_json(doc)})
        return cls({k: cut_from_json(v) for k, v in doc["streams"].items()},
                   {k: cut_from_json(v) for k, v in doc.get("joined", {}).items()},
                   doc.get("subscriber"))

    def start_of(self, key: str, end: Offsets) -> Cut | None:
        """Where stream ``key`` starts in the batch from here to ``end``."""
        found = self.streams.get(key)
        return found if found is not None else end.joined.get(key)
