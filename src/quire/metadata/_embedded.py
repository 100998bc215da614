"""Store logic shared by the drivers that keep metadata in local tables
(``memory://`` and ``sqlite://``).

A driver supplies a :class:`Txn` (one transaction over its tables) and runs
functions inside one through ``_write`` / ``_read``; this module adds the
compare-and-set rules, transactions, leases and watch polling on top.

Leases.  A bookie registration is a row with its own expiry.  Leased records
belong to the store's *session*, one row with an expiry that the same
heartbeat renews every ``lease_ms / 3``; a leased record is visible while
its session has not expired, and the first record write after that deletes
it.  The store counts its lease as certain for ``CERTAIN_FRACTION`` of
``lease_ms`` after the start of its last confirmed renewal (a loop timer),
so it turns UNCERTAIN before any other process can see the session expire.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple, Protocol, TypeVar

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import (
    ConfigError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    TransactionError,
)
from quire.metadata import _names
from quire.metadata._lease import LeaseHolder
from quire.metadata._watch import Subscription
from quire.metadata.model import (
    BookieInfo,
    CheckRecord,
    CreateLedger,
    CreateRecord,
    DeleteLedger,
    DeleteRecord,
    LedgerMetadata,
    Op,
    UpdateLedger,
    UpdateRecord,
    Versioned,
    deserialize,
    deserialize_bookie,
    serialize,
    serialize_bookie,
)
from quire.metadata.store import LeaseState, Watch

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")
Key = int | str
Row = tuple[bytes, int]
"""A stored value and its version."""

CERTAIN_FRACTION = 0.75
"""Part of ``lease_ms`` after a confirmed renewal's start during which the
store counts its lease as certain; the rest absorbs a late timer and the
millisecond rounding of expiry times."""


class Table(enum.Enum):
    """The versioned tables; the value names the kind in error messages."""

    LEDGERS = "ledger"
    COOKIES = "cookie"
    RECORDS = "record"


class Lease(NamedTuple):
    """A bookie registration: live until ``expires_ms`` (wall clock)."""

    bookie_id: str
    data: bytes
    owner: str
    expires_ms: int


class Txn(Protocol):
    """One open transaction on a driver's tables (synchronous, one thread)."""

    def get(self, table: Table, key: Key) -> Row | None: ...
    def put(self, table: Table, key: Key, data: bytes, version: int) -> None: ...
    def delete(self, table: Table, key: Key) -> None: ...
    def ledger_ids(self) -> list[int]: ...
    def cookie_ids(self) -> list[str]: ...
    def record_keys(self, prefix: str) -> list[str]: ...
    def next_counter(self, name: str) -> int: ...
    def get_lease(self, bookie_id: str) -> Lease | None: ...
    def put_lease(self, lease: Lease) -> None: ...
    def delete_lease(self, bookie_id: str) -> None: ...
    def live_leases(self, now_ms: int) -> list[Lease]: ...

    # Sessions and leased records.  A leased record is a RECORDS row plus
    # a mark naming its session; deleting the row removes the mark.
    def session_expiry(self, session: str) -> int | None: ...
    def put_session(self, session: str, expires_ms: int) -> None: ...
    def delete_session(self, session: str) -> None:
        """Delete the session and every record it leases."""
    def lease_record(self, key: str, session: str) -> None: ...
    def record_expiry(self, key: str) -> int | None:
        """When the record's session expires (0: the session is gone); None
        for a record that is not leased, or no record."""
    def dead_leased_keys(self, now_ms: int) -> list[str]:
        """The leased records whose session expired by ``now_ms``."""
    def drop_expired_leases(self, now_ms: int) -> None:
        """Delete the sessions expired by ``now_ms`` and their records."""


