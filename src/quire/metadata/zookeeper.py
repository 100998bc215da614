"""The ``zk://`` driver: metadata in a ZooKeeper ensemble, through kazoo.

``zk://host:port[,host:port...]/chroot``; the chroot is created if missing,
unless the store is opened only to read (``create=False``): a chroot
without Quire's layout is then :class:`~quire.errors.NoMetadataError`.
The znodes under it: :mod:`quire.metadata._znodes`.  Digest credentials,
ACLs, TLS, and securing a tree made without ACLs
(:func:`secure_zookeeper`): :mod:`quire.metadata._zkaccess`.

kazoo completes requests and fires watches on its own threads; both reach
the event loop through :mod:`quire.metadata._kazoo`, and a request with no
answer within twice the session timeout raises MetadataError (outcome
unknown).  After a session expires kazoo opens a new one; the store then
registers its bookies again and re-arms its watches, but leased records stay
gone.  The lease is the session: UNCERTAIN while kazoo's connection is
suspended, EXPIRED when kazoo reports the session lost, LIVE when connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, RolledBackError, RuntimeInconsistency
from kazoo.protocol.states import KazooState

from quire.errors import (
    ConfigError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    NoMetadataError,
    TransactionError,
)
from quire.metadata import _names
from quire.metadata._kazoo import KazooBridge, Trigger, shutdown
from quire.metadata._lease import LeaseHolder
from quire.metadata._watch import Subscription
from quire.metadata._zkaccess import (
    SecuredTree,
    ZooKeeperAccess,
    check_access,
    ensure_layout,
    has_layout,
    secure_tree,
)
from quire.metadata._znodes import VALUE, Znodes, new_version, subject, znode_version
from quire.metadata.model import (
    BookieInfo,
    CreateRecord,
    DeleteRecord,
    LedgerMetadata,
    Op,
    Versioned,
    deserialize,
    deserialize_bookie,
    serialize,
    serialize_bookie,
)
from quire.metadata.store import LeaseState, Watch
from quire.security import ZooKeeperSecurityConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEME = "zk://"


class ZooKeeperStore(LeaseHolder):
    """A :class:`~quire.metadata.store.MetadataStore` in ZooKeeper."""

    def __init__(self, uri: str, client: KazooClient, root: str, *,
                 session_timeout_ms: int, access: ZooKeeperAccess | None = None) -> None:
        super().__init__()
        self.uri = uri
        self._client = client
        self._access = access or ZooKeeperAccess()
        self._kazoo = KazooBridge(uri, client, session_timeout_ms=session_timeout_ms,
                                  denied_hint=self._access.denied_hint())
        self._zk = self._kazoo.call  # every request goes through it
        self._hand_over = self._kazoo.hand_over
        self._paths = Znodes(root)
        self._registered: dict[str, BookieInfo] = {}
        self._tasks: dict[object, asyncio.Task[None]] = {}  # watch loops, re-registration
        self._wakeups: set[asyncio.Event] = set()
        self._session_id = self._kazoo.session()
        self._closed = False
        self.initialised = False
        """Whether this open created the layout under the chroot."""
        client.add_listener(self._on_state)

    # --- session -------------------------------------------------------

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._hand_over(self._on_connected)
        elif state == KazooState.SUSPENDED:
            self._hand_over(self._set_lease, LeaseState.UNCERTAIN)
        elif state == KazooState.LOST:
            self._hand_over(self._set_lease, LeaseState.EXPIRED)

    def _on_connected(self) -> None:
        if self._closed:
            return
        for event in self._wakeups:  # a reconnect may have lost watches: re-arm
            event.set()
        session = self._kazoo.session()
        if session != self._session_id:
            self._session_id = session
            self._set_lease(LeaseState.EXPIRED)  # if kazoo's LOST was not seen
            key = object()
            self._tasks[key] = self._kazoo.loop.create_task(self._register_again(key))
        self._set_lease(LeaseState.LIVE)

    async def _register_again(self, key: object) -> None:
        """The session expired and took our ephemeral nodes: create them again."""
        try:
            for info in list(self._registered.values()):
                try:
                    await self._claim(info)
                except MetadataError as e:
                    log.warning("%s: re-registering bookie %s failed: %s",
                                self.uri, info.bookie_id, e)
        finally:
            self._tasks.pop(key, None)

    # --- ledgers ---------------------------------------------------------

    async def new_ledger_id(self) -> int:
        # The parent's child counter numbers sequential nodes: unique and
        # increasing for every client.  The node itself is not needed.
        path: str = await self._zk("ledger id", self._client.create_async,
                                   self._paths.ledger_id_prefix, sequence=True)
        with contextlib.suppress(MetadataError):
            await self._zk("ledger id", self._client.delete_async, path)
        return int(path[-10:]) + 1

    async def create_ledger(self, ledger_id: int,
                            metadata: LedgerMetadata) -> Versioned[LedgerMetadata]:
        await self._zk(f"ledger {ledger_id}", self._client.create_async,
                       self._paths.ledger(ledger_id), serialize(metadata))
        return Versioned(metadata, 0)

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        data, stat = await self._zk(f"ledger {ledger_id}", self._client.get_async,
                                    self._paths.ledger(ledger_id))
        return Versioned(deserialize(data), stat.version)

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata,
                           expected_version: int) -> Versioned[LedgerMetadata]:
        _names.check_version(expected_version)
        stat = await self._zk(f"ledger {ledger_id}", self._client.set_async,
                              self._paths.ledger(ledger_id), serialize(metadata),
                              expected_version)
        return Versioned(metadata, stat.version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        _names.check_optional_version(expected_version)
        await self._zk(f"ledger {ledger_id}", self._client.delete_async,
                       self._paths.ledger(ledger_id), znode_version(expected_version))

    async def list_ledgers(self) -> list[int]:
        names = await self._zk("ledgers", self._client.get_children_async, self._paths.ledgers)
        return sorted(int(name) for name in names if name.isdigit())

    # --- transactions ----------------------------------------------------

    async def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        ops = list(ops)
        for op in ops:
            _names.check_op(op)
        if not ops:
            return []
        for attempt in range(3):
            # A multi cannot create parents: make the records' key paths first.
            await asyncio.gather(*(
                self._zk(f"record {op.key}", self._client.ensure_path_async,
                         self._paths.record_dir(op.key))
                for op in ops if isinstance(op, CreateRecord)))
            request = self._client.transaction()
            for op in ops:
                self._paths.add_op(request, op)
            results = await self._zk("transaction", request.commit_async)
            failed = next((i for i, r in enumerate(results) if isinstance(r, Exception)
                           and not isinstance(r, RolledBackError | RuntimeInconsistency)), None)
            if failed is None:
                break
            if (isinstance(ops[failed], CreateRecord) and isinstance(results[failed], NoNodeError)
                    and attempt < 2):
                continue  # a concurrent delete pruned the key path we made
            for op in ops:  # drop the key paths made for nothing
                if isinstance(op, CreateRecord):
                    await self._prune(op.key)
            cause = self._kazoo.error(subject(ops[failed]), results[failed])
            raise TransactionError(f"transaction op {failed} ({type(ops[failed]).__name__}) "
                                   f"failed: {cause}", failed, cause)
        for op in ops:
            if isinstance(op, DeleteRecord):
                await self._prune(op.key)
        return [new_version(op, result) for op, result in zip(ops, results, strict=True)]

    # --- bookie registry -------------------------------------------------

    async def register_bookie(self, info: BookieInfo) -> None:
        _names.check_bookie_id(info.bookie_id)
        await self._claim(info)
        self._registered[info.bookie_id] = info

    async def _claim(self, info: BookieInfo) -> None:
        """Create the bookie's ephemeral node, or update it if this session owns
        it; wait (up to twice the session timeout) for another session's node
        to expire."""
        what, path = f"bookie {info.bookie_id}", self._paths.bookie(info.bookie_id)
        data = serialize_bookie(info)
        deadline = time.monotonic() + self._kazoo.timeout_s
        while True:
            try:
                await self._zk(what, self._client.create_async, path, data, ephemeral=True)
                return
            except MetadataExistsError:
                pass
            stat = await self._zk(what, self._client.exists_async, path)
            if stat is not None and stat.ephemeralOwner == self._kazoo.session():
                with contextlib.suppress(MetadataNotFoundError):  # else: create again
                    await self._zk(what, self._client.set_async, path, data)
                    return
            elif stat is not None and time.monotonic() > deadline:
                raise MetadataExistsError(
                    f"bookie {info.bookie_id} is registered by another live session")
            elif stat is not None:
                await asyncio.sleep(0.1)

    async def unregister_bookie(self, bookie_id: str) -> None:
        _names.check_bookie_id(bookie_id)
        self._registered.pop(bookie_id, None)
        with contextlib.suppress(MetadataNotFoundError):
            await self._zk(f"bookie {bookie_id}", self._client.delete_async,
                           self._paths.bookie(bookie_id))

    async def list_bookies(self) -> list[BookieInfo]:
        return await self._live_bookies(None)

    async def _live_bookies(self, trigger: Trigger | None) -> list[BookieInfo]:
        parent = self._paths.bookies
        names = await self._zk("bookie registry", self._client.get_children_async,
                               parent, trigger)
        replies = await asyncio.gather(
            *(self._zk(f"bookie {name}", self._client.get_async, f"{parent}/{name}", trigger)
              for name in names), return_exceptions=True)
        live = []
        for reply in replies:
            if isinstance(reply, MetadataNotFoundError):
                continue  # left meanwhile; the children watch fires for it
            if isinstance(reply, BaseException):
                raise reply
            live.append(deserialize_bookie(reply[0]))
        return sorted(live, key=lambda info: info.bookie_id)

    # --- cookies ---------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> Versioned[bytes]:
        _names.check_bookie_id(bookie_id)
        data, stat = await self._zk(f"cookie {bookie_id}", self._client.get_async,
                                    self._paths.cookie(bookie_id))
        return Versioned(data, stat.version)

    async def write_cookie(self, bookie_id: str, data: bytes,
                           expected_version: int | None) -> int:
        _names.check_bookie_id(bookie_id)
        what, path = f"cookie {bookie_id}", self._paths.cookie(bookie_id)
        if expected_version is None:
            await self._zk(what, self._client.create_async, path, data)
            return 0
        _names.check_version(expected_version)
        stat = await self._zk(what, self._client.set_async, path, data, expected_version)
        return int(stat.version)

    async def delete_cookie(self, bookie_id: str, expected_version: int | None = None) -> None:
        _names.check_bookie_id(bookie_id)
        _names.check_optional_version(expected_version)
        await self._zk(f"cookie {bookie_id}", self._client.delete_async,
                       self._paths.cookie(bookie_id), znode_version(expected_version))

    async def list_cookies(self) -> list[str]:
        names: list[str] = await self._zk("cookies", self._client.get_children_async,
                                          self._paths.cookies)
        return sorted(names)

    # --- records ---------------------------------------------------------

    async def create_record(self, key: str, value: bytes) -> int:
        _names.check_record_key(key)
        for _ in range(3):  # retry if a concurrent delete prunes the path we made
            with contextlib.suppress(MetadataNotFoundError):
                await self._zk(f"record {key}", self._client.create_async,
                               self._paths.record(key), value, makepath=True)
                return 0
        raise MetadataError(f"{self.uri}: record {key}: its key path kept disappearing")

    async def create_leased_record(self, key: str, value: bytes) -> int:
        _names.check_record_key(key)
        for _ in range(3):  # retry if a concurrent delete prunes the path we made
            with contextlib.suppress(MetadataNotFoundError):
                await self._zk(f"record {key}", self._client.create_async,
                               self._paths.record(key), value, ephemeral=True, makepath=True)
                return 0
        raise MetadataError(f"{self.uri}: record {key}: its key path kept disappearing")

    async def read_record(self, key: str) -> Versioned[bytes]:
        _names.check_record_key(key)
        data, stat = await self._zk(f"record {key}", self._client.get_async,
                                    self._paths.record(key))
        return Versioned(data, stat.version)

    async def write_record(self, key: str, value: bytes, expected_version: int) -> int:
        _names.check_record_key(key)
        _names.check_version(expected_version)
        stat = await self._zk(f"record {key}", self._client.set_async,
                              self._paths.record(key), value, expected_version)
        return int(stat.version)

    async def delete_record(self, key: str, expected_version: int | None = None) -> None:
        _names.check_record_key(key)
        _names.check_optional_version(expected_version)
        await self._zk(f"record {key}", self._client.delete_async,
                       self._paths.record(key), znode_version(expected_version))
        await self._prune(key)

    async def _prune(self, key: str) -> None:
        """Remove the key's znode and its ancestors while they are empty."""
        segments = key.split("/")
        while segments:
            try:
                await self._zk("record key path", self._client.delete_async,
                               self._paths.record_dir("/".join(segments)))
            except MetadataError:  # not empty, already gone, or unreachable
                return
            segments.pop()

    async def list_records(self, prefix: str) -> list[str]:
        # Start below the prefix's complete segments, keep the children that
        # match its last (partial) segment, then walk every subtree.
        base, _, partial = prefix.rpartition("/")
        if base and not _names.is_record_key(base):
            return []
        try:
            _, names = await self._below(base)
        except MetadataNotFoundError:
            return []
        frontier = [f"{base}/{n}" if base else n for n in names if n.startswith(partial)]
        keys = []
        while frontier:
            replies = await asyncio.gather(*(self._below(k) for k in frontier),
                                           return_exceptions=True)
            deeper: list[str] = []
            for key, reply in zip(frontier, replies, strict=True):
                if isinstance(reply, MetadataNotFoundError):
                    continue  # pruned meanwhile
                if isinstance(reply, BaseException):
                    raise reply
                is_record, names = reply
                if is_record:
                    keys.append(key)
                deeper.extend(f"{key}/{n}" for n in names)
            frontier = deeper
        return sorted(keys)

    async def _below(self, key: str) -> tuple[bool, list[str]]:
        """Whether ``key`` is a record, and the next segments of its sub-keys
        (``key`` ``""`` is the top of the namespace)."""
        names: list[str] = await self._zk(f"record {key}", self._client.get_children_async,
                                          self._paths.record_dir(key))
        return VALUE in names, [n for n in names if not n.startswith(".")]

    # --- watches ---------------------------------------------------------

    def watch_ledger(self, ledger_id: int,
                     callback: Callable[[Versioned[LedgerMetadata] | None], None]) -> Watch:
        return self._watch_node(f"ledger {ledger_id}", self._paths.ledger(ledger_id),
                                deserialize, callback)

    def watch_record(self, key: str,
                     callback: Callable[[Versioned[bytes] | None], None]) -> Watch:
        _names.check_record_key(key)
        return self._watch_node(f"record {key}", self._paths.record(key), bytes, callback)

    def _watch_node(self, what: str, path: str, decode: Callable[[bytes], T],
                    callback: Callable[[Versioned[T] | None], None]) -> Watch:
        """Watch one znode's decoded value (None while it does not exist)."""
        async def read(trigger: Trigger) -> tuple[Versioned[T] | None, object]:
            while True:
                try:
                    data, stat = await self._zk(what, self._client.get_async, path, trigger)
                    return Versioned(decode(data), stat.version), stat.mzxid
                except MetadataNotFoundError:
                    if await self._zk(what, self._client.exists_async, path, trigger) is None:
                        return None, None
                    # created between the two requests: read it

        return self._watch(callback, read)

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Watch:
        async def read(trigger: Trigger) -> tuple[list[BookieInfo], object]:
            live = await self._live_bookies(trigger)
            return live, live

        return self._watch(callback, read)

    def _watch(self, callback: Callable[[T], None],
               read: Callable[[Trigger], Awaitable[tuple[T, object]]]) -> Watch:
        if self._closed:
            raise MetadataError(f"{self.uri}: store is closed")
        sub = Subscription(callback, self._stop_watch)
        self._tasks[sub] = self._kazoo.loop.create_task(self._run_watch(sub, read))
        return sub.watch

    def _stop_watch(self, sub: Subscription[Any]) -> None:
        task = self._tasks.pop(sub, None)
        if task is not None:
            task.cancel()

    async def _run_watch(self, sub: Subscription[T],
                         read: Callable[[Trigger], Awaitable[tuple[T, object]]]) -> None:
        """Read (arming ZooKeeper watches), offer the value, wait for a trigger.
        Ends when the store closes, even if the task's cancellation is lost
        (Python 3.11's ``wait_for`` drops one that meets a finished request)."""
        changed = asyncio.Event()
        self._wakeups.add(changed)

        def trigger(_event: object) -> None:
            self._hand_over(changed.set)

        try:
            while not self._closed:
                changed.clear()
                try:
                    value, fingerprint = await read(trigger)
                except MetadataError as e:
                    log.warning("%s: watch read failed, retrying: %s", self.uri, e)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 1.0)
                    continue
                sub.offer(value, fingerprint)
                await changed.wait()
        finally:
            self._wakeups.discard(changed)

    # --- lifecycle -------------------------------------------------------

    async def close(self) -> None:
        """Close the session: its watches stop and its ephemeral nodes go."""
        if self._closed:
            return
        self._closed = True
        self._set_lease(LeaseState.CLOSED)
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for event in self._wakeups:  # ends a watch loop that lost its cancellation
            event.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._client.remove_listener(self._on_state)
        await asyncio.to_thread(shutdown, self._client)


