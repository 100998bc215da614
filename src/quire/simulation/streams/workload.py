"""The clients of a stream-layer run and what they do while faults happen.

Each client is a node with the real streams client: a
:class:`~quire.simulation.streams.controllers.SimControllerClient` and a
:class:`~quire.streams.RemoteSegmentStore` resolving owners through the
controllers' ``getURI``.  While the run lasts, each client:

* writes events to stream ``sim/s0`` (and now and then ``sim/s1``) with a
  :class:`~quire.streams.StreamWriter` (exactly once: a writer id,
  numbered blocks, resends), sometimes abandoning the writer mid-flight as
  a crashed client would, and starting another under the same writer id;
* runs transactions on ``sim/s0``: commits, aborts, or walks away (the
  controller aborts it when its lease ends);
* appends fixed-size records to a segment conditionally (expected offset);
* updates a table segment's keys conditionally (expected versions);
* reads ``sim/s0`` as a member of a reader group would: from its position,
  kept in a table, to a cut of the stream's tail, then moves its position
  there (conditionally);
* watches segment lengths (``getStreamSegmentInfo``), which must never go
  back;
* and one of them is the operator: it scales ``sim/s0`` (splits and
  merges), truncates it at a position a reader has passed, and seals
  ``sim/s1`` once.

Outcomes go to the :class:`~quire.simulation.streams.history.StreamHistory`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from quire.errors import (
    BadOffsetError,
    ControllerPreconditionError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentTruncatedError,
    StreamSealedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.segmentstore import NOT_EXISTS, SegmentType
from quire.simulation.network import SimNetwork
from quire.simulation.streams.controllers import SimController, SimControllerClient
from quire.simulation.streams.history import (
    ABORTED,
    ACKED,
    COMMITTED,
    REFUSED,
    UNKNOWN,
    StreamHistory,
    TablePut,
    Txn,
    event,
)
from quire.simulation.trace import Trace
from quire.streams import (
    RemoteSegmentStore,
    SegmentClientConfig,
    StreamReader,
    StreamTransaction,
    StreamWriter,
    controller_resolver,
    tail_cut,
)
from quire.streams.model import segment_name

SCOPE = "sim"
STREAM = "s0"
"""Written, scaled, truncated, read, with transactions."""
SEALED = "s1"
"""Written, then sealed."""
CONDITIONAL = "sim/cond/0.#epoch.0"
TABLE = "sim/kv/0.#epoch.0"
POSITIONS = "sim/positions/0.#epoch.0"
"""The reader group's positions (one key per reader)."""
KEYS = ("k0", "k1", "k2", "k3")
TABLE_KEYS = (b"a", b"b", b"c")
RECORD_BYTES = 24
OP_TIMEOUT_S = 90.0
"""Past this a client operation counts as unknown."""
CLIENT_CONFIG = SegmentClientConfig(connect_timeout_ms=2000, request_timeout_ms=5000,
                                    retry_deadline_ms=15000)


def record(client: str, number: int) -> bytes:
    """A conditional append's fixed-size record."""
    return f"{client}:{number}".encode().ljust(RECORD_BYTES, b".")


class StreamClient:
    """One client node's streams client."""

    def __init__(self, name: str, network: SimNetwork,
                 controllers: dict[str, SimController]) -> None:
        self.name = name
        self.controller = SimControllerClient(network, controllers, timeout_ms=20_000)
        self.segments = RemoteSegmentStore(controller_resolver(self.controller), CLIENT_CONFIG)


def outcome_of(error: BaseException | None) -> str:
    """Acked, refused (a definite no) or unknown."""
    if error is None:
        return ACKED
    if isinstance(error, StreamSealedError | SegmentNotFoundError | BadOffsetError
                  | TableKeyBadVersionError | TableKeyNotFoundError
                  | ControllerPreconditionError):
        return REFUSED
    return UNKNOWN


