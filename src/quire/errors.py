"""Every error Quire raises, in one tree under :class:`QuireError`.

An error that travels on the wire carries its :class:`StatusCode` in the
class attribute ``status``; :func:`error_for_status` maps a status a bookie
answered back to the error class, so client code can ``raise
error_for_status(code)(...)`` and callers catch precise types.

Three families matter for correctness (BP-46, "A note on Response Codes"):

* positive: ``OK``;
* explicit negative: ``NO_SUCH_LEDGER`` and ``NO_SUCH_ENTRY`` (see
  :attr:`StatusCode.is_explicit_negative`);
* unknown: everything else, ``UNKNOWN`` (BP-46's EUNKNOWN) included.  An
  unknown answer is never counted as a "no" in any quorum rule.

This module imports nothing from the rest of Quire: every layer may use it.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class StatusCode(enum.IntEnum):
    """Wire status codes (an int32 in every response)."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    BAD_REQUEST = 100
    IO_ERROR = 101
    UNAUTHORIZED = 102
    BAD_VERSION = 103
    FENCED = 104
    READ_ONLY = 105
    TOO_MANY_REQUESTS = 106
    UNKNOWN = 107
    UNSUPPORTED = 108

    @property
    def is_explicit_negative(self) -> bool:
        """True only for the answers that mean "I definitely do not have it"."""
        return self in (StatusCode.NO_SUCH_LEDGER, StatusCode.NO_SUCH_ENTRY)


class QuireError(Exception):
    """Root of every error Quire raises on purpose."""

    status: ClassVar[StatusCode | None] = None


# --- configuration --------------------------------------------------------


class ConfigError(QuireError):
    """A configuration file or flag is missing, malformed or out of range."""


# --- security (quire.security, quire.auth, quire.http) ----------------------


class InsecureSecretFileError(ConfigError):
    """A secret file (token secret, password, credentials, private key) that
    its group or others may read or write: the server refuses to start."""


class TlsConfigError(ConfigError):
    """TLS settings that do not work: a certificate or key file missing,
    unreadable, not PEM, or a key that does not match its certificate."""


class SecurityError(QuireError):
    """Root of the refusals of authentication and authorization."""


class MalformedAclError(SecurityError):
    """An ACL text (``prn::/scope:S,READ;...``) that does not parse; ``part``
    is the entry or piece at fault."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part


class AuthenticationError(SecurityError):
    """No credentials, or credentials that are not accepted: an unknown user
    and a wrong password give the same message (HTTP 401)."""


class TokenError(AuthenticationError):
    """A delegation token that is refused."""


class TokenInvalidError(TokenError):
    """A token that is not Quire's: malformed, or its signature does not
    verify (the wire's AuthTokenCheckFailed code 0, TOKEN_CHECK_FAILED)."""


class TokenExpiredError(TokenError):
    """A genuine token past its expiry (the wire's code 1, TOKEN_EXPIRED:
    the client asks for a new one)."""


class PermissionDeniedError(SecurityError):
    """An authenticated principal without the permission the request needs
    (HTTP 403, gRPC PERMISSION_DENIED)."""


class RoleNotAllowedError(PermissionDeniedError):
    """A peer certificate without a role, or with one outside the allowed set."""


class TlsHandshakeError(SecurityError):
    """A client's TLS handshake with a server failed: the server's
    certificate is not trusted (another CA, a name it does not cover) or
    the server does not speak TLS.  Not retried: trying again cannot help."""


class UserExistsError(SecurityError):
    """``quire auth user add`` of a name the user database holds already."""


class UserNotFoundError(SecurityError):
    """A user-database operation on a name it does not hold."""


# --- wire protocol --------------------------------------------------------


class ProtocolError(QuireError):
    """Bytes that are not a valid frame: truncated, oversized, lying lengths,
    an unknown version, or a body that does not parse.  The connection that
    produced them must be closed; nothing else is affected."""


class WireCommandError(ProtocolError):
    """Bytes that are not a valid Pravega WireCommand (``quire.pravega_wire``):
    an unknown type code, a length out of range, a payload that does not
    parse or has bytes left over.  The connection that sent them is closed."""


# --- answers a bookie can give (each with its wire status) ----------------


class BookieError(QuireError):
    """A bookie answered with a non-OK status."""


class NoSuchLedgerError(BookieError):
    """Explicit negative: the bookie has never seen this ledger."""

    status = StatusCode.NO_SUCH_LEDGER


class NoSuchEntryError(BookieError):
    """Explicit negative: the bookie knows the ledger but not the entry."""

    status = StatusCode.NO_SUCH_ENTRY


class BadRequestError(BookieError):
    status = StatusCode.BAD_REQUEST


class BookieIOError(BookieError):
    status = StatusCode.IO_ERROR


class UnauthorizedError(BookieError):
    """Wrong password / master key."""

    status = StatusCode.UNAUTHORIZED


class BadVersionError(BookieError):
    status = StatusCode.BAD_VERSION


class LedgerFencedError(BookieError):
    """The ledger was fenced (or closed by recovery): this writer is out."""

    status = StatusCode.FENCED


class ReadOnlyError(BookieError):
    status = StatusCode.READ_ONLY


class TooManyRequestsError(BookieError):
    status = StatusCode.TOO_MANY_REQUESTS


class UnknownStateError(BookieError):
    """BP-46 EUNKNOWN: the bookie cannot say (e.g. a limbo ledger).  Never a no."""

    status = StatusCode.UNKNOWN


class UnsupportedError(BookieError):
    """The bookie does not implement (or has disabled) this operation."""

    status = StatusCode.UNSUPPORTED


class UnexpectedResponseError(BookieError):
    """A bookie's answer that does not fit the request: another op's response,
    or a bare error saying OK.  It carries no status of its own and is an
    unknown, never a no."""


_BY_STATUS: dict[StatusCode, type[BookieError]] = {
    cls.status: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        BadRequestError,
        BookieIOError,
        UnauthorizedError,
        BadVersionError,
        LedgerFencedError,
        ReadOnlyError,
        TooManyRequestsError,
        UnknownStateError,
        UnsupportedError,
    )
    if cls.status is not None
}