def _parse(uri: str) -> tuple[str, str]:
    """``zk://h1:p1,h2:p2/chroot`` -> (``"h1:p1,h2:p2"``, ``"/chroot"`` or ``""``)."""
    hosts, _, chroot = uri[len(SCHEME):].partition("/")
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigError(f"bad ZooKeeper URI {uri!r}: expected "
                              "zk://host:port[,host:port...]/chroot")
    segments = [s for s in chroot.split("/") if s]
    try:
        for segment in segments:
            _names.check_segment(segment, "chroot segment")
    except ValueError as e:
        raise ConfigError(f"bad ZooKeeper URI {uri!r}: {e}") from None
    return hosts, "".join(f"/{s}" for s in segments)


async def open_zookeeper(uri: str, *, session_timeout_ms: int = 6000,
                         connect_timeout_ms: int = 10_000, create: bool = True,
                         zookeeper_digest_file: str = "", zookeeper_tls_ca_file: str = "",
                         zookeeper_tls_cert_file: str = "", zookeeper_tls_key_file: str = ""
                         ) -> ZooKeeperStore:
    """Connect to the ZooKeeper ensemble named by ``uri`` and create the
    layout (``create``), or find it (not ``create``: NoMetadataError if it
    is not there).  The ``zookeeper_*`` options: credentials and TLS
    (:class:`~quire.security.ZooKeeperSecurityConfig`); a session that may
    not read the store fails here (MetadataAccessDeniedError)."""
    settings = ZooKeeperSecurityConfig(
        zookeeper_digest_file=zookeeper_digest_file, zookeeper_tls_ca_file=zookeeper_tls_ca_file,
        zookeeper_tls_cert_file=zookeeper_tls_cert_file,
        zookeeper_tls_key_file=zookeeper_tls_key_file)
    return await _open(uri, settings, session_timeout_ms, connect_timeout_ms, create=create)


