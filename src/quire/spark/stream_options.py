"""The options of the ``quire`` data source when it reads a *stream*
(``option("stream", "scope/stream")``), parsed once into plain data.

=====================  ======================================================
option                 meaning
=====================  ======================================================
stream                 ``scope/stream`` to read (required; selects this reader)
controller             controller URI ``tcp://host:port``, or
                       ``tls://host:port`` for TLS (default
                       ``$QUIRE_CONTROLLER``, else ``tcp://127.0.0.1:9090``)
tls_ca                 CA certificates (PEM file, on every executor) trusted
                       for a ``tls://`` controller and its segment stores
                       (default: the system's)
credentials_file       TOML file (mode 0600, read by the driver) with
                       ``username`` and ``password`` of a user of a cluster
                       with auth on; or give ``username`` and ``password``
start_stream_cut       where reading starts: ``earliest`` (default: the
                       stream's head, after truncation), ``latest`` (its
                       tail now) or a stream cut in JSON, segment id ->
                       offset: ``{"0": 0, "4294967297": 4096}``
end_stream_cut         batch reads: where reading ends: ``latest`` (default:
                       the tail at planning time), ``unbounded`` (same as
                       latest for a batch), or a stream cut in JSON;
                       streaming queries ignore it
tier2                  tier-2 URI the segment store flushes to, as the
                       executors reach it (``file:///shared/path``,
                       ``s3://bucket/prefix?endpoint_url=...``): the ranges
                       already flushed are read from its chunks, only the
                       unflushed tail through the segment store.  Unset:
                       everything through the segment store.  Not
                       discovered: the segment store's tier-2 path is its
                       own configuration and may not be the path the
                       executors mount, so the job says it.
max_rows_per_trigger   streaming: events per micro-batch at most
max_bytes_per_trigger  streaming: segment bytes (headers included) per
                       micro-batch at most (at least one event moves on)
fail_on_data_loss      data truncated away before it was read (an offset
                       of the checkpoint or of a planned partition, a tier-2
                       chunk gone since planning) fails the query
                       (default ``true``); ``false`` skips it with a warning
read_bytes             bytes per read request to the segment store or
                       tier-2 (default 1048576)
batch_rows             rows per Arrow batch handed to Spark (default 8192)
=====================  ======================================================

Rows: ``event binary, scope string, stream string, segment_id long,
offset long`` (``offset``: the segment offset of the event's 8-byte header).
"""

from __future__ import annotations

import json
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


def access_options(options: Mapping[str, str]) -> StreamAccess:
    """The controller, ``tls_ca`` and credentials (``credentials_file``, or
    ``username`` and ``password``) of a read's or a write's options;
    ValueError naming what is wrong.  A credentials file is read here, on
    the driver: executors get the credentials with the plan."""
    try:
        return StreamAccess.of(controller_uri(options.get("controller")),
                               options.get("tls_ca") or None,
                               options.get("credentials_file") or None,
                               options.get("username") or None,
                               options.get("password") or None)
    except ConfigError as e:
        raise ValueError(f"options controller, tls_ca, credentials_file, username, "
                         f"password: {e}") from None


@dataclass(frozen=True)
class StreamOptions:
    """Parsed options of a stream read (picklable; module docstring)."""

    controller: str
    scope: str
    stream: str
    start: str | Cut = EARLIEST
    end: str | Cut = LATEST
    tier2: str | None = None
    max_rows_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    read_bytes: int = 1 << 20
    batch_rows: int = 8192
    tls_ca: str | None = None
    credentials: Credentials | None = None

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Parse Spark's (case-insensitive) options; ValueError names the bad one."""
        get = options.get
        stream = get("stream") or ""
        scope, sep, name = stream.partition("/")
        if not sep or not scope or not name or "/" in name:
            raise ValueError(f"option stream must be scope/stream, got {stream!r}")
        access = access_options(options)
        tier2 = get("tier2") or None
        if tier2 is not None:
            try:
                parse_tier2_uri(tier2)
            except ConfigError as e:
                raise ValueError(f"option tier2: {e}") from None
        return cls(
            controller=access.controller, scope=scope, stream=name,
            start=_cut_option(get("start_stream_cut"), "start_stream_cut", EARLIEST,
                              (EARLIEST, LATEST)),
            end=_cut_option(get("end_stream_cut"), "end_stream_cut", LATEST,
                            (LATEST, UNBOUNDED)),
            tier2=tier2,
            max_rows_per_trigger=positive_option(options, "max_rows_per_trigger", None),
            max_bytes_per_trigger=positive_option(options, "max_bytes_per_trigger", None),
            fail_on_data_loss=bool_option(get("fail_on_data_loss") or "true", "fail_on_data_loss"),
            read_bytes=positive_option(options, "read_bytes", 1 << 20) or 1 << 20,
            batch_rows=positive_option(options, "batch_rows", 8192) or 8192,
            tls_ca=access.tls_ca, credentials=access.credentials,
        )
