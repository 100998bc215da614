"""How a named log is kept in the metadata store: record keys and their JSON.

Layout, for a log called ``NAME`` (every key under ``logs/NAME/``)::

    logs/NAME/head                          HeadRecord: epoch, writer hold, next_seq,
                                            truncated_before
    logs/NAME/ledgers/<seq:012d>            LedgerRecord, one per ledger of the log
    logs/NAME/jobs/<job_id>                 JobRecord: a write job (Spark) in progress
    logs/NAME/jobs/<job_id>/ledgers/<id>    Registration: a ledger written for the job
    logs/NAME/sinks/<sink_id>               SinkRecord: last batch a stream sink committed

The head changes on every membership change (a ledger joins or leaves, a
writer takes or releases the log), so a compare-and-set on its version
orders them; the ledger list is spread over one record per ledger, so a log
can grow for years without any record growing.  Every record is a JSON
object with ``format_version`` 1; readers ignore fields they do not know and
refuse a newer format with :class:`~quire.errors.MetadataError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from quire.errors import MetadataError
from quire.log.position import Position

FORMAT_VERSION = 1
ROOT = "logs/"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")

T = TypeVar("T")


def check_name(name: str, what: str = "log name") -> str:
    """Return ``name`` if it is a valid log (or sink) name, else ValueError:
    1-200 characters of ``A-Z a-z 0-9 . _ -``, not starting with ``.`` or ``-``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"bad {what} {name!r}: use 1-200 of A-Z a-z 0-9 . _ - "
                         "(not starting with '.' or '-')")
    return name


def log_prefix(name: str) -> str:
    return f"{ROOT}{check_name(name)}/"


def head_key(name: str) -> str:
    return f"{log_prefix(name)}head"


def ledgers_prefix(name: str) -> str:
    return f"{log_prefix(name)}ledgers/"


def ledger_key(name: str, seq: int) -> str:
    return f"{ledgers_prefix(name)}{seq:012d}"


def seq_of_ledger_key(name: str, key: str) -> int | None:
    """The seq of a ``ledger_key`` of log ``name`` (None for any other key)."""
    prefix = ledgers_prefix(name)
    rest = key[len(prefix):] if key.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def jobs_prefix(name: str) -> str:
    return f"{log_prefix(name)}jobs/"


def job_key(name: str, job_id: str) -> str:
    return f"{jobs_prefix(name)}{check_name(job_id, 'job id')}"


def registrations_prefix(name: str, job_id: str) -> str:
    return f"{job_key(name, job_id)}/ledgers/"


def registration_key(name: str, job_id: str, ledger_id: int) -> str:
    return f"{registrations_prefix(name, job_id)}{ledger_id:012d}"


def is_registration_key(name: str, key: str) -> bool:
    """True for a ``registration_key`` of any job of log ``name``."""
    prefix = jobs_prefix(name)
    return key.startswith(prefix) and "/ledgers/" in key[len(prefix):]


def sink_key(name: str, sink_id: str) -> str:
    return f"{log_prefix(name)}sinks/{check_name(sink_id, 'sink id')}"


# --- records -------------------------------------------------------------------


@dataclass(frozen=True)
class WriterHold:
    """The writer that holds a log: its epoch, an id of the process that
    opened it, and when (wall clock, ms)."""

    epoch: int
    owner: str
    since_ms: int


@dataclass(frozen=True)
class HeadRecord:
    """The head of a log.

    ``epoch`` goes up by one each time a writer opens the log; ``writer`` is
    the current hold (None when no writer holds the log); ``next_seq`` is the
    seq the next ledger to join gets; every position before
    ``truncated_before`` was removed by a truncation or an overwrite.
    """

    name: str
    created_ms: int
    epoch: int = 0
    writer: WriterHold | None = None
    next_seq: int = 0
    truncated_before: Position = Position.START

    def with_(self, **changes: Any) -> HeadRecord:
        from dataclasses import replace

        return replace(self, **changes)


LedgerState = Literal["open", "closed"]


@dataclass(frozen=True)
class LedgerRecord:
    """One ledger of a log.  ``entries`` and ``bytes`` (payload bytes) are set
    once the ledger is closed; ``epoch`` is the writer epoch that created it
    (None for a ledger that joined by bulk append)."""

    seq: int
    ledger_id: int
    state: LedgerState
    created_ms: int
    entries: int | None = None
    bytes: int | None = None
    epoch: int | None = None

    @property
    def closed(self) -> bool:
        return self.state == "closed"


JobState = Literal["open", "committed", "aborted"]
JobKind = Literal["batch", "sink"]


@dataclass(frozen=True)
class JobRecord:
    """A write job: ledgers written for it (see :class:`Registration`) join
    the log together when it commits, or are deleted.  A ``batch`` job not
    committed within ``ttl_ms`` of ``created_ms`` is garbage; a ``sink`` job
    (one per stream sink) never commits as a whole, only its registrations
    expire."""

    job_id: str
    kind: JobKind
    state: JobState
    created_ms: int
    ttl_ms: int


@dataclass(frozen=True)
class Registration:
    """A ledger written for a job, registered before its first entry; ``task``
    describes the writer (free text) and ``batch_id`` the stream batch, if any."""

    ledger_id: int
    created_ms: int
    task: str = ""
    batch_id: int | None = None


@dataclass(frozen=True)
class SinkRecord:
    """A stream sink's progress: the last batch id it committed to the log."""

    sink_id: str
    last_batch_id: int
    updated_ms: int


