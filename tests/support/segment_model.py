"""The plain model of a segment container's segments and attributes that the
segment store's model tests check against (in-process and across kill -9),
and the names they draw from."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from quire.segmentstore import NULL_ATTRIBUTE_VALUE, AttributeUpdate, UpdateType

NAMES = ["a", "b"]
TABLE = "_system/table"
TABLE_KEYS = [b"x", b"y", b"z"]
WRITERS = [1 << 100, 2 << 100]
KEYS = [1, 2, 3]


@dataclass
class Seg:
    """One segment as the model holds it."""

    data: bytearray = field(default_factory=bytearray)
    start: int = 0
    sealed: bool = False
    attrs: dict[int, int] = field(default_factory=dict)


def model_updates(attrs: dict[int, int], updates: list[AttributeUpdate]) -> dict[int, int] | None:
    """The attributes after ``updates``, or None if one fails."""
    out = dict(attrs)
    for u in updates:
        old = out.get(u.key)
        if u.update_type is UpdateType.REPLACE:
            out[u.key] = u.value
        elif u.update_type is UpdateType.REPLACE_IF_EQUALS:
            if (NULL_ATTRIBUTE_VALUE if old is None else old) != u.comparison_value:
                return None
            out[u.key] = u.value
        elif u.update_type is UpdateType.REPLACE_IF_GREATER:
            if old is not None and u.value <= old:
                return None
            out[u.key] = u.value
        else:
            out[u.key] = (old or 0) + u.value
    return out


# attribute updates of every kind, on the model's keys (hypothesis)
updates_st = st.lists(st.one_of(
    st.builds(AttributeUpdate, st.sampled_from(KEYS), st.just(UpdateType.REPLACE),
              st.integers(0, 3)),
    st.builds(AttributeUpdate, st.sampled_from(KEYS), st.just(UpdateType.REPLACE_IF_EQUALS),
              st.integers(0, 3),
              st.one_of(st.integers(0, 3), st.just(NULL_ATTRIBUTE_VALUE))),
    st.builds(AttributeUpdate, st.sampled_from(KEYS), st.just(UpdateType.REPLACE_IF_GREATER),
              st.integers(0, 3)),
    st.builds(AttributeUpdate, st.sampled_from(KEYS), st.just(UpdateType.ACCUMULATE),
              st.integers(-3, 3)),
), max_size=3)
