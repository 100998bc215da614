"""A stream's history read straight from tier-2, with no Quire process running.

::

    from quire.history import read_stream, StreamDataset
    for batch in read_stream("s3://bucket/tier2?endpoint_url=...", "shop", "orders",
                             start=datetime(2025, 1, 1), end=datetime(2025, 1, 2)):
        ...                             # pyarrow RecordBatches, one row per event
    table = StreamDataset("file:///mnt/tier2", "shop", "orders").to_table()

The segment store's storage writer flushes every segment to tier-2 with
each chunk's sidecar (where events start, when bytes were appended:
:mod:`quire.segmentstore.chunk_sidecars`), and the controller's stream
tables with them; so tier-2 alone tells a stream's segments, epochs and
successors (:mod:`~quire.history.catalog`), which bytes to read between two
cuts or times (:mod:`~quire.history.plan`), and the events with their
append times (:mod:`~quire.history.reader`).  What it sees lags the
cluster by one flush.  Rows: :func:`~quire.history.events.arrow_schema`.
Needs ``pyarrow`` and ``numpy`` (``pip install 'quire[spark]'``).

(``quire.tier2`` is the chunk storage layer below the segment store; this
package sits above both, so it is ``quire.history``, not ``quire.tier2``.)
"""

from quire.history.events import EventSplitter, arrow_schema
from quire.history.plan import Bound, HistorySplit, time_ms
from quire.history.reader import (
    HistoryFragment,
    StreamDataset,
    list_streams,
    plan,
    read_split,
    read_stream,
)

__all__ = [
    "Bound",
    "EventSplitter",
    "HistoryFragment",
    "HistorySplit",
    "StreamDataset",
    "arrow_schema",
    "list_streams",
    "plan",
    "read_split",
    "read_stream",
    "time_ms",
]
