"""Helpers shared by the CLI commands: the metadata URI default, output,
asyncio, and the one place errors become ``error: ...`` (:class:`QuireGroup`)."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import click
from click.exceptions import NoArgsIsHelpError

from quire.errors import QuireError

if TYPE_CHECKING:
    from quire.client import Client, ClientConfig
    from quire.metadata import MetadataStore
    from quire.security import ZooKeeperSecurityConfig

T = TypeVar("T")

DEFAULT_SANDBOX_DIR = Path("quire-sandbox")


def default_metadata_uri() -> str:
    """``$QUIRE_METADATA``, else the default sandbox's SQLite file."""
    env = os.environ.get("QUIRE_METADATA")
    if env:
        return env
    return f"sqlite:///{(DEFAULT_SANDBOX_DIR / 'metadata.db').resolve()}"


ZOOKEEPER_OPTIONS = (
    ("zookeeper_digest_file", "QUIRE_ZOOKEEPER_DIGEST_FILE",
     "File (mode 0600) holding the user:password of a zk:// store's digest ACLs"),
    ("zookeeper_tls_ca_file", "QUIRE_ZOOKEEPER_TLS_CA_FILE",
     "PEM CA file of ZooKeeper's certificate: reach a zk:// store over TLS"),
    ("zookeeper_tls_cert_file", "QUIRE_ZOOKEEPER_TLS_CERT_FILE",
     "PEM client certificate for ZooKeeper over TLS"),
    ("zookeeper_tls_key_file", "QUIRE_ZOOKEEPER_TLS_KEY_FILE",
     "PEM private key of --zookeeper-tls-cert-file (mode 0600)"),
)
"""The options of every command with ``--metadata``: how it reaches a
``zk://`` store (ZooKeeperSecurityConfig key, environment variable, help)."""
_ZOOKEEPER_META = "quire.zookeeper"


