"""The ledger client's entry point (BookKeeper's BookKeeper class)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from quire.client.config import ClientConfig
from quire.client.context import ClientContext
from quire.client.passwords import Password, keys_for, new_ledger_keys
from quire.client.placement import RandomPlacement
from quire.client.read_handle import ReadHandle
from quire.client.recovery import recover_ledger
from quire.client.write_handle import WriteHandle
from quire.clock import SYSTEM_CLOCK
from quire.errors import ClientClosedError, NotEnoughBookiesError
from quire.metadata import LedgerMetadata, MetadataStore, open_store
from quire.peer import BookiePool
from quire.types import DigestType, LedgerState, LedgerType


class Client:
    """Creates, opens, recovers and deletes ledgers on one Quire cluster.

    One client per process is the norm: it holds one connection per bookie,
    shared by all its handles.  Use it on the event loop that connected it::

        client = await Client.connect("sqlite:////tmp/quire/meta.db")
        ledger = await client.create_ledger(ensemble_size=3, write_quorum_size=3,
                                            ack_quorum_size=2, password=b"secret")
        entry_id = await ledger.append(b"payload")
        await ledger.close()
        await client.close()
    """

    def __init__(self, ctx: ClientContext, *, owns_store: bool = True) -> None:
        self._ctx = ctx
        self._owns_store = owns_store
        self._closed = False
        self._writers: set[WriteHandle] = set()
        """Write handles not yet closed: shut down with the client."""

    @classmethod
    async def connect(cls, metadata_uri: str, config: ClientConfig | None = None) -> Client:
        """Open the metadata store named by ``metadata_uri`` (``sqlite:///...``,
        ``zk://...``, ``memory://``) and follow its bookie registry.  Bookies
        that serve TLS are reached with ``config``'s ``tls_ca`` (and
        ``tls_cert``/``tls_key`` for mutual TLS); a ``zk://`` store with its
        ``zookeeper`` settings (digest credentials, TLS)."""
        config = config or ClientConfig()
        store = await open_store(metadata_uri, **config.zookeeper.store_options())
        try:
            pool = await BookiePool.open(store, config.peer_config())
        except BaseException:
            await store.close()
            raise
        return cls(ClientContext(store, pool, config, RandomPlacement()))

    @classmethod
    async def over(cls, store: MetadataStore, config: ClientConfig | None = None) -> Client:
        """A client on a metadata store its caller already has open (a
        bookie's own, for BP-46 recovery); :meth:`close` leaves the store
        open."""
        config = config or ClientConfig()
        pool = await BookiePool.open(store, config.peer_config())
        return cls(ClientContext(store, pool, config, RandomPlacement()), owns_store=False)

    @property
    def config(self) -> ClientConfig:
        return self._ctx.config

    @property
    def metadata_store(self) -> MetadataStore:
        """The metadata store this client uses (shared; do not close it)."""
        return self._ctx.store

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    async def create_ledger(
            self, ensemble_size: int = 3, write_quorum_size: int = 3, ack_quorum_size: int = 2,
            *, ledger_type: LedgerType = LedgerType.PD_JOURNAL,
            digest_type: DigestType = DigestType.CRC32C, password: Password = b"",
            custom_metadata: Mapping[str, bytes] | None = None) -> WriteHandle:
        """Create an OPEN ledger on ``ensemble_size`` distinct writable bookies
        chosen at random and return its writer.

        Needs ``1 <= ack_quorum_size <= write_quorum_size <= ensemble_size``
        (ValueError otherwise); NotEnoughBookiesError if too few bookies are
        writable.  The keys derived from the password are kept in the
        metadata (never the password itself), so that opening with another
        one is refused client-side too, and recovery tools can fence and
        close the ledger (a :class:`LedgerPasswords`: its current password).
        """
        self._check_open()
        if not 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size:
            raise ValueError(
                "need 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size, got "
                f"{ack_quorum_size}/{write_quorum_size}/{ensemble_size}")
        if ledger_type is LedgerType.VD_JOURNAL and ensemble_size > write_quorum_size:
            raise ValueError(
                "VD_JOURNAL ledgers cannot be striped (ensemble_size > write_quorum_size); "
                "BP-14 leaves relaxed durability on striped ledgers to future work")
        ctx = self._ctx
        keys = new_ledger_keys(password)
        try:
            ensemble = ctx.placement.new_ensemble(ensemble_size, ctx.pool.writable_bookies())
        except NotEnoughBookiesError:
            await ctx.pool.refresh()  # the registry watch may lag behind new bookies
            ensemble = ctx.placement.new_ensemble(ensemble_size, ctx.pool.writable_bookies())
        metadata = LedgerMetadata(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size, ledger_type=ledger_type, digest_type=digest_type,
            keys=keys, state=LedgerState.OPEN, ensembles=((0, ensemble),),
            custom_metadata=dict(custom_metadata or {}),
            creation_time_ms=SYSTEM_CLOCK.wall_ms())
        ledger_id = await ctx.store.new_ledger_id()
        versioned = await ctx.store.create_ledger(ledger_id, metadata)
        handle = WriteHandle(ctx, ledger_id, versioned, keys, on_closed=self._writers.discard)
        self._writers.add(handle)
        return handle

    async def open_ledger(self, ledger_id: int, *, password: Password = b"",
                          recovery: bool) -> ReadHandle:
        """Open a ledger for reading.

        ``recovery=True`` (BookKeeper's openLedger) fences the ledger and closes
        it at its last recoverable entry, so its writer can add nothing more;
        the handle is of the closed ledger.  ``recovery=False``
        (openLedgerNoRecovery) only reads the metadata: the LAC is the last
        entry if the ledger is closed, else -1 until
        ``read_last_add_confirmed()``.  UnauthorizedError for a wrong password
        (a :class:`LedgerPasswords`: none of its passwords is the ledger's),
        MetadataNotFoundError for an unknown ledger, LedgerRecoveryError when
        recovery cannot decide the end now.
        """
        return await self._open(ledger_id, password, recovery)

    async def open_ledger_as_admin(self, ledger_id: int, *, recovery: bool) -> ReadHandle:
        """:meth:`open_ledger` with the keys the ledger's metadata holds, no
        password (BookKeeperAdmin's openLedger): what repair, autorecovery
        and an operator's ``quire ledger recover`` use.  Anyone who can read
        the metadata store can do this."""
        return await self._open(ledger_id, None, recovery)

    async def _open(self, ledger_id: int, password: Password | None,
                    recovery: bool) -> ReadHandle:
        self._check_open()
        ctx = self._ctx
        if recovery:
            versioned = await recover_ledger(ctx, ledger_id, password)
        else:
            versioned = await ctx.store.read_ledger(ledger_id)
        md = versioned.value
        keys = md.keys if password is None else keys_for(ledger_id, md, password)
        return ReadHandle(ctx, ledger_id, versioned, keys, follow=not recovery)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's metadata; bookies drop its entries at their next
        garbage collection.  MetadataNotFoundError if there is no such ledger."""
        self._check_open()
        await self._ctx.store.delete_ledger(ledger_id)

    async def close(self) -> None:
        """Close connections and the metadata store (unless the client was
        made :meth:`over` a store of its caller's).  Handles still open are
        abandoned (their pending adds fail with ClientClosedError; the ledgers
        stay OPEN until someone recovers them)."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self._writers):
            handle._shutdown()
        self._writers.clear()
        await self._ctx.pool.close()
        if self._owns_store:
            await self._ctx.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
