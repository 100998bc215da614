"""Pravega's resource names (``prn::/scope:S/stream:T``) and what each segment is guarded by.

A resource is what a permission is granted on:

======================================  =====================================
``prn::/``                              the cluster (HTTP endpoints, listing
                                        and creating scopes)
``prn::/scope:S``                       scope S (creating, listing, deleting
                                        its streams, reader groups, tables)
``prn::/scope:S/stream:T``              stream T of scope S
``prn::/scope:S/reader-group:G``        reader group G of scope S
``prn::/scope:S/key-value-table:K``     key-value table K of scope S
======================================  =====================================

An ACL entry's resource is a *pattern*: ``*`` matches any text, ``/``
included, as in Pravega: ``prn::*`` is everything, ``prn::/scope:S/*``
everything inside scope S but not S itself, ``prn::/scope:*`` every scope
and (since ``*`` crosses ``/``) everything inside them, ``prn::/`` only
the cluster.  :func:`check_resource_pattern` accepts only the
shapes above (with ``*`` anywhere in a name, or for a whole part), so a
typo such as ``prn::/scop:S`` is refused instead of silently matching
nothing.

Segments map to resources by their first two path parts (``scope/name/...``,
as :func:`segment_resource` does), whatever follows: a stream's segments
``S/T/<n>.#epoch.<e>``, their transaction and transient segments
(``...#transaction.<id>``), attribute and index segments (``...$attributes``)
are stream T's.  Reader-group state is the reader group's, as Pravega
checks it (``StreamAuthParams``, ``AuthorizationResourceImpl``): the Rust
client keeps it in the table segment ``S/<G>_kvtable/0.#epoch.0`` (and asks
``getDelegationToken`` for the stream ``<G>_kvtable``), the Java client in
the stream ``S/_RG<G>``; a Java writer's watermark stream ``S/_MARK<T>`` is
stream T's, and so is ``S/_SPARK<T>``, the table where Spark writes to T
record their commits (:mod:`quire.spark.stream_commits`: who may write T
may record a write to it).  (Pravega names a key-value table's segments ``S/<K>_kvtable/...``
as well; Quire serves no key-value tables, so that name is the reader
group's.)

Internal resources: a scope whose name starts with ``_`` (``_system``, where
the controller and the segment stores keep their tables) is internal, and
so is a segment name without a scope and a name (no ``/``).  No ACL grants
an internal resource, whatever its patterns: only the internal identity
(:mod:`quire.security.tokens`) reaches one (see
:meth:`quire.security.principal.Principal.permission`).  Users cannot make
a scope whose name starts with ``_`` (the controller's name rule).
"""

from __future__ import annotations

from quire.errors import MalformedAclError

PREFIX = "prn::"
CLUSTER_RESOURCE = "prn::/"
"""The cluster: the HTTP endpoints, and scope creation and listing."""
SCOPE_TAG = "scope"
STREAM_TAG = "stream"
READER_GROUP_TAG = "reader-group"
KEY_VALUE_TABLE_TAG = "key-value-table"
_INNER_TAGS = (STREAM_TAG, READER_GROUP_TAG, KEY_VALUE_TABLE_TAG)
INTERNAL_SCOPE = "_system"
INTERNAL_RESOURCE = f"{PREFIX}/{SCOPE_TAG}:{INTERNAL_SCOPE}"
"""What every ``_system`` segment (and every segment name that is not
``scope/name/...``) is guarded by."""
READER_GROUP_TABLE_SUFFIX = "_kvtable"
"""The Rust client's reader-group state table: stream ``<group>_kvtable``."""
READER_GROUP_STREAM_PREFIX = "_RG"
"""The Java client's reader-group state stream: ``_RG<group>``."""
MARK_STREAM_PREFIX = "_MARK"
"""The Java client's watermark stream of stream T: ``_MARK<T>``."""
SPARK_WRITES_STREAM_PREFIX = "_SPARK"
"""The table of Spark's writes to stream T: stream ``_SPARK<T>``."""
_FORBIDDEN_IN_NAMES = frozenset("/,; \t\r\n")


def _name(kind: str, name: str) -> str:
    if not name:
        raise ValueError(f"a {kind} name may not be empty")
    return name