EXPLICIT_NEGATIVES: tuple[type[BookieError], ...] = (NoSuchLedgerError, NoSuchEntryError)
"""The errors of the explicit negatives (:attr:`StatusCode.is_explicit_negative`),
for ``isinstance``: the only answers that may count as a "no"."""


def error_for_status(status: int) -> type[BookieError]:
    """The error class for a non-OK wire status (unknown codes map to
    :class:`UnknownStateError`, never to a negative)."""
    try:
        return _BY_STATUS[StatusCode(status)]
    except (ValueError, KeyError):
        return UnknownStateError


# --- metadata store -------------------------------------------------------


class MetadataError(QuireError):
    """The metadata store failed or was unreachable (state unknown)."""


class MetadataVersionError(MetadataError):
    """A compare-and-set lost: the stored version is not the expected one."""


class MetadataExistsError(MetadataError):
    """A create found the key (ledger, cookie or record) already there."""


class MetadataNotFoundError(MetadataError):
    """A direct read found that the key does not exist (a definite answer)."""


class NoMetadataError(MetadataError):
    """A store opened only to read (``open_store(..., create=False)``) names
    nothing: no SQLite file, or a ZooKeeper chroot without Quire's layout.
    Reading never creates a store, so a mistyped URI is not taken for an
    empty cluster."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"no Quire metadata at {uri}")
        self.uri = uri


class MetadataAccessDeniedError(MetadataError):
    """The metadata store refused this process a definite no: ZooKeeper
    answered NoAuth, because Quire's znodes carry digest ACLs and this
    process has no credentials for them, or other ones.  The message names
    the fix (``zookeeper_digest_file``)."""


class TransactionError(MetadataError):
    """A transaction failed as a whole; ``failed_index`` names the op that
    caused it (when the driver can tell) and ``cause`` the reason."""

    def __init__(self, message: str, failed_index: int | None = None,
                 cause: MetadataError | None = None) -> None:
        super().__init__(message)
        self.failed_index = failed_index
        self.cause = cause


# --- bookie process -------------------------------------------------------


class CookieMismatchError(QuireError):
    """A bookie's cookies disagree (a directory was emptied or swapped)."""


class CookieMissingError(CookieMismatchError):
    """BP-46 cookie failure: directories lack the cookie the metadata store
    holds for this bookie (emptied or replaced disks), and nothing was set
    to repair them (``data_integrity_stamp_missing_cookies``, ``quire
    cookie fix``)."""


class StorageError(QuireError):
    """The bookie's local storage failed or found corruption."""


