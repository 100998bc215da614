"""The CBOR decoder and the Rust client's reader-group state
(:mod:`quire.pravega_wire.cbor`, :mod:`quire.pravega_wire.reader_group_state`),
from bytes written by hand in the client's layout and from the bytes of a live
group's table (the real client's own tables are read in
tests/integration/test_operator_surface.py)."""

from __future__ import annotations

import pytest

from quire.errors import ProtocolError
from quire.pravega_wire.cbor import decode
from quire.pravega_wire.reader_group_state import group_of, parse_state, split_key, state_table


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
    with pytest.raises(ProtocolError):
        split_key("09config")
    assert state_table("sc", "g") == "sc/g_kvtable/0.#epoch.0"
    assert group_of("sc/g_kvtable/0.#epoch.0", "sc") == "g"
    assert group_of("sc/st/0.#epoch.0", "sc") is None
    assert group_of("other/g_kvtable/0.#epoch.0", "sc") is None



def test_records_not_in_the_clients_layout_are_a_protocol_error() -> None:
    good_key, good_value = text("19unassigned_segments/sc/st/1.#epoch.0"), \
        wrapped("Offset", struct(read=bytes([7])))
    assert parse_state("sc", "g", [(good_key, good_value)]).unassigned == {"sc/st/1.#epoch.0": 7}
    for key, value in [
        (bytes([0x01]), good_value),  # a key that is not text
        (text("xxconfig/default"), good_value),  # no length before the outer key
        (good_key + bytes([0x00]), good_value),  # bytes after the key's item
        (good_key, wrapped("Offset", struct(written=bytes([7])))),  # an Offset with no "read"
        (good_key, bytes([0xA1]) + text("type_id") + text("Offset")),  # no data
        (text("17assigned_segments/r1"),
         wrapped("HashMap<ScopedSegment, Offset>", bytes([0xA1, 0x01, 0xA0]))),  # not a segment
    ]:
        with pytest.raises(ProtocolError):
            parse_state("sc", "g", [(key, value)])


# --- the Pravega client's reader group state, read ------------------------------------

# entries of a live group's <group>_kvtable (Pravega client 0.3.8, stream a/s of two
# segments, reader-1 holding both): (key, value) as hex
STATE = [
    ("683036636f6e666967", "a267747970655f696464626c6f6264646174618100"),
    ("703036636f6e6669672f64656661756c74",
     "a267747970655f6964781a52656164657247726f7570436f6e66696756657273696f6e6564646461746198"
     "7518a118621856183118a31878181918671872186f18751870185f1872186518661872186518731868185f"
     "18741869186d1865185f186d1869186c186c1869187318190b18b81874187318741861187218741869186e"
     "1867185f18731874187218651861186d185f186318751874187318a118a2186518731863186f1870186518"
     "a11864186e1861186d186518611861186618731874187218651861186d18a11864186e1861186d18651861"
     "187318691855186e1862186f1875186e18641865186418721865186e18641869186e1867185f1873187418"
     "7218651861186d185f186318751874187318a0"),
    ("781c313761737369676e65645f7365676d656e74732f7265616465722d31",
     "a267747970655f6964781e486173684d61703c53636f7065645365676d656e742c204f66667365743e64"
     "64617461987b18a218a3186518731863186f1870186518a11864186e1861186d18651861186118661873"
     "1874187218651861186d18a11864186e1861186d1865186118731867187318651867186d1865186e1874"
     "18a21866186e1875186d18621865187201186518741878185f1869186418f618a118641872186518611864"
     "0018a3186518731863186f1870186518a11864186e1861186d186518611861186618731874187218651861"
     "186d18a11864186e1861186d1865186118731867187318651867186d1865186e187418a21866186e187518"
     "6d18621865187200186518741878185f1869186418f618a11864187218651861186400"),
    ("78243139756e61737369676e65645f7365676d656e74732f612f732f302e2365706f63682e30",
     "a267747970655f696469746f6d6273746f6e6564646174618118a0"),
]


def test_the_pravega_client_reader_group_state_is_read() -> None:
    entries = [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in STATE]
    group = parse_state("a", "grp", entries)
    assert group.streams == ["a/s"]
    assert group.readers == {"reader-1": {"a/s/0.#epoch.0": 0, "a/s/1.#epoch.0": 0}}
    assert group.unassigned == {}  # its one entry is a tombstone
