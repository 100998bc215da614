"""The bookie's read cache: LRU by bytes, with each ledger's cached entries
indexed so that dropping a deleted ledger touches only its own entries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quire.bookie.storage.ledger_storage import ReadCache

ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(1, 4), st.integers(0, 20), st.integers(1, 40)),
    st.tuples(st.just("discard"), st.integers(1, 4)),
    st.tuples(st.just("invalidate"), st.integers(1, 4), st.integers(0, 20)),
), max_size=60)


@given(steps=ops)
def test_the_cache_agrees_with_a_plain_model(steps: list[tuple[int | str, ...]]) -> None:
    cache = ReadCache(max_bytes=200)
    for step in steps:
        if step[0] == "put":
            _, ledger, entry, size = step
            cache.put_many(int(ledger), [(int(entry), bytes([int(entry)]) * int(size))])
        elif step[0] == "discard":
            cache.discard_ledger(int(step[1]))
            assert all(cache.get((int(step[1]), e)) is None for e in range(21))
        else:
            _, ledger, entry = step
            cache.invalidate({(int(ledger), int(entry)): b""})
            assert cache.get((int(ledger), int(entry))) is None
        cached = {(ledger, entry): cache.get((ledger, entry))
                  for ledger in range(1, 5) for entry in range(21)}
        present = {k: v for k, v in cached.items() if v is not None}
        assert cache.size_bytes == sum(map(len, present.values())) <= 200
        assert len(cache) == len(present)
        assert all(v == bytes([k[1]]) * len(v) for k, v in present.items())


def test_discarding_one_ledger_keeps_the_others() -> None:
    cache = ReadCache(max_bytes=1 << 20)
    for ledger in range(1, 1001):
        cache.put_many(ledger, [(e, b"x" * 10) for e in range(5)])
    for ledger in range(1, 1001, 2):
        cache.discard_ledger(ledger)
    assert len(cache) == 500 * 5 and cache.size_bytes == 500 * 5 * 10
    assert cache.get((2, 4)) == b"x" * 10 and cache.get((3, 4)) is None
