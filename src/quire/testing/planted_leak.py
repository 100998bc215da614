"""A leak planted on purpose, to show the soak's slope test catches one.

:func:`install` makes every segment append keep a copy of its data (times
:data:`KEPT_PER_BYTE`) in a list nobody ever empties: a structure that
grows with every append, as a real leak would.  A segment store process
gets it from ``tests/support/planted_leak/sitecustomize.py`` when started
with that directory on ``PYTHONPATH`` and ``QUIRE_PLANTED_LEAK=1``
(``benchmarks/soak_month.py --plant-leak``); the product never imports it.
"""

from __future__ import annotations

from typing import Any

from quire.segmentstore.container import SegmentContainer

KEPT_PER_BYTE = 64
KEPT: list[bytes] = []
"""What the planted leak holds on to."""


def install() -> None:
    """Wrap :meth:`SegmentContainer.append` so that each append leaks."""
    original = SegmentContainer.append

    def leaking_append(self: SegmentContainer, name: str, data: bytes, *args: Any,
                       **kwargs: Any) -> Any:
        KEPT.append(bytes(data) * KEPT_PER_BYTE)
        return original(self, name, data, *args, **kwargs)

    SegmentContainer.append = leaking_append  # type: ignore[method-assign]