async def secure_zookeeper(uri: str, settings: ZooKeeperSecurityConfig, *,
                           progress: Callable[[SecuredTree], None] | None = None,
                           session_timeout_ms: int = 6000, connect_timeout_ms: int = 10_000
                           ) -> SecuredTree:
    """Give every znode of the existing store at ``uri`` the ACL of
    ``settings``' digest file: the upgrade in place of a tree made without
    ACLs (see :mod:`quire.metadata._zkaccess`).  Idempotent."""
    if not settings.zookeeper_digest_file:
        raise ConfigError("securing a ZooKeeper tree needs zookeeper_digest_file")
    store = await _open(uri, settings, session_timeout_ms, connect_timeout_ms, create=False,
                        warn_if_open=False)
    try:
        return await secure_tree(store._kazoo, store._paths, store._access, progress)
    finally:
        await store.close()


async def _open(uri: str, settings: ZooKeeperSecurityConfig, session_timeout_ms: int,
                connect_timeout_ms: int, *, create: bool, warn_if_open: bool = True
                ) -> ZooKeeperStore:
    if not uri.startswith(SCHEME):
        raise ConfigError(f"not a zk:// URI: {uri!r}")
    hosts, root = _parse(uri)
    access = ZooKeeperAccess.load(settings)
    client = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000,
                         connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
                         **access.kazoo_options())
    try:
        await asyncio.to_thread(client.start, connect_timeout_ms / 1000)
    except Exception as e:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(shutdown, client)
        raise MetadataError(f"{uri}: cannot connect to ZooKeeper: {e}"
                            f"{access.connect_hint()}") from e
    store = ZooKeeperStore(uri, client, root, session_timeout_ms=session_timeout_ms,
                           access=access)
    try:
        # find the layout, or create it; then check that this session may read it
        if not await has_layout(store._kazoo, store._paths):
            if not create:
                raise NoMetadataError(uri)
            await ensure_layout(store._kazoo, store._paths)
            store.initialised = True
        await check_access(store._kazoo, store._paths, access, warn_if_open=warn_if_open)
    except BaseException:
        await store.close()
        raise
    return store
