"""Pravega parity in-process: the segment store's hot and cold rules, the
controller's auto-scaling, rolling transactions, updateStream, retention
with subscribers, reader groups, tags, several controllers, and the
client's failover."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest

from quire.controller.cluster import MetadataCluster
from quire.controller.core import ControllerCore
from quire.controller.cuts import retention_cut
from quire.controller.model import (
    RecordedCut,
    RetentionType,
    ScaleType,
    StreamConfig,
    StreamRecord,
    TxnRecord,
    TxnState,
    segment_id,
    segment_name,
    txn_segment_name,
)
from quire.controller_api import Controller_pb2 as pb
from quire.errors import ControllerConcurrentUpdateError, QuireError
from quire.metadata import MetadataStore, open_store
from quire.segmentstore import SegmentType
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.scale_requests import ScaleRequests
from quire.segmentstore.segment_rates import (
    BY_EVENTS,
    SCALE_POLICY_RATE_KEY,
    SCALE_POLICY_TYPE_KEY,
    AutoScaleMonitor,
    AutoScalerConfig,
    ScaleRequest,
    policy_attributes,
)
from quire.streams import ControllerClient
from tests.support.controller import Cluster, make_cluster
from tests.unit.test_controller import info, make_stream


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = await make_cluster()
    yield c
    await c.stop()
    await c.metadata.close()


def core(c: Cluster) -> ControllerCore:
    assert c.controller is not None
    return c.controller.core


# --- the segment store's rules ---------------------------------------------------------


class Container:
    """What the monitor reads of a container."""

    def __init__(self) -> None:
        self.committed = self.accepted = ContainerMetadata(0)

    def record(self, sid: int, size: int, events: int) -> None:
        """What the container's append path counts of an append."""
        s = self.accepted.segments[sid]
        s.appended_bytes += size
        s.appended_events += events

    def add(self, sid: int, name: str, policy: dict[int, int] | None = None) -> None:
        self.committed.segments[sid] = SegmentMetadata(sid, name, SegmentType.STREAM,
                                                       attributes=dict(policy or {}))


def test_a_hot_segment_is_reported_for_a_split_then_muted_and_an_idle_one_as_cold() -> None:
    monitor = AutoScaleMonitor(AutoScalerConfig.every(2))  # windows, cooldown, mute: 2 s
    c = Container()
    c.add(1, "sc/st/0.#epoch.0", policy_attributes(BY_EVENTS, 10))
    c.add(2, "sc/st/0.#epoch.0#transaction.00000000000000000000000000000001")
    c.add(3, "sc/other/0.#epoch.0")  # no policy: not followed
    now = 0
    assert monitor.tick([c], now) == []  # first seen: the cooldown starts
    requests: list[ScaleRequest] = []
    for _ in range(20):  # 4 s at 100 events/s, half of them through the transaction
        now += 200
        c.record(1, 1000, 10)
        c.record(2, 1000, 10)
        c.record(3, 1000, 10)
        requests += monitor.tick([c], now)
    assert [(r.segment_id, r.up) for r in requests] == [(0, True)]  # once: then muted
    assert requests[0].splits == 10  # 100 events/s against 10
    assert requests[0].timestamp_ms > 2000  # not within the cooldown
    assert monitor.rates("sc/other/0.#epoch.0") is None
    requests = []
    for _ in range(100):  # idle: the rates decay below the target
        now += 200
        requests += monitor.tick([c], now)
    downs = [r for r in requests if not r.up]  # still hot for a moment, then cold
    assert downs and all(r.segment_id == 0 for r in downs)
    assert all(b.timestamp_ms - a.timestamp_ms > 2000 for a, b in itertools.pairwise(downs))
    c.committed.segments[1].sealed = True  # sealed: no longer followed
    assert monitor.tick([c], now + 200) == []
    assert monitor.rates("sc/st/0.#epoch.0") is None


