"""What the cluster page shows, gathered by the controller every ``interval_ms``.

:class:`ClusterView` polls, on the controller's loop:

* **bookies**: every bookie with a cookie (known) and its registration
  (up, read-only, or down when unregistered or not answering), its
  ``/metrics`` (entries, entry-log bytes and journal bytes written: rates
  per second) and ``/api/v1/bookie/info`` (disk, ledgers);
* **segment stores**: the live registrations (``segmentstore/hosts/``),
  each one's ``/api/v1/containers`` (owned containers, tier-1 frames,
  tier-2 backlog, read-index bytes, failures) and ``/metrics`` (per-stream
  event and byte totals, containers whose tier-2 flushing fails now);
* **streams**: the controller's own records (state, segment counts per
  epoch: the scaling history, retention), rates from the stores' totals,
  and the reader groups of each scope with their lag in bytes (the
  segments' lengths less the group's read offsets);
* **autorecovery**: the auditor, lost bookies, under-replicated ledgers;
* **errors**: the last warnings logged by this process (a scrape that
  failed among them).

Each poll keeps a sample of the rates for the charts (the last
``history_samples``).  The other processes' HTTP ports are reached with
the controller's own TLS trust (``tls_ca_file``) and, when they
authenticate, a short-lived internal token the controller signs with the
cluster secret (:meth:`~quire.security.TokenSigner.internal_token`).
Nothing here writes anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from quire.controller.core import ControllerCore
from quire.controller.reader_groups import ReaderGroups
from quire.errors import QuireError
from quire.metadata import MetadataStore, read_leader
from quire.node.autorecovery import UnderReplication, lost_bookies
from quire.node.autorecovery.records import AUDITOR_GROUP
from quire.segmentstore.ownership import host_registrations
from quire.types import BookieState

log = logging.getLogger("quire.controller.page")

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """Prometheus text as sample name -> [(labels, value)]."""
    out: Samples = collections.defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), float(sample.value)))
    return out


def _total(samples: Samples, name: str) -> float:
    return sum(v for _labels, v in samples.get(name, ()))


class PeerHttp:
    """GETs to the other processes' HTTP ports (module docstring)."""

    def __init__(self, tls: ssl.SSLContext | None,
                 authorization: Callable[[], str | None] = lambda: None,
                 timeout_s: float = 3.0) -> None:
        self.tls = tls
        self._authorization = authorization
        self._timeout_s = timeout_s
        self._session: Any = None

    async def get(self, address: str, path: str) -> tuple[int, str]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=self._timeout_s))
        scheme = "https" if self.tls is not None else "http"
        authorization = self._authorization()
        headers = {"Authorization": authorization} if authorization else {}
        async with self._session.get(f"{scheme}://{address}{path}", headers=headers,
                                     ssl=self.tls if self.tls is not None else False) as answer:
            return answer.status, await answer.text()

    async def get_ok(self, address: str, path: str) -> str:
        status, text = await self.get(address, path)
        if status != 200:
            raise QuireError(f"{address}{path}: HTTP {status}: {text[:200]}")
        return text

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class RecentErrors(logging.Handler):
    """The last warnings and errors logged by the process."""

    def __init__(self, keep: int = 30) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"time_ms": int(record.created * 1000), "level": record.levelname,
                             "logger": record.name, "message": record.getMessage()[:500]})


@dataclass
class _Rate:
    """A counter's last value and time, to turn it into a rate."""

    value: float = -1.0
    at: float = 0.0

    def update(self, value: float, now: float) -> float:
        rate = 0.0
        if self.value >= 0 and now > self.at and value >= self.value:
            rate = (value - self.value) / (now - self.at)
        self.value, self.at = value, now
        return rate


