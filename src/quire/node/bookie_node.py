"""One bookie's assembly: the steps that bring it up and take it down.

:meth:`BookieNode.start` runs named steps, in order, each one an await of
its own (BP-46 adds its boot steps between them, see the comments there):

1. ``_check_identity``: a stable bookie id;
2. ``_open_metadata``: the metadata store (leased registrations), and the
   HTTP endpoint's TLS and authenticator (:func:`quire.auth.server_security`);
3. ``_validate_cookie``: the cookie in every directory and in metadata (a
   directory that lost it refuses the start, unless
   ``data_integrity_stamp_missing_cookies``: then phase one runs and the
   directory is stamped after it);
4. ``_open_storage``: the storage engine (journal replay, the running mark
   read) and the group committer over its journal;
5. ``_protect``: BP-46 phase one (:mod:`~quire.node.integrity`), when a
   directory lost its cookie or the last run crashed without the journal:
   fence this bookie's ledgers and put the open ones in limbo, durably,
   before anything is answered;
6. ``_build_server``: the bookie server over them (its sync cursors rebuilt);
7. ``_listen``: the listener (:class:`~quire.bookie.listener.BookieListener`:
   TLS and mutual TLS when configured, connection limits), then the
   metrics endpoint;
8. ``_register``: the bookie's address and state in metadata;
9. ``_start_services``: checkpoints, GC, the disk watch;
10. ``_start_repair``: BP-46 phase two (:mod:`~quire.node.repair`) in the
    background, while serving, when ``data_integrity_checking`` is on or a
    ledger is in limbo;
11. ``_start_autorecovery``: an auditor candidate and a replication worker
    (:mod:`~quire.node.autorecovery`) when ``autorecovery_enabled``.

:meth:`BookieNode.stop` undoes them: autorecovery and repair, services,
the HTTP endpoint, listener and connections, the last fsync, storage, registration, metadata
store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from quire.auth import ServerSecurity, server_security
from quire.bookie.admin import ServiceAdminActions, serve_admin
from quire.bookie.config import BookieConfig
from quire.bookie.cookie import (
    CookieCheck,
    check_cookies,
    missing_cookies_error,
    stamp_missing_cookies,
)
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.listener import BookieListener
from quire.bookie.metrics import BookieMetrics
from quire.bookie.server import BookieServer
from quire.bookie.storage import BookieStorage
from quire.client import Client, ClientConfig
from quire.errors import ConfigError, MetadataError, QuireError
from quire.http import HttpServer
from quire.metadata import BookieInfo, MetadataStore, open_leased_store
from quire.node.admin_api import BookieAdminApi
from quire.node.autorecovery import Autorecovery, AutorecoverySettings
from quire.node.entry_copier import EntryCopier
from quire.node.integrity import protect_if_needed
from quire.node.repair import (
    ClientRecoverer,
    LedgerRepair,
    LocalSink,
    RepairMetrics,
    RepairSettings,
)
from quire.peer import BookiePool
from quire.security import ClientCertificates, ServerTls
from quire.types import BookieState

log = logging.getLogger("quire.node")


class BookieNode:
    """A bookie process's parts, started and stopped in order (see the
    module docstring).  Also the server's
    :class:`~quire.bookie.status.StatePublisher`: a change of read-only
    state is registered in metadata."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.bookie_id = config.resolved_bookie_id
        self.metrics = BookieMetrics()
        self.address = ""
        self.metrics_address: str | None = None
        self._store: MetadataStore | None = None
        self._storage: BookieStorage | None = None
        self._committer: GroupCommitter | None = None
        self._server: BookieServer | None = None
        self._listener: BookieListener | None = None
        self._security = ServerSecurity()
        """TLS and authenticator of the HTTP endpoint (the settings' files are
        read at start, after the metadata store opens: a bad or unprotected
        file refuses the start)."""
        self._http: HttpServer | None = None
        self._registered = False
        self._registering: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()
        self._cookie_check: CookieCheck | None = None
        """The boot's cookie check; failed (directories missing their
        cookie) only with ``data_integrity_stamp_missing_cookies``."""
        self._repair: LedgerRepair | None = None
        self._repair_task: asyncio.Task[None] | None = None
        self._client: Client | None = None
        self._peers: BookiePool | None = None
        self._autorecovery: Autorecovery | None = None
        self._admin = BookieAdminApi(self)
        """The admin API under /api/v1/ (quire.node.admin_api)."""
        self.stopping = False

    @property
    def server(self) -> BookieServer:
        assert self._server is not None, "bookie not started"
        return self._server

    # what the admin API reads (quire.node.admin_api.AdminTarget)
    @property
    def metadata(self) -> MetadataStore:
        assert self._store is not None, "bookie not started"
        return self._store

    @property
    def storage(self) -> BookieStorage:
        assert self._storage is not None, "bookie not started"
        return self._storage

    @property
    def autorecovery(self) -> Autorecovery | None:
        return self._autorecovery

    @property
    def registered(self) -> bool:
        return self._registered

    def readiness(self) -> tuple[bool, str]:
        """``/ready``: registered (so clients find it) and not stopping."""
        if self.stopping:
            return False, "stopping"
        return (True, "") if self._registered else (False, "not registered yet")

    @property
    def read_only(self) -> bool:
        return self._server is not None and self._server.read_only

    # --- start ---------------------------------------------------------------------

    async def start(self) -> None:
        self._check_identity()
        store = await self._open_metadata()
        await self._validate_cookie(store)
        storage, committer = await self._open_storage()
        await self._protect(store, storage)
        server = await self._build_server(store, storage, committer)
        await self._listen(server)
        await self._register()
        self._start_services(server)
        await self._start_repair(store, storage, server, committer)
        await self._start_autorecovery(store)
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    def _check_identity(self) -> None:
        if not self.config.bookie_id and self.config.port == 0:
            raise QuireError("set bookie_id when port is 0 (the id must be stable)")

    async def _open_metadata(self) -> MetadataStore:
        self._store = await open_leased_store(
            self.config.metadata_uri, self.config.registration_lease_ms,
            **self.config.security.zookeeper.store_options())
        try:
            self._security = server_security(self.config.security, self._store)
        except QuireError:
            await self._store.close()
            self._store = None
            raise
        return self._store

    async def _validate_cookie(self, store: MetadataStore) -> None:
        storage_config = self.config.storage
        for d in (*storage_config.journal_dirs, *storage_config.ledger_dirs):
            Path(d).mkdir(parents=True, exist_ok=True)
        check = await check_cookies(store, self.bookie_id, storage_config.journal_dirs,
                                    storage_config.ledger_dirs)
        if check.failed and not self.config.data_integrity_stamp_missing_cookies:
            raise missing_cookies_error(check)
        if check.failed:
            log.warning("bookie %s: directories %s lost their cookie; they are stamped "
                        "once the bookie's ledgers are protected (BP-46 phase one)",
                        self.bookie_id, ", ".join(map(str, check.missing_dirs)))
        self._cookie_check = check

    async def _open_storage(self) -> tuple[BookieStorage, GroupCommitter]:
        self._storage = await asyncio.to_thread(BookieStorage.open, self.config.storage)
        self._check_last_shutdown(self._storage)
        self._committer = GroupCommitter(
            self._storage.journal, max_group_wait_ms=self.config.journal_max_group_wait_ms,
            loop_sync_max_ms=self.config.journal_sync_on_loop_max_ms)
        return self._storage, self._committer

    def _check_last_shutdown(self, storage: BookieStorage) -> None:
        """BP-46: report how the previous run ended."""
        last = storage.last_shutdown
        log.log(logging.WARNING if last.unclean else logging.INFO,
                "bookie %s: last shutdown %s", self.bookie_id, last.describe())

    async def _protect(self, store: MetadataStore, storage: BookieStorage) -> None:
        """BP-46 phase one (:func:`~quire.node.integrity.protect_if_needed`),
        then the missing cookies stamped: a crash before the stamps runs
        phase one again."""
        check = self._cookie_check
        cookie_failed = check is not None and check.failed
        await protect_if_needed(store, storage, self.bookie_id, cookie_failed=cookie_failed,
                                data_integrity_checking=self.config.data_integrity_checking)
        if check is not None and cookie_failed:
            await asyncio.to_thread(stamp_missing_cookies, check)
            log.warning("bookie %s: stamped the missing cookies of %s", self.bookie_id,
                        ", ".join(map(str, check.missing_dirs)))

    async def _build_server(self, store: MetadataStore, storage: BookieStorage,
                            committer: GroupCommitter) -> BookieServer:
        self._server = await BookieServer.open(self.config, storage, committer, store, self,
                                               self.metrics)
        self._server.services.update_disk_state()
        return self._server

    async def _listen(self, server: BookieServer) -> None:
        cfg = self.config
        security = cfg.security
        tls = ServerTls.from_config(security, ClientCertificates.REQUIRED if
                                    security.tls_ca_file else ClientCertificates.NONE)
        self._listener = BookieListener(server.hub, server, tls,
                                        allowed_roles=cfg.tls_allowed_roles,
                                        role_field=cfg.tls_role_field)
        port = await self._listener.start(cfg.resolved_listen_host, cfg.port)
        self.address = cfg.advertised_address(port)
        if cfg.metrics_port >= 0:  # /metrics and the admin requests (quire.bookie.admin)
            self._http = await serve_admin(
                self.metrics.registry, ServiceAdminActions(server.services),
                cfg.resolved_listen_host, cfg.metrics_port, tls=self._security.tls,
                authenticator=self._security.authenticator,
                extra_routes=self._admin.routes(), ready=self.readiness)
            assert self._http.port is not None  # started
            self.metrics_address = cfg.advertised_address(self._http.port)

    async def _register(self) -> None:
        assert self._store is not None
        state = BookieState.READ_ONLY if self.read_only else BookieState.WRITABLE
        await self._store.register_bookie(
            BookieInfo(self.bookie_id, self.address, state, self.metrics_address))
        self._registered = True

    def _start_services(self, server: BookieServer) -> None:
        server.services.start()

    async def _start_repair(self, store: MetadataStore, storage: BookieStorage,
                            server: BookieServer, committer: GroupCommitter) -> None:
        """BP-46 phase two, as a background task (see :mod:`~quire.node.repair`)."""
        cfg = self.config
        limbo = storage.limbo_ledgers()
        if not (cfg.data_integrity_checking or limbo):
            return
        client, peers = await self._client_and_peers(store)
        chunk_bytes = max(1 << 20, min(8 << 20, cfg.storage.write_cache_max_bytes // 8))
        copier = EntryCopier(peers, timeout_ms=cfg.repair_read_timeout_ms,
                             chunk_max_bytes=chunk_bytes,
                             batch_max_bytes=cfg.batch_read_max_size_bytes)
        settings = RepairSettings(cfg.repair_start_delay_ms, cfg.repair_retry_interval_ms,
                                  cfg.repair_parallel_ledgers, cfg.repair_progress_every_ledgers)
        metrics = RepairMetrics(self.metrics.registry, lambda: len(storage.limbo_ledgers()))
        self._repair = LedgerRepair(self.bookie_id, store, storage, ClientRecoverer(client),
                                    copier, LocalSink(storage, server.services.covering),
                                    committer.wait_durable, settings, metrics)
        log.info("bookie %s: phase two starts (%d ledgers in limbo)", self.bookie_id,
                 len(limbo))
        self._repair_task = asyncio.get_running_loop().create_task(
            self._repair.run(everything_first=cfg.data_integrity_checking))
        self._repair_task.add_done_callback(_log_failure)

    async def client_and_peers(self) -> tuple[Client, BookiePool]:
        return await self._client_and_peers(self.metadata)

    async def _client_and_peers(self, store: MetadataStore) -> tuple[Client, BookiePool]:
        """The client (recovery) and peer pool (copies) that repair and
        autorecovery share, made on first use: over TLS when this bookie
        serves TLS, its own certificate as the client certificate."""
        config = self._peer_client_config()
        if self._client is None:
            self._client = await Client.over(store, config)
        if self._peers is None:
            self._peers = await BookiePool.open(store, config.peer_config())
        return self._client, self._peers

    def _peer_client_config(self) -> ClientConfig:
        security = self.config.security
        if not security.tls_enabled:
            return ClientConfig()
        if not security.tls_ca_file:
            raise ConfigError("a bookie serving TLS needs tls_ca_file to reach its peers "
                              "(repair, autorecovery)")
        return ClientConfig(tls_ca=security.tls_ca_file, tls_cert=security.tls_cert_file,
                            tls_key=security.tls_key_file)

    async def _start_autorecovery(self, store: MetadataStore) -> None:
        cfg = self.config
        if not cfg.autorecovery_enabled:
            return
        client, peers = await self._client_and_peers(store)
        settings = AutorecoverySettings(
            lost_bookie_delay_s=cfg.lost_bookie_delay_s,
            open_ledger_grace_ms=cfg.open_ledger_grace_ms,
            check_interval_ms=cfg.autorecovery_interval_ms,
            read_timeout_ms=cfg.repair_read_timeout_ms,
            batch_max_bytes=cfg.batch_read_max_size_bytes)
        self._autorecovery = Autorecovery(store, peers, ClientRecoverer(client), self.bookie_id,
                                          settings)
        self._autorecovery.register_metrics(self.metrics.registry)
        self._autorecovery.start()

    async def repair_idle(self) -> None:
        """Return once phase two has nothing left in limbo (at once if it
        does not run)."""
        if self._repair is not None:
            await self._repair.wait_idle()

    def publish(self, state: BookieState) -> None:
        """StatePublisher: register the new state (once registered at all)."""
        if not self._registered:
            return  # start registers the state it finds
        task = asyncio.get_running_loop().create_task(self._publish())
        self._registering.add(task)
        task.add_done_callback(self._registering.discard)

    async def _publish(self) -> None:
        try:
            await self._register()
        except MetadataError as e:
            log.warning("could not register the bookie's state: %s", e)

    # --- stop ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, flush, checkpoint, unregister."""
        if self._listener is None:
            return
        self.stopping = True
        await self._admin.close()
        await self._stop_background()
        server = self._server
        if server is not None:
            await server.services.stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._listener.close()
        if server is not None:
            server.hub.close_all()
        await self._listener.wait_closed()
        self._listener = None
        if self._storage is not None and self._committer is not None:
            await self._committer.wait_durable(self._storage.journal.append_seq)
            self._committer.close()
            await asyncio.to_thread(self._storage.close)
        if self._store is not None:
            with contextlib.suppress(MetadataError):
                await self._store.unregister_bookie(self.bookie_id)
            await self._store.close()
        self._stopped.set()
        log.info("bookie %s stopped cleanly", self.bookie_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _stop_background(self) -> None:
        if self._autorecovery is not None:
            await self._autorecovery.stop()
            self._autorecovery = None
        if self._repair_task is not None:
            self._repair_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._repair_task
            self._repair_task = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._peers is not None:
            await self._peers.close()
            self._peers = None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("BP-46 phase two stopped: %r (ledgers left in limbo stay there until "
                  "the next start)", task.exception(), exc_info=task.exception())