def scope_resource(scope: str) -> str:
    """``prn::/scope:<scope>``"""
    return f"{PREFIX}/{SCOPE_TAG}:{_name('scope', scope)}"


def stream_resource(scope: str, stream: str) -> str:
    """``prn::/scope:<scope>/stream:<stream>``"""
    return f"{scope_resource(scope)}/{STREAM_TAG}:{_name('stream', stream)}"


def reader_group_resource(scope: str, group: str) -> str:
    """``prn::/scope:<scope>/reader-group:<group>``"""
    return f"{scope_resource(scope)}/{READER_GROUP_TAG}:{_name('reader group', group)}"


def key_value_table_resource(scope: str, table: str) -> str:
    """``prn::/scope:<scope>/key-value-table:<table>``"""
    return f"{scope_resource(scope)}/{KEY_VALUE_TABLE_TAG}:{_name('key-value table', table)}"


def stream_info_resource(scope: str, stream: str) -> str:
    """The resource guarding what a client names as stream ``stream`` of
    ``scope`` (a ``StreamInfo`` of ``getDelegationToken``): a reader
    group's state (``<G>_kvtable``, ``_RG<G>``) is the reader group's, a
    watermark stream (``_MARK<T>``) and Spark's commit table of T
    (``_SPARK<T>``) stream T's, a ``_`` scope internal
    (see the module docstring)."""
    if not scope or scope.startswith("_") or not stream:
        return INTERNAL_RESOURCE
    if stream.startswith(SPARK_WRITES_STREAM_PREFIX) and len(stream) > len(
            SPARK_WRITES_STREAM_PREFIX):
        return stream_resource(scope, stream[len(SPARK_WRITES_STREAM_PREFIX):])
    if stream.endswith(READER_GROUP_TABLE_SUFFIX) and len(stream) > len(
            READER_GROUP_TABLE_SUFFIX):
        return reader_group_resource(scope, stream[:-len(READER_GROUP_TABLE_SUFFIX)])
    for prefix, build in ((READER_GROUP_STREAM_PREFIX, reader_group_resource),
                          (MARK_STREAM_PREFIX, stream_resource)):
        if stream.startswith(prefix) and len(stream) > len(prefix):
            return build(scope, stream[len(prefix):])
    return stream_resource(scope, stream)


def segment_resource(segment: str) -> str:
    """The resource guarding segment ``segment`` (by its first two path
    parts, see the module docstring); :data:`INTERNAL_RESOURCE` for
    ``_system/...`` and for a name that is not ``scope/name[/...]``."""
    scope, sep, rest = segment.partition("/")
    if not sep:
        return INTERNAL_RESOURCE
    return stream_info_resource(scope, rest.partition("/")[0])


def is_internal_resource(resource: str) -> bool:
    """True for a resource only the internal identity reaches (a scope
    whose name starts with ``_``, and everything inside one)."""
    return resource.startswith(f"{PREFIX}/{SCOPE_TAG}:_")


def check_resource_pattern(pattern: str) -> None:
    """Refuse (MalformedAclError naming the bad part) a resource pattern not
    of the shapes in the module docstring."""
    def bad(why: str, part: str) -> MalformedAclError:
        where = f" at {part!r}" if part != pattern else ""
        return MalformedAclError(f"bad resource {pattern!r}{where}: {why}", part)

    if not pattern.startswith(PREFIX):
        raise bad(f"a resource starts with {PREFIX!r}", pattern)
    rest = pattern[len(PREFIX):]
    if rest == "*":
        return
    if not rest.startswith("/"):
        raise bad(f"after {PREFIX!r} comes '/' or '*'", rest or pattern)
    path = rest[1:]
    if path in ("", "*"):
        return
    parts = path.split("/")
    if len(parts) > 2:
        raise bad("at most a scope and one thing inside it", path)
    for index, part in enumerate(parts):
        if part == "*":
            continue
        tag, colon, name = part.partition(":")
        allowed = (SCOPE_TAG,) if index == 0 else _INNER_TAGS
        if not colon or tag not in allowed:
            raise bad(f"expected {' or '.join(repr(t + ':NAME') for t in allowed)}", part)
        if not name or _FORBIDDEN_IN_NAMES.intersection(name):
            raise bad("a name is not empty and has no '/', ',', ';' or spaces", part)
