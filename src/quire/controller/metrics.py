"""Controller metrics in Prometheus format, served at ``/metrics`` when
``ControllerConfig.metrics_port`` is not -1.

``quire_controller_rpc`` is a histogram of gRPC request latency in
milliseconds (its ``_count`` is the request count) by method and answer
status (``OK`` or the gRPC status name); the counters follow transactions,
scales (by reason: every epoch a stream begins), auto-scaling's requests,
workflows taken over from dead controllers and retention's truncations.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 3000)


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rpc = Histogram(
            "quire_controller_rpc", "Controller gRPC request latency in milliseconds",
            ["method", "status"], buckets=LATENCY_BUCKETS_MS, registry=self.registry)
        self.transactions_created = Counter(
            "quire_controller_transactions_created", "Transactions opened",
            registry=self.registry)
        self.transactions_ended = Counter(
            "quire_controller_transactions_ended",
            "Transactions committed or aborted (reason: request, lease expired, stream sealed)",
            ["state", "reason"], registry=self.registry)
        self.scales = Counter("quire_controller_scales", "Scales carried out",
                              registry=self.registry)
        self.scales_by_reason = Counter(
            "quire_controller_stream_scales", "Epochs begun, by reason (manual, auto-split, "
            "auto-merge, update, rolling-txn)", ["reason"], registry=self.registry)
        self.autoscale_requests = Counter(
            "quire_controller_autoscale_requests",
            "Auto-scaling requests from the segment stores, by direction and outcome",
            ["direction", "outcome"], registry=self.registry)
        self.workflows_taken_over = Counter(
            "quire_controller_workflows_taken_over",
            "Workflows a dead (or stalled) controller left, finished by the leader",
            registry=self.registry)
        self.leader = Gauge("quire_controller_leader",
                            "1 while this controller leads the cluster's background duties",
                            registry=self.registry)
        self.retention_truncations = Counter(
            "quire_controller_retention_truncations",
            "Streams truncated by their retention policy", registry=self.registry)
