"""One client of a network round, run on a host of its own:
``python -m tests.support.net_client SPEC`` (under ``ip netns exec``).

SPEC is a JSON object: ``role``, ``name`` (the process in the history),
``history`` (the file it records every operation to, see
:mod:`quire.testing.history`) and the role's own keys:

* ``ledger-writer`` (``metadata_uri``, ``quorum`` [E, W, A], ``entries``,
  ``ledgers`` (at most), ``per_ledger`` (0: no limit), ``interval_ms``, ``in_flight``,
  ``add_timeout_ms``): creates ledgers and adds to them, prints
  ``{"ledger": id}`` for each and ``{"closed": id, "ensembles": ...}``;
* ``ledger-reader`` (``metadata_uri``, ``ledger``, ``poll_ms``): follows a
  ledger's LAC and reads up to it; on ``stop`` it recovers (fences and
  closes) each ledger of the command's ``verify`` list and reads it whole;
* ``stream-writer`` / ``pravega-writer`` (``controller_uri``, ``scope``,
  ``stream``, ``keys``, ``events``, ``interval_ms``, ``in_flight``): events
  ``<name>:k<i>:<n>`` with routing key ``k<i>``, by Quire's StreamWriter or
  the real Pravega client, both exactly-once writers;
* ``stream-reader`` / ``pravega-reader`` (``controller_uri``, ``scope``,
  ``stream``, ``group``): one reader of a reader group (Quire's
  StreamReader alone; a real Pravega reader group's member, ``reader`` its
  name), reading from the head and recording each event; a Pravega reader
  with ``fail_after`` N fails after N events, going offline without
  releasing the slice it is in (printing ``{"failed": true}``);
* ``segment-prober`` (``segments``, ``hosts``, ``interval_ms``): asks every
  segment store directly for each segment's length.

Commands arrive on stdin as JSON lines: ``{"cmd": "stop"}`` (writers drain
and close, readers leave; ``verify``: the ledgers a ledger reader checks),
``{"cmd": "recover"}`` (a ledger reader opens its ledger with recovery now).
stdout carries JSON lines:
``{"event": "ready"}``, the role's, then ``{"event": "done"}`` (or
``{"event": "error", ...}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from quire.client import Client, ClientConfig, WriteHandle
from quire.errors import QuireError
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    SegmentClientConfig,
    SegmentConnection,
    StreamReader,
    StreamWriter,
    controller_resolver,
)
from quire.streams.connection import next_request_id
from quire.testing.history import Recorder

PASSWORD = b"net"
Spec = dict[str, Any]


def emit(**line: Any) -> None:
    print(json.dumps(line), flush=True)


class Commands:
    """stdin's JSON commands, handed to the event loop by a reader thread."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def read() -> None:
            for line in sys.stdin:
                with contextlib.suppress(ValueError):
                    loop.call_soon_threadsafe(self._put, json.loads(line))
            loop.call_soon_threadsafe(self._put, {"cmd": "stop"})  # stdin closed

        threading.Thread(target=read, daemon=True).start()

    def _put(self, command: dict[str, Any]) -> None:
        if command.get("cmd") == "stop":
            self.stopped.set()
        self.queue.put_nowait(command)

    def take(self, name: str) -> dict[str, Any] | None:
        """A pending command called ``name``, if one came (others are kept)."""
        kept, found = [], None
        while not self.queue.empty():
            command = self.queue.get_nowait()
            if found is None and command.get("cmd") == name:
                found = command
            else:
                kept.append(command)
        for command in kept:
            self.queue.put_nowait(command)
        return found

    async def pause(self, seconds: float) -> None:
        """Sleep, cut short by a stop (a pace, not a synchronisation)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), seconds)


def _record_outcome(rec: Recorder, op: int, result: Callable[[Any], Any]
                    ) -> Callable[[asyncio.Future[Any]], None]:
    def done(future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            rec.unknown(op, "cancelled")
        elif future.exception() is not None:
            rec.unknown(op, future.exception())  # type: ignore[arg-type]
        else:
            rec.ok(op, result(future.result()))
    return done


# --- ledgers ----------------------------------------------------------------------------


async def ledger_writer(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    client = await Client.connect(spec["metadata_uri"], ClientConfig(
        add_entry_timeout_ms=spec.get("add_timeout_ms", 3000), read_timeout_ms=3000))
    quorum = list(spec.get("quorum", (3, 3, 2)))
    left, ledgers = spec.get("entries", 10**9), spec.get("ledgers", 10**9)
    try:
        while not cmds.stopped.is_set() and left > 0 and ledgers > 0:
            op = rec.invoke("ledger.create", "new", {"quorum": quorum})
            try:
                handle = await client.create_ledger(*quorum, password=PASSWORD)
            except QuireError as e:
                rec.unknown(op, e)
                await cmds.pause(0.5)
                continue
            rec.ok(op, {"ledger": handle.ledger_id})
            emit(ledger=handle.ledger_id)
            ledgers -= 1
            left -= await _fill_ledger(spec, rec, cmds, handle, left)
            op = rec.invoke("ledger.close", str(handle.ledger_id))
            try:
                await handle.close()
            except QuireError as e:
                rec.unknown(op, e)  # fenced: the recoverer closed it
            else:
                rec.ok(op, {"last": handle.last_add_confirmed})
            emit(closed=handle.ledger_id,
                 ensembles=[[first, list(bookies)] for first, bookies in
                            handle.metadata.ensembles])
    finally:
        await client.close()


async def _fill_ledger(spec: Spec, rec: Recorder, cmds: Commands, handle: WriteHandle,
                       left: int) -> int:
    """Add to ``handle`` at the spec's pace until stopped, ``left`` adds
    were made, the ledger's share is full or an add failed; the count made."""
    ledger, per_ledger = str(handle.ledger_id), spec.get("per_ledger", 0)
    slots = asyncio.Semaphore(spec.get("in_flight", 10))
    failed: list[BaseException] = []
    pending: set[asyncio.Future[int]] = set()

    def settled(f: asyncio.Future[int]) -> None:
        slots.release()
        pending.discard(f)
        if f.cancelled() or f.exception() is not None:
            failed.append(f.exception() or asyncio.CancelledError())

    count = 0
    while not cmds.stopped.is_set() and count < left and not failed \
            and (per_ledger == 0 or count < per_ledger):
        await slots.acquire()
        payload = f"{rec.process}-{ledger}-{count}"
        op = rec.invoke("ledger.add", ledger, {"payload": payload})
        try:
            future = handle.append(payload.encode())
        except QuireError as e:
            rec.fail(op, e)  # refused before it was sent
            break
        future.add_done_callback(_record_outcome(rec, op, lambda e: {"entry": e}))
        pending.add(future)
        future.add_done_callback(settled)
        count += 1
        await asyncio.sleep(spec.get("interval_ms", 20) / 1000)  # the writer's pace
    await asyncio.gather(*pending, return_exceptions=True)
    return count