async def test_a_store_learns_a_segment_policy_from_its_attributes(cluster: Cluster) -> None:
    await cluster.stub.createScope(pb.ScopeInfo(scope="sc"))
    answer = await cluster.stub.createStream(pb.StreamConfig(
        streamInfo=info(), scalingPolicy=pb.ScalingPolicy(
            scaleType=pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC, targetRate=100,
            scaleFactor=3, minNumSegments=2)))
    assert answer.status == pb.CreateStreamStatus.SUCCESS
    keys = [SCALE_POLICY_TYPE_KEY, SCALE_POLICY_RATE_KEY]
    for n in range(2):
        assert await cluster.segments.get_attributes(segment_name("sc", "st", n), keys) == \
            {SCALE_POLICY_TYPE_KEY: BY_EVENTS, SCALE_POLICY_RATE_KEY: 100}
    config = await cluster.stub.getStreamConfiguration(info())
    assert (config.scalingPolicy.scaleType, config.scalingPolicy.targetRate,
            config.scalingPolicy.scaleFactor) == (pb.ScalingPolicy.BY_RATE_IN_EVENTS_PER_SEC,
                                                  100, 3)
    # updateStream: the new policy reaches every active segment
    answer = await cluster.stub.updateStream(pb.StreamConfig(
        streamInfo=info(), scalingPolicy=pb.ScalingPolicy(
            scaleType=pb.ScalingPolicy.BY_RATE_IN_KBYTES_PER_SEC, targetRate=7,
            scaleFactor=2, minNumSegments=2)))
    assert answer.status == pb.UpdateStreamStatus.SUCCESS
    assert await cluster.segments.get_attributes(segment_name("sc", "st", 1), keys) == \
        {SCALE_POLICY_TYPE_KEY: 1, SCALE_POLICY_RATE_KEY: 7}


# --- the controller's auto-scaling -----------------------------------------------------


async def test_requests_split_hot_segments_and_merge_cold_neighbours(cluster: Cluster) -> None:
    c = core(cluster)
    c.requests = requests = ScaleRequests(cluster.metadata)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", StreamConfig(
        1, scale_type=ScaleType.BY_RATE_IN_EVENTS_PER_SEC, target_rate=10, scale_factor=3))
    now = c.now_ms()
    await requests.post(ScaleRequest("sc", "st", 0, True, 7, now))
    await c.autoscale()
    current = (await c.stream("sc", "st")).current
    assert [(s.min_key, s.max_key) for s in current.segments] == \
        [(0.0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.0)]  # 7 asked, the scale factor allows 3
    assert await requests.pending() == []
    ids = [s.id for s in current.segments]
    await requests.post(ScaleRequest("sc", "st", ids[0], False, 0, now))
    await c.autoscale()  # one cold segment: marked, nothing merged
    assert (await c.stream("sc", "st")).current.ids() == set(ids)
    await requests.post(ScaleRequest("sc", "st", ids[1], False, 0, now))
    await requests.post(ScaleRequest("sc", "st", 99, True, 2, now))  # not a segment: dropped
    await c.autoscale()
    record = await c.stream("sc", "st")
    assert [(s.min_key, s.max_key) for s in record.current.segments] == \
        [(0.0, 2 / 3), (2 / 3, 1.0)]
    assert [e.reason for e in record.epochs] == ["", "auto-split", "auto-merge"]
    await requests.post(ScaleRequest("sc", "st", ids[2], False, 0, now))
    await requests.post(ScaleRequest("sc", "st", record.current.segments[0].id, False, 0,
                                     now))
    await c.autoscale()  # the minimum is one segment
    assert len((await c.stream("sc", "st")).current.segments) == 1
    await requests.post(ScaleRequest("sc", "st", (await c.stream("sc", "st")).current
                                     .segments[0].id, True, 2, now - 10 ** 9))
    await c.autoscale()  # too old
    assert len((await c.stream("sc", "st")).current.segments) == 1


async def test_update_stream_scales_to_a_changed_fixed_count(cluster: Cluster) -> None:
    await make_stream(cluster, 2)
    answer = await cluster.stub.updateStream(pb.StreamConfig(
        streamInfo=info(), scalingPolicy=pb.ScalingPolicy(minNumSegments=4),
        tags=pb.Tags(tag=["blue"])))
    assert answer.status == pb.UpdateStreamStatus.SUCCESS
    record = await core(cluster).stream("sc", "st")
    assert [(s.min_key, s.max_key) for s in record.current.segments] == \
        [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]
    assert record.epochs[-1].reason == "update" and record.config.tags == ("blue",)
    await make_stream(cluster, 1, stream="plain")
    listed = await cluster.stub.listStreamsInScopeForTag(pb.StreamsInScopeWithTagRequest(
        scope=pb.ScopeInfo(scope="sc"), tag="blue"))
    assert [s.stream for s in listed.streams] == ["st"]


# --- rolling transactions --------------------------------------------------------------


