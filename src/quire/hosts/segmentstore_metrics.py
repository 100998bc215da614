"""A segment store's health on ``/metrics``: degraded containers, tier-1 backlog, flush failures.

Read from the store at scrape time (nothing on the append path):

* ``quire_segmentstore_container_degraded{container}``: 1 while the
  container's storage writer fails (``degraded: tier-2 unavailable since
  ...``) or the container stopped serving, else 0;
* ``quire_segmentstore_tier1_backlog_bytes{container}``: what the
  container's tier-1 log holds from its truncation point;
* ``quire_segmentstore_tier1_throttled{container}``: 1 while appends are
  acknowledged only as tier-2 takes the backlog (the ceiling);
* ``quire_segmentstore_quarantined_segments{container}``: segments its
  writer quarantined;
* ``quire_segmentstore_table_bytes{container}``: the bytes its table
  segments hold (from their start offsets: compaction keeps it near their
  live entries');
* ``quire_segmentstore_tier2_flush_failures_total{cause}``: failed flush
  attempts of this process's storage writers, by cause (the error's type;
  ``cause="none"`` stays 0, so the series exists before any failure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from quire.segmentstore.types import SegmentType

if TYPE_CHECKING:
    from quire.hosts.segmentstore_host import SegmentStoreHost


class HealthCollector(Collector):
    """See the module docstring."""

    def __init__(self, host: SegmentStoreHost) -> None:
        self._host = host

    def collect(self):  # type: ignore[no-untyped-def]
        store = self._host.segments
        degraded = GaugeMetricFamily("quire_segmentstore_container_degraded",
                                     "1 while the container's tier-2 flushing fails or it "
                                     "stopped serving", labels=["container"])
        backlog = GaugeMetricFamily("quire_segmentstore_tier1_backlog_bytes",
                                    "Bytes the container's tier-1 log holds from its "
                                    "truncation point", labels=["container"])
        throttled = GaugeMetricFamily("quire_segmentstore_tier1_throttled",
                                      "1 while appends wait for tier-2 (tier-1 past its "
                                      "ceiling)", labels=["container"])
        quarantined = GaugeMetricFamily("quire_segmentstore_quarantined_segments",
                                        "Segments tier-2 refused, quarantined",
                                        labels=["container"])
        tables = GaugeMetricFamily("quire_segmentstore_table_bytes",
                                   "Bytes the container's table segments hold",
                                   labels=["container"])
        failures = CounterMetricFamily("quire_segmentstore_tier2_flush_failures",
                                       "Failed tier-2 flush attempts, by cause",
                                       labels=["cause"])
        if store is not None:
            for c in store.container_ids:
                container = store.container(c)
                writer = store.writers.get(c)
                label = [str(c)]
                bad = container.failure is not None or (
                    writer is not None and writer.health.degraded is not None)
                degraded.add_metric(label, 1 if bad else 0)
                backlog.add_metric(label, container.committed_side.tier1_bytes)
                throttled.add_metric(label, 1 if container.throttle.throttled else 0)
                quarantined.add_metric(label, 0 if writer is None
                                       else len(writer.quarantine.quarantined))
                tables.add_metric(label, sum(s.length - s.start_offset
                                             for s in container.committed.segments.values()
                                             if s.type is SegmentType.TABLE and not s.deleted))
            for cause, count in sorted({"none": 0, **store.flush_failures}.items()):
                failures.add_metric([cause], count)
        yield from (degraded, backlog, throttled, quarantined, tables, failures)
