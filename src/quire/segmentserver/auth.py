"""Delegation tokens on the wire: which requests carry one, what each needs, how a refusal reads.

With ``auth_enabled`` a segment store checks the token of every request
that names a segment (Pravega's ``delegation_token`` field) before the
request reaches the store:

====================================================  ============================
request                                               needs, on each segment named
====================================================  ============================
ReadSegment, GetStreamSegmentInfo,                    READ
GetSegmentAttribute, ReadTable, ReadTableKeys,
ReadTableEntries, ReadTableEntriesDelta,
ReadAppendTimes, LocateAppendTime (Quire's own)
SetupAppend (once per writer and connection),         READ_UPDATE
UpdateSegmentAttribute, Create*/Delete*/Seal*,
TruncateSegment, MergeSegments (target and source),
UpdateTableEntries, RemoveTableKeys,
UpdateSegmentPolicy, MergeTableSegments
====================================================  ============================

A segment's resource is :func:`quire.security.segment_resource`'s (a
stream's segments are the stream's; a reader group's state table
``<scope>/<G>_kvtable/...`` is the reader group's; ``_system/...`` is
internal, which only the internal identity's token reaches).  Appends after
``SetupAppend`` carry no token and are not checked: a writer is authorized
once per connection, as in Pravega, and its per-append work is unchanged.

Refusals are ``AuthTokenCheckFailed`` (counted by the server like any
refusal reply), with the error code the official client handles
(``../shared/notes/pravega-client-tls-auth.md``):

* ``SetupAppend``: always code 0 (TOKEN_CHECK_FAILED), whatever the cause.
  Code 1 would make a Rust writer resend the same stale token for 120 s;
  with 0 it fails at once.
* any other request: code 1 (TOKEN_EXPIRED) for a genuine token past its
  expiry (the client fetches a new token and retries), code 0 for a token
  that does not verify or does not grant what the request needs.

Verified tokens are remembered (bounded; the expiry is still checked on
every use), so a reader's ReadSegment pays a dictionary lookup and an ACL
match, not an HMAC and a JSON parse.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from quire.errors import PermissionDeniedError, TokenError, TokenExpiredError
from quire.pravega_wire import (
    AuthTokenCheckFailed,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    DeleteSegment,
    DeleteTableSegment,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    LocateAppendTime,
    MergeSegments,
    MergeTableSegments,
    ReadAppendTimes,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SealTableSegment,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
)
from quire.security import Permission, Principal, TokenSigner, segment_resource

TOKEN_CHECK_FAILED = 0
"""AuthTokenCheckFailed's code for a token refused (the client gives up)."""
TOKEN_EXPIRED = 1
"""AuthTokenCheckFailed's code for an expired token (the client fetches a
new one); never sent for SetupAppend."""
MAX_CACHED_TOKENS = 4096

Segments = Callable[[Any], tuple[str, ...]]


def _segment(c: Any) -> tuple[str, ...]:
    return (c.segment,)


def _segment_name(c: Any) -> tuple[str, ...]:
    return (c.segment_name,)


def _merge(c: Any) -> tuple[str, ...]:
    return (c.target, c.source)


_READ, _UPDATE = Permission.READ, Permission.READ_UPDATE
RULES: Mapping[type[WireCommand], tuple[Segments, Permission]] = {
    ReadSegment: (_segment, _READ),
    GetStreamSegmentInfo: (_segment_name, _READ),
    ReadAppendTimes: (_segment, _READ),
    LocateAppendTime: (_segment, _READ),
    GetSegmentAttribute: (_segment_name, _READ),
    ReadTable: (_segment, _READ),
    ReadTableKeys: (_segment, _READ),
    ReadTableEntries: (_segment, _READ),
    ReadTableEntriesDelta: (_segment, _READ),
    SetupAppend: (_segment, _UPDATE),
    UpdateSegmentAttribute: (_segment_name, _UPDATE),
    CreateSegment: (_segment, _UPDATE),
    CreateTableSegment: (_segment, _UPDATE),
    CreateTransientSegment: (_segment, _UPDATE),
    SealSegment: (_segment, _UPDATE),
    SealTableSegment: (_segment, _UPDATE),
    TruncateSegment: (_segment, _UPDATE),
    DeleteSegment: (_segment, _UPDATE),
    DeleteTableSegment: (_segment, _UPDATE),
    MergeSegments: (_merge, _UPDATE),
    MergeTableSegments: (_merge, _UPDATE),
    UpdateSegmentPolicy: (_segment, _UPDATE),
    UpdateTableEntries: (_segment, _UPDATE),
    RemoveTableKeys: (_segment, _UPDATE),
}
"""Every request that names a segment: its segments and the permission needed."""


class WireAuth:
    """Checks the requests of every connection of one server with the
    cluster's token signer; ``clock`` gives Unix seconds (as the signer's)."""

    def __init__(self, signer: TokenSigner, clock: Callable[[], float] = time.time) -> None:
        self._signer = signer
        self._clock = clock
        self._verified: dict[str, tuple[int, Principal]] = {}
        """Token text -> (its expiry, its principal), for tokens that verified."""

    def principal(self, token: str) -> Principal:
        """The principal of a token the signer issued and that has not
        expired (TokenInvalidError, TokenExpiredError otherwise)."""
        known = self._verified.get(token)
        if known is not None:
            if int(self._clock()) < known[0]:
                return known[1]
            del self._verified[token]
        claims = self._signer.verify(token)  # raises for a bad or expired token
        if len(self._verified) >= MAX_CACHED_TOKENS:
            self._verified.clear()  # a flood of distinct tokens: start over
        principal = claims.principal()
        self._verified[token] = (claims.expires_at_s, principal)
        return principal

    def refusal(self, command: Any) -> AuthTokenCheckFailed | None:
        """None if ``command`` (one of :data:`RULES`) may go on, else the
        reply refusing it (module docstring)."""
        segments, needed = RULES[type(command)]
        try:
            principal = self.principal(command.delegation_token)
            for segment in segments(command):
                principal.require(segment_resource(segment), needed)
        except TokenExpiredError as e:
            code = TOKEN_CHECK_FAILED if type(command) is SetupAppend else TOKEN_EXPIRED
            return AuthTokenCheckFailed(command.request_id, str(e), code)
        except (TokenError, PermissionDeniedError) as e:
            return AuthTokenCheckFailed(command.request_id, str(e), TOKEN_CHECK_FAILED)
        return None

    def guard(self, handlers: Mapping[type[WireCommand], Callable[[Any], None]],
              answer: Callable[[WireCommand], None]) -> dict[type[WireCommand],
                                                            Callable[[Any], None]]:
        """``handlers`` with each request of :data:`RULES` checked first:
        a refused one is answered (``answer``) and not handled."""
        guarded = dict(handlers)
        for kind in RULES.keys() & handlers.keys():
            guarded[kind] = self._checked(handlers[kind], answer)
        return guarded

    def _checked(self, handle: Callable[[Any], None], answer: Callable[[WireCommand], None]
                 ) -> Callable[[Any], None]:
        refusal = self.refusal

        def checked(command: Any) -> None:
            refused = refusal(command)
            if refused is None:
                handle(command)
            else:
                answer(refused)
        return checked
