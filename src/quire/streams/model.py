"""Streams as the client sees them: segment ids and names, key ranges,
routing-key hashing and the event framing (sans-IO, no controller calls).

Segment id = ``(epoch << 32) | number``; its name is
``scope/stream/<number>.#epoch.<epoch>`` (Pravega's naming, which the
controller and the Pravega client share).

Events inside a segment are framed as Pravega's writer frames them::

    | i32 type = 0 | i32 length | payload (length bytes) |      big-endian

so a segment written by the Pravega client reads here and the other way
round.  A routing key is hashed to a point of [0, 1) (blake2b, stable
across processes); the event goes to the segment whose key range
``[min_key, max_key)`` holds that point.  Events without a routing key go
to a random segment.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from quire.errors import ProtocolError
from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE

_SEGMENT_NAME = re.compile(r"^(?P<scope>[^/]+)/(?P<stream>[^/]+)/(?P<number>\d+)\.#epoch\."
                           r"(?P<epoch>\d+)(?:#.*)?$")


def segment_id(epoch: int, number: int) -> int:
    return (epoch << 32) | number


def segment_name(scope: str, stream: str, sid: int) -> str:
    return f"{scope}/{stream}/{sid & 0xFFFF_FFFF}.#epoch.{sid >> 32}"


def parse_segment_name(name: str) -> tuple[str, str, int] | None:
    """``(scope, stream, segment id)`` of a stream segment's name (its
    transaction segments' too); None for other names (tables, ``_system``)."""
    m = _SEGMENT_NAME.match(name)
    if m is None:
        return None
    return m["scope"], m["stream"], segment_id(int(m["epoch"]), int(m["number"]))


@dataclass(frozen=True, slots=True)
class Segment:
    """A stream segment and the routing keys it holds, ``[min_key, max_key)``."""

    scope: str
    stream: str
    id: int
    min_key: float
    max_key: float

    @property
    def name(self) -> str:
        return segment_name(self.scope, self.stream, self.id)

    @property
    def epoch(self) -> int:
        return self.id >> 32

    @property
    def number(self) -> int:
        return self.id & 0xFFFF_FFFF


@functools.lru_cache(maxsize=65536)  # writers repeat their keys: hash each once
def key_hash(routing_key: str) -> float:
    """The routing key's point in [0, 1), the same in every process."""
    digest = hashlib.blake2b(routing_key.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def segment_for(segments: Sequence[Segment], point: float) -> Segment:
    """The segment whose key range holds ``point`` (the last one for 1.0)."""
    for segment in segments:
        if segment.min_key <= point < segment.max_key:
            return segment
    if segments and point >= segments[-1].max_key:
        return max(segments, key=lambda s: s.max_key)
    raise ValueError(f"no segment holds key point {point} (ranges do not cover [0, 1))")


def frame_event(payload: bytes) -> bytes:
    """One event as it is stored in a segment."""
    return EVENT_HEADER.pack(EVENT_TYPE, len(payload)) + payload


class EventParser:
    """Events out of a segment's bytes as they are read, whatever the read
    boundaries; :meth:`feed` the bytes read at :attr:`offset` onwards.

    ``offset`` is the segment offset of the next byte expected; each event
    comes out with the offset of its header."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._buf = bytearray()
        self._buf_offset = offset

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        self._buf += data
        self.offset += len(data)
        pos = 0
        buf = self._buf
        while len(buf) - pos >= EVENT_HEADER.size:
            kind, length = EVENT_HEADER.unpack_from(buf, pos)
            if kind != EVENT_TYPE or length < 0:
                raise ProtocolError(f"no event header at segment offset {self._buf_offset + pos} "
                                    f"(type {kind}, length {length})")
            end = pos + EVENT_HEADER.size + length
            if len(buf) < end:
                break
            yield self._buf_offset + pos, bytes(buf[pos + EVENT_HEADER.size:end])
            pos = end
        del buf[:pos]
        self._buf_offset += pos

    @property
    def partial_bytes(self) -> int:
        """Bytes of an event whose end has not been read yet."""
        return len(self._buf)
