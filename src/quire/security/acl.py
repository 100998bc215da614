"""Access control lists in Pravega's syntax: ``prn::/scope:S,READ;prn::/scope:S/*,READ``.

An ACL is an ordered list of entries ``<resource pattern>,<permission>``
separated by ``;`` (a trailing ``;`` and spaces around the parts are
allowed; the empty text is the empty ACL, which grants nothing).
Permissions are ``NONE`` < ``READ`` < ``READ_UPDATE``; resource patterns
are those of :mod:`quire.security.resources`.

Semantics, Pravega's (``AclAuthorizerImpl`` of its password-file handler):
the **first** entry whose pattern matches the resource decides the
permission; no match is ``NONE``.  So order matters: put narrower entries
before wildcards (``prn::/scope:S/stream:T,READ;prn::/scope:S/*,READ_UPDATE``
gives READ on T and READ_UPDATE on the rest of S).  A grant on a scope is
not a grant on what is inside it (``prn::/scope:S`` is the scope itself;
``prn::/scope:S/*`` is what it holds).

Where Quire differs from Pravega, on purpose: a malformed entry is refused
with :class:`~quire.errors.MalformedAclError` naming it (Pravega drops it
silently, so a typo quietly grants less or, with a wildcard, more), and
only ``*`` is special in a pattern (Pravega turns the pattern into a Java
regular expression, so a ``.`` in a name matches any character).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quire.errors import MalformedAclError
from quire.security.resources import check_resource_pattern


class Permission(enum.IntEnum):
    """Pravega's permissions, in increasing order (a higher one includes the lower)."""

    NONE = 0
    READ = 1
    READ_UPDATE = 2

    @classmethod
    def parse(cls, text: str) -> Permission:
        """``READ`` etc. (exact, upper case); MalformedAclError otherwise."""
        try:
            return cls[text]
        except KeyError:
            raise MalformedAclError(
                f"bad permission {text!r}: expected NONE, READ or READ_UPDATE", text) from None


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(piece) for piece in pattern.split("*")), re.DOTALL)


@dataclass(frozen=True)
class AclEntry:
    """One ``<resource pattern>,<permission>`` (the pattern checked)."""

    resource: str
    permission: Permission
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_resource_pattern(self.resource)
        object.__setattr__(self, "_regex", _pattern_regex(self.resource))

    def matches(self, resource: str) -> bool:
        """True if this entry's pattern matches all of ``resource``."""
        return self._regex.fullmatch(resource) is not None

    def __str__(self) -> str:
        return f"{self.resource},{self.permission.name}"


@dataclass(frozen=True)
class Acl:
    """An ordered ACL; the first matching entry decides (module docstring)."""

    entries: tuple[AclEntry, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Acl:
        """The ACL of its text form; MalformedAclError naming the bad entry."""
        entries = []
        for raw in text.split(";"):
            piece = raw.strip()
            if not piece:
                continue
            resource, comma, permission = piece.partition(",")
            if not comma or "," in permission:
                raise MalformedAclError(
                    f"bad ACL entry {piece!r}: expected RESOURCE,PERMISSION "
                    "(e.g. prn::/scope:S,READ)", piece)
            entries.append(AclEntry(resource.strip(), Permission.parse(permission.strip())))
        return cls(tuple(entries))

    @classmethod
    def of(cls, grants: Mapping[str, Permission] | Iterable[tuple[str, Permission]]) -> Acl:
        """An ACL of ``(pattern, permission)`` pairs, in their order."""
        pairs = grants.items() if isinstance(grants, Mapping) else grants
        return cls(tuple(AclEntry(resource, permission) for resource, permission in pairs))

    def permission(self, resource: str) -> Permission:
        """The permission the first matching entry gives ``resource`` (NONE
        if none matches).  Pure pattern matching: the rule that no ACL
        reaches an internal resource is the principal's
        (:meth:`quire.security.principal.Principal.permission`)."""
        for entry in self.entries:
            if entry.matches(resource):
                return entry.permission
        return Permission.NONE

    def allows(self, resource: str, needed: Permission) -> bool:
        return self.permission(resource) >= needed

    def __str__(self) -> str:
        """The text form :meth:`parse` reads back."""
        return ";".join(map(str, self.entries))


def parse_acl(text: str) -> Acl:
    """:meth:`Acl.parse`."""
    return Acl.parse(text)


def format_acl(acl: Acl) -> str:
    """The text form of ``acl`` (``str(acl)``)."""
    return str(acl)
