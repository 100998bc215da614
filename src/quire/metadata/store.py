"""The metadata store interface every driver implements.

Quire keeps its cluster metadata (ledgers, the bookie registry, cookies and
named records) in one :class:`MetadataStore`, like BookKeeper keeps it in
ZooKeeper.  :func:`quire.metadata.open_store` picks the driver from a URI.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from quire.metadata.model import BookieInfo, LedgerMetadata, Op, Versioned


class Watch:
    """Handle of a registered watch: :meth:`cancel` stops its callbacks."""

    def __init__(self, on_cancel: Callable[[], None]) -> None:
        self._on_cancel = on_cancel
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop the watch; no callback runs after this returns.  Idempotent."""
        if not self._cancelled:
            self._cancelled = True
            self._on_cancel()


class LeaseState(enum.Enum):
    """Whether a store's leased records still stand, as the store knows it.

    A store has one lease (ZooKeeper: its session) behind all its leased
    records and elections.
    """

    LIVE = "live"
    """The lease is confirmed: this store's leased records stand."""
    UNCERTAIN = "uncertain"
    """The store cannot confirm its lease (store unreachable, renewals
    failing); its leased records may be gone, or taken by others, by now."""
    EXPIRED = "expired"
    """The lease ended: every leased record it held is gone.  The next
    leased record starts a new lease."""
    CLOSED = "closed"
    """The store was closed; its leased records are gone for good."""


class Leadership(enum.Enum):
    """One candidate's standing in an election."""

    LEADER = "leader"
    """It leads, and its store's lease is confirmed."""
    FOLLOWER = "follower"
    """Another candidate leads, or nobody does yet."""
    UNCERTAIN = "uncertain"
    """It led (or its bid's outcome is unknown) but its store cannot confirm
    the lease now: do no leader's work, it may already be someone else's."""
    ENDED = "ended"
    """It resigned, or its store was closed: it campaigns no more."""


@dataclass(frozen=True)
class ElectionView:
    """What one candidate knows of its election."""

    state: Leadership
    leader: str | None
    """The leading candidate as last read from the store (None: nobody leads,
    or not read yet); stale while the store cannot be reached."""


class Election(Protocol):
    """One candidate campaigning for leadership of a group.

    Contract (every driver; the lease is the store's, see
    :class:`MetadataStore`):

    * **At most one leader per group at any time, as seen through the store**:
      the leader is the candidate named by the group's leased record, and a
      record has one value.
    * **A candidate reports LEADER only while its store's lease is LIVE.**  A
      leader whose store cannot renew its lease turns UNCERTAIN no later than
      the moment the store could let another candidate take over (embedded
      drivers: three quarters of ``lease_ms`` after the start of the last
      confirmed renewal, while the store lets the lease expire at the full
      ``lease_ms``; ZooKeeper: as soon as the connection is suspended, which
      kazoo notices within two thirds of the session timeout, while the server
      expires the session only after the whole timeout).  Both assume the
      event loop runs (a loop stalled past the lease cannot notice anything),
      and the embedded drivers that the host's wall clock does not jump.
    * **A lost leader is replaced**: once the leader's lease ends (its process
      died, its store closed, its ZooKeeper session expired), another
      candidate leads within about the lease (or session timeout) plus one
      watch period.  A candidate whose lease expired campaigns again.
    * :meth:`resign` hands leadership to another candidate at once.  Deleting
      the group's record by other means deposes the leader only once its
      watch sees the deletion (up to one watch period later).
    * Callbacks run on the event loop that created the election; ``elect``
      and :meth:`watch` must be called on it.
    """

    group: str
    candidate: str

    @property
    def state(self) -> Leadership:
        """The candidate's standing now."""
        ...

    @property
    def is_leader(self) -> bool:
        """``state is Leadership.LEADER``."""
        ...

    @property
    def leader(self) -> str | None:
        """The leading candidate as last read from the store, see
        :class:`ElectionView`."""
        ...

    def watch(self, callback: Callable[[ElectionView], None]) -> Watch:
        """Call ``callback`` with the current view soon, then after each change."""
        ...

    async def wait_leader(self) -> None:
        """Return once this candidate leads (at once if it does); raise
        :class:`~quire.errors.MetadataError` if the election ends first."""
        ...

    async def resign(self) -> None:
        """Stop campaigning; if this candidate leads, delete the group's record
        so another candidate takes over.  The election is ENDED even if the
        store cannot be reached (then MetadataError is raised and the record
        stands until the store's lease ends).  Idempotent."""
        ...


