"""Segment names, the one naming rule, and the containers names belong to.

**The naming rule** (:func:`check_name`) is Pravega's (``NameUtils``), one
function for the controller and the segment store alike: a scope or stream
name is 1 to 255 characters of ``A-Z a-z 0-9 . -`` (a reader group's 1 to
250), so ``_`` is left to the system's own names (``_system``, a reader
group's ``<group>_kvtable`` table); a segment name is ``/``-separated parts,
none empty, of those characters plus the system's ``_``, ``#`` and ``$``
(``#epoch.``, ``#transaction.``, ``$attributes``), 1 to 1024 characters.
Anything else raises :class:`~quire.errors.InvalidNameError` where it is
first given.  Every name the rule lets in is storable in tier-2 as it is
given: :func:`quire.tier2.chunk_path` escapes what a file system or an S3
key cannot hold (a part starting with ``.``, a part too long).

A segment's container is a stable hash of its *primary* name, so a
segment, its attribute segment (``<segment>$attributes``), its table index
(``<segment>$index``), its transaction segments
(``<segment>#transaction.<id>``) and its transient segments
(``<segment>#transient.<id>``) all land in one container, in every process
and every run (blake2b, not Python's salted ``hash``).  As in Pravega, a
stream segment's epoch is not part of it (``scope/stream/3.#epoch.7`` is
hashed as ``scope/stream/3``): the segments of one number in every epoch,
the duplicates a rolling transaction creates among them, share the
container of the transaction segments merged into them.
"""

from __future__ import annotations

import hashlib
import re

from quire.errors import InvalidNameError

ATTRIBUTES_SUFFIX = "$attributes"
INDEX_SUFFIX = "$index"
TRANSACTION_DELIMITER = "#transaction."
TRANSIENT_DELIMITER = "#transient."
EPOCH_DELIMITER = ".#epoch."
SYSTEM_SCOPE = "_system"
CONTAINER_COUNT_KEY = "segmentstore/container_count"
"""The metadata record holding the cluster's container count (fixed once set)."""
MAX_NAME_CHARS = 255
"""Pravega's ``MAX_NAME_SIZE``: the longest scope or stream name."""
MAX_READER_GROUP_CHARS = 250
"""Pravega's ``MAX_GIVEN_NAME_SIZE``: the longest reader group name."""
MAX_SEGMENT_NAME_CHARS = 1024
_USER_NAME = re.compile(r"[A-Za-z0-9.\-]+")
_SEGMENT_NAME = re.compile(r"[A-Za-z0-9._\-#$]+(?:/[A-Za-z0-9._\-#$]+)*")
_RULES: dict[str, tuple[re.Pattern[str], int, str]] = {
    "scope": (_USER_NAME, MAX_NAME_CHARS, "A-Z a-z 0-9 . -"),
    "stream": (_USER_NAME, MAX_NAME_CHARS, "A-Z a-z 0-9 . -"),
    "reader group": (_USER_NAME, MAX_READER_GROUP_CHARS, "A-Z a-z 0-9 . -"),
    "segment": (_SEGMENT_NAME, MAX_SEGMENT_NAME_CHARS,
                "'/'-separated non-empty parts of A-Z a-z 0-9 . - _ # $"),
}
NAME_KINDS = tuple(_RULES)


def check_name(kind: str, name: object) -> str:
    """``name`` if it is a valid ``kind`` name (one of :data:`NAME_KINDS`:
    ``scope``, ``stream``, ``reader group``, ``segment``; see the module
    docstring), else :class:`~quire.errors.InvalidNameError` saying why."""
    pattern, longest, characters = _RULES[kind]
    if not isinstance(name, str) or not 0 < len(name) <= longest \
            or pattern.fullmatch(name) is None:
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 \
            else f"{name[:40]!r}... ({len(name)} characters)"
        raise InvalidNameError(f"invalid {kind} name {shown}: 1 to {longest} characters of "
                               f"{characters}")
    return name


def base_segment_name(name: str) -> str:
    """The segment ``name`` belongs with (itself for a plain segment)."""
    for suffix in (ATTRIBUTES_SUFFIX, INDEX_SUFFIX):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    for delimiter in (TRANSACTION_DELIMITER, TRANSIENT_DELIMITER):
        at = name.find(delimiter)
        if at > 0:
            name = name[:at]
    return name


def primary_segment_name(name: str) -> str:
    """``name``'s base name without a stream segment's epoch."""
    base = base_segment_name(name)
    at = base.rfind(EPOCH_DELIMITER)
    return base[:at] if at > 0 else base


def container_of(name: str, container_count: int) -> int:
    """The id (0 .. container_count - 1) of the container holding ``name``."""
    digest = hashlib.blake2b(primary_segment_name(name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % container_count


def container_log_name(container_id: int) -> str:
    """The named log that is container ``container_id``'s tier-1 log."""
    return f"_segmentstore.container-{container_id}"
