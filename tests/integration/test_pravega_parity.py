"""Pravega parity with the real Pravega client (PyPI ``pravega`` 0.3.8)
against Quire's controller and segment server (one child process,
``tests.support.pravega_stack`` with auto-scaling windows, cooldown and mute
of 2 s and a retention pass every 300 ms):

* streams created with an event-rate or a byte-rate policy split while hot
  keys are written and merge once they stop; a reader group reads every
  event once, in order per routing key, across the scales;
* a transaction open across a scale commits (rolled over), its events after
  everything written before its commit; a 600 s lease is accepted;
* a reader group created at the tail, then two acknowledged writes: the
  first slice holds both, 20 runs out of 20;
* retention by size and by time truncates within its limits; a subscriber
  holds truncation until it has read, up to the maximum;
* the CLI describes a live reader group of the client (positions, lag).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pravega_client
import pytest
from click.testing import CliRunner

from quire.cli.main import cli
from quire.errors import ControllerInvalidArgumentError
from quire.streams import ControllerClient, RemoteSegmentStore, StreamWriter, tail_cut
from quire.streams.reader_groups import create_reader_group, list_subscribers, report_read
from tests.support.pravega_reading import Stack, by_routing_key, pravega_stack, read_slices
from tests.support.stream_stack import wait_for, with_stream_clients

KEYS = 16


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with pravega_stack("1000", "--autoscale-s", "2", "--retention-ms", "300") as started:
        yield started


def current_ids(stack: Stack, scope: str, stream: str) -> list[int]:
    async def ids(controller: ControllerClient, _s: RemoteSegmentStore) -> list[int]:
        return [s.id for s in await controller.current_segments(scope, stream)]
    return with_stream_clients(stack.uri, ids)


def describe(stack: Stack, scope: str, stream: str) -> dict[str, Any]:
    async def go(controller: ControllerClient, _s: RemoteSegmentStore) -> dict[str, Any]:
        found: dict[str, Any] = await controller.admin("describeStream",
                                                       {"scope": scope, "stream": stream})
        return found
    return with_stream_clients(stack.uri, go)


def write_until(writer: pravega_client.StreamWriter, rate: float, done: Any,
                numbers: dict[str, int], pad: str = "", timeout_s: float = 30) -> None:
    """Write ``key:n[:pad]`` events over KEYS keys at about ``rate`` a second
    until ``done()`` (the load's pace is the point, hence the sleeps)."""
    deadline = time.monotonic() + timeout_s
    k = 0
    while not done():
        assert time.monotonic() < deadline, "the stream did not scale"
        for _ in range(2):
            key = f"k{k % KEYS}"
            k += 1
            n = numbers.get(key, 0)
            writer.write_event(f"{key}:{n}:{pad}" if pad else f"{key}:{n}", routing_key=key)
            numbers[key] = n + 1
        time.sleep(2 / rate)  # the load's pace


@pytest.mark.parametrize("policy", ["events", "kbytes"])
def test_an_auto_scaled_stream_splits_when_hot_and_merges_when_cold(
        stack: Stack, policy: str) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    scope = f"auto-{policy}"
    assert manager.create_scope(scope)
    scaling = pravega_client.StreamScalingPolicy
    # about 30 events/s: one segment is hot; split in two, neither is
    if policy == "events":
        chosen = scaling.auto_scaling_policy_by_event_rate(20, 2, 1)
    else:  # events of ~100 B: ~3 KiB/s against a target of 2 KiB/s
        chosen = scaling.auto_scaling_policy_by_data_rate(2, 2, 1)
    assert manager.create_stream_with_policy(scope, "s", chosen,
                                             pravega_client.StreamRetentionPolicy.none(), [])
    group = manager.create_reader_group("all", scope, "s")
    writer = manager.create_writer(scope, "s", 32)
    numbers: dict[str, int] = {}
    pad = "x" * 90 if policy == "kbytes" else ""
    write_until(writer, 30, lambda: len(current_ids(stack, scope, "s")) > 1, numbers, pad)
    split = current_ids(stack, scope, "s")
    # a trickle, cold, until the merge: the writer follows each scale as it
    # happens (the Pravega client cannot follow a segment whose successors
    # were sealed before it saw them: a writer idle across a split and the
    # merge of its parts fails)
    write_until(writer, 2, lambda: len(current_ids(stack, scope, "s")) == 1, numbers, pad)
    write_until(writer, 30, lambda: sum(numbers.values()) % KEYS == 0, numbers, pad)
    writer.flush()
    total = sum(numbers.values())
    reader = group.create_reader("r")
    got = asyncio.run(read_slices(reader, total, time.monotonic() + 60))
    if policy == "kbytes":
        got = [":".join(e.split(":")[:2]) for e in got]
    assert by_routing_key(got) == {k: list(range(n)) for k, n in numbers.items()}
    reasons = [e["reason"] for e in describe(stack, scope, "s")["epochs"]]
    assert "auto-split" in reasons and "auto-merge" in reasons, reasons
    assert len(split) >= 2


def test_a_transaction_open_across_a_scale_commits_after_it(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("rolling")
    assert manager.create_stream("rolling", "s", 1)
    writer = manager.create_writer("rolling", "s")
    txn_writer = manager.create_transaction_writer("rolling", "s", 9)  # its pinger lives with it
    txn = txn_writer.begin_txn()
    for n in range(5):
        writer.write_event(f"a:{n}", routing_key="a")
        txn.write_event(f"a:{10 + n}", routing_key="a")
    writer.flush()

    async def split(controller: ControllerClient, _s: RemoteSegmentStore) -> None:
        epoch = await controller.scale("rolling", "s", [0], [(0.0, 0.5), (0.5, 1.0)])
        assert await controller.scale_done("rolling", "s", epoch)
    with_stream_clients(stack.uri, split)
    for n in range(5, 10):
        writer.write_event(f"a:{n}", routing_key="a")  # after the scale, before the commit
    writer.flush()
    for n in range(15, 20):
        txn.write_event(f"a:{n}", routing_key="a")  # the transaction still takes events
    txn.commit()
    # a new writer: the Pravega client's cannot follow a segment whose
    # successors are sealed already (the roll's first epoch), as Pravega's
    # controller names them too
    writer = manager.create_writer("rolling", "s")
    for n in range(20, 25):
        writer.write_event(f"a:{n}", routing_key="a")
    writer.flush()
    reader = manager.create_reader_group("all", "rolling", "s").create_reader("r")
    assert by_routing_key(asyncio.run(read_slices(reader, 25, time.monotonic() + 30))) == \
        {"a": list(range(25))}
    assert [e["reason"] for e in describe(stack, "rolling", "s")["epochs"]] == \
        ["", "manual", "rolling-txn", "rolling-txn"]

    async def leases(controller: ControllerClient, _s: RemoteSegmentStore) -> None:
        long = await controller.create_transaction("rolling", "s", 600_000)
        await controller.abort_transaction("rolling", "s", long.id)
        with pytest.raises(ControllerInvalidArgumentError):
            await controller.create_transaction("rolling", "s", 600_001)
    with_stream_clients(stack.uri, leases)


def test_the_first_slice_at_the_tail_holds_every_event_acknowledged_before(
        stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("tail")
    firsts = []
    for run in range(20):
        assert manager.create_stream("tail", f"s{run}", 1)
        writer = manager.create_writer("tail", f"s{run}")
        writer.write_event("before")
        group = manager.create_reader_group(f"g{run}", "tail", f"s{run}", True)
        reader = group.create_reader("r")  # its first read is at the tail, now
        writer.write_event("one")
        writer.write_event("two")

        async def first(r: pravega_client.StreamReader = reader) -> list[str]:
            piece = await asyncio.wait_for(r.get_segment_slice_async(), 10)
            got = [event.data().decode() for event in piece]
            r.release_segment(piece)
            r.reader_offline()
            return got
        firsts.append(asyncio.run(first()))
    assert firsts == [["one", "two"]] * 20


def test_retention_by_size_and_by_time_truncates_within_its_limits(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("kept")
    retention = pravega_client.StreamRetentionPolicy
    fixed = pravega_client.StreamScalingPolicy.fixed_scaling_policy(1)
    assert manager.create_stream_with_policy("kept", "size", fixed, retention.by_size(2000), [])
    assert manager.create_stream_with_policy("kept", "time", fixed, retention.by_time(1500), [])
    written: list[tuple[float, int]] = []  # (when, end offset) of each event of "time"
    by_size = manager.create_writer("kept", "size")
    by_time = manager.create_writer("kept", "time")
    end = 0
    for _ in range(40):
        by_size.write_event("x" * 92)  # 100 bytes with its header
        by_time.write_event("y" * 92)
        end += 100
        written.append((time.monotonic(), end))
        time.sleep(0.05)  # the load's pace: 2 s of writes

    def head(stream: str) -> tuple[int, int]:
        async def go(controller: ControllerClient, segments: RemoteSegmentStore
                     ) -> tuple[int, int]:
            cut = await controller.head_cut("kept", stream)
            return cut[0], (await tail_cut(controller, segments, "kept", stream))[0]
        return with_stream_clients(stack.uri, go)

    wait_for(lambda: head("size")[0] > 0, "retention by size", 20)
    start, length = head("size")
    assert length - start >= 2000
    wait_for(lambda: head("time")[0] > 0, "retention by time", 20)
    start, _length = head("time")
    now = time.monotonic()
    assert all(now - when >= 1.5 for when, end in written if end <= start)


def test_a_subscriber_holds_truncation_until_it_has_read(stack: Stack) -> None:
    """Two streams written alike, "a" with a subscriber that has read
    nothing, "b" without: once "b" is truncated, "a" was looked at in the
    same retention pass (streams are passed in name order) and kept whole."""
    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> None:
        await controller.create_scope("subs")
        writers = []
        for stream in ("a", "b"):
            await controller.create_stream("subs", stream, 1, "size", 500, retention_max=6000)
            writers.append(StreamWriter(controller, segments, "subs", stream))
            await writers[-1].start()
        group = await create_reader_group(controller, "subs", "audit", {"a": {}})
        assert await list_subscribers(controller, "subs", "a") == ["subs/audit"]
        assert await list_subscribers(controller, "subs", "b") == []

        async def head(stream: str) -> int:
            return (await controller.head_cut("subs", stream))[0]

        async def until(condition: Any) -> None:
            async with asyncio.timeout(20):
                while not await condition():
                    await asyncio.sleep(0.05)  # polling the controller, with a deadline

        async def write(count: int) -> None:
            for w in writers:
                await asyncio.gather(*(w.write_event(b"z" * 92) for _ in range(count)))

        for _ in range(4):  # 4000 bytes, in four steps a retention pass apart
            await write(10)
            await asyncio.sleep(0.4)  # the load's pace: cuts recorded in between
        await until(lambda: _positive(head("b")))
        assert await head("a") == 0  # held: its subscriber has read nothing
        read = await tail_cut(controller, segments, "subs", "a")
        await report_read(controller, "subs", "a", "audit", group["id"], group["generation"],
                          read)
        await until(lambda: _positive(head("a")))
        assert await head("a") <= read[0] and read[0] - await head("a") >= 500
        for _ in range(5):  # 10000 bytes more: past the maximum, read or not
            await write(20)
            await asyncio.sleep(0.4)  # the load's pace: cuts recorded in between
        await until(lambda: _past(head("a"), read[0]))
        length = (await tail_cut(controller, segments, "subs", "a"))[0]
        assert length - await head("a") >= 500
        for w in writers:
            await w.close()
    with_stream_clients(stack.uri, go)


async def _positive(value: Any) -> bool:
    return bool(await value > 0)


async def _past(value: Any, limit: int) -> bool:
    return bool(await value > limit)


def test_the_cli_describes_a_live_reader_group_of_the_client(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("cli")
    assert manager.create_stream("cli", "s", 2)
    writer = manager.create_writer("cli", "s")
    for n in range(10):
        writer.write_event(f"k{n % 2}:{n}", routing_key=f"k{n % 2}")
    writer.flush()
    group = manager.create_reader_group("watchers", "cli", "s")
    reader = group.create_reader("reader-1")

    def quire(*args: str) -> Any:
        result = CliRunner().invoke(cli, [*args, "--controller", stack.uri, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    listed = quire("readergroup", "list", "cli")
    assert [g["group"] for g in listed] == ["cli/watchers"]
    described = quire("readergroup", "describe", "cli/watchers")
    assert described["streams"] == ["cli/s"]
    held = described["readers"]["reader-1"]
    assert sorted(held) == ["cli/s/0.#epoch.0", "cli/s/1.#epoch.0"]
    assert sum(at["lag_bytes"] for at in held.values()) == sum(
        8 + len(f"k{n % 2}:{n}") for n in range(10))
    reader.reader_offline()
    assert quire("readergroup", "delete", "cli/watchers") == {"group": "cli/watchers",
                                                               "deleted": True}
    assert quire("readergroup", "list", "cli") == []
