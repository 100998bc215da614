"""The sandbox: the whole system as child processes, its state in one directory."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quire.bookie.storage.files import lock_holder
from quire.errors import QuireError
from quire.sandbox.processes import (
    CONTROLLER_HTTP_PORT,
    CONTROLLER_PORT,
    BookieProcess,
    ControllerProcess,
    SegmentStoreProcess,
    ServiceProcess,
    autoscale_settings,
    free_port,
    preferred_port,
    sqlite_uri,
    start_all,
    stop_all,
    tier1_quorums,
)

if TYPE_CHECKING:
    from quire.sandbox_security import SandboxSecurity

class Sandbox:
    """The whole system on one machine, as ``pravega standalone`` runs it:
    N bookies, M segment stores and the controller on one metadata store,
    state in ``directory`` (tier-2 in ``directory/tier2``).

    Names and ports (``bookie-1`` ..., ``segmentstore-1`` ..., the
    controller on 9090 when that is free) are chosen on first start and
    kept in ``directory/sandbox.json``, so a restart serves the same
    ledgers and segments at the same addresses.

    With ``security`` (:mod:`quire.sandbox_security`) every process gets
    its TLS and auth settings from it.
    """

    def __init__(self, directory: Path, bookies: int = 3, metadata_uri: str | None = None,
                 segment_stores: int = 1, controller: bool = True, controllers: int = 1,
                 autoscale_interval_s: int = 0, retention_interval_s: int = 0,
                 security: SandboxSecurity | None = None,
                 **bookie_settings: Any) -> None:
        self.directory = directory
        self.count = bookies
        self.security = security
        if security is not None:
            bookie_settings = {**bookie_settings, **security.bookie_settings()}
        self.bookie_settings = bookie_settings
        state = self._load_state()
        self.metadata_uri = (metadata_uri or state.get("metadata")
                             or sqlite_uri(directory / "metadata.db"))
        ports: dict[str, int] = state.get("ports", {})
        self.bookies: list[BookieProcess] = []
        for i in range(1, bookies + 1):
            bookie_id = f"bookie-{i}"
            port = ports.get(bookie_id) or free_port()
            process = BookieProcess(directory, self.metadata_uri, bookie_id, port=port,
                                    **bookie_settings)
            process.ends_with_parent = True
            self.bookies.append(process)
        store_autoscale, controller_autoscale = autoscale_settings(autoscale_interval_s)
        self.segment_stores: list[SegmentStoreProcess] = []
        for i in range(1, segment_stores + 1):
            name = f"segmentstore-{i}"
            store = SegmentStoreProcess(directory, self.metadata_uri, name,
                                        port=ports.get(name) or free_port(), metrics_port=0,
                                        tier2_uri=(directory / "tier2").resolve().as_uri(),
                                        **tier1_quorums(bookies), **store_autoscale,
                                        **(security.segment_store_settings() if security
                                           else {}))
            store.ends_with_parent = True
            self.segment_stores.append(store)
        # controllers on 127.0.0.1 .. 127.0.0.N, one port (see CONTROLLERS_HOST)
        self.controllers: list[ControllerProcess] = []
        port = ports.get("controller") or preferred_port(CONTROLLER_PORT)
        retention = {"retention_interval_ms": retention_interval_s * 1000} \
            if retention_interval_s > 0 else {}
        count = controllers if controller else 0
        for i in range(1, count + 1):
            secure = security.controller_settings(i, count) if security else {}
            controller_process = ControllerProcess(
                directory, self.metadata_uri, "controller" if i == 1 else f"controller-{i}",
                host=f"127.0.0.{i}", port=port,
                metrics_port=(ports.get("controller-http") or preferred_port(CONTROLLER_HTTP_PORT))
                if i == 1 else 0, **controller_autoscale,
                **retention, **secure)
            controller_process.ends_with_parent = True
            self.controllers.append(controller_process)
        self.controller = self.controllers[0] if self.controllers else None

    @property
    def controller_uri(self) -> str:
        """Every controller, for Quire's clients: ``tcp://a:p,b:p,...``
        (``tls://`` under TLS)."""
        scheme = "tls" if self.security is not None else "tcp"
        return f"{scheme}://" + ",".join(
            c.uri.partition("://")[2] if c.address else f"{c.settings['host']}:{c.settings['port']}"
            for c in self.controllers)

    @property
    def processes(self) -> list[ServiceProcess]:
        """Every process, in start order."""
        return [*self.bookies, *self.segment_stores, *self.controllers]

    def _load_state(self) -> dict[str, Any]:
        path = self.directory / "sandbox.json"
        if path.exists():
            loaded: dict[str, Any] = json.loads(path.read_text())
            return loaded
        return {}

    def _save_state(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = {p.name: p.settings["port"] for p in self.processes}
        if self.controller is not None:
            ports["controller-http"] = self.controller.settings["metrics_port"]
        state = {"metadata": self.metadata_uri, "ports": ports}
        (self.directory / "sandbox.json").write_text(json.dumps(state, indent=2))

    def start(self, on_ready: Callable[[ServiceProcess], None] | None = None,
              timeout_s: float = 60.0) -> None:
        """Start the bookies, then the segment stores, then the controller;
        QuireError naming the holders if another process holds one of the
        bookies' directories, or if a process fails to start (then every
        process started is stopped).  Start it from a thread that lives as
        long as the sandbox (see :func:`parent_death_prefix`)."""
        self.check_not_held()
        self._save_state()
        start_all(self.bookies, timeout_s, on_ready)
        try:
            start_all(self.segment_stores, timeout_s, on_ready)
            start_all(self.controllers, timeout_s, on_ready)
        except BaseException:
            self.stop()
            raise

    def check_not_held(self) -> None:
        """QuireError if a process holds a storage lock in the directory (a
        sandbox or bookies left running, say), naming each holder."""
        held = []
        for bookie in self.bookies:
            for lock in sorted(bookie.data_dir.glob("*/*/LOCK")):
                holder = lock_holder(lock.parent)
                if holder is not None:
                    held.append(f"{lock.parent} by {holder}")
        if held:
            raise QuireError(f"{self.directory} is in use (stop those processes first): "
                             + "; ".join(held))

    def stop(self) -> None:
        """Stop the controller, then the segment stores (their containers
        drained), then the bookies."""
        stop_all(self.controllers)
        stop_all(self.segment_stores)
        stop_all(self.bookies)

    def describe(self) -> dict[str, Any]:
        def pid(p: ServiceProcess) -> int | None:
            return p.proc.pid if p.proc is not None else None

        return {"metadata": self.metadata_uri, "dir": str(self.directory.resolve()),
                "bookies": [{"bookie_id": b.bookie_id, "address": b.address,
                             "metrics": b.metrics_address, "pid": pid(b)}
                            for b in self.bookies],
                "segment_stores": [{"host_id": s.host_id, "address": s.address,
                                    "metrics": s.metrics_address, "pid": pid(s)}
                                   for s in self.segment_stores],
                "controller": None if self.controller is None else {
                    "uri": self.controller_uri, "metrics": self.controller.metrics_address,
                    "page": self.controller.ready_event.get("page"),
                    "pid": pid(self.controller)},
                "controllers": [{"address": c.address, "metrics": c.metrics_address,
                                 "pid": pid(c)} for c in self.controllers],
                "security": None if self.security is None else {
                    "tls_ca": str(self.security.ca_file.resolve()),
                    "credentials": str(self.security.credentials_file.resolve())}}