async def test_a_transaction_open_across_a_scale_rolls_over_when_committed(
        cluster: Cluster) -> None:
    c, segments = core(cluster), cluster.segments
    await make_stream(cluster, 1)
    txn_id, _epoch = await c.create_transaction("sc", "st", 600_000)
    empty_id, _ = await c.create_transaction("sc", "st", 1000)
    await segments.append(txn_segment_name("sc", "st", 0, txn_id), b"txn;")
    await segments.append(segment_name("sc", "st", 0), b"before;")
    await c.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])  # open transactions do not block it
    await segments.append(segment_name("sc", "st", segment_id(1, 1)), b"after;")
    await c.end_transaction("sc", "st", empty_id, commit=True)  # nothing written: no roll
    assert len((await c.stream("sc", "st")).epochs) == 2
    await c.end_transaction("sc", "st", txn_id, commit=True)
    record = await c.stream("sc", "st")
    assert [e.reason for e in record.epochs] == ["", "manual", "rolling-txn", "rolling-txn"]
    duplicate = segment_id(2, 0)
    assert [s.id for s in record.epochs[2].segments] == [duplicate]
    assert [s.id for s in record.current.segments] == [segment_id(3, 1), segment_id(3, 2)]
    info_ = await segments.get_info(segment_name("sc", "st", duplicate))
    assert info_.sealed and (await segments.read(segment_name("sc", "st", duplicate), 0,
                                                 100)).data == b"txn;"
    for sid in (segment_id(1, 1), segment_id(1, 2)):  # epoch 1 sealed, followed by the copy
        assert (await segments.get_info(segment_name("sc", "st", sid))).sealed
        assert [s.id for s, _ in record.successors(sid)] == [duplicate]
    assert sorted(s.id for s, _ in record.successors(duplicate)) == \
        [segment_id(3, 1), segment_id(3, 2)]
    assert await c.transaction_state("sc", "st", txn_id) is TxnState.COMMITTED


async def test_a_commit_asked_again_after_its_roll_failed_half_done_finishes_the_roll(
        cluster: Cluster) -> None:
    """Regression (the stream simulation, seed 100065): a roll marks its
    transaction COMMITTED, then seals the duplicates; when that failed, the
    client's second commit found COMMITTED and answered so, ending the
    workflow note, and the transaction's events stayed in a duplicate no
    epoch named: acknowledged, committed, and never read."""
    c, segments = core(cluster), cluster.segments
    await make_stream(cluster, 1)
    txn_id, _epoch = await c.create_transaction("sc", "st", 600_000)
    await segments.append(txn_segment_name("sc", "st", 0, txn_id), b"txn;")
    await c.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    assert cluster.faulty is not None
    cluster.faulty.fail_at["seal"] = 1  # merged, marked COMMITTED, then the first seal fails
    with pytest.raises(QuireError):
        await c.end_transaction("sc", "st", txn_id, commit=True)
    assert await c.transaction_state("sc", "st", txn_id) is TxnState.COMMITTED
    assert (await c.stream("sc", "st")).roll is not None  # half done
    assert await c.end_transaction("sc", "st", txn_id, commit=True) is TxnState.COMMITTED
    record = await c.stream("sc", "st")
    assert record.roll is None
    assert [e.reason for e in record.epochs] == ["", "manual", "rolling-txn", "rolling-txn"]
    duplicate = segment_id(2, 0)
    assert (await segments.read(segment_name("sc", "st", duplicate), 0, 100)).data == b"txn;"
    assert (await segments.get_info(segment_name("sc", "st", duplicate))).sealed
    assert await c.state.works() == []


async def test_an_abort_after_a_scale_failed_half_done_finishes_the_scale(
        cluster: Cluster) -> None:
    """A workflow's note is one per stream and controller: an abort that
    ended normally after a scale had failed half done removed the note the
    sweeper would have finished the scale from, and the stream kept a sealed
    segment with no successor in its current epoch.  Every transaction's
    end finishes a pending scale first now."""
    c, segments = core(cluster), cluster.segments
    await make_stream(cluster, 1)
    txn_id, _epoch = await c.create_transaction("sc", "st", 600_000)
    assert cluster.faulty is not None
    cluster.faulty.fail_at["seal"] = 1  # the successors are created, the seal fails
    with pytest.raises(QuireError):
        await c.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    assert (await c.stream("sc", "st")).scale is not None  # half done
    assert await c.end_transaction("sc", "st", txn_id, commit=False) is TxnState.ABORTED
    record = await c.stream("sc", "st")
    assert record.scale is None and record.current.epoch == 1
    assert (await segments.get_info(segment_name("sc", "st", 0))).sealed
    assert await c.state.works() == []


# --- retention --------------------------------------------------------------------------


