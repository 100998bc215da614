"""The lease side every driver shares: the state it tells watchers, and
elections on top of it."""

from __future__ import annotations

from collections.abc import Callable

from quire.errors import MetadataError
from quire.metadata._watch import Subscription
from quire.metadata.election import LeaseElection
from quire.metadata.store import Election, LeaseState, MetadataStore, Watch


class LeaseHolder:
    """``lease``, ``watch_lease`` and ``elect`` of a
    :class:`~quire.metadata.store.MetadataStore`; the driver reports changes
    through :meth:`_set_lease` (on the event loop).  CLOSED is final."""

    uri: str

    def __init__(self) -> None:
        self._lease_state = LeaseState.LIVE
        self._lease_subs: set[Subscription[LeaseState]] = set()

    @property
    def lease(self) -> LeaseState:
        return self._lease_state

    def watch_lease(self, callback: Callable[[LeaseState], None]) -> Watch:
        sub = Subscription(callback, self._lease_subs.discard)
        self._lease_subs.add(sub)
        sub.offer(self._lease_state, self._lease_state)
        return sub.watch

    def elect(self: MetadataStore, group: str, candidate: str) -> Election:
        if self.lease is LeaseState.CLOSED:
            raise MetadataError(f"{self.uri}: store is closed")
        return LeaseElection(self, group, candidate)

    def _set_lease(self, state: LeaseState) -> None:
        if state is self._lease_state or self._lease_state is LeaseState.CLOSED:
            return
        self._lease_state = state
        for sub in list(self._lease_subs):
            sub.offer(state, state)