def _remember_zookeeper(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value and param.name:
        ctx.meta.setdefault(_ZOOKEEPER_META, {})[param.name] = value


def metadata_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--metadata URI``, and the ``--zookeeper-*`` options (defaults
    ``$QUIRE_ZOOKEEPER_DIGEST_FILE`` ...) that :func:`open_cli_store` uses;
    only the URI is passed to the command."""
    for name, env, text in reversed(ZOOKEEPER_OPTIONS):
        func = click.option("--" + name.replace("_", "-"), name, envvar=env, default=None,
                            expose_value=False, callback=_remember_zookeeper,
                            help=f"{text} (default: ${env}).")(func)
    return click.option(
        "--metadata", "metadata_uri", default=None,
        help="Metadata store URI (default: $QUIRE_METADATA, then "
             "./quire-sandbox/metadata.db).")(func)


def zookeeper_settings() -> ZooKeeperSecurityConfig:
    """The running command's ``--zookeeper-*`` options (or their variables)."""
    from quire.security import ZooKeeperSecurityConfig

    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(_ZOOKEEPER_META, {}) if ctx is not None else {}
    return ZooKeeperSecurityConfig(**given)


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")

TLS_OPTIONS = (
    ("tls_ca", "QUIRE_TLS_CA", "PEM file of the CA that signs the bookies' certificates: "
     "reach them over TLS"),
    ("tls_cert", "QUIRE_TLS_CERT", "PEM client certificate, for bookies with mutual TLS"),
    ("tls_key", "QUIRE_TLS_KEY", "PEM private key of --tls-cert (mode 0600)"),
)
"""The options of commands that reach bookies: (ClientConfig key, environment
variable, help)."""
_TLS_META = "quire.client_tls"


def _remember_tls(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value and param.name:
        ctx.meta.setdefault(_TLS_META, {})[param.name] = value


def tls_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` (defaults ``$QUIRE_TLS_CA``,
    ``$QUIRE_TLS_CERT``, ``$QUIRE_TLS_KEY``): how a command's client reaches
    bookies that serve TLS.  They are kept for :func:`client_config`, not
    passed to the command."""
    for name, env, text in reversed(TLS_OPTIONS):
        func = click.option("--" + name.replace("_", "-"), name, envvar=env, default=None,
                            expose_value=False, callback=_remember_tls,
                            help=f"{text} (default: ${env}).")(func)
    return func


def client_config() -> ClientConfig:
    """The ledger client settings of the running command (its TLS options)."""
    from quire.client import ClientConfig

    ctx = click.get_current_context(silent=True)
    tls = ctx.meta.get(_TLS_META, {}) if ctx is not None else {}
    return ClientConfig(**tls)


COMMAND_LINE_SHOWS_SECRETS = ("other users of this host see it in ps and /proc, and it stays "
                              "in shell histories")
"""Why no secret is a command-line argument (the words the CLI says it with)."""

LEDGER_PASSWORD_ENV = "QUIRE_LEDGER_PASSWORD"
_LEDGER_PASSWORD_META = "quire.ledger_password"


def _remember_ledger_password(ctx: click.Context, param: click.Parameter,
                              value: str | None) -> None:
    if value is not None and param.name:
        ctx.meta.setdefault(_LEDGER_PASSWORD_META, {})[param.name] = value


def ledger_password_options(absent: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--password-file PATH`` (a secret file, mode 0600, see
    :func:`quire.security.read_secret`) and the hidden, deprecated
    ``--password``: the ledger password of a command that opens or creates
    ledgers, read with :func:`ledger_password`.  ``absent`` says in the help
    what the command does with neither them nor ``$QUIRE_LEDGER_PASSWORD``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--password", "password_argument", default=None, hidden=True,
                            expose_value=False, callback=_remember_ledger_password,
                            help="Deprecated: see --password-file.")(func)
        return click.option(
            "--password-file", "password_file", type=click.Path(dir_okay=False),
            default=None, expose_value=False, callback=_remember_ledger_password,
            help=f"File (mode 0600) holding the ledger password (default: "
                 f"${LEDGER_PASSWORD_ENV}, else {absent}).")(func)

    return decorate


@overload
def ledger_password(absent: bytes) -> bytes: ...
@overload
def ledger_password(absent: None) -> bytes | None: ...
def ledger_password(absent: bytes | None) -> bytes | None:
    """The running command's ledger password (:func:`ledger_password_options`):
    the secret in ``--password-file``, else the deprecated ``--password``
    (with one warning on stderr), else ``$QUIRE_LEDGER_PASSWORD`` when not
    empty, else ``absent``."""
    from quire.security import read_secret

    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(_LEDGER_PASSWORD_META, {}) if ctx is not None else {}
    password_file, argument = given.get("password_file"), given.get("password_argument")
    if password_file is not None and argument is not None:
        raise click.UsageError("give --password-file or --password, not both")
    if password_file is not None:
        return read_secret(password_file)
    if argument is not None:
        click.echo(f"warning: --password is deprecated: {COMMAND_LINE_SHOWS_SECRETS}; use "
                   f"--password-file PATH or ${LEDGER_PASSWORD_ENV}", err=True)
        return str(argument).encode()
    env = os.environ.get(LEDGER_PASSWORD_ENV)
    return env.encode() if env else absent


async def until_interrupted(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until it ends or Ctrl-C (SIGINT), which cancels it, and
    again each second until it has ended: Python 3.11's ``asyncio.wait_for``
    can drop a cancellation that meets a finished wait, and a ``tail -f``
    whose one cancellation was dropped followed on for good (seen once in a
    full run: no exit 30 s after Ctrl-C). Its errors pass through."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    interrupted = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    waiting = loop.create_task(interrupted.wait())
    try:
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        loop.remove_signal_handler(signal.SIGINT)
    if not task.cancelled():
        task.result()


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on a fresh uvloop loop; its errors reach :class:`QuireGroup`."""
    import uvloop

    return uvloop.run(factory())


USER_ERRORS: tuple[type[BaseException], ...] = (QuireError, ValueError, OSError,
                                                  sqlite3.Error, TimeoutError)
"""Exceptions that mean the request could not be done (bad input, a store
that is not there, a cluster that cannot serve it): shown as one line.
Anything else is an internal error: one line too, plus a hint about
``--debug``, which shows the traceback."""

DEBUG_ENV = "QUIRE_DEBUG"


def debug_wanted(argv: Sequence[str]) -> bool:
    """``quire --debug ...`` (before the command's name) or ``QUIRE_DEBUG=1``:
    let tracebacks through."""
    root_options = itertools.takewhile(lambda arg: arg.startswith("-"), argv)
    return "--debug" in root_options or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report_error(message: str, as_json: bool) -> None:
    """The error convention: ``error: MESSAGE`` on stderr, and with ``--json``
    also ``{"error": MESSAGE}`` on stdout; a message of several lines is
    joined into one."""
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    if as_json:
        emit_json({"error": message})
    click.echo(f"error: {message}", err=True)


def describe_error(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, OSError) and error.filename is not None and str(error.filename) \
            not in text:
        text = f"{text}: {error.filename}"
    return text


class QuireGroup(click.Group):
    """The ``quire`` root group: every command's errors end here.

    A click usage error exits 2, anything else 1, after :func:`report_error`
    (no traceback).  An exception outside :data:`USER_ERRORS` says it is
    internal and to run with ``--debug``; with ``--debug`` or
    ``QUIRE_DEBUG=1`` it propagates with its traceback.  Ctrl-C exits 130.
    """

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in argv
        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False,
                                  **extra)
        except NoArgsIsHelpError as e:  # a bare group: its help, as click shows it
            click.echo(e.format_message(), err=True)
            return self._finish(2, standalone_mode)
        except click.UsageError as e:
            hint = f" (try '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            report_error(e.format_message() + hint, as_json)
            return self._finish(2, standalone_mode)
        except click.ClickException as e:
            report_error(e.format_message(), as_json)
            return self._finish(e.exit_code, standalone_mode)
        except click.Abort:
            return self._finish(130, standalone_mode)
        except USER_ERRORS as e:
            if debug_wanted(argv):
                raise
            report_error(describe_error(e), as_json)
            return self._finish(1, standalone_mode)
        except Exception as e:
            if debug_wanted(argv):
                raise
            report_error(f"internal error: {type(e).__name__}: {describe_error(e)} "
                         "(run with --debug for details)", as_json)
            return self._finish(1, standalone_mode)
        code = result if isinstance(result, int) else 0
        return self._finish(code, standalone_mode) if standalone_mode else result

    @staticmethod
    def _finish(code: int, standalone_mode: bool) -> int:
        if standalone_mode:
            sys.exit(code)
        return code


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, sort_keys=True))


async def open_cli_store(metadata_uri: str | None, *, create: bool = False) -> MetadataStore:
    """The metadata store of ``metadata_uri`` (or the default).

    Reading never creates: without ``create`` a URI that names no store is
    ``error: no Quire metadata at URI`` (:class:`~quire.errors.NoMetadataError`).
    Only a command that creates things passes ``create``, and says so on
    stderr when it did initialise a new store.  A ``zk://`` store is reached
    with the command's ``--zookeeper-*`` options (:func:`metadata_option`)."""
    from quire.metadata import open_store

    uri = metadata_uri or default_metadata_uri()
    store = await open_store(uri, create=create, **zookeeper_settings().store_options())
    if getattr(store, "initialised", False):
        click.echo(f"initialised a new Quire metadata store at {uri}", err=True)
    return store


def with_client(metadata_uri: str | None, action: Callable[[Client], Awaitable[T]], *,
                create: bool = False) -> T:
    """Run ``action(client)`` on a client of the metadata store of
    ``metadata_uri`` (or the default; see :func:`open_cli_store`), with the
    command's TLS options (:func:`tls_options`)."""
    from quire.client import Client

    config = client_config()

    async def go() -> T:
        store = await open_cli_store(metadata_uri, create=create)
        try:
            client = await Client.over(store, config)
            try:
                return await action(client)
            finally:
                await client.close()
        finally:
            await store.close()

    return run_async(go)


def with_store(metadata_uri: str | None, action: Callable[[MetadataStore], Awaitable[T]], *,
               create: bool = False) -> T:
    """Run ``action(store)`` on the metadata store of ``metadata_uri`` (or the
    default; see :func:`open_cli_store`), closed afterwards."""

    async def go() -> T:
        store = await open_cli_store(metadata_uri, create=create)
        try:
            return await action(store)
        finally:
            await store.close()

    return run_async(go)


def progress_printer(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """A live progress line on stderr for long operations (silent if ``quiet``)."""

    def show(snapshot: dict[str, Any]) -> None:
        if not quiet:
            click.echo(f"\r{snapshot['elapsed_s']:6.1f}s  {snapshot['entries']:>10,} entries  "
                       f"{snapshot['entries_per_s']:>10,.0f}/s", nl=False, err=True)

    return show
