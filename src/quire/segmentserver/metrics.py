"""What a segment server counts for ``/metrics`` (Prometheus).

Observed per request (an append block, a read), never per event: a block
of 500 events costs one histogram observation."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                      2.0, 5.0)


class SegmentServerMetrics:
    """Append and read latency, events and bytes, refusals by reply."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.append_latency = Histogram(
            "quire_segmentstore_append_latency_seconds",
            "From an append block's arrival to its acknowledgement (durable in tier-1)",
            registry=registry, buckets=_LATENCY_BUCKETS_S)
        self.read_latency = Histogram(
            "quire_segmentstore_read_latency_seconds",
            "From a read's arrival to its answer (a tail read's wait included)",
            registry=registry, buckets=_LATENCY_BUCKETS_S)
        self.events = Counter("quire_segmentstore_events_appended",
                              "Events acknowledged (duplicates not counted)", registry=registry)
        self.bytes_appended = Counter("quire_segmentstore_bytes_appended",
                                      "Bytes of events acknowledged", registry=registry)
        self.bytes_read = Counter("quire_segmentstore_bytes_read", "Bytes answered to reads",
                                  registry=registry)
        self.refused = Counter("quire_segmentstore_refused_requests",
                               "Requests answered with an error reply, by reply",
                               ["reply"], registry=registry)
        self.connections = Gauge("quire_segmentstore_connections",
                                 "Client connections served now", registry=registry)
        self.connections_refused = Counter(
            "quire_segmentstore_connections_refused",
            "Client connections closed by a limit, by reason (max_connections, "
            "max_connections_per_peer, idle_timeout, tls_handshake)", ["reason"],
            registry=registry)
        for reason in ("max_connections", "max_connections_per_peer", "idle_timeout",
                       "tls_handshake"):
            self.connections_refused.labels(reason)
        self.segment_totals: dict[str, list[int]] = {}
        """Events and bytes acknowledged per segment name (plain ints on the
        append path; summed by stream at scrape time)."""
        registry.register(_StreamTotals(self.segment_totals))


def stream_of(segment: str) -> tuple[str, str] | None:
    """``(scope, stream)`` of a stream segment's name (a transaction's too);
    None for a name that is not ``scope/stream/...``."""
    parts = segment.split("/", 2)
    if len(parts) < 3 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


class _StreamTotals(Collector):
    """``quire_segmentstore_stream_events_appended_total`` and
    ``..._stream_bytes_appended_total`` by scope and stream, at scrape time."""

    def __init__(self, totals: dict[str, list[int]]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily("quire_segmentstore_stream_events_appended",
                                     "Events acknowledged, by stream", labels=["scope", "stream"])
        size = CounterMetricFamily("quire_segmentstore_stream_bytes_appended",
                                   "Bytes of events acknowledged, by stream",
                                   labels=["scope", "stream"])
        by_stream: dict[tuple[str, str], list[int]] = {}
        for segment, (count, length) in list(self._totals.items()):
            stream = stream_of(segment)
            if stream is not None:
                sums = by_stream.setdefault(stream, [0, 0])
                sums[0] += count
                sums[1] += length
        for (scope, name), (count, length) in sorted(by_stream.items()):
            events.add_metric([scope, name], count)
            size.add_metric([scope, name], length)
        yield events
        yield size