class EmbeddedStore(LeaseHolder, abc.ABC):
    """:class:`~quire.metadata.store.MetadataStore` over a driver's :class:`Txn`."""

    def __init__(self, uri: str, *, lease_ms: int, poll_interval_ms: int,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if lease_ms < 30:
            raise ConfigError(f"lease_ms must be >= 30, got {lease_ms}")
        if not 0 < poll_interval_ms <= 250:
            raise ConfigError(f"poll_interval_ms must be in 1..250, got {poll_interval_ms}")
        super().__init__()
        self.uri = uri
        self._lease_ms = lease_ms
        self._now_ms = clock.wall_ms
        """The wall clock of lease expiries (every process sharing the store
        must read the same one)."""
        self._poll_interval = poll_interval_ms / 1000
        self._owner = uuid.uuid4().hex
        self._registered: dict[str, BookieInfo] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._ledger_subs: dict[int, set[Subscription[Versioned[LedgerMetadata] | None]]] = {}
        self._bookie_subs: set[Subscription[list[BookieInfo]]] = set()
        self._record_subs: dict[str, set[Subscription[Versioned[bytes] | None]]] = {}
        # The session behind leased records: its id (None until a leased
        # record needs one), whether a transaction has confirmed it, and
        # when that certainty ends.
        self._session: str | None = None
        self._session_confirmed = False
        self._certain_until = 0.0
        self._doubt_timer: asyncio.TimerHandle | None = None
        self._closed = False

    @abc.abstractmethod
    async def _write(self, fn: Callable[[Txn], R]) -> R:
        """Run ``fn`` in a write transaction, committed unless it raises.
        Calls run in submission order."""

    @abc.abstractmethod
    async def _read(self, fn: Callable[[Txn], R]) -> R:
        """Run ``fn`` against a consistent snapshot."""

    @abc.abstractmethod
    async def _release(self) -> None:
        """Release the driver's resources (called once, by :meth:`close`)."""

    # --- ledgers ---------------------------------------------------------

    async def new_ledger_id(self) -> int:
        return await self._write(lambda t: t.next_counter("ledger_id"))

    async def create_ledger(self, ledger_id: int,
                            metadata: LedgerMetadata) -> Versioned[LedgerMetadata]:
        _names.check_ledger_id(ledger_id)
        data = serialize(metadata)
        version = await self._write(lambda t: _create(t, Table.LEDGERS, ledger_id, data))
        return Versioned(metadata, version)

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        _names.check_ledger_id(ledger_id)
        data, version = await self._read(lambda t: _require(t, Table.LEDGERS, ledger_id))
        return Versioned(deserialize(data), version)

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata,
                           expected_version: int) -> Versioned[LedgerMetadata]:
        _names.check_ledger_id(ledger_id)
        _names.check_version(expected_version)
        data = serialize(metadata)
        version = await self._write(
            lambda t: _update(t, Table.LEDGERS, ledger_id, data, expected_version))
        return Versioned(metadata, version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        _names.check_ledger_id(ledger_id)
        _names.check_optional_version(expected_version)
        await self._write(lambda t: _delete(t, Table.LEDGERS, ledger_id, expected_version))

    async def list_ledgers(self) -> list[int]:
        return await self._read(lambda t: t.ledger_ids())

    # --- transactions ----------------------------------------------------

    async def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        ops = list(ops)
        for op in ops:
            _names.check_op(op)
        payloads = [serialize(op.metadata) if isinstance(op, CreateLedger | UpdateLedger)
                    else None for op in ops]

        def run(t: Txn) -> list[int | None]:
            versions = []
            for index, (op, payload) in enumerate(zip(ops, payloads, strict=True)):
                try:
                    versions.append(_apply(t, op, payload))
                except (MetadataVersionError, MetadataExistsError, MetadataNotFoundError) as e:
                    raise TransactionError(f"transaction op {index} "
                                           f"({type(op).__name__}) failed: {e}", index, e) from e
            return versions

        return await self._write(self._reaping(run))

    # --- bookie registry -------------------------------------------------

    async def register_bookie(self, info: BookieInfo) -> None:
        _names.check_bookie_id(info.bookie_id)
        # Wait out a registration left by a dead process (its lease runs out).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self._lease_ms / 1000
        while not await self._write(lambda t: self._claim(t, info, self._now_ms())):
            if loop.time() > deadline:
                raise MetadataExistsError(
                    f"bookie {info.bookie_id} is registered by another live process")
            await asyncio.sleep(min(0.1, self._lease_ms / 3000))
        self._registered[info.bookie_id] = info
        self._start_heartbeat()

    async def unregister_bookie(self, bookie_id: str) -> None:
        _names.check_bookie_id(bookie_id)
        self._registered.pop(bookie_id, None)
        await self._write(lambda t: t.delete_lease(bookie_id))

    async def list_bookies(self) -> list[BookieInfo]:
        leases = await self._read(lambda t: t.live_leases(self._now_ms()))
        return [deserialize_bookie(lease.data) for lease in leases]

    def _claim(self, t: Txn, info: BookieInfo, now_ms: int) -> bool:
        """Take or renew ``info``'s lease unless another owner holds it live."""
        held = t.get_lease(info.bookie_id)
        if held is not None and held.owner != self._owner and held.expires_ms > now_ms:
            return False
        t.put_lease(Lease(info.bookie_id, serialize_bookie(info), self._owner,
                          now_ms + self._lease_ms))
        return True

    def _claim_all(self, infos: list[BookieInfo], t: Txn) -> list[str]:
        """Claim every one of ``infos``; returns the ids another owner holds."""
        now_ms = self._now_ms()
        return [info.bookie_id for info in infos if not self._claim(t, info, now_ms)]

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Renew the bookie registrations and the session, every lease_ms / 3."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            # The snapshot is submitted before any later unregister's delete
            # (_write keeps order), so a renewal never revives an unregistered id.
            infos = list(self._registered.values())
            session = self._session if self._session_confirmed else None
            started = loop.time()
            try:
                lost, alive = await self._write(partial(self._renew, infos, session))
            except MetadataError as e:
                log.warning("%s: renewing leases failed: %s", self.uri, e)
                continue
            for bookie_id in lost:
                log.warning("%s: bookie %s was taken over by another process",
                            self.uri, bookie_id)
                self._registered.pop(bookie_id, None)
            if session is not None and session == self._session:
                if alive:
                    self._confirm(started)
                else:
                    log.warning("%s: lease expired before it was renewed: its leased "
                                "records are gone", self.uri)
                    self._expire()

    def _renew(self, infos: list[BookieInfo], session: str | None,
               t: Txn) -> tuple[list[str], bool]:
        """Claim ``infos``; renew ``session`` unless it expired.  Returns the
        bookie ids another owner holds and whether the session lives."""
        lost = self._claim_all(infos, t)
        now_ms = self._now_ms()
        alive = session is not None and self._renew_session(t, session, now_ms)
        t.drop_expired_leases(now_ms)
        return lost, alive

    def _renew_session(self, t: Txn, session: str, now_ms: int) -> bool:
        """Extend ``session`` if it has not expired; whether it had not."""
        expires_ms = t.session_expiry(session)
        if expires_ms is None or expires_ms <= now_ms:
            return False
        t.put_session(session, now_ms + self._lease_ms)
        return True

    def _release_leases(self, bookie_ids: list[str], t: Txn) -> None:
        for bookie_id in bookie_ids:
            lease = t.get_lease(bookie_id)
            if lease is not None and lease.owner == self._owner:
                t.delete_lease(bookie_id)

    # --- cookies ---------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> Versioned[bytes]:
        _names.check_bookie_id(bookie_id)
        data, version = await self._read(lambda t: _require(t, Table.COOKIES, bookie_id))
        return Versioned(data, version)

    async def write_cookie(self, bookie_id: str, data: bytes,
                           expected_version: int | None) -> int:
        _names.check_bookie_id(bookie_id)
        _names.check_optional_version(expected_version)
        if expected_version is None:
            return await self._write(lambda t: _create(t, Table.COOKIES, bookie_id, data))
        return await self._write(
            lambda t: _update(t, Table.COOKIES, bookie_id, data, expected_version))

    async def delete_cookie(self, bookie_id: str, expected_version: int | None = None) -> None:
        _names.check_bookie_id(bookie_id)
        _names.check_optional_version(expected_version)
        await self._write(lambda t: _delete(t, Table.COOKIES, bookie_id, expected_version))

    async def list_cookies(self) -> list[str]:
        return await self._read(lambda t: t.cookie_ids())

    # --- records ---------------------------------------------------------

    async def create_record(self, key: str, value: bytes) -> int:
        _names.check_record_key(key)
        return await self._write(self._reaping(lambda t: _create(t, Table.RECORDS, key, value)))

    async def read_record(self, key: str) -> Versioned[bytes]:
        _names.check_record_key(key)
        row = await self._read(lambda t: _live_record(t, key, self._now_ms()))
        if row is None:
            raise MetadataNotFoundError(f"{_name(Table.RECORDS, key)} does not exist")
        return Versioned(*row)

    async def write_record(self, key: str, value: bytes, expected_version: int) -> int:
        _names.check_record_key(key)
        _names.check_version(expected_version)
        return await self._write(self._reaping(
            lambda t: _update(t, Table.RECORDS, key, value, expected_version)))

    async def delete_record(self, key: str, expected_version: int | None = None) -> None:
        _names.check_record_key(key)
        _names.check_optional_version(expected_version)
        await self._write(self._reaping(
            lambda t: _delete(t, Table.RECORDS, key, expected_version)))

    async def list_records(self, prefix: str) -> list[str]:
        def live_keys(t: Txn) -> list[str]:
            keys = t.record_keys(prefix)
            dead = set(t.dead_leased_keys(self._now_ms()))
            return [key for key in keys if key not in dead] if dead else keys

        return await self._read(live_keys)

    # --- leases and elections ----------------------------------------------

    async def create_leased_record(self, key: str, value: bytes) -> int:
        _names.check_record_key(key)
        loop = asyncio.get_running_loop()
        while True:
            if self._session is None:
                self._session, self._session_confirmed = uuid.uuid4().hex, False
            session, confirmed = self._session, self._session_confirmed
            started = loop.time()
            created = await self._write(
                partial(self._create_leased, key, value, session, confirmed))
            if not created:  # the session ended: start a new one
                if session == self._session:
                    self._expire()
                continue
            if session == self._session:
                self._confirm(started)
            self._start_heartbeat()
            return 0

    def _create_leased(self, key: str, value: bytes, session: str, confirmed: bool,
                       t: Txn) -> bool:
        """Create ``key`` leased by ``session`` (creating the session unless
        it was ``confirmed`` before); False if the session has expired."""
        now_ms = self._now_ms()
        if not self._renew_session(t, session, now_ms):
            if confirmed:
                return False
            t.put_session(session, now_ms + self._lease_ms)
        t.drop_expired_leases(now_ms)
        _create(t, Table.RECORDS, key, value)
        t.lease_record(key, session)
        return True

    def _confirm(self, started: float) -> None:
        """A transaction that began at loop time ``started`` renewed the session."""
        self._session_confirmed = True
        certain_until = started + CERTAIN_FRACTION * self._lease_ms / 1000
        if certain_until > self._certain_until:
            self._certain_until = certain_until
            if self._doubt_timer is not None:
                self._doubt_timer.cancel()
            self._doubt_timer = asyncio.get_running_loop().call_at(
                certain_until, self._set_lease, LeaseState.UNCERTAIN)
        if self._certain_until > asyncio.get_running_loop().time():
            self._set_lease(LeaseState.LIVE)

    def _expire(self) -> None:
        """The session expired: its records are gone; the next leased record
        starts a new one."""
        self._session, self._session_confirmed = None, False
        self._stop_doubt_timer()
        self._set_lease(LeaseState.EXPIRED)

    def _stop_doubt_timer(self) -> None:
        if self._doubt_timer is not None:
            self._doubt_timer.cancel()
            self._doubt_timer = None
        self._certain_until = 0.0

    # --- watches (one poller per store) ----------------------------------

    def watch_ledger(self, ledger_id: int,
                     callback: Callable[[Versioned[LedgerMetadata] | None], None]) -> Watch:
        _names.check_ledger_id(ledger_id)
        return self._subscribe(self._ledger_subs.setdefault(ledger_id, set()), callback)

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Watch:
        return self._subscribe(self._bookie_subs, callback)

    def watch_record(self, key: str,
                     callback: Callable[[Versioned[bytes] | None], None]) -> Watch:
        _names.check_record_key(key)
        return self._subscribe(self._record_subs.setdefault(key, set()), callback)

    def _subscribe(self, subs: set[Subscription[T]], callback: Callable[[T], None]) -> Watch:
        """Add a subscription to ``subs``, the set the poller offers its value to."""
        sub = Subscription(callback, subs.discard)
        subs.add(sub)
        self._start_poller()
        return sub.watch

    def _start_poller(self) -> None:
        if self._closed:
            raise MetadataError(f"{self.uri}: store is closed")
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            ledger_ids = [i for i, subs in self._ledger_subs.items() if subs]
            record_keys = [k for k, subs in self._record_subs.items() if subs]
            if not ledger_ids and not record_keys and not self._bookie_subs:
                return
            try:
                await self._poll_once(ledger_ids, record_keys, bool(self._bookie_subs))
            except MetadataError as e:
                log.warning("%s: watch poll failed: %s", self.uri, e)
            await asyncio.sleep(self._poll_interval)

    async def _poll_once(self, ledger_ids: list[int], record_keys: list[str],
                         bookies: bool) -> None:
        now_ms = self._now_ms()
        rows, records, leases = await self._read(lambda t: (
            {i: t.get(Table.LEDGERS, i) for i in ledger_ids},
            {k: _live_record(t, k, now_ms) for k in record_keys},
            t.live_leases(now_ms) if bookies else []))
        for ledger_id, row in rows.items():
            value = None if row is None else Versioned(deserialize(row[0]), row[1])
            for ledger_sub in list(self._ledger_subs.get(ledger_id, ())):
                ledger_sub.offer(value, row)
        for key, row in records.items():
            record = None if row is None else Versioned(*row)
            for record_sub in list(self._record_subs.get(key, ())):
                record_sub.offer(record, row)
        live = [deserialize_bookie(lease.data) for lease in leases]
        for bookie_sub in list(self._bookie_subs):
            bookie_sub.offer(live, live)

    def _reaping(self, fn: Callable[[Txn], R]) -> Callable[[Txn], R]:
        """``fn`` preceded by deleting expired leased records, so that record
        writes see them absent as reads do."""
        def run(t: Txn) -> R:
            t.drop_expired_leases(self._now_ms())
            return fn(t)
        return run

    # --- lifecycle -------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._set_lease(LeaseState.CLOSED)
        self._stop_doubt_timer()
        for task in (self._heartbeat, self._poller):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        mine = list(self._registered)
        self._registered.clear()
        session, self._session = self._session, None

        def release(t: Txn) -> None:
            self._release_leases(mine, t)
            if session is not None:
                t.delete_session(session)

        try:
            await self._write(release)
        except MetadataError as e:  # they expire with their leases anyway
            log.warning("%s: releasing registrations and leased records failed: %s",
                        self.uri, e)
        finally:
            await self._release()


# --- compare-and-set rules ----------------------------------------------------


def _name(table: Table, key: Key) -> str:
    return f"{table.value} {key}"


def _live_record(t: Txn, key: str, now_ms: int) -> Row | None:
    """The record, unless it is absent or leased by an expired session."""
    row = t.get(Table.RECORDS, key)
    if row is not None:
        expires_ms = t.record_expiry(key)
        if expires_ms is not None and expires_ms <= now_ms:
            return None
    return row


def _require(t: Txn, table: Table, key: Key) -> Row:
    row = t.get(table, key)
    if row is None:
        raise MetadataNotFoundError(f"{_name(table, key)} does not exist")
    return row


def _require_version(t: Txn, table: Table, key: Key, expected: int | None) -> None:
    _, version = _require(t, table, key)
    if expected is not None and version != expected:
        raise MetadataVersionError(
            f"{_name(table, key)} is at version {version}, expected {expected}")


def _create(t: Txn, table: Table, key: Key, data: bytes) -> int:
    if t.get(table, key) is not None:
        raise MetadataExistsError(f"{_name(table, key)} already exists")
    t.put(table, key, data, 0)
    return 0


def _update(t: Txn, table: Table, key: Key, data: bytes, expected: int) -> int:
    _require_version(t, table, key, expected)
    t.put(table, key, data, expected + 1)
    return expected + 1


def _delete(t: Txn, table: Table, key: Key, expected: int | None) -> None:
    _require_version(t, table, key, expected)
    t.delete(table, key)


def _apply(t: Txn, op: Op, payload: bytes | None) -> int | None:
    """Apply one transaction op; ``payload`` is the serialized ledger metadata."""
    match op:
        case CreateLedger(ledger_id=ledger_id):
            assert payload is not None
            return _create(t, Table.LEDGERS, ledger_id, payload)
        case UpdateLedger(ledger_id=ledger_id, expected_version=expected):
            assert payload is not None
            return _update(t, Table.LEDGERS, ledger_id, payload, expected)
        case DeleteLedger(ledger_id=ledger_id, expected_version=expected):
            _delete(t, Table.LEDGERS, ledger_id, expected)
        case CreateRecord(key=key, value=value):
            return _create(t, Table.RECORDS, key, value)
        case UpdateRecord(key=key, value=value, expected_version=expected):
            return _update(t, Table.RECORDS, key, value, expected)
        case DeleteRecord(key=key, expected_version=expected):
            _delete(t, Table.RECORDS, key, expected)
        case CheckRecord(key=key, expected_version=expected):
            _require_version(t, Table.RECORDS, key, expected)
    return None