class HttpRequestError(QuireError):
    """An HTTP request refused by a route of :mod:`quire.http` (a bad body,
    an unknown resource, a state that does not allow it): answered with
    ``http_status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.http_status = status


class AdminRequestError(QuireError):
    """An admin request to a bookie (``quire.bookie.admin``) could not be
    sent, or the bookie answered that it failed."""


# --- ledger client --------------------------------------------------------


class ClientError(QuireError):
    """Errors raised by the ledger client itself."""


class NotEnoughBookiesError(ClientError):
    """Fewer writable bookies than the ensemble needs."""


class LedgerClosedError(ClientError):
    """Append to a ledger that is closed."""


class DigestMismatchError(ClientError):
    """Every replica returned an entry whose digest does not verify."""


class ReadBeyondLastAddConfirmedError(ClientError):
    """A read asked for entries past the LastAddConfirmed."""


class EntryNotAvailableError(ClientError):
    """No replica could serve the entry, and not enough said a definite no
    to call it missing: the state is unknown (retry later)."""


class LedgerRecoveryError(ClientError):
    """Recovery could not decide the ledger's end (unknown answers); retry."""


class ClientTimeoutError(ClientError):
    """A request got no answer within its timeout (an unknown, never a no)."""


class LedgerNotSyncedError(ClientError):
    """BP-14: a VD ledger's acknowledged entries could not all be made
    persistent on an ack quorum (sync reached too few bookies).  A close that
    raises this leaves the ledger OPEN: recovery keeps every entry."""


class QueueFullError(ClientError):
    """The client's queue of adds waiting to be sent is over ``max_queued_bytes``."""


class BookieUnavailableError(ClientError):
    """The connection to a bookie failed or was closed."""


class EnsembleChangeRefusedError(ClientError):
    """A bookie of the ledger failed and the ledger may not replace it
    (ensemble changes are disabled for VD_JOURNAL ledgers, BP-14)."""


class ClientClosedError(ClientError):
    """The client (or the handle) was closed while the operation was pending."""


# --- segment store (quire.segmentstore) -------------------------------------


class SegmentStoreError(QuireError):
    """A segment store operation was refused; nothing of it was applied."""


class SegmentNotFoundError(SegmentStoreError):
    """No such segment (never created, or deleted)."""


class SegmentExistsError(SegmentStoreError):
    """A segment of that name exists already."""


class SegmentSealedError(SegmentStoreError):
    """The segment is sealed: it takes no more appends or attribute changes."""


class SegmentTruncatedError(SegmentStoreError):
    """A read below the segment's start offset (``start_offset`` says where it begins)."""

    def __init__(self, message: str, start_offset: int) -> None:
        super().__init__(message)
        self.start_offset = start_offset


class BadOffsetError(SegmentStoreError):
    """A conditional append whose expected offset is not the segment's length
    (``expected_offset``, ``actual_offset``), or an offset out of range."""

    def __init__(self, message: str, expected_offset: int, actual_offset: int) -> None:
        super().__init__(message)
        self.expected_offset = expected_offset
        self.actual_offset = actual_offset


class BadAttributeUpdateError(SegmentStoreError):
    """An attribute update whose condition failed, or a key or value out of range."""


class TableKeyBadVersionError(SegmentStoreError):
    """A table update or removal whose expected version did not hold."""


class TableKeyNotFoundError(SegmentStoreError):
    """A conditional table update or removal of a key that does not exist."""


class ContainerFencedError(SegmentStoreError):
    """Another owner took the container's tier-1 log: this instance may do nothing more."""


class ContainerNotOwnedError(SegmentStoreError):
    """This segment store does not host (or has not finished starting) the
    segment's container; the Pravega server answers WrongHost."""


class ContainerClosedError(SegmentStoreError):
    """The container was stopped or failed; an operation pending then has an
    unknown outcome (a reopen shows whether it is in the log)."""


class CorruptRecordError(SegmentStoreError):
    """Bytes the segment store wrote and reads back that do not decode, or an
    operation that does not fit the state it is applied to: a tier-1 frame,
    an operation, a container checkpoint, a table entry, a tier-2 attribute
    or index batch, a layout record or a journal snapshot.  Unlike the other
    segment store errors it refuses no request: the record is corrupt (or a
    defect wrote it), and the message says which and where."""


class SegmentQuarantinedError(SegmentSealedError):
    """The segment was quarantined: tier-2 refused it for good, so its storage
    writer sealed it (keeping every byte acknowledged) and it takes no more
    appends.  ``quire segmentstore status`` names it and the cause."""


