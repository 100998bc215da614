"""Leader election over a store's leased records, the same for every driver.

The leader of group ``g`` is the candidate named by the leased record
``elections/g/leader``: a candidate leads by creating it, so the store's
create-if-absent makes the leader unique, and the record vanishes with its
creator's lease.  Candidates watch the record and bid again when it goes.
The record holds JSON ``{"candidate": name, "bid": token}``; the token, new
for each :class:`LeaseElection`, tells a candidate's own record from that
of another candidate of the same name.

Observers that do not campaign use :func:`read_leader` and
:func:`watch_leader`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable

from quire.errors import MetadataError, MetadataExistsError, MetadataNotFoundError
from quire.metadata import _names
from quire.metadata._watch import Subscription
from quire.metadata.model import Versioned
from quire.metadata.store import (
    ElectionView,
    Leadership,
    LeaseState,
    MetadataStore,
    Watch,
)

log = logging.getLogger(__name__)

RETRY_DELAY_S = 0.25
"""Pause before bidding again after the store could not be reached."""


def leader_key(group: str) -> str:
    """The record naming ``group``'s leader."""
    _names.check_record_key(group)
    return f"elections/{group}/leader"


def _bid(record: Versioned[bytes]) -> tuple[str, str]:
    """(candidate, bid token) of a leader record."""
    try:
        fields = json.loads(record.value)
        return str(fields["candidate"]), str(fields["bid"])
    except (ValueError, KeyError, TypeError):
        raise MetadataError(f"malformed election record {record.value!r}") from None


async def _read(store: MetadataStore, key: str) -> Versioned[bytes] | None:
    try:
        return await store.read_record(key)
    except MetadataNotFoundError:
        return None


async def read_leader(store: MetadataStore, group: str) -> str | None:
    """The candidate leading ``group`` now (None if nobody does)."""
    record = await _read(store, leader_key(group))
    return None if record is None else _bid(record)[0]


def watch_leader(store: MetadataStore, group: str,
                 callback: Callable[[str | None], None]) -> Watch:
    """Call ``callback`` with ``group``'s leader (None: nobody) now and after
    each change; a malformed record reads as None."""
    def on_record(record: Versioned[bytes] | None) -> None:
        leader = None
        if record is not None:
            try:
                leader = _bid(record)[0]
            except MetadataError as e:
                log.warning("%s: %s", store.uri, e)
        callback(leader)

    return store.watch_record(leader_key(group), on_record)


