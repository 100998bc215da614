"""``quire sandbox``: a local cluster of bookie processes for trying Quire."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from quire.cli.common import DEFAULT_SANDBOX_DIR, emit_json, run_async
from quire.sandbox import (
    CONTROLLERS_HOST,
    NO_JOURNAL_SETTINGS,
    Sandbox,
    ServiceProcess,
    ServiceSupervisor,
    resolves_to,
)

if TYPE_CHECKING:
    from quire.sandbox_security import SandboxSecurity


@click.command()
@click.option("--bookies", default=3, show_default=True, help="Number of bookie processes.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_SANDBOX_DIR, show_default=True,
              help="State directory (kept across restarts).")
@click.option("--metadata", "metadata_uri", default=None,
              help="Metadata URI (default: SQLite in DIR; or zk://host:port/chroot).")
@click.option("--no-journal", is_flag=True,
              help="BP-46: bookies skip the journal for adds (journal_write_data = false) "
                   "and detect and repair what a crash loses (data_integrity_checking = true).")
@click.option("--segment-stores", default=1, show_default=True,
              help="Number of segment store processes (0: bookies only, no controller).")
@click.option("--controllers", default=1, show_default=True, type=click.IntRange(1, 9),
              help="Number of controller processes, on 127.0.0.1 .. 127.0.0.N, one port.")
@click.option("--autoscale-interval-s", default=0, type=click.IntRange(0, None),
              help="Auto-scaling's rate windows, cooldown and mute, in seconds, so that "
                   "streams scale within seconds (0: Pravega's 2 to 20 minutes).")
@click.option("--retention-interval-s", default=0, type=click.IntRange(0, None),
              help="How often retention policies are applied (0: every minute).")
@click.option("--secure", is_flag=True,
              help="TLS and authentication everywhere: a local CA and certificates for "
                   "localhost, a cluster secret and an admin user with a random password "
                   "(credentials.toml, mode 0600), all in DIR/security.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object once ready.")
def sandbox(bookies: int, directory: Path, metadata_uri: str | None, no_journal: bool,
            segment_stores: int, controllers: int, autoscale_interval_s: int,
            retention_interval_s: int, secure: bool, as_json: bool) -> None:
    """Run the whole system locally until Ctrl-C (or SIGTERM), as
    ``pravega standalone`` does: bookies, segment stores and the controller.

    A Pravega client connects to the controller URI it prints.  A process
    that exits is restarted on its address, with a backoff from 0.5 s
    doubling up to 30 s while restarts fail; the others keep serving.  Every
    process ends when the sandbox does, even by kill -9 (Linux).

    With --secure it prints the controller's tls://localhost URI, the CA and
    the credentials file, and the environment a Pravega client needs.
    """
    journal_settings = NO_JOURNAL_SETTINGS if no_journal else {}
    security = None
    if secure:
        from quire.sandbox_security import prepare

        security = prepare(directory / "security")
    cluster = Sandbox(directory, bookies, metadata_uri, segment_stores=segment_stores,
                      controller=segment_stores > 0, controllers=controllers,
                      autoscale_interval_s=autoscale_interval_s,
                      retention_interval_s=retention_interval_s, security=security,
                      metrics_port=0,
                      autorecovery_enabled=True, **journal_settings)
    run_async(lambda: check_store(cluster.metadata_uri, security))
    scheme = "https" if secure else "http"

    def ready(process: ServiceProcess) -> None:
        if not as_json:
            label = process.service if process.name == process.service or \
                process.service == "controller" else f"{process.service} {process.name}"
            click.echo(f"{label} ready on {process.address} "
                       f"(metrics {scheme}://{process.metrics_address}/metrics)", err=True)

    def announce() -> None:
        if as_json:
            emit_json(cluster.describe())
        else:
            click.echo(f"metadata: {cluster.metadata_uri}")
            if cluster.controller is not None:
                click.echo(f"controller: {cluster.controller_uri}")
                page = cluster.controller.ready_event.get("page")
                if page:
                    click.echo(f"cluster page: {page}")
                if len(cluster.controllers) > 1:
                    port = cluster.controller.settings["port"]
                    if resolves_to(CONTROLLERS_HOST, len(cluster.controllers)):
                        click.echo(f"controllers for a Pravega client: "
                                   f"tcp://{CONTROLLERS_HOST}:{port}")
                    else:
                        click.echo(f"{CONTROLLERS_HOST} does not resolve to 127.0.0.1 .. "
                                   f"127.0.0.{len(cluster.controllers)} (run scripts/setup "
                                   "--system): a Pravega client can use one controller only",
                                   err=True)
            if security is not None:
                click.echo(f"tls ca: {security.ca_file.resolve()}")
                click.echo(f"credentials: {security.credentials_file.resolve()}")
                click.echo("a Pravega client needs (the password read from the credentials "
                           "file):")
                for line in security.shell_exports():
                    click.echo(f"  {line}")
                click.echo("quire commands need:")
                for line in security.cli_exports():
                    click.echo(f"  {line}")
            click.echo(f"try: QUIRE_METADATA={cluster.metadata_uri} quire bookie list", err=True)
            if cluster.controller is not None:
                extra = (f" --tls-ca {security.ca_file.resolve()} --credentials "
                         f"{security.credentials_file.resolve()}" if security else "")
                click.echo(f"try: quire scope list --controller {cluster.controller_uri}"
                           f"{extra} (or any Pravega client)", err=True)
            click.echo("Ctrl-C stops the sandbox", err=True)

    def say(line: str) -> None:
        if as_json and line == STOPPING:
            return
        click.echo(line, err=True)

    if not as_json:
        click.echo(f"starting {bookies} bookies and {segment_stores} segment store(s) "
                   f"in {directory} ...", err=True)
    # a failed start (or Ctrl-C, a KeyboardInterrupt here) stops every bookie it started
    cluster.start(on_ready=ready)
    supervise(cluster, say, announce)


STOPPING = "stopping the sandbox ..."


def supervise(cluster: Sandbox, say: Callable[[str], None], announce: Callable[[], None]
              ) -> None:
    """Keep the processes running (:class:`ServiceSupervisor`) until SIGINT or
    SIGTERM, then stop them.  ``announce`` runs once the signals are caught,
    and they stay caught until every bookie stopped, so signals sent as soon
    as the sandbox says it is ready, or in a burst, stop it cleanly once."""
    # The handler runs between two bytecodes of this thread, wherever it is,
    # so it takes no lock: it notes the signal, and set_wakeup_fd makes the
    # pipe readable, which ends the loop's select at once.  (It used to set
    # a threading.Event, whose lock the loop's Event.wait could be holding
    # when the signal landed: Ctrl-C then hung the sandbox.)
    stop_signals: list[int] = []
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous_wakeup_fd = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    previous_handlers = {sig: signal.signal(sig, lambda signum, _frame: stop_signals.append(signum))
                         for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        announce()
        supervisor = ServiceSupervisor(cluster.processes, say)
        while not stop_signals:
            select.select([wake_read], [], [], 0.5)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
            if not stop_signals:
                supervisor.poll()
    finally:
        say(STOPPING)
        cluster.stop()
        signal.set_wakeup_fd(previous_wakeup_fd)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        os.close(wake_read)
        os.close(wake_write)


async def check_store(metadata_uri: str, security: SandboxSecurity | None = None) -> None:
    """Open and close the metadata store, so a URI that is not one fails
    here, before any bookie starts (initialising it, and saying so, if new);
    with ``security``, put its admin user in the user database."""
    from quire.auth import UserDatabase
    from quire.cli.common import open_cli_store

    store = await open_cli_store(metadata_uri, create=True)
    try:
        if security is not None:
            await security.ensure_admin(UserDatabase(store))
    finally:
        await store.close()