def test_retention_keeps_the_minimum_holds_for_subscribers_and_forces_the_maximum() -> None:
    record = StreamRecord.new(StreamConfig(1, RetentionType.SIZE, 100, 1000), 0)
    record.retention_cuts = [RecordedCut(t, size, {0: size})
                             for t, size in [(1, 100), (2, 500), (3, 900), (4, 1500)]]
    # 2000 bytes now: the latest cut keeping >= 100 bytes after it
    assert retention_cut(record, 10, 2000) == record.retention_cuts[3]
    # a subscriber at 1200: held at the latest cut at or before it
    assert retention_cut(record, 10, 2000, [{0: 1200}]) == record.retention_cuts[2]
    # a subscriber at 50: nothing read, but 1950 bytes behind it exceed the maximum:
    # truncated at the latest cut keeping at least the maximum (1100 bytes)
    assert retention_cut(record, 10, 2000, [{0: 50}]) == record.retention_cuts[2]
    # without a maximum, a subscriber at 600 holds it at 500, one at 50 before any cut
    record.config = StreamConfig(1, RetentionType.SIZE, 100)
    assert retention_cut(record, 10, 2000, [{0: 600}, {0: 1800}]) == record.retention_cuts[1]
    assert retention_cut(record, 10, 2000, [{0: 50}]) is None
    # no cut keeps the minimum: nothing
    record.config = StreamConfig(1, RetentionType.SIZE, 5000)
    assert retention_cut(record, 10, 2000, [{0: 2000}]) is None
    record.config = StreamConfig(1)
    assert retention_cut(record, 10, 2000) is None


async def test_reader_groups_subscribe_and_report_what_they_read(cluster: Cluster) -> None:
    stub = cluster.stub
    await make_stream(cluster, 1)
    created = await stub.createReaderGroup(pb.ReaderGroupConfiguration(
        scope="sc", readerGroupName="rg", retentionType=1,
        startingStreamCuts=[pb.StreamCut(streamInfo=info(), cut={0: 0})]))
    assert created.status == pb.CreateReaderGroupResponse.SUCCESS
    group_id = created.config.readerGroupId
    assert group_id and created.config.generation == 0
    assert list((await stub.listSubscribers(info())).subscribers) == ["sc/rg"]
    await cluster.segments.append(segment_name("sc", "st", 0), b"x" * 10)

    async def report(offset: int, generation: int = 0, subscriber: str = "sc/rg") -> int:
        status: int = (await stub.updateSubscriberStreamCut(pb.SubscriberStreamCut(
            subscriber=subscriber, generation=generation, readerGroupId=group_id,
            streamCut=pb.StreamCut(streamInfo=info(), cut={0: offset})))).status
        return status
    assert await report(10) == pb.UpdateSubscriberStatus.SUCCESS
    assert await report(10, generation=5) == pb.UpdateSubscriberStatus.GENERATION_MISMATCH
    assert await report(10, subscriber="sc/nope") == \
        pb.UpdateSubscriberStatus.SUBSCRIBER_NOT_FOUND
    bad = await stub.updateSubscriberStreamCut(pb.SubscriberStreamCut(
        subscriber="sc/rg", readerGroupId=group_id,
        streamCut=pb.StreamCut(streamInfo=info(), cut={7: 0})))
    assert bad.status == pb.UpdateSubscriberStatus.STREAM_CUT_NOT_VALID
    found = await core(cluster).state.subscriber("sc", "st", "sc/rg")
    assert found is not None and found[0]["cut"] == [[0, 10]]
    updated = await stub.updateReaderGroup(pb.ReaderGroupConfiguration(
        scope="sc", readerGroupName="rg", retentionType=0))
    assert (updated.status, updated.generation) == (pb.UpdateReaderGroupResponse.SUCCESS, 1)
    assert list((await stub.listSubscribers(info())).subscribers) == []  # no retention: none
    config = await stub.getReaderGroupConfig(pb.ReaderGroupInfo(scope="sc", readerGroup="rg"))
    assert config.config.generation == 1 and config.config.readerGroupId == group_id
    assert (await stub.deleteReaderGroup(pb.ReaderGroupInfo(
        scope="sc", readerGroup="rg"))).status == pb.DeleteReaderGroupStatus.SUCCESS
    assert (await stub.getReaderGroupConfig(pb.ReaderGroupInfo(
        scope="sc", readerGroup="rg"))).status == pb.ReaderGroupConfigResponse.RG_NOT_FOUND


# --- several controllers ---------------------------------------------------------------


