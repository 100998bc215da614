"""The options and columns of a Spark write to streams (every option:
``docs/spark.md``).

The stream is ``option("stream", "scope/stream")``, or each row's
``stream`` column (``scope/stream``; then ``option("stream")`` may be
left out).  Rows give column ``event`` (binary, or string as UTF-8) and,
if the DataFrame has it, ``routing_key`` (string; null: no key).

A stream that does not exist is created (unless ``create`` is ``false``),
its scope too, with the policies the Pravega connector's options give
(:class:`StreamPolicies`): ``default_num_segments``,
``default_scale_factor`` with ``default_segment_target_rate_bytes_per_sec``
or ``default_segment_target_rate_events_per_sec`` (auto-scaling),
``default_retention_duration_milliseconds`` or
``default_retention_size_bytes`` (retention, with ``retention_max``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import BinaryType, StringType, StructType

from quire.errors import ScopeNotFoundError
from quire.security import Credentials
from quire.spark.options import bool_option, parse_duration_ms, positive_option
from quire.spark.stream_options import access_options, split_stream
from quire.streams import StreamAccess
from quire.streams.controller import ControllerClient


@dataclass(frozen=True)
class StreamPolicies:
    """How a write creates a stream that does not exist (module docstring)."""

    segments: int = 1
    scaling: str = "fixed"
    """``fixed``, ``kbytes`` or ``events``."""
    target_rate: int = 0
    scale_factor: int = 0
    retention: str = "none"
    """``none``, ``time`` (ms) or ``size`` (bytes)."""
    retention_param: int = 0
    retention_max: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamPolicies:
        rate_bytes = positive_option(options, "default_segment_target_rate_bytes_per_sec", None)
        rate_events = positive_option(options, "default_segment_target_rate_events_per_sec",
                                      None)
        duration = positive_option(options, "default_retention_duration_milliseconds", None)
        size = positive_option(options, "default_retention_size_bytes", None)
        if (rate_bytes and rate_events) or (duration and size):
            raise ValueError("give one target rate (bytes or events) and one retention "
                             "(duration or size)")
        scaling, rate = "fixed", 0
        if rate_bytes:
            scaling, rate = "kbytes", max(1, rate_bytes // 1024)
        elif rate_events:
            scaling, rate = "events", rate_events
        factor = positive_option(options, "default_scale_factor", 2 if rate else None) or 0
        retention = "time" if duration else "size" if size else "none"
        return cls(positive_option(options, "default_num_segments", 1) or 1, scaling, rate,
                   factor if rate else 0, retention, duration or size or 0,
                   positive_option(options, "retention_max", None) or 0)

    async def create(self, controller: ControllerClient, scope: str, stream: str) -> bool:
        """Create ``scope/stream`` (and its scope) with these policies;
        False if someone else created it first."""
        try:
            return await self._create_stream(controller, scope, stream)
        except ScopeNotFoundError:
            await controller.create_scope(scope)
            return await self._create_stream(controller, scope, stream)

    async def _create_stream(self, controller: ControllerClient, scope: str,
                             stream: str) -> bool:
        return await controller.create_stream(
            scope, stream, self.segments, self.retention, self.retention_param,
            scaling=self.scaling, target_rate=self.target_rate,
            scale_factor=self.scale_factor, retention_max=self.retention_max)


@dataclass(frozen=True)
class StreamSinkOptions:
    """The options of a write to streams (see the module docstring).
    ``scope``/``stream`` are empty when rows route themselves."""

    scope: str
    stream: str
    controller: str
    sink_id: str | None = None
    txn_lease_ms: int = 120_000
    tls_ca: str | None = None
    credentials: Credentials | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    create: bool = True
    policies: StreamPolicies = StreamPolicies()

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials, self.tls_cert,
                            self.tls_key)

    @property
    def key(self) -> str:
        return f"{self.scope}/{self.stream}"

    @classmethod
    def parse(cls, options: Mapping[str, str], routed: bool = False) -> StreamSinkOptions:
        """Parse Spark's options (``routed``: a ``stream`` column routes the
        rows, so option stream may be left out); ValueError names the bad one."""
        target = (options.get("stream") or "").strip()
        scope = stream = ""
        if target or not routed:
            scope, stream = split_stream(target)
        access = access_options(options)
        lease = parse_duration_ms(options.get("txn_lease") or "120s")
        if lease <= 0:
            raise ValueError("option txn_lease must be positive")
        sink_id = options.get("sink_id")
        if sink_id is not None and (not sink_id.strip() or "/" in sink_id):
            raise ValueError(f"option sink_id must be a non-empty name without '/', "
                             f"got {sink_id!r}")
        return cls(scope, stream, access.controller, sink_id, lease, access.tls_ca,
                   access.credentials, access.tls_cert, access.tls_key,
                   bool_option(options.get("create") or "true", "create"),
                   StreamPolicies.parse(options))


def _columns(schema: StructType) -> tuple[str, str | None]:
    """The names of the event column and of the routing key column (if any)."""
    event = key = None
    for f in schema.fields:
        name = f.name.lower()
        if name == "event":
            if not isinstance(f.dataType, BinaryType | StringType):
                raise ValueError(f"column event must be binary or string, not "
                                 f"{f.dataType.simpleString()}")
            event = f.name
        elif name == "routing_key":
            if not isinstance(f.dataType, StringType):
                raise ValueError(f"column routing_key must be a string, not "
                                 f"{f.dataType.simpleString()}")
            key = f.name
    if event is None:
        raise ValueError(f"a write to a stream takes column 'event' (binary or string) and "
                         f"optionally 'routing_key'; the DataFrame has {schema.fieldNames()}")
    return event, key


def stream_column(schema: StructType) -> str | None:
    """The name of the column routing each row to its stream (None: none)."""
    for f in schema.fields:
        if f.name.lower() == "stream":
            if not isinstance(f.dataType, StringType):
                raise ValueError(f"column stream must be a string (scope/stream), not "
                                 f"{f.dataType.simpleString()}")
            return f.name
    return None
