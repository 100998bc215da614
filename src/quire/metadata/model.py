"""Values kept in the metadata store, their wire format, and transaction ops.

Ledger metadata is stored as JSON (``format_version`` 2, bytes as base64).
Readers ignore fields they do not know, so a later minor revision may add
fields (each with a default); a change old readers must not misread bumps
``format_version``, which old readers refuse with :class:`MetadataError`.

Versions:

* 1 kept the ledger's ``password``.
* 2 keeps the keys derived from it instead (``master_key``, ``mac_key``,
  :class:`~quire.security.ledger_keys.LedgerKeys`): what recovery needs,
  never the password (a reader of the metadata store can still fence and
  write the ledger with them; it learns no password that may open anything
  else).  A version 1 record is read as it is, its keys derived from its
  password, and becomes a version 2 record at its next write (a close, an
  ensemble change, a recovery): nothing keeps the password in memory.  Old
  readers refuse version 2 (they would have read an empty password).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from quire.errors import MetadataError
from quire.security.ledger_keys import EMPTY_PASSWORD_KEYS, LedgerKeys
from quire.types import BookieState, DigestType, LedgerState, LedgerType

T = TypeVar("T")

FORMAT_VERSION = 2
"""Version of the ledger metadata encoding written by :func:`serialize`."""
PASSWORD_FORMAT_VERSION = 1
"""The version that kept the password (read, never written)."""

Ensembles = tuple[tuple[int, tuple[str, ...]], ...]


@dataclass(frozen=True)
class LedgerMetadata:
    """What the store knows about one ledger (BookKeeper's LedgerMetadata).

    ``ensembles`` holds one ``(first_entry_id, bookie_ids)`` pair per fragment,
    sorted by first entry id; every ensemble has ``ensemble_size`` bookies.
    ``last_entry_id`` and ``length`` are meaningful once the state is CLOSED.
    ``keys`` are the ledger's keys (derived from its password; the
    password itself is never kept).  The constructor checks these
    invariants and raises :class:`ValueError`.
    """

    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    ledger_type: LedgerType = LedgerType.PD_JOURNAL
    digest_type: DigestType = DigestType.CRC32C
    keys: LedgerKeys = EMPTY_PASSWORD_KEYS
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    ensembles: Ensembles = ()
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict, hash=False)
    creation_time_ms: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.ack_quorum_size <= self.write_quorum_size <= self.ensemble_size:
            raise ValueError(
                "need 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size, got "
                f"{self.ack_quorum_size}/{self.write_quorum_size}/{self.ensemble_size}")
        if self.last_entry_id < -1 or self.length < 0:
            raise ValueError(f"bad last_entry_id {self.last_entry_id} or length {self.length}")
        ensembles = tuple((first, tuple(bookies)) for first, bookies in self.ensembles)
        previous = -1
        for first, bookies in ensembles:
            if first <= previous:
                raise ValueError(f"ensembles must start at increasing entry ids >= 0: {first}")
            if len(bookies) != self.ensemble_size:
                raise ValueError(f"ensemble at entry {first} has {len(bookies)} bookies, "
                                 f"expected {self.ensemble_size}")
            previous = first
        custom = dict(self.custom_metadata)
        if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in custom.items()):
            raise ValueError("custom_metadata maps str to bytes")
        object.__setattr__(self, "ensembles", ensembles)
        object.__setattr__(self, "custom_metadata", MappingProxyType(custom))

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the fragment that contains ``entry_id``."""
        index = bisect.bisect_right([first for first, _ in self.ensembles], entry_id) - 1
        if index < 0:
            raise ValueError(f"no ensemble covers entry {entry_id}")
        return self.ensembles[index][1]

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        """The bookies of the last (current) fragment."""
        if not self.ensembles:
            raise ValueError("ledger has no ensemble")
        return self.ensembles[-1][1]

    def with_(self, **changes: Any) -> LedgerMetadata:
        """A copy with ``changes`` applied (invariants checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A value with the store's version number for compare-and-set."""

    value: T
    version: int


@dataclass(frozen=True)
class BookieInfo:
    """A live bookie as listed in the registry."""

    bookie_id: str
    address: str
    state: BookieState
    metrics_address: str | None = None


# --- transaction ops ---------------------------------------------------------


@dataclass(frozen=True)
class CreateLedger:
    ledger_id: int
    metadata: LedgerMetadata


@dataclass(frozen=True)
class UpdateLedger:
    ledger_id: int
    metadata: LedgerMetadata
    expected_version: int


@dataclass(frozen=True)
class DeleteLedger:
    ledger_id: int
    expected_version: int | None


@dataclass(frozen=True)
class CreateRecord:
    key: str
    value: bytes


@dataclass(frozen=True)
class UpdateRecord:
    key: str
    value: bytes
    expected_version: int


@dataclass(frozen=True)
class DeleteRecord:
    key: str
    expected_version: int | None


@dataclass(frozen=True)
class CheckRecord:
    """Asserts a record's version without changing it."""

    key: str
    expected_version: int


Op = (CreateLedger | UpdateLedger | DeleteLedger
      | CreateRecord | UpdateRecord | DeleteRecord | CheckRecord)


# --- wire format -------------------------------------------------------------