class RecoveryError(SegmentStoreError):
    """Disaster recovery refused or could not finish: tier-1 logs that exist
    already, a container count nobody records, tier-2 records that do not
    fit together.  What was done before it is said in the message."""


# --- controller (quire.controller) ------------------------------------------
# Each family answers one gRPC status (quire.controller.service), never UNKNOWN.


class ControllerError(QuireError):
    """A controller request was refused."""


class ControllerInvalidArgumentError(ControllerError):
    """A malformed request: a bad name, key range, lease, stream cut or an
    auto-scaling policy (gRPC INVALID_ARGUMENT)."""


class InvalidNameError(SegmentStoreError, ControllerInvalidArgumentError):
    """A scope, stream, reader group or segment name outside Quire's naming
    rule (Pravega's, :func:`quire.segmentstore.names.check_name`): refused
    where it is first given, by the controller (gRPC INVALID_ARGUMENT) and by
    the segment store (the wire's ErrorMessage with code
    ILLEGAL_ARGUMENT_EXCEPTION); nothing of the request was applied."""


class ControllerNotFoundError(ControllerError):
    """The scope, stream, segment, epoch or transaction named does not exist
    (gRPC NOT_FOUND)."""


class ScopeNotFoundError(ControllerNotFoundError):
    """No such scope."""


class StreamNotFoundError(ControllerNotFoundError):
    """No such stream (or it is still being created)."""


class TransactionNotFoundError(ControllerNotFoundError):
    """No such transaction on the stream."""


class ControllerPreconditionError(ControllerError):
    """The request does not fit the state it finds: a sealed stream, a
    transaction already aborted or committed (gRPC FAILED_PRECONDITION)."""


class ControllerConcurrentUpdateError(ControllerError):
    """A controller record changed under this controller between its read and
    its conditional update (another controller wrote it); retrying reads it
    afresh (gRPC ABORTED)."""


# --- tier-2 chunk storage (quire.tier2) --------------------------------------


class Tier2Error(QuireError):
    """A tier-2 (long-term storage) operation failed: an I/O error, an
    unreachable or refusing server.  The chunk's state is unknown unless a
    more precise subclass says otherwise."""


class ChunkNotFoundError(Tier2Error):
    """No chunk of that name: never written, deleted, or vanished (a later
    truncate or delete removed it; a layout reader turns this into
    truncation, never into wrong bytes)."""


class ChunkExistsError(Tier2Error):
    """A chunk of that name exists already: chunks are created exclusively,
    so nothing was written."""


class ChunkRangeError(Tier2Error):
    """A read that starts past the end of its chunk (``offset``,
    ``chunk_length``)."""

    def __init__(self, message: str, offset: int, chunk_length: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.chunk_length = chunk_length


class Tier2RefusedError(Tier2Error):
    """Tier-2 refused a request definitely: the same request would be refused
    the same way again (a name or size outside the contract, an S3 access
    denial or invalid key, a file system's EACCES, ENAMETOOLONG...).  Nothing
    was written.  The storage writer quarantines a segment tier-2 keeps
    refusing while it accepts the others' chunks."""


class ChunkTooLargeError(Tier2RefusedError):
    """A chunk over ``max_chunk_bytes`` was refused; nothing was written."""


class InvalidChunkNameError(Tier2RefusedError):
    """A chunk name outside the contract of :class:`quire.tier2.ChunkStorage`."""


class InvalidLayoutError(Tier2Error):
    """A segment layout that does not decode, breaks its invariants, or does
    not match its chunks (a chunk holding fewer bytes than recorded)."""


# --- stream client (quire.streams) ------------------------------------------


class SegmentStoreConnectionError(ContainerClosedError):
    """The connection to a segment's segment store broke, or could not be
    made before a deadline.  A request that was on it has an unknown
    outcome, as under a closed container (so it is never a "no")."""


class ControllerUnavailableError(ControllerError):
    """The controller could not be reached, or answered UNAVAILABLE,
    DEADLINE_EXCEEDED or another status that is not a definite answer:
    the request's outcome is unknown."""


class StreamSealedError(ControllerError):
    """A write to a stream whose segments are all sealed (no successors)."""


# --- helpers ------------------------------------------------------------------


def fresh_copy(error: BaseException) -> BaseException:
    """A new instance of ``error`` to raise, with its cause (one exception
    object raised in many places would pile up tracebacks); ``error`` itself
    if its class cannot be built again from its ``args``."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error.__cause__
    return copy
