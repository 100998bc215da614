"""Which segment store hosts which container: leased hosts, one assignment.

Every segment store process registers itself as a *leased* record
``segmentstore/hosts/<host id>`` holding its wire address (and its HTTP
address, ``metrics``, when it serves one: the controller's cluster page
reads it there); the record lives
while the process's metadata-store lease does, so a process that dies (or
is cut off from the store) drops out on its own.  One of them, elected
through the store (group ``segmentstore/assigner``), is the **assigner**:
every ``rebalance_interval_ms`` it lists the live hosts and, when the set
changed, writes the one assignment record ``segmentstore/assignment``
(container id -> host id, JSON) by compare-and-set.  Every host watches
that record and converges on it: it starts the containers assigned to it
(opening a container takes its tier-1 log's epoch, which fences the
previous owner, so a host that is only slow, not dead, fails every later
operation with ContainerFencedError) and stops those assigned elsewhere.

While its lease is uncertain (cut off from the store, or not yet past an
expiry), a host keeps its containers: writes stay safe, as a log another
host took refuses them, and stopping every container at each metadata
hiccup would turn it into an outage of the data path.  Reads are not
fenced that way, so meanwhile the host sets the store's
:attr:`~quire.segmentstore.store.SegmentStore.confirm_reads`: each read
first proves through tier-1 that its container is still this host's, and
is refused (WrongHost) once another host took it over.  (Pravega's segment
store keeps its containers across a lost ZooKeeper connection too: its
container monitor acts on the last assignment it saw.)

The assignment is sticky and balanced (:func:`balanced_assignment`): a
container stays where it is while its host lives and holds no more than
its fair share, so a host joining or leaving moves only the containers it
must.  The record is the truth for clients too: :func:`owner_address` is
what the controller's ``getURI`` answers, and a host asked about a
container it does not host (or has not finished opening) answers WrongHost.

Pravega's controller assigns containers the same way (a leased host
registry and one assignment map); there the controller itself is the
assigner, here any segment store may be, which keeps the controller out
of the write path of ownership.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quire.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from quire.metadata import Election, LeaseState, MetadataStore, Versioned, Watch
from quire.segmentstore.store import SegmentStore

log = logging.getLogger(__name__)

HOSTS_PREFIX = "segmentstore/hosts/"
ASSIGNMENT_KEY = "segmentstore/assignment"
ASSIGNER_GROUP = "segmentstore/assigner"


@dataclass(frozen=True, slots=True)
class OwnershipSettings:
    rebalance_interval_ms: int = 1000
    """How often the assigner lists the live hosts (and a host retries a
    container that failed to open or failed later)."""
    register_wait_ms: int = 60_000
    """How long a starting host waits for the host record of its previous
    run to go (a restart after ``kill -9`` is usually faster than the old
    metadata session's timeout) before it gives up: a record that outlives
    this belongs to another live process with the same host id."""


def balanced_assignment(container_count: int, hosts: Sequence[str],
                        current: Mapping[int, str]) -> dict[int, str]:
    """Every container on a live host, loads within one of each other.

    A container keeps its host while that host is live and below its fair
    share (``ceil(containers / hosts)``); the others go, in container order,
    to the least loaded host (ties: the smallest host id).  No live host:
    nothing is assigned."""
    if not hosts:
        return {}
    fair = math.ceil(container_count / len(hosts))
    load = dict.fromkeys(hosts, 0)
    result: dict[int, str] = {}
    for container in range(container_count):
        host = current.get(container)
        if host in load and load[host] < fair:
            result[container] = host
            load[host] += 1
    for container in range(container_count):
        if container not in result:
            host = min(load, key=lambda h: (load[h], h))
            result[container] = host
            load[host] += 1
    return result


def _decode_assignment(record: Versioned[bytes] | None) -> dict[int, str]:
    if record is None:
        return {}
    return {int(c): h for c, h in json.loads(record.value)["containers"].items()}


def _encode_assignment(assignment: Mapping[int, str]) -> bytes:
    return json.dumps({"containers": {str(c): h for c, h in sorted(assignment.items())}},
                      sort_keys=True).encode()


async def read_assignment(store: MetadataStore) -> tuple[dict[int, str], int | None]:
    """The assignment and its record version (None: no record yet)."""
    try:
        record = await store.read_record(ASSIGNMENT_KEY)
    except MetadataNotFoundError:
        return {}, None
    return _decode_assignment(record), record.version


async def live_hosts(store: MetadataStore) -> dict[str, str]:
    """Host id -> wire address of every registered (live) segment store."""
    hosts: dict[str, str] = {}
    for key in await store.list_records(HOSTS_PREFIX):
        try:
            record = await store.read_record(key)
        except MetadataNotFoundError:
            continue  # its lease ended between the listing and the read
        hosts[key[len(HOSTS_PREFIX):]] = json.loads(record.value)["address"]
    return hosts


async def host_registrations(store: MetadataStore) -> dict[str, dict[str, str]]:
    """Host id -> registration (``address``, and ``metrics`` if it serves
    HTTP) of every live segment store."""
    hosts: dict[str, dict[str, str]] = {}
    for key in await store.list_records(HOSTS_PREFIX):
        try:
            record = await store.read_record(key)
        except MetadataNotFoundError:
            continue
        hosts[key[len(HOSTS_PREFIX):]] = json.loads(record.value)
    return hosts


async def owner_address(store: MetadataStore, container_id: int) -> str | None:
    """The wire address of the live host assigned ``container_id``; None
    while nobody live is (a caller answers "try again", never "no such")."""
    assignment, _version = await read_assignment(store)
    host = assignment.get(container_id)
    if host is None:
        return None
    try:
        record = await store.read_record(HOSTS_PREFIX + host)
    except MetadataNotFoundError:
        return None
    address: str = json.loads(record.value)["address"]
    return address


class ContainerOwnership:
    """One segment store's part in container ownership (module docstring).

    :meth:`start` registers the host and begins converging; :meth:`close`
    stops the containers this host runs and deregisters it."""

    def __init__(self, metadata: MetadataStore, segments: SegmentStore, host_id: str,
                 address: str, settings: OwnershipSettings | None = None,
                 metrics_address: str | None = None) -> None:
        self.metadata = metadata
        self.segments = segments
        self.host_id = host_id
        self.address = address
        self.metrics_address = metrics_address
        self.settings = settings or OwnershipSettings()
        self.assignment: dict[int, str] = {}
        """The assignment as last read from the record (the newest version seen)."""
        self._assignment_version: int | None = None
        self._wake = asyncio.Event()
        self._settled = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._watch: Watch | None = None
        self._lease_watch: Watch | None = None
        self._election: Election | None = None
        self._closed = False
        self._expired = False
        """The lease expired since this host last registered: its host
        record is gone, even if a new lease is live by the time the
        converging loop looks (a ZooKeeper client reconnects with a new
        session at once once a partition heals)."""

    @property
    def mine(self) -> set[int]:
        """The containers the assignment gives this host."""
        return {c for c, h in self.assignment.items() if h == self.host_id}

    async def start(self) -> None:
        await self._register_at_start()
        self._lease_watch = self.metadata.watch_lease(self._on_lease)
        election = self.metadata.elect(ASSIGNER_GROUP, self.host_id)
        self._election = election
        self._watch = self.metadata.watch_record(ASSIGNMENT_KEY, self._on_assignment)
        self._tasks = [asyncio.create_task(self._converge(), name="quire-ownership-converge"),
                       asyncio.create_task(self._assign(election),
                                           name="quire-ownership-assigner")]

    async def _register_at_start(self) -> None:
        """Register, waiting out the record an earlier run of this host left
        (it goes when that run's lease ends)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.register_wait_ms / 1000
        while True:
            try:
                await self._register()
                return
            except MetadataExistsError:
                if loop.time() > deadline:
                    raise MetadataExistsError(
                        f"segment store host {self.host_id!r} is registered by another live "
                        f"process (still after {self.settings.register_wait_ms} ms)") from None
                log.warning("host %s: the record of an earlier run is still there; waiting "
                            "for its lease to end", self.host_id)
            await asyncio.sleep(self.settings.rebalance_interval_ms / 1000)  # polling it

    async def _register(self) -> None:
        record: dict[str, str] = {"address": self.address}
        if self.metrics_address is not None:
            record["metrics"] = self.metrics_address
        await self.metadata.create_leased_record(HOSTS_PREFIX + self.host_id,
                                                 json.dumps(record).encode())

    def _on_lease(self, state: LeaseState) -> None:
        if state is LeaseState.EXPIRED:
            self._expired = True
        self._confirm_reads()
        self._wake.set()

    def _confirm_reads(self) -> None:
        """Reads confirm ownership through tier-1 unless the lease is
        confirmed and no expiry is left to handle (module docstring)."""
        self.segments.confirm_reads = \
            self._expired or self.metadata.lease is not LeaseState.LIVE

    def _on_assignment(self, record: Versioned[bytes] | None) -> None:
        try:
            assignment = _decode_assignment(record)
        except (ValueError, KeyError, TypeError) as e:
            log.error("unreadable container assignment record: %s", e)
            return
        if self._take_assignment(assignment, None if record is None else record.version):
            self._wake.set()

    def _take_assignment(self, assignment: dict[int, str], version: int | None) -> bool:
        """Hold ``assignment`` (record version ``version``) unless the one
        held is newer: a read that started before a change can answer after
        the watch delivered it, and the watch does not deliver that change
        again, so putting the older one back would leave this host on it for
        good (the stream simulation, seed 106609: a container no host opened)."""
        held = self._assignment_version
        if held is not None and (version is None or version < held):
            return False
        self.assignment, self._assignment_version = assignment, version
        return True

    async def wait_converged(self) -> None:
        """Return once this host runs exactly the containers assigned to it
        (as last read), all open."""
        async with self._settled:
            await self._settled.wait_for(self._converged)

    def converged(self) -> bool:
        """Whether this host runs exactly its assigned containers, all open
        (``/ready``), as last read."""
        return self._converged()

    def convergence(self) -> dict[str, Any]:
        """Where this host stands against its assignment, for status and
        diagnostics: the containers assigned to it, those it runs, those
        failed, and those starting or stopping (with the step each waits for)."""
        running = self.segments.container_ids
        return {"assigned": sorted(self.mine), "running": running,
                "failed": [c for c in running if self.segments.container(c).failure is not None],
                **self.segments.transitions}

    def _converged(self) -> bool:
        return set(self.segments.container_ids) == self.mine \
            and all(self.segments.container(c).failure is None for c in self.mine)

    async def _converge(self) -> None:
        interval_s = self.settings.rebalance_interval_ms / 1000
        while not self._closed:
            self._wake.clear()
            try:
                await self._converge_once()
            except MetadataError as e:
                log.warning("converging on the container assignment failed, retrying: %s", e)
            async with self._settled:
                self._settled.notify_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)

    async def _converge_once(self) -> None:
        lease = self.metadata.lease
        if lease is not LeaseState.LIVE or self._expired:
            if lease is LeaseState.UNCERTAIN and not self._expired:
                return  # keep serving (tier-1 fencing keeps that safe), start nothing
            # the host record is gone: others may be opening these containers now
            for container_id in self.segments.container_ids:
                await self.segments.stop_container(container_id)
            if lease in (LeaseState.EXPIRED, LeaseState.LIVE):
                with contextlib.suppress(MetadataExistsError):
                    await self._register()  # a new lease; the assigner sees the host again
                self._expired = False
                self._confirm_reads()
            return
        mine = self.mine
        running = set(self.segments.container_ids)
        for container_id in sorted(running - mine):
            await self.segments.stop_container(container_id)
        failed = [c for c in sorted(running & mine)
                  if self.segments.container(c).failure is not None]
        if failed:
            # fenced or broken while this host is (as last seen) its owner: read the
            # record itself before reopening, so a stale view never fences the owner
            self._take_assignment(*await read_assignment(self.metadata))
            for container_id in failed:
                log.warning("container %d failed (%s)", container_id,
                            self.segments.container(container_id).failure)
                await self.segments.stop_container(container_id)
            mine = self.mine
        results = await asyncio.gather(
            *(self.segments.start_container(c)
              for c in sorted(mine - set(self.segments.container_ids))),
            return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("opening a container failed, retrying: %r", result)

    async def _assign(self, election: Election) -> None:
        interval_s = self.settings.rebalance_interval_ms / 1000
        while not self._closed:
            if election.is_leader:
                try:
                    await self.rebalance()
                except MetadataError as e:
                    log.warning("rebalancing containers failed, retrying: %s", e)
            await asyncio.sleep(interval_s)  # the assigner's period, not a synchronisation

    async def rebalance(self) -> None:
        """Write the balanced assignment for the live hosts if it differs."""
        hosts = sorted(await live_hosts(self.metadata))
        current, version = await read_assignment(self.metadata)
        wanted = balanced_assignment(self.segments.container_count, hosts, current)
        if wanted == current:
            return
        try:
            if version is None:
                await self.metadata.create_record(ASSIGNMENT_KEY, _encode_assignment(wanted))
            else:
                await self.metadata.write_record(ASSIGNMENT_KEY, _encode_assignment(wanted),
                                                 version)
        except (MetadataExistsError, MetadataVersionError):
            return  # another assigner wrote first; the next round reads it
        log.info("container assignment: %s", wanted)

    async def close(self) -> None:
        """Stop converging and assigning, stop this host's containers and
        deregister it (its containers move to the others)."""
        self._closed = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for watch in (self._watch, self._lease_watch):
            if watch is not None:
                watch.cancel()
        if self._election is not None:
            with contextlib.suppress(MetadataError):
                await self._election.resign()
        await self.segments.close()
        with contextlib.suppress(MetadataError):
            await self.metadata.delete_record(HOSTS_PREFIX + self.host_id)
