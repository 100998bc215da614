"""Ledger metadata: invariants and the JSON wire format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quire.errors import MetadataError
from quire.metadata import LedgerMetadata, deserialize, serialize
from quire.metadata.model import BookieInfo, deserialize_bookie, serialize_bookie
from quire.security.ledger_keys import EMPTY_PASSWORD_KEYS, LedgerKeys
from quire.types import BookieState, DigestType, LedgerState, LedgerType

bookie_ids = st.text(st.characters(codec="utf-8"), min_size=1)


@st.composite
def ledger_metadata(draw: st.DrawFn) -> LedgerMetadata:
    ensemble_size = draw(st.integers(1, 6))
    write_quorum = draw(st.integers(1, ensemble_size))
    ack_quorum = draw(st.integers(1, write_quorum))
    firsts = sorted(draw(st.sets(st.integers(0, 2**62), max_size=4)))
    ensembles = tuple(
        (first, tuple(draw(st.lists(bookie_ids, min_size=ensemble_size,
                                    max_size=ensemble_size))))
        for first in firsts)
    return LedgerMetadata(
        ensemble_size=ensemble_size, write_quorum_size=write_quorum,
        ack_quorum_size=ack_quorum,
        ledger_type=draw(st.sampled_from(LedgerType)),
        digest_type=draw(st.sampled_from(DigestType)),
        keys=LedgerKeys.of_password(draw(st.binary(max_size=32))),
        state=draw(st.sampled_from(LedgerState)),
        last_entry_id=draw(st.integers(-1, 2**62)),
        length=draw(st.integers(0, 2**62)),
        ensembles=ensembles,
        custom_metadata=draw(st.dictionaries(st.text(max_size=10), st.binary(max_size=20),
                                             max_size=4)),
        creation_time_ms=draw(st.integers(0, 2**62)))


@settings(deadline=None, max_examples=100)
@given(ledger_metadata())
def test_serialize_round_trips(md: LedgerMetadata) -> None:
    data = serialize(md)
    assert json.loads(data)["format_version"] == 2
    assert deserialize(data) == md


def test_helpers() -> None:
    md = LedgerMetadata(2, 2, 1, ensembles=((0, ("a", "b")), (10, ("a", "c"))))
    assert md.ensemble_at(0) == md.ensemble_at(9) == ("a", "b")
    assert md.ensemble_at(10) == md.last_ensemble == ("a", "c")
    closed = md.with_(state=LedgerState.CLOSED, last_entry_id=20)
    assert (closed.state, closed.last_entry_id, closed.ensembles) == \
        (LedgerState.CLOSED, 20, md.ensembles)
    with pytest.raises(TypeError):
        md.custom_metadata["x"] = b"y"  # type: ignore[index]
    assert hash(md) == hash(LedgerMetadata(2, 2, 1, ensembles=md.ensembles))


@pytest.mark.parametrize("kwargs", [
    {"ensemble_size": 2, "write_quorum_size": 3, "ack_quorum_size": 1},
    {"ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 0},
    {"ensemble_size": 2, "write_quorum_size": 2, "ack_quorum_size": 2, "length": -1},
    {"ensemble_size": 2, "write_quorum_size": 2, "ack_quorum_size": 2,
     "ensembles": ((0, ("a",)),)},
    {"ensemble_size": 1, "write_quorum_size": 1, "ack_quorum_size": 1,
     "ensembles": ((5, ("a",)), (5, ("b",)))},
])
def test_invariants_are_checked(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LedgerMetadata(**kwargs)  # type: ignore[arg-type]


def test_unknown_fields_are_ignored_and_missing_optional_ones_default() -> None:
    doc = {"format_version": 1, "ensemble_size": 1, "write_quorum_size": 1,
           "ack_quorum_size": 1, "added_by_a_newer_writer": {"x": 1}}
    assert deserialize(json.dumps(doc).encode()) == LedgerMetadata(1, 1, 1)


GOOD = json.loads(serialize(LedgerMetadata(1, 1, 1, ensembles=((0, ("a",)),))))


@pytest.mark.parametrize("data", [
    b"", b"not json", b"\xff\xfe", b"[]", b"null", b'{"format_version": 1}',
    json.dumps({**GOOD, "format_version": 3}).encode(),
    json.dumps({**GOOD, "format_version": "1"}).encode(),
    json.dumps({**GOOD, "ensemble_size": "1"}).encode(),
    json.dumps({**GOOD, "ensemble_size": True}).encode(),
    json.dumps({**GOOD, "ack_quorum_size": 2}).encode(),
    json.dumps({**GOOD, "digest_type": "MD5"}).encode(),
    json.dumps({**GOOD, "master_key": "not base64!"}).encode(),
    json.dumps({k: v for k, v in GOOD.items() if k != "mac_key"}).encode(),
    json.dumps({**GOOD, "format_version": 1, "password": "not base64!"}).encode(),
    json.dumps({**GOOD, "custom_metadata": {"k": 1}}).encode(),
    json.dumps({**GOOD, "ensembles": [[0]]}).encode(),
    json.dumps({**GOOD, "ensembles": [[0, "a"]]}).encode(),
    json.dumps({**GOOD, "ensembles": [[0, [1]]]}).encode(),
])
def test_malformed_metadata_raises_metadata_error(data: bytes) -> None:
    with pytest.raises(MetadataError):
        deserialize(data)


def test_the_keys_are_kept_never_the_password() -> None:
    md = LedgerMetadata(1, 1, 1, digest_type=DigestType.HMAC_SHA1,
                        keys=LedgerKeys.of_password(b"s3cret"))
    doc = json.loads(serialize(md))
    assert "password" not in doc and b"s3cret" not in serialize(md)
    assert (doc["master_key"], doc["mac_key"]) == (
        "RgaMSVsWifj+Stj/YV4ovwkfeHs=", "BHAb1Qphx/PhSrpCWb+gTNMSTA8=")  # BookKeeper's SHA-1s
    assert "s3cret" not in repr(md)


def test_a_version_1_record_with_a_password_reads_as_its_keys() -> None:
    old = {**GOOD, "format_version": 1, "password": "czNjcmV0"}  # b"s3cret"
    del old["master_key"], old["mac_key"]
    md = deserialize(json.dumps(old).encode())
    assert md.keys == LedgerKeys.of_password(b"s3cret")
    assert md.ensembles == ((0, ("a",)),)
    again = json.loads(serialize(md))  # its next write: version 2, the keys only
    assert again["format_version"] == 2 and "password" not in again
    assert deserialize(serialize(md)) == md
    no_password = {k: v for k, v in old.items() if k != "password"}
    assert deserialize(json.dumps(no_password).encode()).keys == EMPTY_PASSWORD_KEYS


def test_bookie_info_round_trips() -> None:
    info = BookieInfo("b1", "127.0.0.1:3181", BookieState.READ_ONLY, "127.0.0.1:8000")
    assert deserialize_bookie(serialize_bookie(info)) == info
    with pytest.raises(MetadataError):
        deserialize_bookie(b'{"bookie_id": "b1"}')