def serialize(md: LedgerMetadata) -> bytes:
    """Encode ledger metadata (see the module docstring for the format)."""
    doc = {
        "format_version": FORMAT_VERSION,
        "ensemble_size": md.ensemble_size,
        "write_quorum_size": md.write_quorum_size,
        "ack_quorum_size": md.ack_quorum_size,
        "ledger_type": md.ledger_type.value,
        "digest_type": md.digest_type.value,
        "master_key": _b64(md.keys.master_key),
        "mac_key": _b64(md.keys.mac_key),
        "state": md.state.value,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "ensembles": [[first, list(bookies)] for first, bookies in md.ensembles],
        "custom_metadata": {k: _b64(v) for k, v in md.custom_metadata.items()},
        "creation_time_ms": md.creation_time_ms,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def deserialize(data: bytes) -> LedgerMetadata:
    """Decode what :func:`serialize` wrote; anything malformed raises MetadataError."""
    doc = _load_object(data, "ledger metadata")
    version = doc.get("format_version")
    if type(version) is not int or version < 1:
        raise MetadataError(f"ledger metadata has no valid format_version: {version!r}")
    if version > FORMAT_VERSION:
        raise MetadataError(f"ledger metadata format_version {version} is newer than "
                            f"this reader ({FORMAT_VERSION})")
    try:
        return LedgerMetadata(
            ensemble_size=_get(doc, "ensemble_size", int),
            write_quorum_size=_get(doc, "write_quorum_size", int),
            ack_quorum_size=_get(doc, "ack_quorum_size", int),
            ledger_type=LedgerType(_get(doc, "ledger_type", str, LedgerType.PD_JOURNAL.value)),
            digest_type=DigestType(_get(doc, "digest_type", str, DigestType.CRC32C.value)),
            keys=_keys(doc, version),
            state=LedgerState(_get(doc, "state", str, LedgerState.OPEN.value)),
            last_entry_id=_get(doc, "last_entry_id", int, -1),
            length=_get(doc, "length", int, 0),
            ensembles=tuple(_ensemble(item) for item in _get(doc, "ensembles", list, [])),
            custom_metadata={k: _unb64(_typed(v, str))
                             for k, v in _get(doc, "custom_metadata", dict, {}).items()},
            creation_time_ms=_get(doc, "creation_time_ms", int, 0),
        )
    except (ValueError, TypeError) as e:
        raise MetadataError(f"malformed ledger metadata: {e}") from e


def ledger_json(ledger_id: int, md: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as JSON-ready values (``quire ledger info``, the
    bookie admin API's ``/api/v1/ledger/metadata``)."""
    return {
        "ledger_id": ledger_id,
        "state": md.state.value,
        "ensemble_size": md.ensemble_size,
        "write_quorum_size": md.write_quorum_size,
        "ack_quorum_size": md.ack_quorum_size,
        "ledger_type": md.ledger_type.value,
        "digest_type": md.digest_type.value,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "ensembles": [{"first_entry_id": first, "bookies": list(bookies)}
                      for first, bookies in md.ensembles],
        "custom_metadata": {k: base64.b64encode(v).decode() for k, v in
                            md.custom_metadata.items()},
        "creation_time_ms": md.creation_time_ms,
    }


def serialize_bookie(info: BookieInfo) -> bytes:
    """Encode a registry entry as JSON."""
    return json.dumps({"bookie_id": info.bookie_id, "address": info.address,
                       "state": info.state.value, "metrics_address": info.metrics_address},
                      sort_keys=True).encode()


def deserialize_bookie(data: bytes) -> BookieInfo:
    """Decode :func:`serialize_bookie`'s output; malformed raises MetadataError."""
    doc = _load_object(data, "bookie registration")
    try:
        metrics = doc.get("metrics_address")
        return BookieInfo(bookie_id=_get(doc, "bookie_id", str),
                          address=_get(doc, "address", str),
                          state=BookieState(_get(doc, "state", str)),
                          metrics_address=None if metrics is None else _typed(metrics, str))
    except (ValueError, TypeError) as e:
        raise MetadataError(f"malformed bookie registration: {e}") from e


_REQUIRED: Any = object()


def _load_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise MetadataError(f"{what} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise MetadataError(f"{what} is not a JSON object")
    return doc


def _typed(value: Any, kind: type[T]) -> T:
    # bool is an int subclass; never accept it where a number is expected
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def _get(doc: dict[str, Any], key: str, kind: type[T], default: T = _REQUIRED) -> T:
    if key not in doc:
        if default is _REQUIRED:
            raise ValueError(f"missing field {key!r}")
        return default
    return _typed(doc[key], kind)


def _keys(doc: dict[str, Any], version: int) -> LedgerKeys:
    if version == PASSWORD_FORMAT_VERSION:
        return LedgerKeys.of_password(_unb64(_get(doc, "password", str, "")))
    return LedgerKeys(_unb64(_get(doc, "master_key", str)), _unb64(_get(doc, "mac_key", str)))


def _ensemble(item: Any) -> tuple[int, tuple[str, ...]]:
    first, bookies = _typed(item, list)
    return _typed(first, int), tuple(_typed(b, str) for b in _typed(bookies, list))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"bad base64 {text!r}") from e
