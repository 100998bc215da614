"""What a history must satisfy: :func:`check` returns every anomaly.

An ``unknown`` operation never counts as a failure: an unknown write may
or may not appear, but it must not appear twice or out of order; a
``fail`` write must never appear.

**Ledgers** (``obj`` is the ledger id).  ``ledger.add`` (value
``payload``, result ``entry``); ``ledger.close`` and ``ledger.recover``
(result ``last``, the entry the ledger is closed at); ``ledger.read``
(result ``entries`` as ``[[entry, payload], ...]``, ``last`` if it read a
closed ledger, ``complete`` if it read every entry up to ``last``);
``ledger.lac`` (result ``lac``).

* everyone sees one close (*divergent close*); no ledger is closed below
  an acknowledged entry (*closed below an acknowledged entry*), and no
  entry above the close is ever read (*fenced write visible*: an old,
  fenced writer's add);
* every acknowledged add is read back at its entry with its payload by any
  read that covers that entry, a complete read covering them all (*lost
  acknowledged entry*); reads agree on each entry (*divergent read*); a
  payload is at one entry only (*duplicate entry*); a failed add is never
  read (*failed write visible*);
* one writer's adds are in the ledger in the order it made them
  (*reordered*);
* one reader's LAC never moves backwards (*LAC moved backwards*);
* a ledger with acknowledged adds is read completely at least once
  (*unchecked*: otherwise nothing above could be proved).

**Streams** (``obj`` is ``scope/stream``).  ``event.write`` by a writer
(value ``key``, ``payload``, ``exactly_once``); ``event.read`` by a reader
(value ``group``; result ``payload``, ``segment``, ``offset``);
``reader.release`` (value ``group``, result ``segment``: every event the
reader read from that segment, or from all with none, is released: its
position is kept by the group); ``reader.fail`` (value ``group``: the
reader left without releasing what it holds); ``group.done`` (value
``group``: the group's readers read the stream to its end).

* every acknowledged event is read by each group that is done (*lost
  acknowledged event*), and a group is done for every stream with
  acknowledged events (*unchecked*); nothing is read that nobody wrote
  (*phantom event*); a failed write is never read (*failed write visible*);
* an exactly-once writer's event is at one position (*event written
  twice*);
* a group reads each position once while its readers live: it may read a
  position again only after the reader that read it failed without
  releasing it (*event read twice*);
* one writer's events of one routing key are first read in the order it
  wrote them, across scaling too (*reordered*).

**Segment lengths** (``segment.length``, ``obj`` the segment, result
``length``): a read must not return a length below one that a read
completed before it began had returned (*stale read*): whichever host
answers, the segment's length never goes back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from quire.testing.history import FAIL, Anomaly, Operation


def check(ops: Sequence[Operation]) -> list[Anomaly]:
    """Every anomaly of the history (module docstring)."""
    by_obj: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for op in ops:
        family = op.f.partition(".")[0]
        if family in ("ledger", "event", "reader", "group"):
            by_obj["ledger" if family == "ledger" else "stream", op.obj].append(op)
    anomalies: list[Anomaly] = []
    for (family, obj), group in sorted(by_obj.items()):
        if family == "ledger":
            anomalies += _check_ledger(obj, group)
        else:
            anomalies += _check_stream(obj, group)
    anomalies += _check_lacs(ops)
    anomalies += _check_lengths(ops)
    return anomalies


# --- ledgers ----------------------------------------------------------------------------


def _check_ledger(ledger: str, ops: list[Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    ok = [o for o in ops if o.ok]
    adds = [o for o in ops if o.f == "ledger.add"]
    reads = [o for o in ok if o.f == "ledger.read"]
    closes = [o for o in ok if o.f in ("ledger.close", "ledger.recover", "ledger.read")
              and o.res("last") is not None]
    ends = {o.res("last"): o for o in closes}
    if len(ends) > 1:
        found.append(Anomaly("divergent close", f"ledger {ledger} closed at entries "
                             f"{sorted(ends)}", list(ends.values())))
    last, close = (min(ends), ends[min(ends)]) if ends else (None, None)
    contents: dict[int, tuple[str, Operation]] = {}
    for read in reads:
        for entry, payload in read.res("entries", []):
            if entry in contents and contents[entry][0] != payload:
                found.append(Anomaly("divergent read", f"ledger {ledger} entry {entry} read "
                                     f"as {contents[entry][0]!r} and {payload!r}",
                                     [contents[entry][1], read]))
            contents.setdefault(entry, (payload, read))
            if last is not None and close is not None and entry > last:
                found.append(Anomaly("fenced write visible", f"ledger {ledger} closed at "
                                     f"{last} but entry {entry} was read", [close, read]))
    where: dict[str, int] = {}
    for entry, (payload, read) in sorted(contents.items()):
        if payload in where:
            found.append(Anomaly("duplicate entry", f"ledger {ledger}: {payload!r} is at "
                                 f"entries {where[payload]} and {entry}",
                                 [contents[where[payload]][1], read]))
        else:
            where[payload] = entry
    complete = next((r for r in reads if r.res("complete")), None)
    for add in adds:
        payload, entry = add.arg("payload"), add.res("entry")
        if add.outcome == FAIL and payload in where:
            found.append(Anomaly("failed write visible", f"ledger {ledger}: a failed add is "
                                 f"at entry {where[payload]}",
                                 [add, contents[where[payload]][1]]))
        if not add.ok:
            continue
        if last is not None and close is not None and entry > last:
            found.append(Anomaly("closed below an acknowledged entry", f"ledger {ledger} "
                                 f"closed at {last}, entry {entry} was acknowledged",
                                 [add, close]))
        elif entry in contents and contents[entry][0] != payload:
            found.append(Anomaly("lost acknowledged entry", f"ledger {ledger} entry {entry} "
                                 f"was acknowledged as {payload!r}, read as "
                                 f"{contents[entry][0]!r}", [add, contents[entry][1]]))
        elif entry not in contents and complete is not None:
            found.append(Anomaly("lost acknowledged entry", f"ledger {ledger} entry {entry} "
                                 "was acknowledged; a complete read lacks it",
                                 [add, complete]))
    found += _check_add_order(ledger, adds, where)
    if complete is None and any(a.ok for a in adds):
        found.append(Anomaly("unchecked", f"ledger {ledger} has acknowledged adds but was "
                             "never read completely", []))
    return found


def _check_add_order(ledger: str, adds: list[Operation],
                     where: dict[str, int]) -> list[Anomaly]:
    found: list[Anomaly] = []
    by_writer: dict[str, list[Operation]] = defaultdict(list)
    for add in adds:
        by_writer[add.process].append(add)
    for writer_adds in by_writer.values():
        previous: tuple[int, Operation] | None = None
        for add in sorted(writer_adds, key=lambda o: (o.invoked, o.id)):
            entry = add.res("entry") if add.ok else where.get(add.arg("payload"))
            if entry is None:
                continue
            if previous is not None and entry <= previous[0]:
                found.append(Anomaly("reordered", f"ledger {ledger}: an add made later is at "
                                     f"entry {entry}, not after {previous[0]}",
                                     [previous[1], add]))
            previous = (entry, add)
    return found


def _check_lacs(ops: Iterable[Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    seen: dict[tuple[str, str], Operation] = {}
    for op in sorted((o for o in ops if o.f == "ledger.lac" and o.ok),
                     key=lambda o: (o.completed, o.id)):
        key = (op.process, op.obj)
        best = seen.get(key)
        if best is not None and op.res("lac") < best.res("lac"):
            found.append(Anomaly("LAC moved backwards", f"ledger {op.obj}: reader "
                                 f"{op.process} saw LAC {best.res('lac')}, then "
                                 f"{op.res('lac')}", [best, op]))
        if best is None or op.res("lac") > best.res("lac"):
            seen[key] = op
    return found


# --- streams ----------------------------------------------------------------------------


def _check_stream(stream: str, ops: list[Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    writes = {o.arg("payload"): o for o in ops if o.f == "event.write"}
    groups: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.f != "event.write" and op.arg("group") is not None:
            groups[op.arg("group")].append(op)
    acknowledged = [w for w in writes.values() if w.ok]
    if acknowledged and not any(o.f == "group.done" and o.ok for o in ops):
        found.append(Anomaly("unchecked", f"stream {stream} has acknowledged events but no "
                             "reader group read it to its end", []))
    for group, group_ops in sorted(groups.items()):
        found += _check_group(stream, group, group_ops, writes)
    return found


def _check_group(stream: str, group: str, ops: list[Operation],
                 writes: dict[Any, Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    reads = sorted((o for o in ops if o.f == "event.read" and o.ok),
                   key=lambda o: (o.invoked, o.process, o.id))
    by_payload: dict[Any, list[Operation]] = defaultdict(list)
    for read in reads:
        payload = read.res("payload")
        write = writes.get(payload)
        if write is None:
            found.append(Anomaly("phantom event", f"{stream}: group {group} read "
                                 f"{payload!r}, which nobody wrote", [read]))
        elif write.outcome == FAIL and not by_payload[payload]:
            found.append(Anomaly("failed write visible", f"{stream}: group {group} read "
                                 "an event whose write failed", [write, read]))
        by_payload[payload].append(read)
    for payload, seen in by_payload.items():
        found += _check_rereads(stream, group, ops, writes.get(payload), seen)
    done = next((o for o in ops if o.f == "group.done" and o.ok), None)
    if done is not None:
        for write in writes.values():
            if write.ok and write.before(done) and write.arg("payload") not in by_payload:
                found.append(Anomaly("lost acknowledged event", f"{stream}: group {group} "
                                     "read the stream to its end without this acknowledged "
                                     "event", [write, done]))
    found += _check_key_order(stream, group, writes.values(), reads, by_payload)
    return found


def _position(read: Operation) -> tuple[Any, Any]:
    return read.res("segment"), read.res("offset")


def _check_rereads(stream: str, group: str, ops: list[Operation], write: Operation | None,
                   seen: list[Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    positions = {_position(r): r for r in seen}
    if len(positions) > 1 and (write is None or write.arg("exactly_once", True)):
        found.append(Anomaly("event written twice", f"{stream}: one event is at "
                             f"{len(positions)} positions", [w for w in (write,) if w] +
                             list(positions.values())))
        return found
    for first, again in pairwise(seen):
        if not _released_by_failure(ops, first, again):
            found.append(Anomaly("event read twice", f"{stream}: group {group} read an "
                                 "event again while the reader that read it lived, or "
                                 "after it released it", [first, again]))
    return found


def _released_by_failure(ops: list[Operation], first: Operation, again: Operation) -> bool:
    """``first``'s reader failed after reading it, before ``again``, and had
    not released it by then: the group may hand the event out again."""
    reader, segment = first.process, first.res("segment")
    assert first.completed is not None
    for fail in ops:
        if fail.f != "reader.fail" or fail.process != reader or \
                not first.completed <= fail.invoked <= again.invoked:
            continue
        released = any(
            o.f == "reader.release" and o.process == reader and
            o.res("segment") in (None, segment) and first.completed <= o.invoked <= fail.invoked
            for o in ops)
        if not released:
            return True
    return False


def _check_key_order(stream: str, group: str, writes: Iterable[Operation],
                     reads: list[Operation],
                     by_payload: dict[Any, list[Operation]]) -> list[Anomaly]:
    found: list[Anomaly] = []
    order = {id(r): i for i, r in enumerate(reads)}
    sequences: dict[tuple[str, Any], list[Operation]] = defaultdict(list)
    for write in writes:
        sequences[write.process, write.arg("key")].append(write)
    for (_writer, key), sequence in sequences.items():
        if key is None:
            continue  # no routing key: no order promised
        previous: tuple[int, Operation, Operation] | None = None
        for write in sorted(sequence, key=lambda o: (o.invoked, o.id)):
            seen = by_payload.get(write.arg("payload"))
            if not seen:
                continue
            index = order[id(seen[0])]
            if previous is not None and index < previous[0]:
                found.append(Anomaly("reordered", f"{stream}: group {group} read key {key!r}'s "
                                     "events out of the order they were written",
                                     [previous[1], write, previous[2], seen[0]]))
            previous = (index, write, seen[0])
    return found


# --- segment lengths --------------------------------------------------------------------


def _check_lengths(ops: Iterable[Operation]) -> list[Anomaly]:
    found: list[Anomaly] = []
    lengths = [o for o in ops if o.f == "segment.length" and o.ok]
    completions = sorted(lengths, key=lambda o: (o.completed, o.id))
    frontier: dict[str, Operation] = {}
    done = 0
    for read in sorted(lengths, key=lambda o: (o.invoked, o.id)):
        while done < len(completions) and completions[done].before(read):
            seen = completions[done]
            best = frontier.get(seen.obj)
            if best is None or seen.res("length") > best.res("length"):
                frontier[seen.obj] = seen
            done += 1
        best = frontier.get(read.obj)
        if best is not None and read.res("length") < best.res("length"):
            found.append(Anomaly("stale read", f"segment {read.obj}: length "
                                 f"{read.res('length')} read after {best.res('length')} had "
                                 "been", [best, read]))
    return found