class LeaseElection:
    """:class:`~quire.metadata.store.Election` on a leased record.

    One task bids and re-reads whenever the record or the store's lease
    changes; the standing it reports combines what that task last learnt
    (``_held``: the record is ours, not ours, or unknown after a failed
    request) with the store's lease as it is at the moment of asking.

    The record watch is armed again after each read and compared with that
    read: a watch skips values equal to the last one *it* delivered, so a
    record created and deleted while the task read it directly would
    otherwise look unchanged.
    """

    def __init__(self, store: MetadataStore, group: str, candidate: str) -> None:
        if not isinstance(candidate, str) or not candidate:
            raise ValueError(f"candidate must be a non-empty str, got {candidate!r}")
        self.group = group
        self.candidate = candidate
        self._store = store
        self._key = leader_key(group)
        self._token = uuid.uuid4().hex
        self._value = json.dumps({"candidate": candidate, "bid": self._token}).encode()
        self._held: bool | None = False
        self._seen: str | None = None  # bid token of the record last read (None: absent)
        self._leader: str | None = None
        self._ended = False
        self._changed = asyncio.Event()
        self._published = ElectionView(Leadership.FOLLOWER, None)
        self._subs: set[Subscription[ElectionView]] = set()
        self._waiters: set[asyncio.Future[None]] = set()
        self._lease_watch = store.watch_lease(self._on_lease)
        self._record_watch: Watch | None = None
        self._task = asyncio.get_running_loop().create_task(self._campaign())

    # --- what the candidate knows ------------------------------------------

    @property
    def state(self) -> Leadership:
        if self._ended:
            return Leadership.ENDED
        lease = self._store.lease
        if lease is LeaseState.CLOSED:
            return Leadership.ENDED
        if self._held is False or lease is LeaseState.EXPIRED:
            return Leadership.FOLLOWER
        if self._held is True and lease is LeaseState.LIVE:
            return Leadership.LEADER
        return Leadership.UNCERTAIN

    @property
    def is_leader(self) -> bool:
        return self.state is Leadership.LEADER

    @property
    def leader(self) -> str | None:
        return self._leader

    def view(self) -> ElectionView:
        return ElectionView(self.state, self._leader)

    def watch(self, callback: Callable[[ElectionView], None]) -> Watch:
        sub = Subscription(callback, self._subs.discard)
        self._subs.add(sub)
        sub.offer(self._published, self._published)
        return sub.watch

    async def wait_leader(self) -> None:
        while not self.is_leader:
            if self.state is Leadership.ENDED:
                raise MetadataError(f"election {self.group}: {self.candidate} no longer "
                                    "campaigns")
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)

    def _publish(self) -> None:
        """Tell watchers and waiters if the view changed."""
        view = self.view()
        if view == self._published:
            return
        self._published = view
        for sub in list(self._subs):
            sub.offer(view, view)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- campaigning ---------------------------------------------------------

    def _on_record(self, record: Versioned[bytes] | None) -> None:
        try:
            token = None if record is None else _bid(record)[1]
        except MetadataError:
            token = ""
        if token != self._seen:
            self._changed.set()

    def _watch_record(self) -> None:
        """Watch the record afresh: its first value is compared with the last read."""
        if self._record_watch is not None:
            self._record_watch.cancel()
        self._record_watch = self._store.watch_record(self._key, self._on_record)

    def _on_lease(self, lease: LeaseState) -> None:
        if lease is LeaseState.EXPIRED:
            self._held = False  # the record went with the lease
        self._publish()
        self._changed.set()

    def _campaigning(self) -> bool:
        return not self._ended and self._store.lease is not LeaseState.CLOSED

    async def _campaign(self) -> None:
        """Bid, then wait for a change; ends when the election or its store
        does, even if the task's cancellation is lost (Python 3.11's
        ``wait_for`` drops one that meets a finished request)."""
        try:
            while self._campaigning():
                self._changed.clear()
                try:
                    await self._bid()
                except MetadataError as e:
                    log.warning("%s: election %s: %s", self._store.uri, self.group, e)
                    self._publish()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), RETRY_DELAY_S)
                    continue
                self._publish()
                if self._campaigning():
                    self._watch_record()
                    await self._changed.wait()
        finally:
            self._publish()

    async def _bid(self) -> None:
        """Read the record; create it if there is none."""
        record = await _read(self._store, self._key)
        if record is None:
            self._held = None  # unknown until the create answers
            try:
                await self._store.create_leased_record(self._key, self._value)
            except MetadataExistsError:
                self._held = False
                self._changed.set()  # someone was quicker: read who
                return
            self._held, self._leader, self._seen = True, self.candidate, self._token
            return
        candidate, token = _bid(record)
        self._held, self._leader, self._seen = token == self._token, candidate, token

    async def resign(self) -> None:
        if self._ended:
            return
        self._ended = True
        for watch in (self._lease_watch, self._record_watch):
            if watch is not None:
                watch.cancel()
        self._changed.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        held, self._held = self._held, False
        try:
            if held is not False and self._store.lease in (LeaseState.LIVE,
                                                           LeaseState.UNCERTAIN):
                # Another bid can stand there at the same version only if
                # this lease ended between the read and the delete; deleting
                # it would cost a new election, not make two leaders.
                record = await _read(self._store, self._key)
                if record is not None and _bid(record)[1] == self._token:
                    with contextlib.suppress(MetadataNotFoundError):
                        await self._store.delete_record(self._key, record.version)
        finally:
            self._publish()
