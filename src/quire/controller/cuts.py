"""Stream cuts: checking them, ordering them, and where retention truncates (sans-IO).

A stream cut maps segment ids to offsets; a valid one covers the key space
(0, 1] exactly once.  Two cuts are ordered region by region of the key
space: where both name one segment, by offset; where they name two
overlapping segments, the one created in the earlier epoch comes first (two
overlapping segments never coexist in an epoch, so the earlier one was
sealed before the later was created).  A cut is *at or before* another if
it is so in every region; cuts that are before in one region and after in
another are not ordered.

Retention (Pravega's): the controller records a cut every retention
interval and truncates only at recorded cuts.  The minimum limit is always
kept: the stream is truncated at the latest recorded cut that keeps at
least ``retention_param`` (bytes or ms) after it.  A stream with
subscribers (reader groups that report what they have read) is truncated
no further than the latest recorded cut at or before every subscriber's
cut, unless that would keep more than ``retention_max``: then at the
latest cut that keeps at least the maximum, read or not.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from quire.controller.model import (
    KEY_SPACE_END,
    RecordedCut,
    RetentionType,
    StreamRecord,
    merged,
    segment_epoch,
)
from quire.errors import ControllerInvalidArgumentError

Cut = Mapping[int, int]


def is_cut(record: StreamRecord, cut: Cut) -> bool:
    """Whether ``cut`` is a cut of the stream (wherever its head is)."""
    known = record.all_segments()
    if any(sid not in known or offset < 0 for sid, offset in cut.items()):
        return False
    segments = sorted((known[sid] for sid in cut), key=lambda s: s.min_key)
    return bool(segments) and merged([(s.min_key, s.max_key) for s in segments]) == \
        [(0.0, KEY_SPACE_END)] and all(a.max_key <= b.min_key
                                       for a, b in itertools.pairwise(segments))


def check_cut(record: StreamRecord, cut: Cut) -> list[int]:
    """Check a stream cut (its segments cover (0, 1] exactly, offsets are
    not negative, it is not before the current head) and return the ids of
    the segments wholly before it (ControllerInvalidArgumentError if not)."""
    known = record.all_segments()
    segments = []
    for sid, offset in cut.items():
        s = known.get(sid)
        if s is None:
            raise ControllerInvalidArgumentError(f"segment {sid} is not in the stream")
        if offset < 0:
            raise ControllerInvalidArgumentError(f"segment {sid}: offset {offset} < 0")
        segments.append(s)
    segments.sort(key=lambda s: s.min_key)
    if not segments or merged([(s.min_key, s.max_key) for s in segments]) != \
            [(0.0, KEY_SPACE_END)] or any(a.max_key > b.min_key for a, b in
                                           itertools.pairwise(segments)):
        raise ControllerInvalidArgumentError("a stream cut must cover the keys (0, 1] "
                                             "exactly once")
    head = record.head_cut()
    for h, h_offset in head.items():
        hs = known[h]
        for s in segments:
            if s.overlaps(hs) and (segment_epoch(s.id) < segment_epoch(h)
                                   or (s.id == h and cut[s.id] < h_offset)):
                raise ControllerInvalidArgumentError(
                    f"the stream cut is before the stream's head at segment {h}")
    return sorted(sid for sid, s in known.items() if sid not in cut and any(
        c.overlaps(s) and segment_epoch(c.id) > segment_epoch(sid) for c in segments))


def after_head(record: StreamRecord, cut: Cut) -> bool:
    """Whether ``cut`` is a valid cut past the stream's head."""
    try:
        check_cut(record, cut)
    except ControllerInvalidArgumentError:
        return False
    return dict(cut) != record.head_cut()


def at_or_before(record: StreamRecord, a: Cut, b: Cut) -> bool:
    """Whether cut ``a`` is at or before cut ``b`` in every region (both
    valid cuts of ``record``'s stream)."""
    known = record.all_segments()
    for sa, offset_a in a.items():
        ra = known[sa]
        for sb, offset_b in b.items():
            if sa == sb:
                if offset_a > offset_b:
                    return False
            elif ra.overlaps(known[sb]) and segment_epoch(sa) > segment_epoch(sb):
                return False
    return True


def retention_cut(record: StreamRecord, now_ms: int, size: int,
                  subscribers: Sequence[Cut] = ()) -> RecordedCut | None:
    """The recorded cut to truncate at (module docstring), the stream
    holding ``size`` bytes now and its subscribers having read up to
    ``subscribers``; None to keep everything."""
    c = record.config
    if c.retention is RetentionType.NONE:
        return None
    cuts = record.retention_cuts

    def kept(r: RecordedCut) -> int:
        return size - r.size if c.retention is RetentionType.SIZE else now_ms - r.time_ms

    def last(limit: int) -> int | None:
        found = None
        for i, r in enumerate(cuts):
            if kept(r) >= limit:
                found = i
        return found

    at_min = last(c.retention_param)
    if at_min is None:
        return None
    if not subscribers:
        return cuts[at_min]
    held = None
    for i, r in enumerate(cuts):
        if all(at_or_before(record, r.cut, s) for s in subscribers):
            held = i
    chosen = at_min if held is None else min(at_min, held)
    at_max = last(c.retention_max) if c.retention_max > 0 else None
    if held is None and at_max is None:
        return None
    if at_max is not None and (held is None or at_max > chosen):
        chosen = at_max
    return cuts[chosen]
