"""Bookie metrics in Prometheus format, served at ``/metrics`` (by
:mod:`quire.bookie.admin`, beside the admin requests).

Per-operation names follow one scheme: ``quire_bookie_<op>_request`` is a
histogram of request latency in milliseconds (its ``_count`` is the request
count), labelled by answer status.  BP-62's two batch-read histograms use
exactly the buckets the BP lists.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from quire.bookie.storage.compaction import CompactionStats
from quire.errors import StatusCode
from quire.protocol import OpCode

_perf_counter = time.perf_counter
log = logging.getLogger("quire.bookie")

REFUSAL_LOG_INTERVAL_S = 10.0
"""At most one log line per reason this often (an attack would flood the log)."""

LATENCY_BUCKETS_MS = (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 3000)
# BP-62: [0-5], [5-10], [10-20], [20-50], [50-100], [100-200], [200-500],
# [500-1000], [1000-3000], [>3000] milliseconds.
BATCH_READ_LATENCY_BUCKETS_MS = (5, 10, 20, 50, 100, 200, 500, 1000, 3000)
# BP-62: [0-128], [128-512], [512-1k], [1k-2k], [2k-4k], [4k-16k], [16k-128k],
# [128k-1MB], [>1MB] bytes.
BATCH_READ_SIZE_BUCKETS_BYTES = (128, 512, 1024, 2048, 4096, 16384, 131072, 1048576)


class LatencyRecorder:
    """Observations for one histogram child, gathered on one thread and
    applied to the child in bulk by :meth:`flush`.

    ``observe`` costs a ``bisect`` and two list/float updates instead of
    prometheus_client's locked per-observation update, which shows on the
    add path.  The child ends up with the same bucket counts, count and sum
    (up to float rounding of the sum) once ``flush`` ran; the server flushes
    before it writes the answers the observations belong to, so a scrape
    that follows an answer sees its observation.  If the child does not
    expose the internals the bulk update needs, ``flush`` replays each
    observation through ``child.observe``.
    """

    __slots__ = ("_bounds", "_bulk", "_child", "_counts", "_sum", "_values", "pending")

    def __init__(self, child: Any) -> None:
        self._child = child
        bounds: list[float] = list(getattr(child, "_upper_bounds", None) or ())
        self._bulk = (bool(bounds) and hasattr(child, "_buckets") and hasattr(child, "_sum")
                      and len(child._buckets) == len(bounds))
        self._bounds = bounds if self._bulk else []
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._values: list[float] = []
        self.pending = False
        """True from the first observation until the next flush."""

    def observe(self, amount: float) -> None:
        if self._bulk:
            # The first bucket whose upper bound is >= amount, as Histogram.observe.
            self._counts[bisect_left(self._bounds, amount)] += 1
            self._sum += amount
        else:
            self._values.append(amount)
        self.pending = True

    def observe_many(self, amount: float, count: int) -> None:
        """``count`` observations of the same ``amount`` (a batch answered at once)."""
        if self._bulk:
            self._counts[bisect_left(self._bounds, amount)] += count
            self._sum += amount * count
        else:
            self._values.extend([amount] * count)
        self.pending = True

    def flush(self) -> None:
        if not self.pending:
            return
        self.pending = False
        child = self._child
        if not self._bulk:
            values, self._values = self._values, []
            for value in values:
                child.observe(value)
            return
        counts = self._counts
        buckets = child._buckets
        for i, n in enumerate(counts):
            if n:
                buckets[i].inc(n)
                counts[i] = 0
        child._sum.inc(self._sum)
        self._sum = 0.0


class BookieMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests: dict[int, Histogram] = {}
        for op in OpCode:
            buckets = (BATCH_READ_LATENCY_BUCKETS_MS if op is OpCode.BATCH_READ_ENTRY
                       else LATENCY_BUCKETS_MS)
            self.requests[op] = Histogram(
                f"quire_bookie_{op.name.lower()}_request",
                f"{op.name} request latency in milliseconds, by answer status",
                ["status"], buckets=buckets, registry=r)
        self.batch_read_response_size = Histogram(
            "quire_bookie_batch_read_entry_response_size",
            "BATCH_READ_ENTRY response size in bytes",
            buckets=BATCH_READ_SIZE_BUCKETS_BYTES, registry=r)
        self.unsupported_requests = Counter(
            "quire_bookie_unsupported_requests", "Requests for unknown operations", registry=r)
        self.malformed_frames = Counter(
            "quire_bookie_malformed_frames", "Connections closed for malformed input",
            registry=r)
        self.journal_fsync = Histogram(
            "quire_bookie_journal_fsync_latency", "Journal fsync latency in milliseconds",
            buckets=LATENCY_BUCKETS_MS, registry=r)
        self.journal_group_size = Histogram(
            "quire_bookie_journal_group_size", "Journal records made durable per fsync",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r)
        self.journal_written_bytes = Gauge(
            "quire_bookie_journal_written_bytes_total",
            "Journal record bytes written to journal files (counter; page padding not "
            "counted)", registry=r)
        self.journal_loop_syncs = Gauge(
            "quire_bookie_journal_syncs_on_loop_total",
            "Journal fsyncs the event loop ran itself, not the fsync thread (counter; "
            "see journal_sync_on_loop_max_ms)", registry=r)
        # Per-entry counts are plain ints read at scrape time: a prometheus
        # Counter takes a lock on every inc(), which shows on the add path.
        self.entries_written = 0
        self.bytes_written = 0
        Gauge("quire_bookie_entries_written_total", "Entries added (counter)",
              registry=r).set_function(lambda: self.entries_written)
        Gauge("quire_bookie_bytes_written_total", "Entry bytes added (counter)",
              registry=r).set_function(lambda: self.bytes_written)
        self.read_cache_hits = Gauge(
            "quire_bookie_read_cache_hits", "Reads served from the read cache", registry=r)
        self.read_cache_misses = Gauge(
            "quire_bookie_read_cache_misses", "Reads that went to the entry logs", registry=r)
        self.connections = Gauge(
            "quire_bookie_connections", "Open client connections", registry=r)
        self.connection_refusals = Counter(
            "quire_bookie_connection_refusals",
            "Connections closed by a limit or by TLS, by reason (max_connections, "
            "max_connections_per_peer, idle_timeout, replies_unread_timeout, tls_handshake, "
            "tls_role)", ["reason"],
            registry=r)
        self.reads_paused = Counter(
            "quire_bookie_connection_reads_paused",
            "Times a connection stopped reading, by reason (replies_unread: its answers "
            "above max_buffered_reply_bytes; request_budget: max_connection_pending_bytes "
            "spent)", ["reason"], registry=r)
        self._refusals_logged: dict[str, tuple[float, int]] = {}
        self.read_only = Gauge(
            "quire_bookie_read_only", "1 while the bookie is read-only", registry=r)
        self.compactions = Counter(
            "quire_bookie_compactions", "Entry-log compaction runs, by kind (minor, major)",
            ["kind"], registry=r)
        self.compacted_entry_logs = Counter(
            "quire_bookie_compaction_entry_logs", "Entry logs compacted and removed",
            registry=r)
        self.compaction_entries_moved = Counter(
            "quire_bookie_compaction_entries_moved", "Entries copied by compaction",
            registry=r)
        self.compaction_bytes_moved = Counter(
            "quire_bookie_compaction_bytes_moved",
            "Record bytes copied by compaction", registry=r)
        self.compaction_bytes_reclaimed = Counter(
            "quire_bookie_compaction_bytes_reclaimed",
            "Disk bytes compaction freed (logs removed less their copies)", registry=r)
        self.entry_logs_removed = Counter(
            "quire_bookie_gc_entry_logs_removed",
            "Entry logs GC removed because none of their ledgers exists", registry=r)

    def log_refusal(self, reason: str, detail: str = "") -> None:
        """A warning for a refused connection, at most one per reason every
        :data:`REFUSAL_LOG_INTERVAL_S` (saying how many went unlogged)."""
        now = time.monotonic()
        last, skipped = self._refusals_logged.get(reason, (-REFUSAL_LOG_INTERVAL_S, 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged[reason] = (last, skipped + 1)
            return
        self._refusals_logged[reason] = (now, 0)
        more = f" ({skipped} more since the last report)" if skipped else ""
        log.warning("connection refused: %s%s%s", reason, f": {detail}" if detail else "", more)

    def count_compaction(self, kind: str, stats: CompactionStats) -> None:
        self.compactions.labels(kind).inc()
        self.compacted_entry_logs.inc(stats.logs_compacted)
        self.compaction_entries_moved.inc(stats.entries_moved)
        self.compaction_bytes_moved.inc(stats.bytes_moved)
        self.compaction_bytes_reclaimed.inc(max(0, stats.bytes_reclaimed))


class RequestLatencies:
    """Request latency histograms by op and answer status, observed in
    batches: each observation is gathered in its :class:`LatencyRecorder`
    and applied to the histogram once per loop iteration, by the action
    ``before_answers`` schedules to run before that iteration's answers are
    written (so a scrape that follows an answer sees it)."""

    def __init__(self, metrics: BookieMetrics,
                 before_answers: Callable[[Callable[[], None]], None]) -> None:
        self._metrics = metrics
        self._before_answers = before_answers
        self._recorders: dict[tuple[OpCode, StatusCode], LatencyRecorder] = {}
        self._add_ok: LatencyRecorder | None = None

    def recorder(self, op: OpCode, status: StatusCode) -> LatencyRecorder:
        key = (op, status)
        recorder = self._recorders.get(key)
        if recorder is None:
            recorder = self._recorders[key] = LatencyRecorder(
                self._metrics.requests[op].labels(status.name))
        return recorder

    def add_ok(self) -> LatencyRecorder:
        """The recorder of successful adds (looked up once, then kept)."""
        recorder = self._add_ok
        if recorder is None:
            recorder = self._add_ok = self.recorder(OpCode.ADD_ENTRY, StatusCode.OK)
        return recorder

    def observe(self, op: OpCode, started: float, status: StatusCode) -> None:
        self.record(self.recorder(op, status), started)

    def record(self, recorder: LatencyRecorder, started: float, count: int = 1) -> None:
        """Observe the latency since ``started`` (ms), ``count`` times (a batch
        answered at once)."""
        if not recorder.pending:
            self._before_answers(recorder.flush)
        elapsed_ms = (_perf_counter() - started) * 1000.0
        if count == 1:
            recorder.observe(elapsed_ms)
        else:
            recorder.observe_many(elapsed_ms, count)
