"""Simulated tier-2: a :class:`~quire.tier2.ChunkStorage` twin on a node of the network.

:class:`SimTier2` is the storage service (node :data:`TIER2`): the chunks
it holds durably, and the faults it can have.  Each segment store process
talks to it through a :class:`SimChunkStorage` (its driver), every call an
exchange over the simulated network
(:meth:`~quire.simulation.network.SimNetwork.exchange`), so a call can be
slow, refused, cut off by a partition, or die with the caller, and the
contract of :class:`~quire.tier2.ChunkStorage` holds exactly:

* a chunk is created whole in one step on the service's side (never seen
  partly written); an exclusive create of a chunk that exists with other
  bytes is ChunkExistsError, with the same bytes a no-op;
* a call whose answer is lost (the caller crashed mid-write, a partition,
  a reset) or that the service fails after doing it raises
  :class:`~quire.errors.Tier2Error` with its outcome unknown: the chunk
  may or may not exist (a write torn by a crash is never visible: a torn
  write is one that did not happen);
* every call takes the service ``latency_ms`` (an object store's, a few
  to tens of milliseconds) besides the network's delays; while the service
  is *unavailable* every call fails (Tier2Error); a *slow* service takes up
  to ``slow_ms`` longer per call;
* a delete is not durable on return: for ``delete_durable_s`` it can come
  back when the service loses power (:meth:`SimTier2.power_loss`: calls in
  flight are lost, the deleted chunks of that window return as orphans).

Every change is recorded (:attr:`SimTier2.changes`: the chunk, the node
and the time), for the invariants; :meth:`SimTier2.snapshot` is what a
reader sees at one instant, as a storage of its own, so that ``quire tier2
check`` (:func:`~quire.segmentstore.tier2_check.check`) can run on it at
any simulated moment.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from quire.errors import ChunkExistsError, ChunkNotFoundError, ChunkRangeError, Tier2Error
from quire.simulation.network import AnswerLost, SimNetwork, Unreachable, current_node
from quire.simulation.trace import Trace
from quire.tier2 import ChunkInfo
from quire.tier2.chunk_storage import (
    ChunkData,
    check_chunk_name,
    check_chunk_size,
    check_read_arguments,
)

T = TypeVar("T")
TIER2 = "t2"
"""The node tier-2 runs on."""


@dataclass
class Tier2Faults:
    """How the service misbehaves now (the nemesis changes these)."""

    slow_ms: float = 0.0
    """Each call takes up to this much longer."""
    error_probability: float = 0.0
    """Chance that a call fails after it was done (a write's outcome unknown)."""
    unavailable: bool = False
    """Every call fails."""


@dataclass(frozen=True)
class Change:
    """One change tier-2 made: a chunk written or deleted, by whom, when."""

    kind: str
    """``"write"`` or ``"delete"``."""
    chunk: str
    node: str
    at_s: float


class SimTier2:
    """The tier-2 service (module docstring)."""

    def __init__(self, network: SimNetwork, rng: random.Random, trace: Trace, *,
                 max_chunk_bytes: int, delete_durable_s: float = 2.0,
                 latency_ms: tuple[float, float] = (2.0, 20.0)) -> None:
        self._network = network
        self._rng = rng
        self._trace = trace
        self.max_chunk_bytes = max_chunk_bytes
        self.delete_durable_s = delete_durable_s
        self.latency_ms = latency_ms
        self.chunks: dict[str, bytes] = {}
        """What the service holds durably: what every reader sees."""
        self._deleted: dict[str, tuple[float, bytes]] = {}
        """Chunks deleted in the last ``delete_durable_s``: (when, bytes)."""
        self.faults = Tier2Faults()
        self.changes: list[Change] = []
        self.power_losses = 0

    def storage(self) -> SimChunkStorage:
        """A driver for the running node."""
        return SimChunkStorage(self)

    async def call(self, what: str, do: Callable[[], T]) -> T:
        """Run ``do`` on the service for the running node (module docstring)."""
        network, rng = self._network, self._rng

        async def serve() -> T:
            faults = self.faults
            await asyncio.sleep((rng.uniform(*self.latency_ms)
                                 + (rng.uniform(0.0, faults.slow_ms) if faults.slow_ms else 0.0))
                                / 1000)
            if self.faults.unavailable:
                raise Tier2Error(f"tier-2 unavailable ({what})")
            result = do()
            if self.faults.error_probability and rng.random() < self.faults.error_probability:
                raise Tier2Error(f"tier-2 failed {what} (outcome unknown)")
            return result
        try:
            return await network.exchange(TIER2, serve, what)
        except (Unreachable, AnswerLost) as e:
            raise Tier2Error(f"tier-2: {e}") from None

    # --- the service's side (run by call) -------------------------------------------

    def write(self, name: str, content: bytes) -> None:
        existing = self.chunks.get(name)
        if existing is None:
            self.chunks[name] = content
            self.changes.append(Change("write", name, current_node.get(),
                                       asyncio.get_running_loop().time()))
        elif existing != content:
            raise ChunkExistsError(f"sim tier-2: chunk {name} exists already")

    def get(self, name: str) -> bytes:
        try:
            return self.chunks[name]
        except KeyError:
            raise ChunkNotFoundError(f"sim tier-2: no chunk {name}") from None

    def delete(self, name: str) -> None:
        content = self.chunks.pop(name, None)
        if content is not None:
            now = asyncio.get_running_loop().time()
            self._deleted[name] = (now, content)
            self.changes.append(Change("delete", name, current_node.get(), now))

    # --- faults -----------------------------------------------------------------------

    def power_loss(self) -> list[str]:
        """The service loses power and comes back at once: calls in flight
        are lost (their answers too), deletes not yet durable may be undone
        (each with even chance).  Returns the chunks that came back."""
        now = asyncio.get_running_loop().time()
        life = self._network.kill(TIER2)
        loop = asyncio.get_running_loop()
        kill = getattr(loop, "kill", None)
        if kill is not None:
            kill(TIER2, life)
        self._network.node_up(TIER2)
        back = []
        for name, (when, content) in sorted(self._deleted.items()):
            if now - when < self.delete_durable_s and name not in self.chunks \
                    and self._rng.random() < 0.5:
                self.chunks[name] = content
                back.append(name)
        self._deleted = {}
        self.power_losses += 1
        self._trace.event(f"tier-2 lost power: {len(back)} deleted chunks came back")
        return back

    async def snapshot(self) -> Snapshot:
        """Tier-2 as a reader sees it now, in a storage of its own."""
        return Snapshot(dict(self.chunks))


class Snapshot:
    """Chunks as they were at one instant: the reading half of a
    :class:`~quire.tier2.ChunkStorage` (what ``quire tier2 check`` and
    recovery's readers use), answering at once."""

    uri = "sim://tier2-snapshot"

    def __init__(self, chunks: dict[str, bytes]) -> None:
        self._chunks = chunks

    def _get(self, name: str) -> bytes:
        try:
            return self._chunks[name]
        except KeyError:
            raise ChunkNotFoundError(f"snapshot: no chunk {name}") from None

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        raise Tier2Error("a snapshot is read-only")

    async def read(self, name: str, offset: int, length: int) -> bytes:
        check_read_arguments(offset, length)
        content = self._get(name)
        if offset > len(content):
            raise ChunkRangeError(f"snapshot: read of chunk {name} at {offset}, past its end "
                                  f"({len(content)})", offset, len(content))
        return content[offset:offset + length]

    async def length(self, name: str) -> int:
        return len(self._get(name))

    async def exists(self, name: str) -> bool:
        return name in self._chunks

    async def delete(self, name: str) -> None:
        raise Tier2Error("a snapshot is read-only")

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        return [ChunkInfo(name, len(content)) for name, content in sorted(self._chunks.items())
                if name.startswith(prefix)]

    async def close(self) -> None:
        """Nothing to release."""


class SimChunkStorage:
    """A node's driver of :class:`SimTier2` (a :class:`~quire.tier2.ChunkStorage`)."""

    uri = "sim://tier2"

    def __init__(self, tier2: SimTier2) -> None:
        self._tier2 = tier2

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        check_chunk_name(name)
        check_chunk_size(name, len(data), self._tier2.max_chunk_bytes)
        content = bytes(data)
        await self._call(f"write {name}", lambda: self._tier2.write(name, content))

    async def read(self, name: str, offset: int, length: int) -> bytes:
        check_read_arguments(offset, length)
        check_chunk_name(name)

        def read() -> bytes:
            content = self._tier2.get(name)
            if offset > len(content):
                raise ChunkRangeError(f"sim tier-2: read of chunk {name} at {offset}, past "
                                      f"its end ({len(content)})", offset, len(content))
            return content[offset:offset + length]
        return await self._call(f"read {name}", read)

    async def length(self, name: str) -> int:
        check_chunk_name(name)
        return await self._call(f"length {name}", lambda: len(self._tier2.get(name)))

    async def exists(self, name: str) -> bool:
        check_chunk_name(name)
        return await self._call(f"exists {name}", lambda: name in self._tier2.chunks)

    async def delete(self, name: str) -> None:
        check_chunk_name(name)
        await self._call(f"delete {name}", lambda: self._tier2.delete(name))

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        def listing() -> list[ChunkInfo]:
            return [ChunkInfo(name, len(content))
                    for name, content in sorted(self._tier2.chunks.items())
                    if name.startswith(prefix)]
        return await self._call(f"list {prefix}", listing)

    async def close(self) -> None:
        """Nothing to release."""

    def _call(self, what: str, do: Callable[[], T]) -> Awaitable[T]:
        return self._tier2.call(what, do)