class ClusterView:
    """See the module docstring: :meth:`start` polls until :meth:`close`;
    :meth:`snapshot` is the page's JSON."""

    def __init__(self, core: ControllerCore, metadata: MetadataStore, peers: PeerHttp,
                 reader_groups: ReaderGroups, *, interval_ms: int = 1000,
                 history_samples: int = 180) -> None:
        self.core = core
        self.metadata = metadata
        self.peers = peers
        self.reader_groups = reader_groups
        self.interval_s = interval_ms / 1000
        self.errors = RecentErrors()
        self.history: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=history_samples)
        self._rates: dict[str, _Rate] = collections.defaultdict(_Rate)
        self._latest: dict[str, Any] = {"bookies": [], "segment_stores": [], "streams": [],
                                        "autorecovery": {}, "errors": [], "time_ms": 0}
        self._task: asyncio.Task[None] | None = None
        self._logger = logging.getLogger("quire")

    def start(self) -> None:
        self._logger.addHandler(self.errors)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-view")

    async def close(self) -> None:
        self._logger.removeHandler(self.errors)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.peers.close()

    def snapshot(self) -> dict[str, Any]:
        return {**self._latest, "errors": list(self.errors.records)[::-1],
                "history": list(self.history)}

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # the next poll tries again; the page shows the error
                log.exception("cluster page: gathering failed")
            await asyncio.sleep(self.interval_s)  # the page's refresh period

    def _rate(self, key: str, value: float, now: float) -> float:
        return round(self._rates[key].update(value, now), 3)

    async def poll(self) -> None:
        now = time.monotonic()
        bookies, stores = await asyncio.gather(self._bookies(now), self._segment_stores())
        streams = await self._streams(now, stores)
        self._latest = {"time_ms": int(time.time() * 1000), "bookies": bookies,
                        "segment_stores": [s["view"] for s in stores], "streams": streams,
                        "autorecovery": await self._autorecovery()}
        self.history.append({
            "time_ms": self._latest["time_ms"],
            "bookies": {b["id"]: {"entries_per_s": b["entries_per_s"],
                                  "journal_bytes_per_s": b["journal_bytes_per_s"]}
                        for b in bookies},
            "streams": {s["name"]: {"events_per_s": s["events_per_s"],
                                    "bytes_per_s": s["bytes_per_s"]} for s in streams},
            "tier2_backlog_bytes": sum(c.get("tier2BacklogBytes") or 0
                                       for s in stores for c in s["view"]["containers"])})

    def _failed(self, what: str, error: BaseException) -> str:
        message = f"{what}: {type(error).__name__}: {error}"
        log.warning("cluster page: %s", message)
        return message

    async def _bookies(self, now: float) -> list[dict[str, Any]]:
        registered = {b.bookie_id: b for b in await self.metadata.list_bookies()}
        known = sorted(set(await self.metadata.list_cookies()) | set(registered))

        async def one(bookie_id: str) -> dict[str, Any]:
            info = registered.get(bookie_id)
            view: dict[str, Any] = {"id": bookie_id, "address": info.address if info else None,
                                    "state": "down", "entries_per_s": 0.0,
                                    "entry_log_bytes_per_s": 0.0, "journal_bytes_per_s": 0.0,
                                    "free_bytes": None, "total_bytes": None, "ledgers": None,
                                    "error": None}
            if info is None:
                return view
            view["state"] = "read-only" if info.state is BookieState.READ_ONLY else "up"
            if not info.metrics_address:
                return view
            try:
                samples = parse_metrics(await self.peers.get_ok(info.metrics_address,
                                                                "/metrics"))
                details = json.loads(await self.peers.get_ok(
                    info.metrics_address, "/api/v1/bookie/info"))
            except (TimeoutError, OSError, QuireError, ValueError) as e:
                view["state"] = "down"
                view["error"] = self._failed(f"bookie {bookie_id}", e)
                return view
            for key, name in (("entries_per_s", "quire_bookie_entries_written_total"),
                              ("entry_log_bytes_per_s", "quire_bookie_bytes_written_total"),
                              ("journal_bytes_per_s",
                               "quire_bookie_journal_written_bytes_total")):
                view[key] = self._rate(f"bookie/{bookie_id}/{key}", _total(samples, name), now)
            view.update(free_bytes=details.get("freeSpace"), total_bytes=details.get(
                "totalSpace"), ledgers=details.get("ledgers"))
            return view

        return list(await asyncio.gather(*(one(b) for b in known)))

    async def _segment_stores(self) -> list[dict[str, Any]]:
        async def one(host_id: str, record: dict[str, str]) -> dict[str, Any]:
            view: dict[str, Any] = {"id": host_id, "address": record.get("address"),
                                    "containers": [], "degraded_containers": 0, "error": None}
            samples: Samples = {}
            address = record.get("metrics")
            if address:
                try:
                    samples = parse_metrics(await self.peers.get_ok(address, "/metrics"))
                    view["containers"] = json.loads(await self.peers.get_ok(
                        address, "/api/v1/containers"))["containers"]
                    view["degraded_containers"] = int(_total(
                        samples, "quire_segmentstore_container_degraded"))
                except (TimeoutError, OSError, QuireError, ValueError, KeyError) as e:
                    view["error"] = self._failed(f"segment store {host_id}", e)
            return {"view": view, "samples": samples, "metrics": address}

        hosts = await host_registrations(self.metadata)
        return list(await asyncio.gather(*(one(h, r) for h, r in sorted(hosts.items()))))

    async def segment_names(self, prefix: str) -> list[str]:
        """The live segments whose name starts with ``prefix``, from every
        segment store (the reader groups' :data:`SegmentLister`)."""
        from urllib.parse import quote

        names: list[str] = []
        for record in (await host_registrations(self.metadata)).values():
            address = record.get("metrics")
            if address:
                text = await self.peers.get_ok(address, f"/api/v1/segments?prefix="
                                                        f"{quote(prefix)}")
                names.extend(s["name"] for s in json.loads(text)["segments"])
        return names

    async def _all_streams(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        scopes, token = await self.core.list_scopes("")
        while scopes:
            for scope in scopes:
                names, stream_token = await self.core.list_streams(scope, "")
                while names:
                    found.extend((scope, n) for n in names)
                    names, stream_token = await self.core.list_streams(scope, stream_token)
            scopes, token = await self.core.list_scopes(token)
        return found

    async def _segment_lengths(self, stores: Iterable[dict[str, Any]], prefix: str
                               ) -> dict[str, int]:
        lengths: dict[str, int] = {}
        for store in stores:
            if store["metrics"] and store["view"]["error"] is None:
                with contextlib.suppress(OSError, QuireError, ValueError, asyncio.TimeoutError):
                    from urllib.parse import quote

                    text = await self.peers.get_ok(store["metrics"],
                                                   f"/api/v1/segments?prefix={quote(prefix)}")
                    lengths.update({s["name"]: s["length"]
                                    for s in json.loads(text)["segments"]})
        return lengths

    async def _streams(self, now: float, stores: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events: dict[tuple[str, str], float] = collections.defaultdict(float)
        sizes: dict[tuple[str, str], float] = collections.defaultdict(float)
        for store in stores:
            for target, name in ((events, "quire_segmentstore_stream_events_appended_total"),
                                 (sizes, "quire_segmentstore_stream_bytes_appended_total")):
                for labels, value in store["samples"].get(name, ()):
                    target[labels.get("scope", ""), labels.get("stream", "")] += value
        out = []
        groups_by_scope: dict[str, list[dict[str, Any]]] = {}
        for scope, name in await self._all_streams():
            try:
                record = await self.core.stream(scope, name)
            except QuireError:
                continue
            if scope not in groups_by_scope:
                groups_by_scope[scope] = await self._groups(scope, stores)
            key = f"{scope}/{name}"
            c = record.config
            out.append({
                "name": key, "state": record.state.value,
                "segments": len(record.current.segments),
                "epochs": [{"epoch": e.epoch, "created_ms": e.created_ms,
                            "segments": [[s.min_key, s.max_key] for s in e.segments]}
                           for e in record.epochs[-50:]],
                "retention": {"type": c.retention.value, "param": c.retention_param,
                              "max": c.retention_max},
                "events_per_s": self._rate(f"stream/{key}/events", events[scope, name], now),
                "bytes_per_s": self._rate(f"stream/{key}/bytes", sizes[scope, name], now),
                "events_total": events[scope, name], "bytes_total": sizes[scope, name],
                "reader_groups": [g for g in groups_by_scope[scope] if key in g["streams"]]})
        return out

    async def _groups(self, scope: str, stores: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups = []
        lengths: dict[str, int] | None = None
        for group in await self.reader_groups.names(scope):
            try:
                state = await self.reader_groups.state(scope, group)
            except (QuireError, ValueError) as e:
                self._failed(f"reader group {scope}/{group}", e)
                continue
            if state is None:
                continue
            if lengths is None:
                lengths = await self._segment_lengths(stores, f"{scope}/")
            positions = state.positions()
            lag = sum(max(0, lengths.get(s, 0) - offset) for s, offset in positions.items())
            groups.append({"name": group, "streams": state.streams, "readers":
                           sorted(state.readers), "lag_bytes": lag, "positions": positions})
        return groups

    async def _autorecovery(self) -> dict[str, Any]:
        marks = UnderReplication(self.metadata)
        marked = await marks.marked()
        return {"auditor": await read_leader(self.metadata, AUDITOR_GROUP),
                "lost_bookies": sorted(await lost_bookies(self.metadata)),
                "under_replicated": marked[:100], "under_replicated_count": len(marked)}

