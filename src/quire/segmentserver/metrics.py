"""What a segment server counts for ``/metrics`` (Prometheus).

Observed per request (an append block, a read), never per event: a block
of 500 events costs one histogram observation."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