class MetadataStore(Protocol):
    """Versioned, compare-and-set metadata shared by every Quire process.

    Contract, common to all drivers:

    * **Versions.**  Every ledger, cookie and record carries an int version:
      0 when created, +1 on each successful write.  A write or delete that
      names an ``expected_version`` is a compare-and-set: it succeeds only if
      the stored version still equals it, otherwise it raises
      :class:`~quire.errors.MetadataVersionError` and changes nothing.
      Deleting and creating again starts over at 0 (as ZooKeeper does).
    * **Errors.**  :class:`~quire.errors.MetadataNotFoundError` and
      :class:`~quire.errors.MetadataExistsError` are definite answers.  Any
      other :class:`~quire.errors.MetadataError` (store unreachable, timeout,
      corrupt data) means the outcome of a write is *unknown*: re-read before
      deciding.  Malformed arguments (negative ids, bad keys) raise
      :class:`ValueError`.
    * **Names.**  Ledger ids are ints >= 0 (zero-padded to 10 digits where they
      form a path).  Bookie ids are one path segment; record keys are
      '/'-separated segments such as ``"logs/mylog/ledgers/0000000001"``.  A
      segment is non-empty, does not start with '.', and holds no control
      characters.
    * **Transactions** apply all ops or none, in order (later ops see earlier
      ones).  On failure they raise :class:`~quire.errors.TransactionError`
      whose ``failed_index`` names the op and whose ``cause`` is a
      MetadataVersionError, MetadataExistsError or MetadataNotFoundError.
    * **Bookie registry.**  A registration stays live until it is
      unregistered, the store that made it is closed, or its process dies
      (ZooKeeper: an ephemeral node, gone when the session expires; embedded
      drivers: a lease renewed every ``lease_ms / 3``).  Registering an id
      that another process holds waits up to twice the lease (or session
      timeout) for that registration to expire, then raises
      MetadataExistsError.  Re-registering from the same store updates the
      entry.
    * **Leased records** are records that live as long as the lease of the
      store that created them: they are read, written (compare-and-set, the
      record stays leased), listed, watched, deleted and used in transactions
      like any record, and disappear for every reader when the lease ends:
      the store is closed, its process dies, or it cannot renew the lease in
      time (ZooKeeper: ephemeral znodes of the store's session, gone when the
      session expires, after ``session_timeout_ms``; embedded drivers: one
      lease per store in the shared tables, renewed every ``lease_ms / 3``
      with the bookie registrations, gone ``lease_ms`` after the last renewal
      by the wall clock the processes of a host share).  :attr:`lease` and
      :meth:`watch_lease` tell the owner whether its lease stands; a lease
      that expired is not renewed again, so no leased record comes back.
      Unlike bookie registrations, leased records are not created again
      after their lease ends.
    * **Elections** (:meth:`elect`) keep the leader's name in the leased record
      ``elections/<group>/leader``; see :class:`Election`.
    * **Watches** call their callback on the event loop thread that created
      them: once with the current value soon after registration (so no change
      between a read and the watch is lost), then after each change.  Several
      quick changes may be seen as one.  Drivers without push notification
      poll at most every 250 ms.  ``watch_*`` must be called on the loop.
    * A store is used from the event loop that opened it; :meth:`close`
      releases it (and its bookie registrations and leased records).
    """

    uri: str

    # --- ledgers ---------------------------------------------------------

    async def new_ledger_id(self) -> int:
        """A new ledger id, unique and strictly increasing across every process
        sharing the store (ids start at 1 and may have gaps)."""
        ...

    async def create_ledger(self, ledger_id: int,
                            metadata: LedgerMetadata) -> Versioned[LedgerMetadata]:
        """Store a new ledger; MetadataExistsError if the id is taken."""
        ...

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        """The ledger's metadata; MetadataNotFoundError if there is none."""
        ...

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata,
                           expected_version: int) -> Versioned[LedgerMetadata]:
        """Compare-and-set the ledger's metadata; returns it with its new version."""
        ...

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Delete the ledger (at any version if ``expected_version`` is None)."""
        ...

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, sorted."""
        ...

    # --- atomic multi-op -------------------------------------------------

    async def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        """Apply ``ops`` atomically; returns each op's new version (None for
        deletes and checks)."""
        ...

    # --- bookie registry -------------------------------------------------

    async def register_bookie(self, info: BookieInfo) -> None:
        """Make the bookie live (or update its entry), see the class docstring."""
        ...

    async def unregister_bookie(self, bookie_id: str) -> None:
        """Remove the bookie from the live set (no error if it is not there)."""
        ...

    async def list_bookies(self) -> list[BookieInfo]:
        """The live bookies, sorted by id."""
        ...

    # --- cookies ---------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> Versioned[bytes]:
        """The bookie's cookie; MetadataNotFoundError if it has none."""
        ...

    async def write_cookie(self, bookie_id: str, data: bytes,
                           expected_version: int | None) -> int:
        """Create the cookie (``expected_version`` None; MetadataExistsError if
        present) or compare-and-set it; returns the new version."""
        ...

    async def delete_cookie(self, bookie_id: str, expected_version: int | None = None) -> None:
        """Delete the bookie's cookie."""
        ...

    async def list_cookies(self) -> list[str]:
        """Every bookie id that has a cookie, sorted."""
        ...

    # --- named records ---------------------------------------------------

    async def create_record(self, key: str, value: bytes) -> int:
        """Create a record; MetadataExistsError if the key is taken."""
        ...

    async def read_record(self, key: str) -> Versioned[bytes]:
        """The record; MetadataNotFoundError if absent."""
        ...

    async def write_record(self, key: str, value: bytes, expected_version: int) -> int:
        """Compare-and-set a record; returns its new version."""
        ...

    async def delete_record(self, key: str, expected_version: int | None = None) -> None:
        """Delete a record (its sub-keys, if any, are not affected)."""
        ...

    async def list_records(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix`` (a plain string prefix), sorted."""
        ...

    # --- leases and elections --------------------------------------------

    async def create_leased_record(self, key: str, value: bytes) -> int:
        """Create a record that lives while this store's lease does (see the
        class docstring); MetadataExistsError if the key is taken."""
        ...

    @property
    def lease(self) -> LeaseState:
        """Whether this store's lease stands, as the store knows it now."""
        ...

    def watch_lease(self, callback: Callable[[LeaseState], None]) -> Watch:
        """Call ``callback`` with :attr:`lease` now and after each change."""
        ...

    def elect(self, group: str, candidate: str) -> Election:
        """Start campaigning as ``candidate`` (any non-empty name) for the
        leadership of ``group`` (a record key); see :class:`Election`."""
        ...

    # --- watches ---------------------------------------------------------

    def watch_ledger(self, ledger_id: int,
                     callback: Callable[[Versioned[LedgerMetadata] | None], None]) -> Watch:
        """Call ``callback`` with the ledger's metadata (None while it does not
        exist) now and after each change."""
        ...

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Watch:
        """Call ``callback`` with the live bookies now and whenever the set or
        an entry changes."""
        ...

    def watch_record(self, key: str,
                     callback: Callable[[Versioned[bytes] | None], None]) -> Watch:
        """Call ``callback`` with the record (None while it does not exist) now
        and after each change."""
        ...

    async def close(self) -> None:
        """Stop watches, drop this store's registrations and leased records
        (its lease turns CLOSED), release resources."""
        ...