async def two_controllers(cluster: Cluster, faulty: str, sound: str
                          ) -> tuple[tuple[ControllerCore, MetadataStore],
                                     tuple[ControllerCore, MetadataStore]]:
    """Two more controllers of ``cluster``, each with its metadata session:
    ``faulty`` on the segment store whose calls can be made to fail, ``sound``
    on the store itself."""
    name = f"memory://controllers-{id(cluster)}"
    out = []
    for member, segments in ((faulty, cluster.faulty), (sound, cluster.segments)):
        metadata = await open_store(name)
        out.append((ControllerCore(segments, core(cluster).config,  # type: ignore[arg-type]
                                   cluster=MetadataCluster(metadata, f"{member}:1")),
                    metadata))
    return out[0], out[1]


async def test_the_leader_finishes_a_scale_its_dead_controller_left(cluster: Cluster) -> None:
    await make_stream(cluster, 2)
    (dead, dead_metadata), (live, live_metadata) = await two_controllers(cluster, "dead",
                                                                         "live")
    await dead.start()
    assert cluster.faulty is not None
    cluster.faulty.fail_at["seal"] = 1  # its scale: successors created, then it "dies"
    with pytest.raises(Exception):  # noqa: B017 (the injected failure)
        await dead.scale("sc", "st", [1], [(0.5, 0.75), (0.75, 1.0)])
    assert (await live.stream("sc", "st")).scale is not None
    await dead_metadata.close()  # its lease ends with it
    await live.start()
    await live.cluster._election.wait_leader()  # type: ignore[attr-defined]
    await live.sweep()
    record = await live.stream("sc", "st")
    assert record.scale is None and len(record.epochs) == 2
    assert [r for r in await live.state.works() if r[2] == dead.cluster.member] == []
    await live.close()
    await live_metadata.close()


async def test_one_controller_at_a_time_makes_a_new_streams_segments() -> None:
    """A creation left half done is finished by one controller at a time
    (the creator claims the CREATING record): two at once, the stream went
    ACTIVE, was truncated past its first segments (deleted), and the other's
    late create made one again, where a writer's events were acknowledged
    in no epoch (the stream simulation, seed 108706)."""
    # (the cluster's own controller, which sees no other member alive, sweeps
    # no notes meanwhile)
    cluster = await make_cluster(txn_sweep_interval_ms=3_600_000)
    (first, first_metadata), (second, second_metadata) = await two_controllers(
        cluster, "first", "second")
    await first.start()
    await second.start()
    await first.create_scope("sc")
    assert cluster.faulty is not None
    cluster.faulty.fail_at["create_segment"] = 2  # its transactions table, then a segment
    with pytest.raises(QuireError):  # the injected failure: its creation half done
        await first.create_stream("sc", "st", StreamConfig(2))
    found = await second.state.stream("sc", "st")
    assert found is not None and found[0].creator == first.cluster.member
    with pytest.raises(ControllerConcurrentUpdateError):  # the first lives: its to finish
        await second.create_stream("sc", "st", StreamConfig(2))
    await first.close()
    await first_metadata.close()  # the first is gone: the second takes the creation over
    assert await second.create_stream("sc", "st", StreamConfig(2)) is True
    record = await second.stream("sc", "st")
    assert record.creator == "" and len(record.current.segments) == 2
    for s in record.current.segments:
        assert not (await cluster.segments.get_info(segment_name("sc", "st", s.id))).sealed
    await second.close()
    await second_metadata.close()
    await cluster.stop()
    await cluster.metadata.close()


async def test_the_client_fails_over_to_the_next_controller(cluster: Cluster) -> None:
    assert cluster.controller is not None and cluster.controller.port is not None
    async with ControllerClient(f"tcp://127.0.0.1:1,127.0.0.1:{cluster.controller.port}",
                                timeout_ms=5_000) as client:
        assert await client.create_scope("sc")
        assert await client.list_scopes() == ["sc"]
        assert (await client.admin("cluster", {}))["leader"] is True


def test_a_pending_scale_or_roll_already_names_the_successors() -> None:
    """A writer told its segment is sealed asks for the successors before the
    new epoch is recorded: they exist, and are answered."""
    record = StreamRecord.new(StreamConfig(2), 0)
    record.scale = record.plan_scale([0], [(0.0, 0.25), (0.25, 0.5)], 5)
    assert [s.id for s, _ in record.successors(0)] == [segment_id(1, 2), segment_id(1, 3)]
    assert record.successors(1) == []
    record.apply_scale(record.scale)
    txn = TxnRecord(0, (0, 1), TxnState.COMMITTING, 0)
    record.roll = record.plan_roll(txn, 6)
    assert [s.id for s, _ in record.successors(segment_id(1, 2))] == [segment_id(2, 0)]
    assert [s.id for s, _ in record.successors(segment_id(2, 0))] == \
        [segment_id(3, 2), segment_id(3, 3)]
    assert record.find(segment_id(3, 1)) is not None
