"""The storage-metadata table's layout records carry their segment's type
(for disaster recovery), tagged so records written before the tag still
read: golden bytes of both."""

from __future__ import annotations

import pytest

from quire.errors import CorruptRecordError
from quire.segmentstore.storage_records import (
    decode_layout_record,
    decode_typed_layout_record,
    encode_layout_record,
)
from quire.segmentstore.types import SegmentType
from quire.tier2 import SegmentLayout, encode_layout

LAYOUT = SegmentLayout("a").with_chunk("a.E1.0", 3).with_sealed()


def test_a_record_carries_its_segment_type() -> None:
    record = encode_layout_record(7, LAYOUT, SegmentType.TABLE)
    assert record[:9].hex() == "0000000000000007" "83"
    assert record[9:] == encode_layout(LAYOUT)
    assert decode_typed_layout_record(record) == (7, SegmentType.TABLE, LAYOUT)
    assert decode_layout_record(record) == (7, LAYOUT)
    for kind in SegmentType:
        assert decode_typed_layout_record(encode_layout_record(1, LAYOUT, kind))[1] == kind
    with pytest.raises(ValueError):
        encode_layout_record(1, LAYOUT, 0x80)


def test_a_record_from_before_the_type_tag_reads_as_type_unknown() -> None:
    old = bytes.fromhex("0000000000000007") + encode_layout(LAYOUT)
    assert old[8] == 1  # the layout's version byte, where the tag now is
    assert decode_typed_layout_record(old) == (7, 0, LAYOUT)
    assert decode_layout_record(old) == (7, LAYOUT)
    for cut in range(9):
        with pytest.raises(CorruptRecordError):
            decode_typed_layout_record(old[:cut])
