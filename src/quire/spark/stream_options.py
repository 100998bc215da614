"""The options of the ``quire`` data source when it reads *streams*, parsed
once into plain data (the table of every option: ``docs/spark.md``).

Which streams: ``stream`` (``scope/stream``), ``streams`` (``scope/a,
scope/b``) or ``stream_pattern`` (``scope/<regex>``, the whole name
matched; streams created later join a running query between
micro-batches); or ``metadata_table`` (``streams`` with ``scope``,
``stream_info`` with ``stream``) for a table about them.

Where to start and end: ``start_stream_cut`` / ``end_stream_cut``
(``earliest``, ``latest``, or, for one stream, a cut in JSON) or
``start_time`` / ``end_time`` (ISO 8601, or ms since the epoch: the events
appended in ``[start_time, end_time)``).

Where from: the cluster (``controller``, with ``tls_ca``, ``tls_cert`` /
``tls_key``, ``credentials_file`` or ``username`` / ``password``), its
flushed history read from ``tier2`` by the tasks, or, with ``read_mode``
``tier2``, tier-2 alone (no cluster: :mod:`quire.history`).

Rows: ``event binary, scope string, stream string, segment_id long,
offset long, timestamp timestamp`` (``offset``: the segment offset of the
event's 8-byte header; ``timestamp``: when it was appended, null if not
known).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from quire.errors import ConfigError
from quire.security import Credentials
from quire.spark.options import bool_option, positive_option
from quire.streams.controller import controller_uri
from quire.streams.credentials import StreamAccess
from quire.tier2 import parse_tier2_uri

EARLIEST = "earliest"
LATEST = "latest"
UNBOUNDED = "unbounded"
CLUSTER = "cluster"
TIER2 = "tier2"
METADATA_TABLES = ("streams", "stream_info")

Cut = dict[int, int]
"""A stream cut: segment id -> offset."""


def parse_cut(text: str, name: str) -> Cut:
    """A stream cut in JSON (``{"<segment id>": offset, ...}``) as a dict;
    ValueError naming the option if it is not one."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError(f"option {name} must be earliest, latest or a stream cut in JSON "
                         f"(segment id -> offset), got {text!r}") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"option {name}: a stream cut is a non-empty JSON object of segment "
                         f"id -> offset, got {text!r}")
    cut: Cut = {}
    for key, value in raw.items():
        try:
            sid = int(key)
        except ValueError:
            raise ValueError(f"option {name}: segment id {key!r} is not an integer") from None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or sid < 0:
            raise ValueError(f"option {name}: segment {key} -> {value!r}: ids and offsets "
                             "are integers >= 0")
        cut[sid] = value
    return cut


def cut_to_json(cut: Mapping[int, int]) -> dict[str, int]:
    """A cut as Spark offsets and ``start_stream_cut`` hold it (string keys, sorted)."""
    return {str(sid): cut[sid] for sid in sorted(cut)}


def cut_from_json(offset: Mapping[str, int]) -> Cut:
    return {int(k): int(v) for k, v in offset.items()}


def _cut_option(text: str | None, name: str, default: str,
                keywords: tuple[str, ...]) -> str | Cut:
    if text is None:
        return default
    word = text.strip().lower()
    if word in keywords:
        return LATEST if word == UNBOUNDED else word
    return parse_cut(text, name)


