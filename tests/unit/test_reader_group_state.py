"""The CBOR decoder and the Rust client's reader-group state, from bytes
written by hand in the client's layout (the real client's own tables are
read in tests/integration/test_operator_surface.py)."""

from __future__ import annotations

import pytest

from quire.controller.reader_groups import group_of, parse_state, split_key, state_table
from quire.errors import ProtocolError
from quire.pravega_wire.cbor import decode


def text(s: str) -> bytes:
    raw = s.encode()
    assert len(raw) < 256
    return (bytes([0x60 | len(raw)]) if len(raw) < 24 else bytes([0x78, len(raw)])) + raw


def test_cbor_items() -> None:
    assert decode(bytes([0x18, 200])) == 200
    assert decode(bytes([0x39, 0x01, 0x00])) == -257
    assert decode(bytes([0x1B]) + (2**64 - 1).to_bytes(8, "big")) == 2**64 - 1
    assert decode(text("héllo"[:4])) == "héll"
    assert decode(bytes([0x82, 0x01, 0xF6])) == [1, None]
    assert decode(bytes([0xA1]) + text("a") + bytes([0xF5])) == {"a": True}
    assert decode(bytes([0x9F, 0x01, 0x02, 0xFF])) == [1, 2]
    assert decode(bytes([0xFB]) + bytes.fromhex("3ff8000000000000")) == 1.5
    assert decode(bytes([0xA1, 0xA1]) + text("k") + bytes([0x01, 0x02])) == {(("k", 1),): 2}
    for bad in (b"", bytes([0x1C]), bytes([0x62, 0x61]), bytes([0x81])):
        with pytest.raises(ProtocolError):
            decode(bad)


def wrapped(type_id: str, payload: bytes) -> bytes:
    """The client's Value: {"type_id": text, "data": [bytes as ints]}."""
    n = len(payload)
    header = bytes([0x80 | n]) if n < 24 else bytes([0x98, n]) if n < 256 else \
        bytes([0x99]) + n.to_bytes(2, "big")
    data = header + b"".join(
        bytes([b]) if b < 24 else bytes([0x18, b]) for b in payload)
    return bytes([0xA2]) + text("type_id") + text(type_id) + text("data") + data


def struct(**fields: bytes) -> bytes:
    return bytes([0xA0 | len(fields)]) + b"".join(text(k) + v for k, v in fields.items())


def scoped_segment(number: int) -> bytes:
    return struct(scope=struct(name=text("sc")), stream=struct(name=text("st")),
                  segment=struct(number=bytes([number]), tx_id=bytes([0xF6])))


def test_a_groups_state_from_its_table() -> None:
    offsets = bytes([0xA1]) + scoped_segment(0) + struct(read=bytes([0x18, 100]))
    config = struct(V1=struct(starting_stream_cuts=bytes([0xA1]) + struct(
        scope=struct(name=text("sc")), stream=struct(name=text("st"))) + text("Unbounded")))
    entries = [
        (text("06config"), wrapped("blob", bytes([0]))),
        (text("06config/default"), wrapped("ReaderGroupConfigVersioned", config)),
        (text("17assigned_segments/r1"), wrapped("HashMap<ScopedSegment, Offset>", offsets)),
        (text("19unassigned_segments"), wrapped("blob", bytes([0]))),
    ]
    # an unassigned segment, and a removal not cleaned up yet
    entries.append((text("19unassigned_segments/sc/st/1.#epoch.0"),
                    wrapped("Offset", struct(read=bytes([7])))))
    entries.append((text("19unassigned_segments/sc/st/0.#epoch.0"),
                    wrapped("tombstone", bytes([0xA0]))))
    state = parse_state("sc", "grp", entries)
    assert state.streams == ["sc/st"]
    assert state.readers == {"r1": {"sc/st/0.#epoch.0": 100}}
    assert state.unassigned == {"sc/st/1.#epoch.0": 7}
    assert state.positions() == {"sc/st/0.#epoch.0": 100, "sc/st/1.#epoch.0": 7}


def test_keys_and_names() -> None:
    assert split_key("06config/default") == ("config", "default")
    assert split_key("06config") == ("config", None)
    with pytest.raises(ValueError):
        split_key("09config")
    assert state_table("sc", "g") == "sc/g_kvtable/0.#epoch.0"
    assert group_of("sc/g_kvtable/0.#epoch.0", "sc") == "g"
    assert group_of("sc/st/0.#epoch.0", "sc") is None
    assert group_of("other/g_kvtable/0.#epoch.0", "sc") is None
