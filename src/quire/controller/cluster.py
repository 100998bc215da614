"""Several controllers serving one cluster: who is alive, who leads.

Every controller serves every RPC, over the same tables; what no RPC asks
for (the transaction sweeper, retention, auto-scaling's requests, and
finishing what a dead controller left half done) is the *leader's* duty.
:class:`ControllerCluster` is the seam; :class:`MetadataCluster` keeps it
in the metadata store every process shares:

* ``controllers/members/<member>``: a leased record per controller (its
  ``{"address"}``), gone with the controller's lease: a member without it
  is dead, and what it was doing may be taken over;
* ``elections/controllers/leader``: the election of the leader
  (:meth:`~quire.metadata.store.MetadataStore.elect`).

:class:`SoloCluster` is the one controller of a cluster without a shared
metadata store (tests, in-process stacks): always the leader, alone.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Protocol

from quire.errors import MetadataError, MetadataNotFoundError
from quire.metadata import Election, MetadataStore

MEMBERS_PREFIX = "controllers/members/"
ELECTION_GROUP = "controllers"


def member_name(address: str) -> str:
    """A name for this controller process, unique across its restarts."""
    return f"{address.replace('/', '_')}-{uuid.uuid4().hex[:8]}"


class ControllerCluster(Protocol):
    """The controllers of one cluster, seen from one of them.

    Contract: :attr:`member` names this controller for as long as it runs
    (never reused by a later process); :meth:`alive` answers False for a
    member only once its lease ended, so a controller that answers False
    for another has nothing to fear from that one's half-done work (the
    work is idempotent anyway, see :mod:`quire.controller.core`);
    :attr:`is_leader` is True for at most one member at a time as far as
    the metadata store can tell (see :class:`~quire.metadata.store.Election`).
    """

    member: str

    @property
    def is_leader(self) -> bool: ...

    async def alive(self, member: str) -> bool: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class SoloCluster:
    """The only controller: it leads, and every workflow is its own."""

    def __init__(self, member: str = "solo") -> None:
        self.member = member

    @property
    def is_leader(self) -> bool:
        return True

    async def alive(self, member: str) -> bool:
        return member == self.member

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


class MetadataCluster:
    """:class:`ControllerCluster` over a metadata store (module docstring)."""

    def __init__(self, metadata: MetadataStore, address: str) -> None:
        self.metadata = metadata
        self.address = address
        self.member = member_name(address)
        self._election: Election | None = None

    @property
    def is_leader(self) -> bool:
        return self._election is not None and self._election.is_leader

    @property
    def leader(self) -> str | None:
        return None if self._election is None else self._election.leader

    async def alive(self, member: str) -> bool:
        try:
            await self.metadata.read_record(MEMBERS_PREFIX + member)
        except MetadataNotFoundError:
            return False
        return True

    async def members(self) -> list[str]:
        return [key.removeprefix(MEMBERS_PREFIX)
                for key in await self.metadata.list_records(MEMBERS_PREFIX)]

    async def start(self) -> None:
        await self.metadata.create_leased_record(
            MEMBERS_PREFIX + self.member, json.dumps({"address": self.address}).encode())
        self._election = self.metadata.elect(ELECTION_GROUP, self.member)

    async def close(self) -> None:
        if self._election is not None:
            election, self._election = self._election, None
            with contextlib.suppress(MetadataError):  # the lease ends with the store anyway
                await election.resign()