async def ledger_reader(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    client = await Client.connect(spec["metadata_uri"], ClientConfig(read_timeout_ms=3000))
    ledger = str(spec["ledger"])
    try:
        handle = await client.open_ledger(int(ledger), password=PASSWORD, recovery=False)
        next_entry = 0
        while not cmds.stopped.is_set():
            if cmds.take("recover") is not None:
                emit(recovered=await _recover(client, rec, ledger))
            op = rec.invoke("ledger.lac", ledger)
            try:
                lac = await handle.read_last_add_confirmed()
            except QuireError as e:
                rec.fail(op, e)
            else:
                rec.ok(op, {"lac": lac})
                if lac >= next_entry:
                    op = rec.invoke("ledger.read", ledger, {"from": next_entry})
                    try:
                        entries = await handle.read(next_entry, lac)
                    except QuireError as e:
                        rec.fail(op, e)
                    else:
                        rec.ok(op, {"entries": [[e.entry_id, e.data.decode()]
                                                for e in entries]})
                        next_entry = lac + 1
            await cmds.pause(spec.get("poll_ms", 100) / 1000)
        stop = cmds.take("stop") or {}
        for other in stop.get("verify", [int(ledger)]):
            await _verify(client, rec, str(other))
    finally:
        await client.close()


async def _recover(client: Client, rec: Recorder, ledger: str) -> int:
    """Open ``ledger`` with recovery (fencing its writer); its last entry."""
    op = rec.invoke("ledger.recover", ledger)
    for attempt in range(20):
        try:
            handle = await client.open_ledger(int(ledger), password=PASSWORD, recovery=True)
        except QuireError as e:
            if attempt == 19:
                rec.unknown(op, e)
                raise
            await asyncio.sleep(0.5)  # recovery could not decide yet: try again
        else:
            rec.ok(op, {"last": handle.last_add_confirmed})
            return handle.last_add_confirmed
    raise AssertionError("unreachable")


async def _verify(client: Client, rec: Recorder, ledger: str) -> None:
    """Recover ``ledger`` and read it whole: the history's complete read."""
    last = await _recover(client, rec, ledger)
    handle = await client.open_ledger(int(ledger), password=PASSWORD, recovery=False)
    op = rec.invoke("ledger.read", ledger, {"from": 0})
    try:
        entries = await handle.read(0, last) if last >= 0 else []
    except QuireError as e:
        rec.fail(op, e)
        raise
    rec.ok(op, {"entries": [[e.entry_id, e.data.decode()] for e in entries], "last": last,
                "complete": True})


# --- streams ----------------------------------------------------------------------------


def _stream_clients(spec: Spec) -> tuple[ControllerClient, RemoteSegmentStore]:
    controller = ControllerClient(spec["controller_uri"], timeout_ms=20_000)
    return controller, RemoteSegmentStore(controller_resolver(controller), SegmentClientConfig(
        request_timeout_ms=20_000, retry_deadline_ms=120_000))


def _event(rec: Recorder, n: int, spec: Spec) -> tuple[str, str]:
    key = f"k{n % spec.get('keys', 4)}"
    return key, f"{rec.process}:{key}:{n}"


async def stream_writer(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    controller, segments = _stream_clients(spec)
    stream = f"{spec['scope']}/{spec['stream']}"
    writer = StreamWriter(controller, segments, spec["scope"], spec["stream"])
    try:
        await writer.start()
        slots = asyncio.Semaphore(spec.get("in_flight", 20))
        n = 0
        while not cmds.stopped.is_set() and n < spec.get("events", 10**9):
            await slots.acquire()
            key, payload = _event(rec, n, spec)
            op = rec.invoke("event.write", stream, {"key": key, "payload": payload,
                                                    "exactly_once": True})
            try:
                future = writer.write_event(payload.encode(), routing_key=key)
            except QuireError as e:
                rec.fail(op, e)
                break
            future.add_done_callback(_record_outcome(rec, op, lambda _: None))
            future.add_done_callback(lambda f: slots.release())
            n += 1
            await asyncio.sleep(spec.get("interval_ms", 20) / 1000)  # the writer's pace
        with contextlib.suppress(QuireError, TimeoutError):
            await asyncio.wait_for(writer.flush(), 120)
    finally:
        await writer.close()
        await segments.close()
        await controller.close()


async def stream_reader(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    controller, segments = _stream_clients(spec)
    stream = f"{spec['scope']}/{spec['stream']}"
    reader = StreamReader(controller, segments, spec["scope"], spec["stream"])
    group = spec["group"]

    async def read() -> None:
        async for event in reader.events(follow=True):
            rec.instant("event.read", stream, {"group": group},
                        {"payload": event.data.decode(), "segment": event.segment_id,
                         "offset": event.offset})

    task = asyncio.create_task(read())
    stop = asyncio.create_task(cmds.stopped.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # an error of the reads: the reader fails
    finally:
        for t in (task, stop):
            t.cancel()
        await asyncio.gather(task, stop, return_exceptions=True)
        await reader.close()
        await segments.close()
        await controller.close()


async def pravega_writer(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    import pravega_client

    manager = pravega_client.StreamManager(spec["controller_uri"])
    writer = manager.create_writer(spec["scope"], spec["stream"])
    stream = f"{spec['scope']}/{spec['stream']}"
    n = 0
    while not cmds.stopped.is_set() and n < spec.get("events", 10**9):
        key, payload = _event(rec, n, spec)
        op = rec.invoke("event.write", stream, {"key": key, "payload": payload,
                                                "exactly_once": True})
        try:
            await writer.write_event_async(payload, routing_key=key)
        except Exception as e:  # the binding's errors are plain exceptions
            rec.unknown(op, str(e))
        else:
            rec.ok(op)
        n += 1
        await asyncio.sleep(spec.get("interval_ms", 20) / 1000)  # the writer's pace


async def pravega_reader(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    import pravega_client

    manager = pravega_client.StreamManager(spec["controller_uri"])
    group_name, stream = spec["group"], f"{spec['scope']}/{spec['stream']}"
    group = manager.create_reader_group(group_name, spec["scope"], spec["stream"])
    reader = group.create_reader(spec["reader"])
    fetch: asyncio.Future[Any] | None = None
    fail_after = spec.get("fail_after")  # events read, then fail (None: never)
    try:
        while not cmds.stopped.is_set():
            if fetch is None:
                fetch = asyncio.ensure_future(reader.get_segment_slice_async())
            done, _ = await asyncio.wait({fetch}, timeout=0.5)
            if not done:
                continue
            piece, fetch = fetch.result(), None
            events = list(piece)
            if fail_after is not None and len(events) >= fail_after:
                events = events[:fail_after]  # read part of the slice, then fail
                fail_after = 0
            elif fail_after is not None:
                fail_after -= len(events)
            for event in events:
                rec.instant("event.read", stream, {"group": group_name},
                            {"payload": event.data().decode(), "segment": None,
                             "offset": event.offset()})
            if fail_after == 0:
                rec.instant("reader.fail", stream, {"group": group_name})
                emit(failed=True)
                return  # offline below, holding this slice unreleased
            reader.release_segment(piece)
            if events:
                rec.instant("reader.release", stream, {"group": group_name},
                            {"segment": None})
            if not events:
                await cmds.pause(0.1)  # nothing new: the client hands out empty slices
    finally:
        reader.reader_offline()


# --- probes -----------------------------------------------------------------------------


async def segment_prober(spec: Spec, rec: Recorder, cmds: Commands) -> None:
    from quire.pravega_wire import GetStreamSegmentInfo, StreamSegmentInfo

    connections: dict[str, SegmentConnection] = {}
    while not cmds.stopped.is_set():
        for host in spec["hosts"]:
            for segment in spec["segments"]:
                op = rec.invoke("segment.length", segment, {"host": host})
                try:
                    connection = connections.get(host)
                    if connection is None or connection.broken:
                        connection = connections[host] = await SegmentConnection.open(host,
                                                                                     2000)
                    request_id = next_request_id()
                    reply = await asyncio.wait_for(connection.request(
                        GetStreamSegmentInfo(request_id, segment, ""), request_id), 5)
                except (QuireError, TimeoutError) as e:
                    rec.fail(op, e)
                    continue
                if isinstance(reply, StreamSegmentInfo) and reply.exists:
                    rec.ok(op, {"length": reply.write_offset})
                else:
                    rec.fail(op, type(reply).__name__)  # WrongHost: not the owner
        await cmds.pause(spec.get("interval_ms", 200) / 1000)
    for connection in connections.values():
        connection.abort()


ROLES: dict[str, Callable[[Spec, Recorder, Commands], Awaitable[None]]] = {
    "ledger-writer": ledger_writer,
    "ledger-reader": ledger_reader,
    "stream-writer": stream_writer,
    "stream-reader": stream_reader,
    "pravega-writer": pravega_writer,
    "pravega-reader": pravega_reader,
    "segment-prober": segment_prober,
}


async def main(spec: Spec) -> int:
    rec = Recorder(spec["history"], spec["name"])
    cmds = Commands()
    emit(event="ready")
    try:
        await ROLES[spec["role"]](spec, rec, cmds)
    except Exception as e:  # reported to the harness, which fails the round
        emit(event="error", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        rec.close()
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