class StreamWorkload:
    """The clients' tasks (module docstring)."""

    def __init__(self, network: SimNetwork, controllers: dict[str, SimController],
                 rng: random.Random, trace: Trace, history: StreamHistory, *,
                 clients: int = 3) -> None:
        self.network = network
        self.rng = rng
        self.trace = trace
        self.history = history
        self.clients = [StreamClient(f"c{i}", network, controllers)
                        for i in range(1, clients + 1)]
        self.running = True
        self._writers = 0
        self._txns = 0
        self.reader_cuts: dict[str, list[tuple[dict[int, int], int]]] = {}
        """Reader -> (position, events read before it) of each round it completed."""
        self._unsaved: dict[str, tuple[dict[int, int], list[bytes]]] = {}
        """Reader -> (position, events) of its last round whose position save
        had no answer: credited to it if the next round starts there."""

    def spawn(self, client: StreamClient | str,
              coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        name = client if isinstance(client, str) else client.name
        return asyncio.get_running_loop().create_task(
            coro, context=self.network.context_of(name))

    # --- set-up (before any fault) ----------------------------------------------------

    async def setup(self) -> None:
        """Create the streams, segment and tables (each step again until it
        is done: a slow network may time the first calls out)."""
        c = self.clients[0]
        steps: list[Callable[[], Awaitable[object]]] = [
            lambda: c.controller.create_scope(SCOPE),
            lambda: c.controller.create_stream(SCOPE, STREAM, 2),
            lambda: c.controller.create_stream(SCOPE, SEALED, 1),
            lambda: c.segments.create_segment(CONDITIONAL, SegmentType.STREAM),
            lambda: c.segments.create_segment(TABLE, SegmentType.TABLE),
            lambda: c.segments.create_segment(POSITIONS, SegmentType.TABLE)]
        for step in steps:
            while True:
                try:
                    await step()
                    break
                except SegmentExistsError:
                    break  # (an earlier attempt made it)
                except QuireError as e:
                    self.trace.event(f"set-up step failed, again: {e!r}")
        self.trace.event("streams, segment and tables created")

    # --- the run --------------------------------------------------------------------

    async def run(self, duration_s: float, then: Callable[[], Awaitable[None]]) -> None:
        """The clients' jobs for ``duration_s``; ``then()`` once they are told
        to stop (the faults end), before waiting for what they still do."""
        jobs = {self._writer: (0, 1, 2), self._transactions: (1, 2), self._conditional: (0, 1),
                self._tables: (0, 2), self._reader: (1, 2), self._lengths: (0,),
                self._operator: (0,)}
        tasks = [self.spawn(self.clients[i], job(self.clients[i]))
                 for job, which in jobs.items() for i in which if i < len(self.clients)]
        await asyncio.sleep(duration_s)
        self.running = False
        await then()
        await asyncio.gather(*tasks)

    async def _pause(self, low: float = 0.05, high: float = 0.8) -> None:
        await asyncio.sleep(self.rng.uniform(low, high))

    async def _settle(self, future: asyncio.Future[Any]) -> BaseException | None:
        try:
            await asyncio.wait_for(asyncio.shield(future), OP_TIMEOUT_S)
        except (QuireError, TimeoutError) as e:
            return e
        return None

    # --- writers ----------------------------------------------------------------------

    async def _writer(self, c: StreamClient) -> None:
        rng, history = self.rng, self.history
        writer_id = rng.getrandbits(128)
        while self.running:
            self._writers += 1
            name = f"{c.name}w{self._writers}"
            stream = SEALED if rng.random() < 0.2 else STREAM
            writer = StreamWriter(c.controller, c.segments, SCOPE, stream, writer_id)
            try:
                await asyncio.wait_for(writer.start(), OP_TIMEOUT_S)
            except (QuireError, TimeoutError) as e:
                self.trace.event(f"{name} could not start on {stream}: {e!r}")
                await self._pause(0.5, 2.0)
                continue
            number = 0
            for _burst in range(rng.randint(1, 6)):
                if not self.running:
                    break
                written = []
                for _ in range(rng.randint(1, 8)):
                    number += 1
                    key = rng.choice(KEYS)
                    payload = event(name, key, number)
                    history.writes[payload] = UNKNOWN
                    history.streams_of[payload] = stream
                    written.append((payload, writer.write_event(payload, key)))
                if rng.random() < 0.1:  # the client dies: what is in flight is unknown
                    self.trace.event(f"{name} abandoned with {len(written)} events in flight")
                    for _payload, future in written:
                        future.add_done_callback(_retrieve)
                    _abandon(writer)
                    break
                for payload, future in written:
                    self._record_write(name, stream, payload, await self._settle(future))
                await self._pause()
            else:
                await _close(writer)
            self.trace.event(f"{name} done at {number}")
            await self._pause()

    def _record_write(self, name: str, stream: str, e: bytes,
                      error: BaseException | None) -> None:
        outcome = outcome_of(error)
        self.history.writes[e] = outcome
        if outcome == REFUSED:
            if isinstance(error, StreamSealedError) and stream in self.history.sealed_streams:
                return
            self.history.wrong_refusals.append(f"{e!r} to {stream} refused: {error!r}")

    # --- transactions -----------------------------------------------------------------

    async def _transactions(self, c: StreamClient) -> None:
        rng = self.rng
        while self.running:
            await self._pause(0.5, 3.0)
            if not self.running:
                return
            self._txns += 1
            name = f"{c.name}t{self._txns}"
            try:
                txn = await asyncio.wait_for(StreamTransaction.begin(
                    c.controller, c.segments, SCOPE, STREAM,
                    lease_ms=rng.randint(3000, 12000), writer_id=rng.getrandbits(128)),
                    OP_TIMEOUT_S)
            except (QuireError, TimeoutError) as e:
                self.trace.event(f"{name} did not begin: {e!r}")
                continue
            fate = self.history.txns[name] = Txn(STREAM, fate=UNKNOWN)
            self.history.txn_ids[name] = txn.id
            self.trace.event(f"{name} began")
            written = []
            for n in range(1, rng.randint(2, 6)):
                key = rng.choice(KEYS)
                payload = event(name, key, n, name)
                written.append((payload, txn.write_event(payload, key)))
            ok = True
            for payload, future in written:
                if await self._settle(future) is None:
                    fate.events.append(payload)
                else:
                    ok = False
            choice = rng.random()
            if not ok or choice < 0.25:
                fate.fate = await self._end(name, txn.abort(), ABORTED)
            elif choice < 0.85:
                fate.fate = await self._end(name, txn.commit(), COMMITTED)
            else:
                self.trace.event(f"{name} walks away (its lease will end)")
                await _abandon_txn(txn)

    async def _end(self, name: str, ending: Coroutine[Any, Any, None], fate: str) -> str:
        error = await self._settle(asyncio.ensure_future(ending))
        outcome = outcome_of(error)
        self.trace.event(f"{name} {fate}: {outcome}" + (f" ({error!r})" if error else ""))
        if outcome == ACKED:
            return fate
        if outcome == REFUSED and isinstance(error, ControllerPreconditionError):
            return ABORTED if fate == COMMITTED else COMMITTED  # it ended the other way
        return UNKNOWN

    # --- conditional appends ------------------------------------------------------------

    async def _conditional(self, c: StreamClient) -> None:
        rng, history = self.rng, self.history
        writer_id = rng.getrandbits(128)
        number = 0
        length: int | None = None
        while self.running:
            await self._pause(0.2, 1.2)
            if length is None:
                try:
                    length = (await asyncio.wait_for(c.segments.get_info(CONDITIONAL),
                                                     OP_TIMEOUT_S)).length
                except (QuireError, TimeoutError):
                    continue
            number += 1
            data = record(c.name, number)
            history.conditional[data] = (UNKNOWN, length)
            future = c.segments.append(CONDITIONAL, data, writer_id, number,
                                       expected_offset=length)
            error = await self._settle(future)
            outcome = outcome_of(error)
            if outcome == ACKED:
                result = future.result()
                history.conditional[data] = (ACKED, result.length - RECORD_BYTES)
                length = result.length
            else:
                history.conditional[data] = (outcome, length)
                length = None

    # --- tables -------------------------------------------------------------------------

    async def _tables(self, c: StreamClient) -> None:
        rng, history = self.rng, self.history
        number = 0
        while self.running:
            await self._pause(0.2, 1.2)
            key = rng.choice(TABLE_KEYS)
            try:
                found = (await asyncio.wait_for(c.segments.table_get(TABLE, [key]),
                                                OP_TIMEOUT_S))[0]
            except (QuireError, TimeoutError):
                continue
            number += 1
            value = f"{c.name}:{number}".encode()
            expected = NOT_EXISTS if found is None else found.version
            put = TablePut(key, value, expected, UNKNOWN)
            history.puts.append(put)
            future = c.segments.table_put(TABLE, [(key, value, expected)])
            error = await self._settle(future)
            put.outcome = outcome_of(error)
            if put.outcome == ACKED:
                put.version = future.result()[0]

    # --- the reader group ---------------------------------------------------------------

    async def _reader(self, c: StreamClient) -> None:
        name = f"{c.name}r"
        cuts = self.reader_cuts.setdefault(name, [])
        behind = False
        while self.running:
            await self._pause(0.5, 2.0)
            try:
                await asyncio.wait_for(self._read_round(c, name, cuts, behind), OP_TIMEOUT_S)
                behind = False
            except (SegmentNotFoundError, SegmentTruncatedError) as e:
                # the stream was truncated past this reader (another reader had
                # read what it lost): go on from the stream's head
                self.trace.event(f"{name} is behind the head: {e!r}")
                behind = True
            except (QuireError, TimeoutError) as e:
                self.trace.event(f"{name} round failed: {e!r}")

    async def _read_round(self, c: StreamClient, name: str,
                          cuts: list[tuple[dict[int, int], int]], behind: bool) -> None:
        found = (await c.segments.table_get(POSITIONS, [name.encode()]))[0]
        version = NOT_EXISTS if found is None else found.version
        if found is None or behind:
            position = await c.controller.head_cut(SCOPE, STREAM)
        else:
            position = {int(k): v for k, v in json.loads(found.value or b"{}").items()}
        unsaved = self._unsaved.pop(name, None)
        if unsaved is not None and unsaved[0] == position and not behind:
            # that round's save landed after all: this reader read its events
            self.history.reads[name].extend(unsaved[1])
            cuts.append((position, len(self.history.reads[name])))
        tail = await tail_cut(c.controller, c.segments, SCOPE, STREAM)
        reader = StreamReader(c.controller, c.segments, SCOPE, STREAM, cut=position,
                              end_cut=tail)
        events = [e.data async for e in reader.events()]
        self.history.seen.update(events)
        future = c.segments.table_put(POSITIONS, [(name.encode(), json.dumps(
            {str(k): v for k, v in sorted(tail.items())}).encode(), version)])
        if outcome_of(await self._settle(future)) != ACKED:
            self._unsaved[name] = (tail, events)
            return
        read = self.history.reads[name]
        read.extend(events)
        cuts.append((tail, len(read)))
        self.trace.event(f"{name} read {len(events)} events up to {sorted(tail.items())}")

    # --- lengths --------------------------------------------------------------------------

    async def _lengths(self, c: StreamClient) -> None:
        longest: dict[str, int] = {}
        while self.running:
            await self._pause(0.3, 1.5)
            try:
                current = await asyncio.wait_for(c.controller.current_segments(SCOPE, STREAM),
                                                 OP_TIMEOUT_S)
                names = [s.name for s in current] + [CONDITIONAL]
                for name in names:
                    length = (await asyncio.wait_for(c.segments.get_info(name),
                                                     OP_TIMEOUT_S)).length
                    if length < longest.get(name, 0):
                        self.history.lengths_back.append(
                            f"{c.name} saw {name} at {longest[name]}, then at {length}")
                    longest[name] = max(length, longest.get(name, 0))
            except (QuireError, TimeoutError):
                continue

    # --- the operator ---------------------------------------------------------------------

    async def _operator(self, c: StreamClient) -> None:
        rng = self.rng
        sealed_at = rng.uniform(0.3, 0.8)
        started = asyncio.get_running_loop().time()
        while self.running:
            await self._pause(0.5, 3.0)
            if not self.running:
                return
            try:
                if SEALED not in self.history.sealed_streams and \
                        asyncio.get_running_loop().time() - started > sealed_at * 10:
                    self.history.sealed_streams.add(SEALED)
                    self.trace.event(f"operator seals {SCOPE}/{SEALED}")
                    await asyncio.wait_for(c.controller.seal_stream(SCOPE, SEALED), OP_TIMEOUT_S)
                elif rng.random() < 0.6:
                    await asyncio.wait_for(self._scale(c), OP_TIMEOUT_S)
                else:
                    await asyncio.wait_for(self._truncate(c), OP_TIMEOUT_S)
            except (QuireError, TimeoutError) as e:
                self.trace.event(f"operator: {e!r}")

    async def _scale(self, c: StreamClient) -> None:
        current = await c.controller.current_segments(SCOPE, STREAM)
        rng = self.rng
        if len(current) > 1 and (len(current) >= 4 or rng.random() < 0.4):
            at = rng.randrange(len(current) - 1)
            pair = current[at:at + 2]
            sealed, ranges = [s.id for s in pair], [(pair[0].min_key, pair[1].max_key)]
        else:
            s = rng.choice(current)
            middle = (s.min_key + s.max_key) / 2
            sealed, ranges = [s.id], [(s.min_key, middle), (middle, s.max_key)]
        names = [segment_name(SCOPE, STREAM, sid) for sid in sealed]
        self.trace.event(f"operator scales {STREAM}: seals {names}")
        await c.controller.scale(SCOPE, STREAM, sealed, ranges)
        self.trace.event("operator: scale done")

    async def _truncate(self, c: StreamClient) -> None:
        readers = sorted(r for r, cuts in self.reader_cuts.items() if cuts)
        if not readers:
            return
        reader = self.rng.choice(readers)
        found = (await c.segments.table_get(POSITIONS, [reader.encode()]))[0]
        if found is None:
            return
        position = {int(k): v for k, v in json.loads(found.value or b"{}").items()}
        below = next((n for cut, n in self.reader_cuts[reader] if cut == position), None)
        if below is None:
            return  # a position whose round's events the history does not hold
        self.trace.event(f"operator truncates {STREAM} at {reader}'s {sorted(position.items())}")
        self.history.truncated.update(self.history.reads[reader][:below])
        await c.controller.truncate_stream(SCOPE, STREAM, position)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _abandon(writer: StreamWriter) -> None:
    """A client that dies: its connections go, nothing is flushed (what it
    had in flight stays unknown)."""
    asyncio.get_running_loop().create_task(_close_now(writer))


async def _close_now(writer: StreamWriter) -> None:
    """The writer's process is gone: its tasks stop, its connections drop
    (a client crash, without killing the other tasks of the client node)."""
    writer._closed = True
    for task in list(writer._tasks):
        task.cancel()
    for state in writer._writers.values():
        if state.connection is not None:
            state.connection.abort()


async def _close(writer: StreamWriter) -> None:
    try:
        await asyncio.wait_for(writer.close(), OP_TIMEOUT_S)
    except (QuireError, TimeoutError):
        await _close_now(writer)


async def _abandon_txn(txn: StreamTransaction) -> None:
    await _close_now(txn._writer)
