"""Attribute updates resolved against a segment's attributes (sans-IO).

:func:`resolve_updates` is how the container (and its twin,
:class:`quire.testing.memory_writer_source.MemoryWriterSource`) turns a
request's :class:`~quire.segmentstore.types.AttributeUpdate` s into final
values, checking their conditions; :func:`initial_attributes` those of a
new segment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from quire.errors import BadAttributeUpdateError
from quire.segmentstore.operations import Attributes
from quire.segmentstore.types import (
    NULL_ATTRIBUTE_VALUE,
    AttributeUpdate,
    UpdateType,
    check_key,
    check_value,
)


def resolve_updates(current: Mapping[int, int], updates: Iterable[AttributeUpdate],
                    extra: Iterable[tuple[int, int]] = ()) -> Attributes:
    """The final values ``updates`` give against ``current``, in order
    (BadAttributeUpdateError if a condition fails: then nothing applies)."""
    changed: dict[int, int] = {}
    for u in updates:
        if not isinstance(u, AttributeUpdate):
            raise BadAttributeUpdateError(f"not an AttributeUpdate: {u!r}")
        old = changed.get(u.key, current.get(u.key))
        kind = u.update_type
        if kind is UpdateType.REPLACE:
            value = u.value
        elif kind is UpdateType.REPLACE_IF_EQUALS:
            if (NULL_ATTRIBUTE_VALUE if old is None else old) != u.comparison_value:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x} is {old}, not {u.comparison_value}")
            value = u.value
        elif kind is UpdateType.REPLACE_IF_GREATER:
            if old is not None and u.value <= old:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x} is {old}, not below {u.value}")
            value = u.value
        elif kind is UpdateType.ACCUMULATE:
            value = (old or 0) + u.value
            try:
                check_value(value)
            except BadAttributeUpdateError:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x}: {old} + {u.value} overflows") from None
        else:
            raise BadAttributeUpdateError(f"unknown update type {kind!r}")
        changed[u.key] = value
    for key, value in extra:
        changed[key] = value
    return tuple(changed.items())


def initial_attributes(attributes: Mapping[int, int] | Sequence[AttributeUpdate] | None
                       ) -> Attributes:
    """A new segment's attributes, checked: given as values, or as updates
    (resolved against none)."""
    if attributes is None:
        return ()
    if isinstance(attributes, Mapping):
        for k, v in attributes.items():
            check_key(k)
            check_value(v)
        return tuple(attributes.items())
    return resolve_updates({}, attributes)