def parse_time_ms(text: str | None, name: str) -> int | None:
    """A time option: ms since the epoch, or ISO 8601 (UTC unless it says)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"option {name} must be ms since the epoch or an ISO 8601 time, got "
                         f"{text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def access_options(options: Mapping[str, str]) -> StreamAccess:
    """The controller, ``tls_ca``, ``tls_cert`` / ``tls_key`` and credentials
    (``credentials_file``, or ``username`` and ``password``) of a read's or a
    write's options; ValueError naming what is wrong.  A credentials file is
    read here, on the driver: executors get the credentials with the plan."""
    try:
        return StreamAccess.of(controller_uri(options.get("controller")),
                               options.get("tls_ca") or None,
                               options.get("credentials_file") or None,
                               options.get("username") or None,
                               options.get("password") or None,
                               options.get("tls_cert") or None,
                               options.get("tls_key") or None)
    except ConfigError as e:
        raise ValueError(f"options controller, tls_ca, tls_cert, tls_key, credentials_file, "
                         f"username, password: {e}") from None


def split_stream(text: str, name: str = "stream") -> tuple[str, str]:
    """``scope/stream`` as its two names; ValueError naming the option."""
    scope, sep, stream = text.strip().partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise ValueError(f"option {name} must be scope/stream, got {text!r}")
    return scope, stream


def is_stream_read(options: Mapping[str, str]) -> bool:
    """The options name streams (or a table about them), not a log."""
    return any(options.get(k) for k in ("stream", "streams", "stream_pattern",
                                         "metadata_table"))


@dataclass(frozen=True)
class StreamOptions:
    """Parsed options of a stream read (picklable; module docstring)."""

    controller: str
    streams: tuple[tuple[str, str], ...] = ()
    """The streams named (``stream`` or ``streams``)."""
    pattern: tuple[str, str] | None = None
    """``stream_pattern``: (scope, regex over the stream's name)."""
    start: str | Cut = EARLIEST
    end: str | Cut = LATEST
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    tier2: str | None = None
    read_mode: str = CLUSTER
    max_rows_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    read_bytes: int = 1 << 20
    batch_rows: int = 8192
    tls_ca: str | None = None
    credentials: Credentials | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    hold_retention: bool = True
    subscriber: str | None = None
    split_bytes: int = 64 << 20

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials, self.tls_cert,
                            self.tls_key)

    @property
    def scope(self) -> str:
        """The (first) stream's scope."""
        return self.pattern[0] if self.pattern else self.streams[0][0]

    @property
    def stream(self) -> str:
        """The one stream read (ValueError when the options name several)."""
        if self.pattern or len(self.streams) != 1:
            raise ValueError("this needs exactly one stream (option stream)")
        return self.streams[0][1]

    def matches(self, scope: str, stream: str) -> bool:
        """Whether ``scope/stream`` is one the options select."""
        if self.pattern is not None:
            return scope == self.pattern[0] and re.fullmatch(self.pattern[1], stream) is not None
        return (scope, stream) in self.streams

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Parse Spark's (case-insensitive) options; ValueError names the bad one."""
        get = options.get
        named = [k for k in ("stream", "streams", "stream_pattern") if get(k)]
        if len(named) != 1:
            raise ValueError("give one of the options stream, streams or stream_pattern")
        streams: tuple[tuple[str, str], ...] = ()
        pattern = None
        if named[0] == "stream":
            streams = (split_stream(get("stream") or ""),)
        elif named[0] == "streams":
            streams = tuple(dict.fromkeys(split_stream(s, "streams")
                                          for s in (get("streams") or "").split(",")
                                          if s.strip()))
            if not streams:
                raise ValueError("option streams must list scope/stream names")
        else:
            scope, regex = split_stream(get("stream_pattern") or "", "stream_pattern")
            try:
                re.compile(regex)
            except re.error as e:
                raise ValueError(f"option stream_pattern: {regex!r} is not a regex: {e}") \
                    from None
            pattern = (scope, regex)
        access = access_options(options)
        tier2 = get("tier2") or None
        if tier2 is not None:
            try:
                parse_tier2_uri(tier2)
            except ConfigError as e:
                raise ValueError(f"option tier2: {e}") from None
        read_mode = (get("read_mode") or CLUSTER).strip().lower()
        if read_mode not in (CLUSTER, TIER2) or (read_mode == TIER2 and tier2 is None):
            raise ValueError("option read_mode is cluster or tier2 (which needs option tier2)")
        start = _cut_option(get("start_stream_cut"), "start_stream_cut", EARLIEST,
                            (EARLIEST, LATEST))
        end = _cut_option(get("end_stream_cut"), "end_stream_cut", LATEST, (LATEST, UNBOUNDED))
        if (isinstance(start, dict) or isinstance(end, dict)) and len(streams) != 1:
            raise ValueError("a stream cut in JSON is for one stream (option stream)")
        start_time = parse_time_ms(get("start_time"), "start_time")
        end_time = parse_time_ms(get("end_time"), "end_time")
        if (start_time is not None and get("start_stream_cut")) or \
                (end_time is not None and get("end_stream_cut")):
            raise ValueError("give a start (end) time or a start (end) stream cut, not both")
        subscriber = get("subscriber") or None
        if subscriber is not None and not re.fullmatch(r"[A-Za-z0-9.\-][A-Za-z0-9._\-]{0,120}",
                                                       subscriber):
            raise ValueError(f"option subscriber must be a reader group name, got "
                             f"{subscriber!r}")
        return cls(
            controller=access.controller, streams=streams, pattern=pattern,
            start=start, end=end, start_time_ms=start_time, end_time_ms=end_time,
            tier2=tier2, read_mode=read_mode,
            max_rows_per_trigger=positive_option(options, "max_rows_per_trigger", None),
            max_bytes_per_trigger=positive_option(options, "max_bytes_per_trigger", None),
            fail_on_data_loss=bool_option(get("fail_on_data_loss") or "true", "fail_on_data_loss"),
            read_bytes=positive_option(options, "read_bytes", 1 << 20) or 1 << 20,
            batch_rows=positive_option(options, "batch_rows", 8192) or 8192,
            tls_ca=access.tls_ca, credentials=access.credentials, tls_cert=access.tls_cert,
            tls_key=access.tls_key,
            hold_retention=bool_option(get("hold_retention") or "true", "hold_retention"),
            subscriber=subscriber,
            split_bytes=positive_option(options, "split_bytes", 64 << 20) or 64 << 20,
        )