# --- encoding ------------------------------------------------------------------


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps({"format_version": FORMAT_VERSION, **doc}, sort_keys=True,
                      separators=(",", ":")).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise MetadataError(f"{what} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise MetadataError(f"{what} is not a JSON object")
    version = doc.get("format_version")
    if type(version) is not int or version < 1:
        raise MetadataError(f"{what} has no valid format_version: {version!r}")
    if version > FORMAT_VERSION:
        raise MetadataError(f"{what} format_version {version} is newer than this reader "
                            f"({FORMAT_VERSION})")
    return doc


def _field(doc: dict[str, Any], key: str, kind: type[T], what: str,
           optional: bool = False) -> T:
    value = doc.get(key)
    if value is None and optional:
        return value  # type: ignore[return-value]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MetadataError(f"{what}: field {key!r} should be {kind.__name__}, got {value!r}")
    return value


def encode_head(head: HeadRecord) -> bytes:
    writer = None if head.writer is None else {
        "epoch": head.writer.epoch, "owner": head.writer.owner,
        "since_ms": head.writer.since_ms}
    return _dump({"name": head.name, "created_ms": head.created_ms, "epoch": head.epoch,
                  "writer": writer, "next_seq": head.next_seq,
                  "truncated_before": [head.truncated_before.ledger_seq,
                                       head.truncated_before.entry_id]})


def decode_head(data: bytes) -> HeadRecord:
    what = "log head record"
    doc = _load(data, what)
    writer_doc = doc.get("writer")
    writer = None
    if writer_doc is not None:
        if not isinstance(writer_doc, dict):
            raise MetadataError(f"{what}: bad writer {writer_doc!r}")
        writer = WriterHold(epoch=_field(writer_doc, "epoch", int, what),
                            owner=_field(writer_doc, "owner", str, what),
                            since_ms=_field(writer_doc, "since_ms", int, what))
    truncated = doc.get("truncated_before", [0, 0])
    try:
        before = Position(*truncated)
    except (TypeError, ValueError) as e:
        raise MetadataError(f"{what}: bad truncated_before {truncated!r}") from e
    return HeadRecord(name=_field(doc, "name", str, what),
                      created_ms=_field(doc, "created_ms", int, what),
                      epoch=_field(doc, "epoch", int, what), writer=writer,
                      next_seq=_field(doc, "next_seq", int, what), truncated_before=before)


def encode_ledger(record: LedgerRecord) -> bytes:
    return _dump({"seq": record.seq, "ledger_id": record.ledger_id, "state": record.state,
                  "created_ms": record.created_ms, "entries": record.entries,
                  "bytes": record.bytes, "epoch": record.epoch})


def decode_ledger(data: bytes) -> LedgerRecord:
    what = "log ledger record"
    doc = _load(data, what)
    state = _field(doc, "state", str, what)
    if state not in ("open", "closed"):
        raise MetadataError(f"{what}: bad state {state!r}")
    return LedgerRecord(seq=_field(doc, "seq", int, what),
                        ledger_id=_field(doc, "ledger_id", int, what),
                        state="open" if state == "open" else "closed",
                        created_ms=_field(doc, "created_ms", int, what),
                        entries=_field(doc, "entries", int, what, optional=True),
                        bytes=_field(doc, "bytes", int, what, optional=True),
                        epoch=_field(doc, "epoch", int, what, optional=True))


def encode_job(job: JobRecord) -> bytes:
    return _dump({"job_id": job.job_id, "kind": job.kind, "state": job.state,
                  "created_ms": job.created_ms, "ttl_ms": job.ttl_ms})


def decode_job(data: bytes) -> JobRecord:
    what = "log job record"
    doc = _load(data, what)
    kind = _field(doc, "kind", str, what)
    state = _field(doc, "state", str, what)
    if kind not in ("batch", "sink") or state not in ("open", "committed", "aborted"):
        raise MetadataError(f"{what}: bad kind {kind!r} or state {state!r}")
    return JobRecord(job_id=_field(doc, "job_id", str, what),
                     kind="batch" if kind == "batch" else "sink",
                     state="open" if state == "open" else
                     ("committed" if state == "committed" else "aborted"),
                     created_ms=_field(doc, "created_ms", int, what),
                     ttl_ms=_field(doc, "ttl_ms", int, what))


def encode_registration(reg: Registration) -> bytes:
    return _dump({"ledger_id": reg.ledger_id, "created_ms": reg.created_ms, "task": reg.task,
                  "batch_id": reg.batch_id})


def decode_registration(data: bytes) -> Registration:
    what = "log job registration"
    doc = _load(data, what)
    return Registration(ledger_id=_field(doc, "ledger_id", int, what),
                        created_ms=_field(doc, "created_ms", int, what),
                        task=_field(doc, "task", str, what),
                        batch_id=_field(doc, "batch_id", int, what, optional=True))


def encode_sink(sink: SinkRecord) -> bytes:
    return _dump({"sink_id": sink.sink_id, "last_batch_id": sink.last_batch_id,
                  "updated_ms": sink.updated_ms})


def decode_sink(data: bytes) -> SinkRecord:
    what = "log sink record"
    doc = _load(data, what)
    return SinkRecord(sink_id=_field(doc, "sink_id", str, what),
                      last_batch_id=_field(doc, "last_batch_id", int, what),
                      updated_ms=_field(doc, "updated_ms", int, what))
