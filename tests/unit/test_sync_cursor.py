"""BP-14 sync cursor bookkeeping against a model: the candidate is the
highest entry id up to which every entry is synced or confirmed by a LAC."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quire.bookie.sync_cursor import SyncCursor, decode_cursor, encode_cursor


def model_candidate(start: int, synced: set[int], top_lac: int) -> int:
    candidate = max(start, top_lac)
    while candidate + 1 in synced:
        candidate += 1
    return candidate


# Ops: ("add", n, lac) adds the next n entries of the order, each piggy-backing
# lac; ("sync", k) makes the first k adds so far durable; ("lac", lac).
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 6), st.integers(-1, 30)),
    st.tuples(st.just("sync"), st.integers(0, 40)),
    st.tuples(st.just("lac"), st.integers(-1, 30))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(order=st.permutations(list(range(30))), script=ops, start=st.integers(-1, 3),
       batched=st.booleans())
def test_candidate_matches_the_model(order: list[int], script: list[tuple[int, ...]],
                                     start: int, batched: bool) -> None:
    """Entries arrive in any order (in-order runs are the fast path, the
    rest goes through ``ahead``); learn() of a whole run equals learn() one
    add at a time."""
    cursor = SyncCursor(start)
    added: list[tuple[int, int]] = []  # (seq, entry id) in arrival order
    synced: set[int] = set()
    top_lac = -1
    for op in script:
        if op[0] == "add":
            _, n, lac = op
            run = [(len(added) + i + 1, entry_id, lac)
                   for i, entry_id in enumerate(order[len(added):len(added) + n])]
            if batched:
                cursor.learn(run)
            else:
                for add in run:
                    cursor.learn([add])
            added += [(seq, entry_id) for seq, entry_id, _ in run]
            if run:
                top_lac = max(top_lac, lac)
        elif op[0] == "sync":
            durable = min(op[1], len(added))
            before = cursor.candidate
            moved = cursor.synced_through(durable)
            synced |= {entry_id for seq, entry_id in added if seq <= durable}
            assert moved == (cursor.candidate != before)
        else:
            cursor.confirmed(op[1])
            top_lac = max(top_lac, op[1])
        assert cursor.candidate == model_candidate(start, synced, top_lac)


def test_cursor_blob_round_trips_and_unknown_blobs_read_as_nothing() -> None:
    assert decode_cursor(encode_cursor(41)) == 41
    assert decode_cursor(b"") == -1
    assert decode_cursor(b"\x02" + encode_cursor(41)[1:]) == -1
