"""What a streaming read of streams tells the cluster and the user about its
progress: the retention hold, and the lag.

**Retention.**  A query with ``hold_retention`` (the default) is a
*subscriber* of every stream it reads: it registers a reader group with the
controller, one per stream, named ``<subscriber>-<stream>`` (the
subscriber's name, ``spark-<16 hex>``, is drawn when the query starts and
kept in its offsets, so a restart from the checkpoint keeps it; option
``subscriber`` names it), with retention ``manual``, starting where the
query starts; each committed micro-batch publishes its end cut
(``updateSubscriberStreamCut``).  The controller's consumption-based
retention never truncates past a subscriber's cut (within the stream's
``retention_max``), so retention never drops what the query has not
committed.  A query given up for good leaves its groups holding retention
until its maximum: :func:`release_retention` removes them.

**Lag.**  A Python streaming source has no custom metrics in this PySpark;
the source reports, with each batch, each stream's tail and the bytes the
query is behind it once that batch is read (``reportLatestOffset``: the
progress's ``sources[].latestOffset`` is ``{"streams": {...}, "lag_bytes":
{"scope/stream": n}}``).  :func:`query_lag` reads it from a query's last
progress and sets the gauge ``quire_spark_stream_lag_bytes{query, stream}``
(:data:`LAG_GAUGE`, prometheus_client's default registry);
:class:`LagListener` sets it on every progress event of every query.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from quire.errors import QuireError
from quire.spark._runtime import runtime
from quire.spark.stream_options import Cut, StreamOptions
from quire.spark.stream_read import stream_clients
from quire.streams.credentials import StreamAccess
from quire.streams.reader_groups import create_reader_group, delete_reader_group, report_read

log = logging.getLogger("quire.spark")

LAG_GAUGE = Gauge("quire_spark_stream_lag_bytes",
                  "Bytes a streaming query reading Quire streams is behind each stream's tail",
                  ["query", "stream"])
_MAX_GROUP_NAME = 255


def group_name(subscriber: str, stream: str) -> str:
    """The reader group holding retention of ``stream`` for ``subscriber``."""
    name = f"{subscriber}-{stream}"
    if len(name) <= _MAX_GROUP_NAME:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return f"{name[:_MAX_GROUP_NAME - 17]}-{digest}"


class RetentionHold:
    """A query's subscriptions to its streams (module docstring)."""

    def __init__(self, opts: StreamOptions, subscriber: str) -> None:
        self.opts = opts
        self.subscriber = subscriber
        self._groups: dict[str, dict[str, Any]] = {}

    async def subscribe(self, key: str, cut: Cut) -> None:
        """Subscribe to stream ``key`` (``scope/stream``) from ``cut``, unless
        done (the stored group if it exists: a restarted query's)."""
        if key in self._groups:
            return
        scope, _, stream = key.partition("/")
        controller, _segments = await stream_clients(self.opts.access, self.opts.read_bytes)
        self._groups[key] = await create_reader_group(
            controller, scope, group_name(self.subscriber, stream), {stream: cut}, "manual")

    async def report(self, cuts: Mapping[str, Cut]) -> None:
        """Publish the committed ``cuts`` (a failure only leaves retention
        held at the cut before: logged, not raised)."""
        controller, _segments = await stream_clients(self.opts.access, self.opts.read_bytes)
        for key, cut in sorted(cuts.items()):
            scope, _, stream = key.partition("/")
            try:
                await self.subscribe(key, cut)
                group = self._groups[key]
                await report_read(controller, scope, stream,
                                  group_name(self.subscriber, stream), group["id"],
                                  int(group["generation"]), cut)
            except QuireError as e:
                log.warning("stream %s: the committed cut of subscriber %s was not "
                            "published (%s); retention stays held at the one before", key,
                            self.subscriber, e)


def release_retention(controller: str, subscriber: str, streams: list[str], *,
                      tls_ca: str | None = None, credentials_file: str | None = None
                      ) -> list[str]:
    """Remove a given-up query's retention holds on ``streams``
    (``scope/stream`` each; the subscriber's name is in the query's offsets);
    the reader groups removed."""
    access = StreamAccess.of(controller, tls_ca, credentials_file)

    async def release() -> list[str]:
        client, _segments = await stream_clients(access)
        removed = []
        for key in streams:
            scope, _, stream = key.partition("/")
            try:
                await delete_reader_group(client, scope, group_name(subscriber, stream))
                removed.append(key)
            except QuireError as e:
                log.info("no retention hold of %s on %s: %s", subscriber, key, e)
        return removed

    found: list[str] = runtime().run(release())
    return found


def lag_of_progress(progress: Mapping[str, Any] | None) -> dict[str, int]:
    """``scope/stream`` -> bytes behind the tail, from a query progress (a
    dict, as ``StreamingQuery.lastProgress``) of a query reading streams."""
    lag: dict[str, int] = {}
    for source in (progress or {}).get("sources", []):
        latest = source.get("latestOffset")
        if isinstance(latest, str):
            try:
                latest = json.loads(latest)
            except ValueError:
                continue
        if isinstance(latest, dict) and "lag_bytes" in latest:
            lag.update({k: int(v) for k, v in latest["lag_bytes"].items()})
    return lag


def query_lag(query: Any) -> dict[str, int]:
    """Stream ``scope/stream`` -> bytes a running query is behind its tail,
    as of its last micro-batch (also set in :data:`LAG_GAUGE`)."""
    lag = lag_of_progress(query.lastProgress)
    name = str(query.name or query.id)
    for key, value in lag.items():
        LAG_GAUGE.labels(name, key).set(value)
    return lag


def _listener_base() -> type:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    return StreamingQueryListener


class LagListener(_listener_base()):  # type: ignore[misc]
    """A ``StreamingQueryListener`` setting :data:`LAG_GAUGE` on every
    progress of every query (``spark.streams.addListener(LagListener())``)."""

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to set yet."""

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        lag = lag_of_progress(json.loads(progress.json))
        for key, value in lag.items():
            LAG_GAUGE.labels(str(progress.name or progress.id), key).set(value)

    def onQueryIdle(self, event: Any) -> None:
        """Nothing changed."""

    def onQueryTerminated(self, event: Any) -> None:
        """The gauge keeps the last values."""
