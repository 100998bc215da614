"""What the clients of a stream-layer run were told, what they read, and
the invariants checked against it (:func:`check`).

Only what a client was *told* counts: an append, a commit or a table put
that failed without a definite answer is *unknown*, neither acknowledged
nor refused.  Events are unique byte strings (:func:`event`) naming their
writer, routing key and number, so any event found anywhere can be traced
to the one write that made it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from quire.simulation.workload import Violation

ACKED, REFUSED, UNKNOWN = "acked", "refused", "unknown"
COMMITTED, ABORTED = "committed", "aborted"


def event(writer: str, key: str, number: int, txn: str = "-") -> bytes:
    """The payload of ``writer``'s event ``number`` with routing key ``key``
    (in transaction ``txn``)."""
    return f"{writer}|{key}|{number}|{txn}".encode()


def parse(payload: bytes) -> tuple[str, str, int, str] | None:
    """(writer, key, number, txn) of an :func:`event`, None for anything else."""
    try:
        writer, key, number, txn = payload.decode().split("|")
        return writer, key, int(number), txn
    except ValueError:
        return None


@dataclass
class Txn:
    """One transaction as its client saw it."""

    stream: str
    events: list[bytes] = field(default_factory=list)
    """The events acknowledged into it (durable in its segments)."""
    fate: str = UNKNOWN
    """``committed``, ``aborted`` (told so, or left to expire), ``unknown``."""


@dataclass
class TablePut:
    key: bytes
    value: bytes
    expected: int | None
    outcome: str
    version: int | None = None
    """The new version, if acknowledged."""


@dataclass
class StreamHistory:
    """The run's history (module docstring)."""

    writes: dict[bytes, str] = field(default_factory=dict)
    """Every event written outside transactions -> acked, refused or unknown."""
    streams_of: dict[bytes, str] = field(default_factory=dict)
    """Event -> the stream it was written to."""
    wrong_refusals: list[str] = field(default_factory=list)
    """Events refused with an answer that cannot be right (a live stream
    called sealed or missing)."""
    txns: dict[str, Txn] = field(default_factory=dict)
    txn_ids: dict[str, int] = field(default_factory=dict)
    """Transaction -> its id (once the controller gave one)."""
    reads: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    """Reader -> every event it read in the rounds whose end it recorded, in
    order (its position moves past each event once)."""
    seen: set[bytes] = field(default_factory=set)
    """Every event any reader read (visible: it must stay)."""
    truncated: set[bytes] = field(default_factory=set)
    """Events below a cut a stream was truncated at (read before it was)."""
    lengths_back: list[str] = field(default_factory=list)
    conditional: dict[bytes, tuple[str, int]] = field(default_factory=dict)
    """Record -> (outcome, its offset if acknowledged, else the offset expected)."""
    puts: list[TablePut] = field(default_factory=list)
    tier2: list[str] = field(default_factory=list)
    """``quire tier2 check`` violations found at crash points and at the end."""
    owners: list[str] = field(default_factory=list)
    """Writes of a fenced owner that took effect."""
    recovery: list[str] = field(default_factory=list)
    liveness: list[str] = field(default_factory=list)
    final: dict[str, list[bytes]] = field(default_factory=dict)
    """Stream -> its events read from its head at the end, in order."""
    final_conditional: bytes | None = None
    final_table: dict[bytes, tuple[bytes, int]] = field(default_factory=dict)
    sealed_streams: set[str] = field(default_factory=set)
    """Streams whose sealing was asked for (a refusal as sealed is right there)."""

    def acked_events(self) -> Iterable[bytes]:
        yield from (e for e, outcome in self.writes.items() if outcome == ACKED)
        for txn in self.txns.values():
            if txn.fate == COMMITTED:
                yield from txn.events


def check(h: StreamHistory) -> list[Violation]:
    """Every invariant violated by the history ``h``."""
    out: list[Violation] = []
    final_all: dict[bytes, str] = {}
    for stream, events in sorted(h.final.items()):
        seen: set[bytes] = set()
        for e in events:
            if e in seen:
                out.append(Violation("event-duplicated", f"{e!r} twice in {stream}"))
            seen.add(e)
            final_all[e] = stream
        out += _order(f"the final read of {stream}", events)
    ever_read = h.seen.union(*h.reads.values())
    for reader, events in sorted(h.reads.items()):
        if len(set(events)) != len(events):
            twice = sorted({e for e in events if events.count(e) > 1})
            out.append(Violation("event-duplicated", f"{reader} read {twice[:3]!r} twice"))
        out += _order(f"{reader}'s reads", events)
    for e in sorted(h.acked_events()):
        if e not in final_all and e not in h.truncated:
            out.append(Violation("acknowledged-event-lost", f"{e!r} is gone"
                                 + (" (a reader had read it)" if e in ever_read else "")))
    for e in sorted(set(final_all) | ever_read):
        out += _visible(h, e)
    for e in sorted(ever_read):
        if e not in final_all and e not in h.truncated:
            out.append(Violation("read-not-durable", f"{e!r} was read, then was gone"))
    for name, txn in sorted(h.txns.items()):
        present = [e for e in txn.events if e in final_all or e in h.truncated]
        if txn.fate == COMMITTED and len(present) != len(txn.events):
            out.append(Violation("transaction-not-atomic", f"committed {name}: "
                                 f"{len(present)} of {len(txn.events)} events visible"))
        if txn.fate == UNKNOWN and present and len(present) != len(txn.events):
            out.append(Violation("transaction-not-atomic", f"{name} (outcome unknown): "
                                 f"{len(present)} of {len(txn.events)} events visible"))
    out += [Violation("wrongly-refused", text) for text in h.wrong_refusals]
    out += [Violation("length-moved-back", text) for text in h.lengths_back]
    out += _conditional(h)
    out += _table(h)
    out += [Violation("tier2-inconsistent", text) for text in h.tier2]
    out += [Violation("fenced-owner-wrote", text) for text in h.owners]
    out += [Violation("recovery", text) for text in h.recovery]
    out += [Violation("liveness", text) for text in h.liveness]
    return out


