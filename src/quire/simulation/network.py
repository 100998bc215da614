"""A simulated network of byte-stream connections between named nodes.

Each connection is a pair of :class:`SimTransport` ends, one per
``asyncio.Protocol`` (a client's peer connection, a bookie's
``BookieConnection``).  What one end writes reaches the other after a
delay drawn from the run's ``random.Random``, in order (a stream, as TCP
is), possibly cut in pieces; different connections are independent, so
their messages are reordered against each other.  Faults:

* **delay**: each write may be held ``slow_delay_s`` (long enough for a
  request to time out), with probability ``slow_probability``;
* **pause** (:meth:`SimNetwork.pause`): a node's traffic stops for a while
  (a hung process as its peers see it, BP-46's "C1 hangs"; its own timers
  still run): nothing it sends or is sent arrives before the pause ends;
* **reset** (:meth:`SimNetwork.reset_random`): both ends see ``connection_lost``;
  bytes in flight are lost;
* **partition** (:meth:`SimNetwork.partition`): a set of nodes is cut off
  from the rest: their connections across the cut are reset and new ones
  refused until :meth:`SimNetwork.heal`;
* **listener down** (a crashed bookie, :meth:`SimNetwork.unlisten`):
  connections to it are reset and refused;
* **link cut** (:meth:`SimNetwork.cut_link`): two nodes cannot reach each
  other (the rest of the network can), until :meth:`SimNetwork.heal`.

A node that crashes and restarts (a segment store, a controller) lives
several *lives* (:meth:`SimNetwork.kill`): what a dead life still runs
(its tasks' cleanup after they were cancelled) connects nowhere and
exchanges nothing, so it cannot act on the cluster once its process is
gone, even after the node came back.  :meth:`SimNetwork.exchange` is one
request and its answer between two nodes (a gRPC call, a metadata
transaction), with the same delays, pauses, cuts and lives.

The node a connection comes from is the ``current_node`` context variable
of the task that opens it (each simulated client runs its tasks under its
own).  Nothing here touches a socket.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from quire.simulation.trace import Trace

P = TypeVar("P", bound=asyncio.BaseProtocol)

current_node: contextvars.ContextVar[str] = contextvars.ContextVar("current_node",
                                                                   default="?")
"""The simulated node the running task belongs to."""
current_life: contextvars.ContextVar[int] = contextvars.ContextVar("current_life", default=0)
"""Which life of its node the running task belongs to (see :meth:`SimNetwork.kill`)."""
T = TypeVar("T")


class Unreachable(ConnectionRefusedError):
    """An exchange that never reached its destination (nothing was done)."""


class AnswerLost(ConnectionResetError):
    """An exchange whose answer was lost (what it did is unknown)."""


@dataclass(frozen=True)
class NetworkConfig:
    """Delays of the simulated network, in virtual milliseconds."""

    min_delay_ms: float = 0.05
    max_delay_ms: float = 2.0
    slow_probability: float = 0.0
    """Chance that one write is held ``slow_delay_ms`` more."""
    slow_delay_ms: float = 6000.0
    split_probability: float = 0.2
    """Chance that one write arrives in two pieces."""


class SimTransport(asyncio.Transport):
    """One end of a simulated connection (see the module docstring)."""

    def __init__(self, network: SimNetwork, conn: SimConnection, local: str, remote: str) -> None:
        super().__init__()
        self._network = network
        self._conn = conn
        self.local = local
        self.remote = remote
        self.protocol: asyncio.Protocol | None = None
        self.peer: SimTransport | None = None
        self._closing = False
        self._paused = False
        self._held: list[bytes] = []
        """Bytes that arrived while reading was paused."""
        self.in_flight: deque[tuple[float, bytes]] = deque()
        """(arrival time, bytes) written by this end and not yet delivered,
        arrival times never decreasing: the stream's order (timers due at
        the same time may run in any order, so each one delivers what is
        due from the front of this queue)."""

    # --- asyncio.Transport -------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.remote
        if name == "sockname":
            return self.local
        return default

    def is_closing(self) -> bool:
        return self._closing or not self._conn.open

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._conn.open or self.peer is None:
            return
        self._network.send(self, bytes(data))

    def close(self) -> None:
        self._network.sever(self._conn, None, by=self.local)

    def abort(self) -> None:
        self._network.sever(self._conn, None, by=self.local)

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        """Reading resumes; what arrived meanwhile is handed over on the
        next iteration (as a real transport would: never from inside the
        protocol call that resumed it)."""
        if not self._paused:
            return
        self._paused = False
        if self._held:
            self._network.soon(self.local, self._hand_over_held)

    def _hand_over_held(self) -> None:
        while self._held and not self._paused:
            data = self._held.pop(0)
            if not self._conn.open or self.protocol is None:
                return
            self.protocol.data_received(data)

    def is_reading(self) -> bool:
        return not self._paused

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Nothing is buffered here (:meth:`write` hands the bytes to the
        network): no limit to keep."""

    # --- the network's side ------------------------------------------------------

    def receive(self, data: bytes) -> None:
        if not self._conn.open or self.protocol is None:
            return
        if self._paused or self._held:  # (held bytes go first)
            self._held.append(data)
            return
        self.protocol.data_received(data)

    def lost(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._held = []
        if self.protocol is not None:
            self.protocol.connection_lost(exc)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class SimConnection:
    """A pair of ends between a client node and a listener."""

    def __init__(self, conn_id: int, client_node: str, server_node: str) -> None:
        self.conn_id = conn_id
        self.client_node = client_node
        self.server_node = server_node
        self.ends: list[SimTransport] = []
        self.open = True

    def __repr__(self) -> str:
        return f"conn#{self.conn_id}({self.client_node}->{self.server_node})"


class SimNetwork:
    """Listeners by address, open connections, partitions (module docstring)."""

    def __init__(self, rng: random.Random, trace: Trace, config: NetworkConfig) -> None:
        self._rng = rng
        self._trace = trace
        self.config = config
        self._listeners: dict[str, tuple[str, Callable[[], asyncio.Protocol]]] = {}
        """address -> (node, protocol factory)."""
        self._connections: list[SimConnection] = []
        self._cut: frozenset[str] = frozenset()
        """Nodes partitioned away from the others (empty: none)."""
        self._next_id = 0
        self._paused_until: dict[str, float] = {}
        """Node -> loop time its pause ends."""
        self._contexts: dict[str, contextvars.Context] = {}
        self._down: set[str] = set()
        """Crashed nodes: they open no connection."""
        self._cut_links: set[frozenset[str]] = set()
        """Pairs of nodes that cannot reach each other."""
        self._lives: dict[str, int] = {}
        """Node -> its current life (0 unless it was killed)."""

    def _context_of(self, node: str) -> contextvars.Context:
        """A context whose ``current_node`` is ``node``: what arrives at a
        node runs in it, so the tasks it starts (a reconnection, an
        ensemble change) belong to that node too."""
        life = self._lives.get(node, 0)
        key = node if not life else f"{node}#{life}"
        context = self._contexts.get(key)
        if context is None:
            context = self._contexts[key] = contextvars.Context()
            context.run(current_node.set, node)
            context.run(current_life.set, life)
        return context

    def context_of(self, node: str) -> contextvars.Context:
        """A copy of the context of ``node``'s current life (to run a task as it)."""
        return self._context_of(node).copy()

    def life_of(self, node: str) -> int:
        return self._lives.get(node, 0)

    def alive(self) -> bool:
        """Whether the running code belongs to its node's current life, up."""
        node = current_node.get()
        return node not in self._down and current_life.get() == self._lives.get(node, 0)

    def kill(self, node: str) -> int:
        """``node``'s process dies: as :meth:`node_down`, and its current life
        ends (what that life still runs is cut off for good); returns the
        life that ended."""
        self.node_down(node)
        life = self._lives.get(node, 0)
        self._lives[node] = life + 1
        return life

    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    # --- listeners ---------------------------------------------------------------

    def listen(self, node: str, address: str, factory: Callable[[], asyncio.Protocol]) -> None:
        self._listeners[address] = (node, factory)

    def unlisten(self, address: str) -> None:
        """Stop accepting at ``address`` and reset every connection to it."""
        entry = self._listeners.pop(address, None)
        if entry is None:
            return
        for conn in list(self._connections):
            if conn.server_node == entry[0]:
                self.sever(conn, ConnectionResetError("bookie went away"))

    def node_down(self, node: str) -> None:
        """``node`` crashed: every connection from or to it is reset, and it
        opens none until :meth:`node_up`."""
        self._down.add(node)
        for conn in list(self._connections):
            if node in (conn.client_node, conn.server_node):
                self.sever(conn, ConnectionResetError(f"{node} went away"))

    def node_up(self, node: str) -> None:
        self._down.discard(node)

    # --- faults ------------------------------------------------------------------

    def _blocked(self, a: str, b: str) -> bool:
        return (a in self._cut) != (b in self._cut) or (
            bool(self._cut_links) and frozenset((a, b)) in self._cut_links)

    def reachable(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` can talk now (neither down, nothing between)."""
        return not self._blocked(a, b) and a not in self._down and b not in self._down

    def cut_link(self, a: str, b: str) -> None:
        """``a`` and ``b`` cannot reach each other until :meth:`heal`."""
        self._cut_links.add(frozenset((a, b)))
        self._trace.event(f"link {a} - {b} cut")
        for conn in list(self._connections):
            if {conn.client_node, conn.server_node} == {a, b}:
                self.sever(conn, ConnectionResetError("link cut"))

    def partition(self, nodes: frozenset[str]) -> None:
        """Cut ``nodes`` off from every other node (replacing any cut)."""
        self._cut = nodes
        self._trace.event(f"partition {sorted(nodes)}")
        for conn in list(self._connections):
            if self._blocked(conn.client_node, conn.server_node):
                self.sever(conn, ConnectionResetError("partitioned"))

    def soon(self, node: str, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the next iteration, as ``node``."""
        self._loop().call_soon(callback, context=self._context_of(node))

    def pause(self, node: str, seconds: float) -> None:
        """Hold everything to and from ``node`` for ``seconds`` (see the
        module docstring); connections stay open."""
        until = self._loop().time() + seconds
        self._paused_until[node] = max(until, self._paused_until.get(node, 0.0))
        self._trace.event(f"{node} paused for {seconds:.3f} s")

    def end_pauses(self) -> None:
        """No node is paused from now on (bytes already held still arrive
        when their pause would have ended)."""
        self._paused_until.clear()

    def _resumes_at(self, *nodes: str) -> float:
        return max(self._paused_until.get(node, 0.0) for node in nodes)

    def heal_link(self, a: str, b: str) -> None:
        """Undo :meth:`cut_link` of ``a`` and ``b``."""
        if frozenset((a, b)) in self._cut_links:
            self._cut_links.discard(frozenset((a, b)))
            self._trace.event(f"link {a} - {b} healed")

    def heal(self) -> None:
        if self._cut or self._cut_links:
            self._trace.event("partition healed")
        self._cut = frozenset()
        self._cut_links = set()

    def reset_random(self) -> None:
        """Reset one open connection, chosen by the run's rng (if any)."""
        if self._connections:
            self.sever(self._rng.choice(self._connections), ConnectionResetError("reset"))

    # --- connections -------------------------------------------------------------

    async def connect(self, factory: Callable[[], P], address: str) -> tuple[SimTransport, P]:
        node = current_node.get()
        await asyncio.sleep(self._delay_s())
        entry = self._listeners.get(address)
        if entry is None or self._blocked(node, entry[0]) or node in self._down \
                or entry[0] in self._down or not self.alive():
            raise ConnectionRefusedError(f"{node} cannot reach {address}")
        server_node, server_factory = entry
        self._next_id += 1
        conn = SimConnection(self._next_id, node, server_node)
        client_end = SimTransport(self, conn, node, server_node)
        server_end = SimTransport(self, conn, server_node, node)
        client_end.peer, server_end.peer = server_end, client_end
        conn.ends = [client_end, server_end]
        self._connections.append(conn)
        server_protocol = server_factory()
        server_end.protocol = server_protocol
        server_protocol.connection_made(server_end)
        protocol = factory()
        assert isinstance(protocol, asyncio.Protocol)
        client_end.protocol = protocol
        protocol.connection_made(client_end)
        self._trace.event(f"connect {conn}")
        return client_end, protocol

    async def exchange(self, dst: str, serve: Callable[[], Coroutine[Any, Any, T]],
                       what: str = "") -> T:
        """One request from the running node to ``dst`` and its answer:
        ``serve()`` runs as ``dst`` (its current life) once the request
        arrives, and its result or error comes back.  Unreachable if the
        request cannot be delivered (nothing was done); AnswerLost if ``dst``
        died meanwhile or the answer cannot be delivered (the outcome is
        unknown).  Both after the network's delays."""
        src = current_node.get()
        loop = self._loop()
        await asyncio.sleep(self._exchange_delay_s(src, dst))
        if not self.reachable(src, dst) or not self.alive():
            raise Unreachable(f"{src} cannot reach {dst}" + (f" ({what})" if what else ""))
        life = self._lives.get(dst, 0)
        task: asyncio.Task[T] = loop.create_task(serve(), context=self.context_of(dst))
        task.add_done_callback(_retrieve)  # (the caller may have given up waiting)
        await asyncio.wait([task])
        await asyncio.sleep(self._exchange_delay_s(dst, src))
        if self._lives.get(dst, 0) != life or not self.reachable(src, dst) or task.cancelled():
            if not task.cancelled():
                task.exception()  # (retrieved: the caller hears "unknown")
            raise AnswerLost(f"the answer of {dst} to {src} was lost"
                             + (f" ({what})" if what else ""))
        return task.result()

    async def call(self, dst: str, serve: Callable[[], T], what: str = "") -> T:
        """:meth:`exchange` for a service that answers at once (``serve`` is
        a plain function: a metadata transaction): the same delays and
        faults, without a task on the far side."""
        src = current_node.get()
        await asyncio.sleep(self._exchange_delay_s(src, dst))
        if not self.reachable(src, dst) or not self.alive():
            raise Unreachable(f"{src} cannot reach {dst}" + (f" ({what})" if what else ""))
        life = self._lives.get(dst, 0)
        try:
            result = serve()
        except Exception as e:
            error: Exception | None = e
        else:
            error = None
        await asyncio.sleep(self._exchange_delay_s(dst, src))
        if self._lives.get(dst, 0) != life or not self.reachable(src, dst):
            raise AnswerLost(f"the answer of {dst} to {src} was lost"
                             + (f" ({what})" if what else ""))
        if error is not None:
            raise error
        return result

    def _exchange_delay_s(self, src: str, dst: str) -> float:
        wait = max(0.0, self._resumes_at(src, dst) - self._loop().time())
        return wait + self._delay_s()

    def _delay_s(self) -> float:
        cfg, rng = self.config, self._rng
        delay_ms = rng.uniform(cfg.min_delay_ms, cfg.max_delay_ms)
        if cfg.slow_probability and rng.random() < cfg.slow_probability:
            delay_ms += cfg.slow_delay_ms
        return delay_ms / 1000.0

    def send(self, sender: SimTransport, data: bytes) -> None:
        """Deliver ``data`` to the other end, later, in stream order."""
        loop = self._loop()
        receiver = sender.peer
        assert receiver is not None
        pieces = [data]
        if len(data) > 1 and self._rng.random() < self.config.split_probability:
            cut = self._rng.randrange(1, len(data))
            pieces = [data[:cut], data[cut:]]
        queue = sender.in_flight
        paused_until = self._resumes_at(sender.local, sender.remote)
        for piece in pieces:
            arrival = max(loop.time(), paused_until) + self._delay_s()
            if queue and queue[-1][0] > arrival:
                arrival = queue[-1][0]
            queue.append((arrival, piece))
            loop.call_at(arrival, self._deliver_due, sender, receiver,
                         context=self._context_of(receiver.local))

    def _deliver_due(self, sender: SimTransport, receiver: SimTransport) -> None:
        queue, now = sender.in_flight, self._loop().time()
        while queue and queue[0][0] <= now:
            receiver.receive(queue.popleft()[1])

    def sever(self, conn: SimConnection, exc: Exception | None, *, by: str = "") -> None:
        """Close both ends (each protocol hears it on the next iteration);
        ``by``: the node that closed it (else the network did)."""
        if not conn.open:
            return
        conn.open = False
        self._connections.remove(conn)
        self._trace.event(f"close {conn} by {by}" if by else f"close {conn}: {exc}")
        loop = self._loop()
        for end in conn.ends:
            loop.call_soon(end.lost, exc, context=self._context_of(end.local))
