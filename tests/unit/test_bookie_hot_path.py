"""The bookie's batched hot paths give what the one-at-a-time paths give."""

from __future__ import annotations

import os
import random
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from quire.bookie.metrics import LATENCY_BUCKETS_MS, LatencyRecorder
from quire.bookie.storage import BookieStorage, StorageConfig
from quire.errors import ProtocolError
from quire.protocol import codec


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line and "_sum" not in line]


def test_latency_recorder_matches_histogram_observe() -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("lat", "latency", ["status"], buckets=LATENCY_BUCKETS_MS, registry=direct)
    h2 = Histogram("lat", "latency", ["status"], buckets=LATENCY_BUCKETS_MS, registry=batched)
    recorder = LatencyRecorder(h2.labels("OK"))
    values = [0.0, 0.25, 0.2500001, 1, 3000, 3000.5, 1e9, *LATENCY_BUCKETS_MS]
    rng = random.Random(5)
    values += [rng.uniform(0, 4000) for _ in range(500)]
    for value in values:
        h1.labels("OK").observe(value)
        recorder.observe(value)
    h1.labels("OK").observe(7.0)
    h1.labels("OK").observe(7.0)
    recorder.observe_many(7.0, 2)
    assert recorder.pending
    recorder.flush()
    assert not recorder.pending
    assert _exposition(direct) == _exposition(batched)
    assert h1.labels("OK")._sum.get() == pytest.approx(h2.labels("OK")._sum.get())


def test_add_entries_is_add_entry_one_by_one(tmp_path: Path) -> None:
    key, other = b"k" * 20, b"o" * 20

    def items() -> list[tuple[int, int, bytes, bytes]]:
        return [(1, 0, b"a" * 30, key), (1, 1, b"b" * 30, key), (2, 0, b"c" * 30, key),
                (1, 2, b"d" * 30, other),  # wrong master key
                (3, 0, b"e" * 30, key),  # fenced below
                (-1, 0, b"f" * 30, key), (1, 1 << 63, b"g" * 30, key),  # bad ids
                (1, 1, b"h" * 30, key),  # re-add of an entry id
                (2, 1, b"i" * 5000, key)]  # over the reject limit

    engines = []
    for name in ("one", "batch"):
        config = StorageConfig(journal_dirs=(tmp_path / name,), ledger_dirs=(tmp_path / name,),
                               write_cache_max_bytes=1000, write_cache_reject_ratio=4.0)
        engine = BookieStorage.open(config)
        engine.fence(3, key)
        engines.append(engine)
    one, batch = engines
    expected: list[object] = []
    for ledger_id, entry_id, entry, master in items():
        try:
            expected.append(one.add_entry(ledger_id, entry_id, entry, master))
        except Exception as e:
            expected.append(e)
    got = batch.add_entries(items())
    assert [type(r) for r in got] == [type(r) for r in expected]
    assert [r for r in got if isinstance(r, int)] == [r for r in expected if isinstance(r, int)]
    assert [str(r) for r in got] == [str(r) for r in expected]
    for engine in engines:
        engine.journal.sync()
    assert one.journal.mark() == batch.journal.mark()
    for ledger_id, entry_id in ((1, 0), (1, 1), (2, 0)):
        assert one.read_entry(ledger_id, entry_id) == batch.read_entry(ledger_id, entry_id)
    assert one.write_cache_bytes == batch.write_cache_bytes
    for engine in engines:
        engine.close()


def _generic(direction: str, data: bytes) -> list[object]:
    decode = codec._decode_request if direction == "requests" else codec._decode_response
    out: list[object] = []
    pos = 0
    while pos + 8 <= len(data):
        (frame_len, header) = struct.unpack_from(">II", data, pos)
        if pos + 4 + frame_len > len(data):
            break
        try:
            out.append(decode((header >> 16) & 0xFF, header & 0xFFFF,
                              memoryview(data)[pos + 8:pos + 4 + frame_len]))
        except ProtocolError:
            out.append("ProtocolError")
            break
        pos += 4 + frame_len
    return out


def test_decoder_fast_paths_match_the_generic_decoders() -> None:
    """next_messages' tight ADD_ENTRY loops against the generic per-op decoders."""
    rng = random.Random(1)
    for _ in range(500):
        frames = []
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.5:  # ADD_ENTRY requests, some too short
                body = struct.pack(">Q20s", rng.getrandbits(64), rng.randbytes(20)) + \
                    rng.randbytes(rng.choice([0, 15, 16, 17, 100]))
                flags = rng.choice([0, 2, 4, 6, 0x8000])
            else:  # ADD_ENTRY responses: unknown statuses, bare errors, bad sizes
                body = struct.pack(">Qiqqq", rng.getrandbits(64),
                                   rng.choice([0, -1, 7, 103, 999]), rng.getrandbits(63),
                                   rng.getrandbits(63), rng.getrandbits(63) - 2**62)
                body = body[:rng.choice([36, 36, 36, 35, 12])]
                flags = rng.choice([0, 0, 0x8000, 1])
            frames.append(struct.pack(">II", 4 + len(body), (1 << 24) | (1 << 16) | flags) + body)
        data = b"".join(frames)
        for direction in ("requests", "responses"):
            decoder = codec.Decoder(direction)  # type: ignore[arg-type]
            decoder.feed(data)
            got: list[object] = []
            try:
                got += decoder.next_messages()
                if decoder.error is not None:
                    got.append("ProtocolError")
            except ProtocolError:
                got.append("ProtocolError")
            assert got == _generic(direction, data)


