"""Settings of tier-2 storage (one frozen dataclass, units in the names) and
the URIs that choose its driver.

URIs:

* ``file:///abs/path``: chunks are files under that directory (created if
  missing), a chunk name's ``/`` separating directories;
* ``memory://`` (a private store) or ``memory://NAME`` (a store shared by
  every open of that name in this process): for unit tests;
* ``s3://bucket/prefix?endpoint_url=URL&region=REGION&create=MODE``: objects
  ``prefix/<chunk name>`` in ``bucket`` (the prefix may be empty); every
  query key is optional: ``endpoint_url`` (default: AWS's), ``region``
  (default ``us-east-1``), ``create`` = ``if-none-match`` (default: exclusive
  creation by a conditional PUT) or ``head-then-put`` for servers that
  ignore ``If-None-Match`` (see :mod:`quire.tier2.s3` for why that is safe
  with epoch-named chunks).  Credentials come from the usual AWS environment
  variables or files, never from the URI.

Out-of-range values and malformed URIs raise
:class:`~quire.errors.ConfigError` at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from quire.errors import ConfigError

DEFAULT_MAX_CHUNK_BYTES = 16 * 1024 * 1024
"""16 MiB: the smallest size at which one writer's chunks (each with its own
fdatasync and directory fsync) keep up with a raw sequential write + fsync
of the same bytes: ``benchmarks/tier2_write.py`` (256 MiB, one chunk in
flight, ext4 on this VM) measured 0.29x of raw with 1 MiB chunks, 0.59x
with 4 MiB, 0.84x with 16 MiB, 0.96x with 64 MiB.  Larger chunks cost
memory (the S3 driver holds a chunk per write) and delay a segment's first
roll; S3 charges per request, so fewer, larger objects are cheaper there
too."""

S3_CREATE_MODES = ("if-none-match", "head-then-put")


@dataclass(frozen=True)
class FileLocation:
    """A ``file://`` URI: the directory holding the chunks."""

    root: Path


@dataclass(frozen=True)
class MemoryLocation:
    """A ``memory://`` URI: ``name`` is empty for a private store."""

    name: str


@dataclass(frozen=True)
class S3Location:
    """An ``s3://`` URI, parsed."""

    bucket: str
    prefix: str
    """Key prefix without leading or trailing ``/`` (may be empty)."""
    endpoint_url: str | None
    region: str
    create_mode: str
    """One of :data:`S3_CREATE_MODES`."""

    def key_of(self, chunk_name: str) -> str:
        return f"{self.prefix}/{chunk_name}" if self.prefix else chunk_name


Location = FileLocation | MemoryLocation | S3Location


def parse_tier2_uri(uri: str) -> Location:
    """The location a tier-2 URI names (:class:`ConfigError` if it names none)."""
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or query:
            raise ConfigError(f"tier-2 URI {uri!r}: expected file:///absolute/path")
        return FileLocation(Path(parts.path))
    if parts.scheme == "memory":
        if parts.path not in ("", "/") or query:
            raise ConfigError(f"tier-2 URI {uri!r}: expected memory:// or memory://NAME")
        return MemoryLocation(parts.netloc)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ConfigError(f"tier-2 URI {uri!r}: no bucket (s3://bucket/prefix)")
        unknown = set(query) - {"endpoint_url", "region", "create"}
        if unknown:
            raise ConfigError(f"tier-2 URI {uri!r}: unknown option(s) {sorted(unknown)}")
        create_mode = query.get("create", S3_CREATE_MODES[0])
        if create_mode not in S3_CREATE_MODES:
            raise ConfigError(f"tier-2 URI {uri!r}: create must be one of {S3_CREATE_MODES}")
        return S3Location(bucket=parts.netloc, prefix=parts.path.strip("/"),
                          endpoint_url=query.get("endpoint_url") or None,
                          region=query.get("region") or "us-east-1", create_mode=create_mode)
    raise ConfigError(f"tier-2 URI {uri!r}: the scheme must be file, memory or s3")


@dataclass(frozen=True)
class Tier2Config:
    uri: str
    """Where the chunks live (see the module docstring)."""
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    """Largest chunk: writers roll to a new chunk at this size, and every
    driver refuses a bigger one (:class:`~quire.errors.ChunkTooLargeError`)."""
    s3_timeout_ms: int = 30_000
    """Connect and read timeout of each S3 request."""
    s3_max_attempts: int = 3
    """Attempts per S3 request (botocore's "standard" retries, with backoff)."""
    s3_request_deadline_ms: int = 120_000
    """Longest one S3 call may take, its attempts included: past it the call
    fails (a :class:`~quire.errors.Tier2Error`), so a server that hangs
    (waiting for its ``100 Continue``, say, which no other timeout bounds)
    holds a storage writer this long, not for ever."""
    power_loss_tracking: bool = False
    """File driver: record what each fsync made durable in a sidecar, for
    :mod:`quire.testing.tier2_power_loss` (tests only)."""
    test_skip_file_fsync: bool = False
    """File driver, tests only: never fsync a chunk's bytes (the power-loss
    tests show this loses chunks)."""
    test_skip_directory_fsync: bool = False
    """File driver, tests only: never fsync a directory (the power-loss tests
    show this loses chunks' names)."""

    def __post_init__(self) -> None:
        for name in ("max_chunk_bytes", "s3_timeout_ms", "s3_max_attempts",
                     "s3_request_deadline_ms"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"tier-2 setting {name} must be a positive int, got {value!r}")
        parse_tier2_uri(self.uri)

    @property
    def location(self) -> Location:
        return parse_tier2_uri(self.uri)
