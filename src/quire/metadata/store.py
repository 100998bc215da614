"""The metadata store interface every driver implements.

Quire keeps its cluster metadata (ledgers, the bookie registry, cookies and
named records) in one :class:`MetadataStore`, like BookKeeper keeps it in
ZooKeeper.  :func:`quire.metadata.open_store` picks the driver from a URI.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    * **Watches** call their callback on the event loop thread that created
      them: once with the current value soon after registration (so no change
      between a read and the watch is lost), then after each change.  Several
      quick changes may be seen as one.  Drivers without push notification
      poll at most every 250 ms.  ``watch_*`` must be called on the loop.
    * A store is used from the event loop that opened it; :meth:`close`
      releases it (and its bookie registrations).
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

    async def close(self) -> None:
        """Stop watches, drop this store's registrations, release resources."""
        ...