_KEY, _OTHER = b"k" * 20, b"o" * 20
runs = st.lists(st.tuples(
    st.sampled_from([1, 1, 1, 2, 3]),           # ledger (3: fenced below, 2: unknown at first)
    st.sampled_from([_KEY, _KEY, _KEY, _OTHER]),  # master key
    st.integers(0, 12),                         # entry id
    st.integers(24, 400)),                      # entry size
    min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(runs, min_size=1, max_size=6), tight_cache=st.booleans())
def test_add_run_gives_what_add_entries_gives(batches: list[list[tuple[int, bytes, int, int]]],
                                              tight_cache: bool) -> None:
    """Twin engines take the same batches: one through add_entries only, the
    other through add_run, falling back to add_entries when it declines.
    Results, journal bytes, write cache and ledger state agree; a declined
    run changes nothing.  The batches mix the usual run (one ledger, one
    key, ids rising) with everything add_run must leave to add_entries:
    several ledgers or keys, an unknown or fenced ledger, a wrong key,
    repeated or falling ids, entries already cached, a full write cache."""
    with tempfile.TemporaryDirectory() as tmp:
        engines = []
        for name in ("entries", "run"):
            config = StorageConfig(journal_dirs=(Path(tmp) / name,),
                                   ledger_dirs=(Path(tmp) / name,),
                                   write_cache_max_bytes=800 if tight_cache else 1 << 20,
                                   write_cache_reject_ratio=2.0)
            engine = BookieStorage.open(config)
            engine.fence(3, _KEY)
            engine.add_entry(1, 100, b"x" * 30, _KEY)  # ledger 1 known from the start
            engines.append(engine)
        plain, columns = engines
        taken = 0
        try:
            for batch in batches:
                items = [(ledger, entry_id, bytes([entry_id % 251]) * size, key)
                         for ledger, key, entry_id, size in batch]
                expected = plain.add_entries(items)
                before = (columns.journal.mark(), columns.write_cache_bytes)
                ledgers, keys = {i[0] for i in items}, {i[3] for i in items}
                last = columns.add_run(items[0][0], items[0][3], [i[1] for i in items],
                                       [i[2] for i in items]) \
                    if len(ledgers) == 1 and len(keys) == 1 else None
                if last is None:
                    assert (columns.journal.mark(), columns.write_cache_bytes) == before
                    got: list[object] = list(columns.add_entries(items))
                else:
                    taken += 1
                    got = list(range(last - len(items) + 1, last + 1))
                assert [type(r) for r in got] == [type(r) for r in expected]
                assert [str(r) for r in got] == [str(r) for r in expected]
                assert columns.journal.mark() == plain.journal.mark()
                assert columns.write_cache_bytes == plain.write_cache_bytes
            for engine in engines:
                engine.journal.sync()
            assert _journal_bytes(plain) == _journal_bytes(columns)
            for ledger in (1, 2, 3):
                for entry_id in range(13):
                    assert _read_or_error(plain, ledger, entry_id) == _read_or_error(
                        columns, ledger, entry_id)
        finally:
            for engine in engines:
                engine.close()


def _journal_bytes(engine: BookieStorage) -> bytes:
    directory = engine.journal.directory
    return b"".join((directory / name).read_bytes() for name in sorted(os.listdir(directory))
                    if name.endswith(".jnl"))


def _read_or_error(engine: BookieStorage, ledger_id: int, entry_id: int) -> object:
    try:
        return engine.read_entry(ledger_id, entry_id)
    except Exception as e:
        return type(e).__name__


def test_a_run_crossing_a_journal_file_is_placed_as_append_add_entries_places_it(
        tmp_path: Path) -> None:
    """append_add_run writes the records append_add_entries writes, rolls
    included: a run past the end of a 64 KiB file leaves both journals
    with the same seqs, marks and file bytes."""
    engines = [BookieStorage.open(StorageConfig(
        journal_dirs=(tmp_path / name,), ledger_dirs=(tmp_path / name,),
        journal_file_size_bytes=64 * 1024)) for name in ("entries", "run")]
    try:
        plain, columns = (engine.journal for engine in engines)
        ids, entries = list(range(10)), [bytes([i]) * 1000 for i in range(10)]
        mark = columns.mark()
        assert columns.append_add_run(7, ids, entries) == plain.append_add_entries(
            [(7, i, e) for i, e in zip(ids, entries, strict=True)])
        assert columns.mark().offset - mark.offset == sum(8 + 17 + len(e) for e in entries)
        big_ids, big = list(range(10, 80)), [b"z" * 1000] * 70  # 70 KB: past the file's end
        assert columns.append_add_run(7, big_ids, big) == plain.append_add_entries(
            [(7, i, e) for i, e in zip(big_ids, big, strict=True)])
        assert columns.mark() == plain.mark() and columns.mark().file_seq > mark.file_seq
        for journal in (plain, columns):
            journal.sync()
        assert _journal_bytes(engines[0]) == _journal_bytes(engines[1])
    finally:
        for engine in engines:
            engine.close()