def _visible(h: StreamHistory, e: bytes) -> list[Violation]:
    """What is wrong with event ``e`` being visible (read or in a stream)."""
    parsed = parse(e)
    if parsed is None:
        return [Violation("phantom-event", f"{e!r} was never written")]
    name = parsed[3]
    if name == "-":
        outcome = h.writes.get(e)
        if outcome in (None, REFUSED):
            return [Violation("phantom-event", f"{e!r} was {outcome or 'never'} written")]
        return []
    txn = h.txns.get(name)
    if txn is None or e not in txn.events:
        return [Violation("phantom-event", f"{e!r}: transaction {name} never had it")]
    if txn.fate == ABORTED:
        return [Violation("transaction-not-atomic",
                          f"{e!r} of aborted transaction {name} is visible")]
    return []


def _order(where: str, events: list[bytes]) -> list[Violation]:
    """Each writer's events of one key in the order it wrote them."""
    last: dict[tuple[str, str], int] = {}
    out: list[Violation] = []
    for e in events:
        parsed = parse(e)
        if parsed is None:
            continue
        writer, key, number, _txn = parsed
        before = last.get((writer, key))
        if before is not None and number < before:
            out.append(Violation("writer-order", f"{where}: {writer}'s {key} event {number} "
                                 f"after {before}"))
        last[(writer, key)] = number if before is None else max(before, number)
    return out


def _conditional(h: StreamHistory) -> list[Violation]:
    content = h.final_conditional
    if content is None:
        return []
    out: list[Violation] = []
    size = len(next(iter(h.conditional), b"x" * 24)) if h.conditional else 24
    found: dict[bytes, list[int]] = defaultdict(list)
    for offset in range(0, len(content) - len(content) % size, size):
        found[content[offset:offset + size]].append(offset)
    for record, offsets in sorted(found.items()):
        outcome = h.conditional.get(record, (None, -1))[0]
        if len(offsets) > 1:
            out.append(Violation("conditional-append", f"{record!r} at {offsets}"))
        if outcome in (None, REFUSED):
            what = outcome or "never written"
            out.append(Violation("conditional-append", f"{record!r} ({what}) is at {offsets}"))
    for record, (outcome, offset) in sorted(h.conditional.items()):
        if outcome == ACKED and offset not in found.get(record, []):
            out.append(Violation("conditional-append", f"acknowledged {record!r} is not at "
                                 f"{offset} (found at {found.get(record, [])})"))
    return out


def _table(h: StreamHistory) -> list[Violation]:
    out: list[Violation] = []
    by_key: dict[bytes, list[TablePut]] = defaultdict(list)
    for put in h.puts:
        by_key[put.key].append(put)
    for key, puts in sorted(by_key.items()):
        acked = [p for p in puts if p.outcome == ACKED]
        expected = [p.expected for p in acked if p.expected is not None]
        if len(set(expected)) != len(expected):
            out.append(Violation("table-lost-update", f"{key!r}: two puts acknowledged from "
                                 f"one version ({sorted(expected)})"))
        versions = [p.version for p in acked]
        if len(set(versions)) != len(versions):
            out.append(Violation("table-lost-update", f"{key!r}: versions given twice "
                                 f"({versions})"))
        final = h.final_table.get(key)
        top = max(acked, key=lambda p: p.version or -1, default=None)
        if final is None:
            if top is not None:
                out.append(Violation("table-lost-update", f"{key!r} is gone"))
            continue
        value, version = final
        if top is not None and top.version is not None and version < top.version:
            out.append(Violation("table-lost-update", f"{key!r} is at version {version}, "
                                 f"below the acknowledged {top.version}"))
        writers = [p for p in puts if p.value == value]
        if not writers or all(p.outcome == REFUSED for p in writers):
            out.append(Violation("table-lost-update", f"{key!r} holds {value!r}, which no "
                                 "put that may have landed wrote"))
        elif top is not None and top.version == version and top.value != value:
            out.append(Violation("table-lost-update", f"{key!r} at version {version} holds "
                                 f"{value!r}, not the acknowledged {top.value!r}"))
    return out
