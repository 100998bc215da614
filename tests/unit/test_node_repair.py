"""BP-46 phase two's two pure parts, without processes: which entries a
bookie should hold and lacks (striping, several fragments), and the entry
copier's choice of sources (a bad copy refused, an UNKNOWN or a timeout
never taken for "no such entry": the next source is asked)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from quire.errors import ClientTimeoutError, NoSuchEntryError, QuireError, UnknownStateError
from quire.metadata import LedgerMetadata
from quire.node.entry_copier import EntryCopier
from quire.node.repair import LedgerRepair
from quire.protocol import BatchReadResponse, DigestManager, LedgerKeys
from quire.types import DigestType, LedgerState

PW = b"pw"
LEDGER = 5


def closed(ensemble_size: int, write_quorum: int, fragments: Sequence[tuple[int, tuple[str, ...]]],
           last: int) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size, write_quorum, 1, keys=LedgerKeys.of_password(PW),
                          state=LedgerState.CLOSED, last_entry_id=last,
                          ensembles=tuple(fragments))


class StoredIds:
    """The one storage call ``missing_entries`` makes."""

    def __init__(self, have: set[int]) -> None:
        self.have = have

    def stored_entry_ids(self, ledger_id: int, first: int, last: int) -> set[int]:
        return {e for e in self.have if first <= e <= last}


def repair_for(bookie: str, have: set[int]) -> LedgerRepair:
    return LedgerRepair(bookie, cast(Any, None), cast(Any, StoredIds(have)), cast(Any, None),
                        cast(Any, None), cast(Any, None), cast(Any, None), cast(Any, None),
                        cast(Any, None))


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 5).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e))),
       st.lists(st.integers(1, 30), min_size=1, max_size=3),
       st.integers(0, 80), st.sets(st.integers(0, 80)), st.data())
def test_missing_entries_are_those_of_its_write_sets_it_lacks(
        shape: tuple[int, int], fragment_lengths: list[int], last: int, have: set[int],
        data: st.DataObject) -> None:
    size, quorum = shape
    pool = [f"b{i}" for i in range(size + 2)]
    fragments, first = [], 0
    for length in fragment_lengths:
        fragments.append((first, tuple(data.draw(st.permutations(pool))[:size])))
        first += length
    metadata = closed(size, quorum, fragments, last)
    me = "b0"
    expected = []
    for entry_id in range(last + 1):
        ensemble = metadata.ensemble_at(entry_id)
        # entry e goes to the W bookies from position e mod E on, wrapping
        targets = {ensemble[(entry_id + i) % size] for i in range(quorum)}
        if me in targets and entry_id not in have:
            expected.append(entry_id)
    assert repair_for(me, have).missing_entries(LEDGER, metadata) == expected


def test_an_empty_closed_ledger_lacks_nothing() -> None:
    metadata = closed(3, 3, [(0, ("a", "b", "c"))], -1)
    assert repair_for("a", set()).missing_entries(LEDGER, metadata) == []


# --- the copier -------------------------------------------------------------------

DIGEST = DigestManager(LEDGER, DigestType.CRC32C, PW)


def good(entry_id: int) -> bytes:
    return DIGEST.encode(entry_id, entry_id - 1, 0, f"entry {entry_id}".encode())


def corrupted(entry_id: int) -> bytes:
    entry = good(entry_id)
    return entry[:-1] + bytes([entry[-1] ^ 1])


class Peer:
    """A bookie's batch reads: its copies, or one error for everything."""

    def __init__(self, copies: dict[int, bytes], error: QuireError | None = None) -> None:
        self.copies = copies
        self.error = error
        self.asked: list[tuple[int, int]] = []

    async def batch_read(self, ledger_id: int, start: int, count: int, max_bytes: int,
                         timeout_s: float) -> BatchReadResponse:
        self.asked.append((start, count))
        if self.error is not None:
            raise self.error
        entries = []
        for entry_id in range(start, start + count):
            if entry_id not in self.copies:
                break
            entries.append(self.copies[entry_id])
        if not entries:
            raise NoSuchEntryError(f"entry {start}")
        return BatchReadResponse.from_entries(0, cast(Any, 0), ledger_id, start, entries)


class Pool:
    def __init__(self, peers: dict[str, Peer]) -> None:
        self.peers = peers

    def client(self, bookie_id: str) -> Peer:
        return self.peers[bookie_id]


class Sink:
    def __init__(self) -> None:
        self.stored: dict[int, bytes] = {}

    async def store(self, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]]) -> None:
        self.stored.update(entries)


def copier(peers: dict[str, Peer]) -> EntryCopier:
    return EntryCopier(cast(Any, Pool(peers)), timeout_ms=1000, chunk_max_bytes=64 * 1024,
                       batch_max_bytes=1 << 20)


METADATA = LedgerMetadata(3, 3, 2, keys=LedgerKeys.of_password(PW), state=LedgerState.CLOSED,
                          last_entry_id=599, ensembles=((0, ("me", "p1", "p2")),))


async def test_copies_come_in_runs_verified_and_from_both_peers() -> None:
    peers = {"p1": Peer({e: good(e) for e in range(600)}),
             "p2": Peer({e: good(e) for e in range(600)})}
    sink = Sink()
    report = await copier(peers).copy(LEDGER, METADATA, list(range(600)), sink, target="me")
    assert report.copied == 600 and report.unavailable == [] and report.refused == 0
    assert sink.stored == {e: good(e) for e in range(600)}
    assert peers["p1"].asked and peers["p2"].asked  # the load is spread
    # a source's part of a chunk is asked in runs, not entry by entry
    assert len(peers["p1"].asked) + len(peers["p2"].asked) < 20


async def test_a_corrupted_copy_is_refused_and_the_other_peer_asked() -> None:
    peers = {"p1": Peer({e: corrupted(e) for e in range(600)}),
             "p2": Peer({e: good(e) for e in range(600)})}
    sink = Sink()
    report = await copier(peers).copy(LEDGER, METADATA, list(range(600)), sink, target="me")
    assert report.refused > 0
    assert report.unavailable == []
    assert sink.stored == {e: good(e) for e in range(600)}


async def test_unknown_or_silent_peers_leave_entries_for_later_never_lost() -> None:
    for error in (UnknownStateError("limbo"), ClientTimeoutError("no answer")):
        peers = {"p1": Peer({}, error), "p2": Peer({e: good(e) for e in range(0, 600, 2)})}
        sink = Sink()
        report = await copier(peers).copy(LEDGER, METADATA, list(range(600)), sink, target="me")
        assert sink.stored == {e: good(e) for e in range(0, 600, 2)}
        assert report.unavailable == list(range(1, 600, 2))
        assert report.copied == 300


async def test_no_good_copy_anywhere_stores_nothing_of_that_entry() -> None:
    peers = {"p1": Peer({e: corrupted(e) for e in range(600)}),
             "p2": Peer({e: corrupted(e) if e == 7 else good(e) for e in range(600)})}
    sink = Sink()
    report = await copier(peers).copy(LEDGER, METADATA, list(range(600)), sink, target="me")
    assert 7 not in sink.stored
    assert report.unavailable == [7]
