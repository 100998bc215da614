"""The bookie's admin API under ``/api/v1/``, on its HTTP port (BookKeeper's HTTP admin service).

Served by :mod:`quire.http` beside ``/metrics`` (so TLS and
authentication apply: reading needs READ on ``prn::/``, changing
READ_UPDATE).  JSON in and out; paths and shapes follow BookKeeper's
where it has the endpoint (BookKeeper answers ``PUT`` for changes and so
does this), Quire's own fields added in ``camelCase`` as BookKeeper's:

==========================================  ======  =========================================
path                                        method  answer
==========================================  ======  =========================================
``/api/v1/bookie/info``                     GET     this bookie: id, address, free and total
                                                    disk, ledgers, entry logs, directories
``/api/v1/bookie/state``                    GET     ``running``, ``readOnly``, ``shuttingDown``,
                                                    ``availableForHighPriorityWrites``
``/api/v1/bookie/is_ready``                 GET     200 once registered, else 503
``/api/v1/bookie/state/readonly``           GET     ``{"readOnly": bool}``
``/api/v1/bookie/state/readonly``           PUT     body ``{"readOnly": bool}``: the
                                                    operator's toggle; the state after it
``/api/v1/bookie/list_bookies``             GET     ``?type=rw|ro`` (default both): bookie id
                                                    -> address of the registered bookies
``/api/v1/bookie/cluster_info``             GET     bookie counts, the auditor, whether any
                                                    ledger is under-replicated
``/api/v1/bookie/last_log_mark``            GET     journal directory -> ``"file:offset"``
                                                    of the last checkpoint (replay starts
                                                    there) and of the journal's end
``/api/v1/bookie/gc``                       GET     ``{"is_in_force_gc": bool}``
``/api/v1/bookie/gc``                       PUT     GC and a major compaction now; its report
``/api/v1/bookie/gc_details``               GET     ``[{compaction counters and times}]``
``/api/v1/ledger/list``                     GET     ``?print_metadata=true``: ledger id ->
                                                    metadata (or null)
``/api/v1/ledger/metadata``                 GET     ``?ledger_id=N``: ``{N: metadata}``;
                                                    404 if there is no such ledger
``/api/v1/autorecovery/status``             GET     whether this bookie runs autorecovery,
                                                    the auditor, lost bookies, marked ledgers
``/api/v1/autorecovery/list_under_replicated_ledger``  GET  ``?missingreplica=ID``: marked
                                                    ledger ids
``/api/v1/autorecovery/who_is_auditor``     GET     ``{"Auditor": id or null}``
``/api/v1/autorecovery/trigger_audit``      PUT     mark the lost bookies' ledgers now
``/api/v1/autorecovery/decommission``       PUT     body ``{"bookie_src": id}``: start
                                                    re-replicating what it holds (202)
``/api/v1/autorecovery/decommission``       GET     the running or last decommission
==========================================  ======  =========================================

Every refusal is ``{"error": ...}``: 400 for a bad body or parameter,
404 for an unknown ledger or bookie, 409 for a decommission already
running.  The cluster-wide answers read the metadata store the bookie
shares with everyone, so any bookie answers them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from quire.errors import HttpRequestError, MetadataNotFoundError, QuireError
from quire.http import Route, json_response, read_json
from quire.metadata import MetadataStore, ledger_json, read_leader
from quire.node.autorecovery import AutorecoverySettings, UnderReplication, lost_bookies
from quire.node.autorecovery.decommission import DecommissionProgress, decommission
from quire.node.autorecovery.records import AUDITOR_GROUP
from quire.node.repair import ClientRecoverer
from quire.types import BookieState

if TYPE_CHECKING:
    from aiohttp import web

    from quire.bookie.config import BookieConfig
    from quire.bookie.server import BookieServer
    from quire.bookie.storage import BookieStorage
    from quire.client import Client
    from quire.node.autorecovery import Autorecovery
    from quire.peer import BookiePool

log = logging.getLogger("quire.node")

PREFIX = "/api/v1"


class AdminTarget(Protocol):
    """What the admin API reads and changes of a running bookie (the
    :class:`~quire.node.bookie_node.BookieNode`)."""

    bookie_id: str
    address: str
    config: BookieConfig

    @property
    def metadata(self) -> MetadataStore: ...

    @property
    def server(self) -> BookieServer: ...

    @property
    def storage(self) -> BookieStorage: ...

    @property
    def autorecovery(self) -> Autorecovery | None: ...

    @property
    def registered(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    async def client_and_peers(self) -> tuple[Client, BookiePool]: ...


@dataclasses.dataclass
class _Decommission:
    bookie_id: str
    ledgers_left: int = -1
    entries_copied: int = 0
    ledgers_replicated: int | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = dataclasses.field(default=None, repr=False)

    def describe(self) -> dict[str, Any]:
        running = self.task is not None and not self.task.done()
        return {"bookie_src": self.bookie_id, "running": running,
                "ledgersLeft": self.ledgers_left, "entriesCopied": self.entries_copied,
                "ledgersReplicated": self.ledgers_replicated, "error": self.error}


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() in ("true", "1", "yes")


def _ledger_id(request: web.Request) -> int:
    raw = request.query.get("ledger_id")
    if raw is None:
        raise HttpRequestError(400, "ledger_id is required")
    try:
        return int(raw)
    except ValueError:
        raise HttpRequestError(400, f"ledger_id {raw!r} is not a number") from None


class BookieAdminApi:
    """The routes of one bookie's admin API (module docstring)."""

    def __init__(self, target: AdminTarget) -> None:
        self._target = target
        self._decommission: _Decommission | None = None

    def routes(self) -> list[Route]:
        def get(path: str, action: Callable[[web.Request], Awaitable[Any]]) -> Route:
            return Route("GET", PREFIX + path, self._json(action))

        def put(path: str, action: Callable[[web.Request], Awaitable[Any]]) -> Route:
            return Route("PUT", PREFIX + path, self._json(action))

        return [
            get("/bookie/info", self.info),
            get("/bookie/state", self.state),
            Route("GET", PREFIX + "/bookie/is_ready", self.is_ready),
            get("/bookie/state/readonly", self.read_only),
            put("/bookie/state/readonly", self.set_read_only),
            get("/bookie/list_bookies", self.list_bookies),
            get("/bookie/cluster_info", self.cluster_info),
            get("/bookie/last_log_mark", self.last_log_mark),
            get("/bookie/gc", self.gc_state),
            put("/bookie/gc", self.gc),
            get("/bookie/gc_details", self.gc_details),
            get("/ledger/list", self.ledgers),
            get("/ledger/metadata", self.ledger_metadata),
            get("/autorecovery/status", self.autorecovery_status),
            get("/autorecovery/list_under_replicated_ledger", self.under_replicated),
            get("/autorecovery/who_is_auditor", self.auditor),
            put("/autorecovery/trigger_audit", self.trigger_audit),
            put("/autorecovery/decommission", self.start_decommission),
            get("/autorecovery/decommission", self.decommission_state),
        ]

    @staticmethod
    def _json(action: Callable[[web.Request], Awaitable[Any]]
              ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                body = await action(request)
            except HttpRequestError:
                raise
            except QuireError as e:  # the metadata store, a peer: the answer says what failed
                log.warning("%s %s failed: %s", request.method, request.path, e)
                return json_response(500, {"error": f"{type(e).__name__}: {e}"})
            status = 202 if isinstance(body, _Accepted) else 200
            return json_response(status, body.body if isinstance(body, _Accepted) else body)
        return handler

    # --- the bookie ------------------------------------------------------------------

    async def info(self, _request: web.Request) -> dict[str, Any]:
        t = self._target
        storage = t.storage
        free, total = await asyncio.to_thread(storage.disk_usage)
        stats = storage.stats
        cfg = t.config.storage
        return {"bookieId": t.bookie_id, "address": t.address, "freeSpace": free,
                "totalSpace": total, "ledgers": stats.ledgers, "entryLogs": stats.entry_logs,
                "writeCacheBytes": stats.write_cache_bytes,
                "journalDirs": [str(d) for d in cfg.journal_dirs],
                "ledgerDirs": [str(d) for d in cfg.ledger_dirs]}

    async def state(self, _request: web.Request) -> dict[str, Any]:
        t = self._target
        read_only = t.server.read_only
        return {"running": not t.stopping, "readOnly": read_only,
                "shuttingDown": t.stopping, "availableForHighPriorityWrites": not read_only,
                "readOnlyByOperator": t.server.status.by_operator}

    async def is_ready(self, _request: web.Request) -> web.StreamResponse:
        if self._target.registered and not self._target.stopping:
            return json_response(200, {"ready": True})
        return json_response(503, {"ready": False})

    async def read_only(self, _request: web.Request) -> dict[str, Any]:
        return {"readOnly": self._target.server.read_only}

    async def set_read_only(self, request: web.Request) -> dict[str, Any]:
        body = await read_json(request)
        wanted = body.get("readOnly")
        if not isinstance(wanted, bool):
            raise HttpRequestError(400, 'the body must be {"readOnly": true|false}')
        return {"readOnly": self._target.server.status.set_by_operator(wanted)}

    async def last_log_mark(self, _request: web.Request) -> dict[str, Any]:
        storage = self._target.storage
        checkpointed = storage.ledger_storage.index.journal_mark()
        end = storage.journal.mark()
        journal = str(self._target.config.storage.journal_dirs[0])
        return {journal: {"checkpointed": None if checkpointed is None else
                          f"{checkpointed.file_seq}:{checkpointed.offset}",
                          "current": f"{end.file_seq}:{end.offset}"}}

    async def gc_state(self, _request: web.Request) -> dict[str, Any]:
        return {"is_in_force_gc": self._target.server.services.gc_details()["forceCompacting"]}

    async def gc(self, _request: web.Request) -> dict[str, Any]:
        return dataclasses.asdict(await self._target.server.services.gc_now())

    async def gc_details(self, _request: web.Request) -> list[dict[str, Any]]:
        return [self._target.server.services.gc_details()]

    # --- the cluster -----------------------------------------------------------------

    async def list_bookies(self, request: web.Request) -> dict[str, Any]:
        kind = request.query.get("type")
        if kind not in (None, "rw", "ro"):
            raise HttpRequestError(400, f"type must be rw or ro, not {kind!r}")
        wanted = {"rw": {BookieState.WRITABLE}, "ro": {BookieState.READ_ONLY}}.get(
            kind or "", set(BookieState))
        return {b.bookie_id: b.address for b in await self._target.metadata.list_bookies()
                if b.state in wanted}

    async def cluster_info(self, _request: web.Request) -> dict[str, Any]:
        store = self._target.metadata
        registered = await store.list_bookies()
        cookies = set(await store.list_cookies())
        writable = sum(b.state is BookieState.WRITABLE for b in registered)
        auditor = await read_leader(store, AUDITOR_GROUP)
        marked = await UnderReplication(store).marked()
        unavailable = len(cookies - {b.bookie_id for b in registered})
        return {"auditorElected": auditor is not None, "auditorId": auditor or "",
                "clusterUnderReplicated": bool(marked), "ledgerReplicationEnabled": True,
                "totalBookiesCount": len(registered) + unavailable,
                "writableBookiesCount": writable,
                "readonlyBookiesCount": len(registered) - writable,
                "unavailableBookiesCount": unavailable}

    async def ledgers(self, request: web.Request) -> dict[str, Any]:
        store = self._target.metadata
        with_metadata = _flag(request, "print_metadata")
        out: dict[str, Any] = {}
        for ledger_id in await store.list_ledgers():
            if not with_metadata:
                out[str(ledger_id)] = None
                continue
            with contextlib.suppress(MetadataNotFoundError):  # deleted meanwhile
                out[str(ledger_id)] = ledger_json(ledger_id,
                                                  (await store.read_ledger(ledger_id)).value)
        return out

    async def ledger_metadata(self, request: web.Request) -> dict[str, Any]:
        ledger_id = _ledger_id(request)
        try:
            found = await self._target.metadata.read_ledger(ledger_id)
        except MetadataNotFoundError:
            raise HttpRequestError(404, f"no ledger {ledger_id}") from None
        return {str(ledger_id): ledger_json(ledger_id, found.value)}

    # --- autorecovery ----------------------------------------------------------------

    async def autorecovery_status(self, _request: web.Request) -> dict[str, Any]:
        store = self._target.metadata
        return {"enabled": self._target.autorecovery is not None,
                "auditor": await read_leader(store, AUDITOR_GROUP),
                "lostBookies": sorted(await lost_bookies(store)),
                "underReplicatedLedgers": await UnderReplication(store).marked()}

    async def under_replicated(self, request: web.Request) -> list[int]:
        marks = UnderReplication(self._target.metadata)
        missing = request.query.get("missingreplica")
        excluding = request.query.get("excludingmissingreplica")
        found = []
        for ledger_id in await marks.marked():
            mark = await marks.read(ledger_id)
            if mark is None or (missing and missing not in mark.bookies) or \
                    (excluding and excluding in mark.bookies):
                continue
            found.append(ledger_id)
        return found

    async def auditor(self, _request: web.Request) -> dict[str, Any]:
        return {"Auditor": await read_leader(self._target.metadata, AUDITOR_GROUP)}

    async def trigger_audit(self, _request: web.Request) -> dict[str, Any]:
        from quire.node.autorecovery import mark_ledgers_of

        store = self._target.metadata
        lost = sorted(await lost_bookies(store))
        return {"lostBookies": lost, "ledgersMarked": await mark_ledgers_of(store, lost=lost)}

    async def start_decommission(self, request: web.Request) -> _Accepted:
        body = await read_json(request)
        bookie_id = body.get("bookie_src")
        if not isinstance(bookie_id, str) or not bookie_id:
            raise HttpRequestError(400, 'the body must be {"bookie_src": "<bookie id>"}')
        running = self._decommission
        if running is not None and running.task is not None and not running.task.done():
            raise HttpRequestError(409, f"bookie {running.bookie_id} is being decommissioned")
        if bookie_id not in await self._target.metadata.list_cookies():
            raise HttpRequestError(404, f"no bookie {bookie_id} (it has no cookie)")
        job = _Decommission(bookie_id)
        job.task = asyncio.get_running_loop().create_task(self._run_decommission(job))
        self._decommission = job
        return _Accepted(job.describe())

    async def _run_decommission(self, job: _Decommission) -> None:
        def progress(p: DecommissionProgress) -> None:
            job.ledgers_left, job.entries_copied = p.ledgers_left, p.entries_copied

        try:
            client, peers = await self._target.client_and_peers()
            job.ledgers_replicated = await decommission(
                self._target.metadata, peers, ClientRecoverer(client), job.bookie_id,
                AutorecoverySettings(), progress)
            job.ledgers_left = 0
        except QuireError as e:
            job.error = str(e)
            log.warning("decommission of bookie %s failed: %s", job.bookie_id, e)

    async def decommission_state(self, _request: web.Request) -> dict[str, Any]:
        if self._decommission is None:
            raise HttpRequestError(404, "no decommission was started on this bookie")
        return self._decommission.describe()

    async def close(self) -> None:
        """Stop a decommission still running (the bookie stops)."""
        job = self._decommission
        if job is not None and job.task is not None and not job.task.done():
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task


@dataclasses.dataclass(frozen=True)
class _Accepted:
    """An answer of 202: the change started and goes on."""

    body: dict[str, Any]
