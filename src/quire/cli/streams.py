"""``quire scope create|list|delete`` and
``quire stream create|list|seal|delete|write|cat|tail`` (``info``,
``update``, ``truncate`` and ``scale`` are in :mod:`quire.cli.stream_shape`).

Over :mod:`quire.streams`, against a controller (``--controller
tcp://host:port``, default ``$QUIRE_CONTROLLER``, then
``tcp://127.0.0.1:9090``); segment stores are found through the
controller's getURI.  A secured cluster: ``--controller tls://host:port``
with ``--tls-ca`` (``$QUIRE_TLS_CA``) and ``--credentials`` (a TOML file
with ``username`` and ``password``, mode 0600; ``$QUIRE_CREDENTIALS``);
a password is never a command-line argument.  ``--json`` prints one JSON document, except
``tail``, which prints one JSON object per event as it comes.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.cli.common import emit_json, json_option, run_async, until_interrupted

if TYPE_CHECKING:  # imported where used: every `quire` command imports this module
    from quire.streams import ControllerClient, Event, RemoteSegmentStore

T = TypeVar("T")

_ACCESS_KEY = "quire_stream_access"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name is not None:
        ctx.meta.setdefault(_ACCESS_KEY, {})[param.name] = value
    return value


def controller_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--controller`` (given to the command), ``--tls-ca`` and
    ``--credentials`` (kept for :func:`with_controller`)."""
    f = click.option("--credentials", "credentials", type=click.Path(dir_okay=False),
                     default=None, envvar="QUIRE_CREDENTIALS", expose_value=False,
                     callback=_remember,
                     help="TOML file (mode 0600) with the username and password "
                          "($QUIRE_CREDENTIALS).")(f)
    f = click.option("--tls-ca", "tls_ca", type=click.Path(dir_okay=False), default=None,
                     envvar="QUIRE_TLS_CA", expose_value=False, callback=_remember,
                     help="CA certificates (PEM) trusted for a tls:// controller and its "
                          "segment stores ($QUIRE_TLS_CA; default: the system's).")(f)
    return click.option(
        "--controller", "controller_uri", default=None, metavar="tcp://HOST:PORT",
        help="Controller URI, tcp:// or tls:// (default: $QUIRE_CONTROLLER, then "
             "tcp://127.0.0.1:9090).")(f)


def controller_uri_of(given: str | None) -> str:
    from quire.streams import controller_uri

    return controller_uri(given)


def with_controller(uri: str | None,
                    action: Callable[[ControllerClient, RemoteSegmentStore], Awaitable[T]]) -> T:
    """Run ``action(controller, segments)`` with fresh clients, closed
    afterwards (TLS and credentials from :func:`controller_option`'s options)."""
    from quire.errors import QuireError
    from quire.streams import StreamAccess

    context = click.get_current_context(silent=True)
    given = context.meta.get(_ACCESS_KEY, {}) if context is not None else {}
    try:
        access = StreamAccess.of(controller_uri_of(uri), given.get("tls_ca"),
                                 given.get("credentials"))
    except QuireError as e:
        raise click.UsageError(str(e)) from e

    async def go() -> T:
        controller, segments = access.clients()
        try:
            return await action(controller, segments)
        finally:
            await segments.close()
            await controller.close()

    return run_async(go)


def event_json(event: Event) -> dict[str, Any]:
    return {"segment": event.segment_id, "offset": event.offset,
            "data": base64.b64encode(event.data).decode()}


def echo_event(event: Event, as_hex: bool) -> None:
    click.echo(event.data.hex() if as_hex else event.data.decode("utf-8", "backslashreplace"))


def split_stream(name: str) -> tuple[str, str]:
    scope, sep, stream = name.partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise click.BadParameter(f"a stream is SCOPE/STREAM, got {name!r}")
    return scope, stream


stream_argument = click.argument("name", metavar="SCOPE/STREAM")
hex_option = click.option("--hex", "as_hex", is_flag=True, help="Print payloads as hex.")


# --- scopes ---------------------------------------------------------------------------


@click.group()
def scope() -> None:
    """Create, list and delete scopes (Pravega's namespaces of streams)."""


@scope.command("create")
@click.argument("name")
@controller_option
@json_option
def scope_create(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Create scope NAME (nothing to do if it exists)."""

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> bool:
        return await controller.create_scope(name)

    created = with_controller(controller_uri, go)
    if as_json:
        emit_json({"scope": name, "created": created})
    else:
        click.echo(f"scope {name} " + ("created" if created else "exists already"))


@scope.command("list")
@controller_option
@json_option
def scope_list(controller_uri: str | None, as_json: bool) -> None:
    """Every scope."""

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> list[str]:
        return await controller.list_scopes()

    scopes = with_controller(controller_uri, go)
    if as_json:
        emit_json(scopes)
    else:
        for name in scopes:
            click.echo(name)


@scope.command("delete")
@click.argument("name")
@controller_option
@json_option
def scope_delete(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Delete scope NAME, which must have no streams."""

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> None:
        await controller.delete_scope(name)

    with_controller(controller_uri, go)
    if as_json:
        emit_json({"scope": name, "deleted": True})
    else:
        click.echo(f"scope {name} deleted")


# --- streams --------------------------------------------------------------------------


@click.group()
def stream() -> None:
    """Create, inspect, scale, write, read, seal and delete streams."""


def policy_options(defaults: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a stream's configuration (``defaults``: create's; else
    update's, where an unset option keeps the stream's value)."""
    def default(value: Any) -> Any:
        return value if defaults else None

    options = [
        click.option("--segments", "segment_count", default=default(1), type=int,
                     show_default=defaults,
                     help="Number of segments (fixed scaling), or the minimum (auto-scaling)."),
        click.option("--scaling", type=click.Choice(["fixed", "events", "kbytes"]),
                     default=default("fixed"), show_default=defaults,
                     help="Scaling policy: a fixed count, or auto-scaling by events/s or "
                          "KiB/s per segment."),
        click.option("--target-rate", type=int, default=default(0),
                     help="Auto-scaling: the rate per segment (events/s or KiB/s)."),
        click.option("--scale-factor", type=int, default=default(2),
                     show_default=defaults,
                     help="Auto-scaling: split a hot segment into up to this many."),
        click.option("--retention", type=click.Choice(["none", "time", "size"]),
                     default=default("none"), show_default=defaults,
                     help="Retention policy."),
        click.option("--retention-param", default=default(0), type=int,
                     help="The least to keep: milliseconds (time) or bytes (size)."),
        click.option("--retention-max", default=default(0), type=int,
                     help="The most to keep, however far behind subscribers are (0: no "
                          "maximum)."),
        click.option("--tags", default=None, metavar="T1,T2",
                     help="The stream's tags, comma-separated (replaces them)."),
    ]

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        return f
    return apply


def tags_of(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(t.strip() for t in value.split(",") if t.strip())


@stream.command("create")
@stream_argument
@policy_options(defaults=True)
@controller_option
@json_option
def stream_create(name: str, segment_count: int, scaling: str, target_rate: int,
                  scale_factor: int, retention: str, retention_param: int, retention_max: int,
                  tags: str | None, controller_uri: str | None, as_json: bool) -> None:
    """Create stream SCOPE/STREAM (nothing to do if it exists)."""
    scope_name, stream_name = split_stream(name)
    auto = scaling != "fixed"

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> bool:
        return await controller.create_stream(
            scope_name, stream_name, segment_count, retention, retention_param,
            tags_of(tags) or (), scaling=scaling, target_rate=target_rate if auto else 0,
            scale_factor=scale_factor if auto else 0, retention_max=retention_max)

    created = with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "created": created})
    else:
        click.echo(f"stream {name} " + ("created" if created else "exists already"))


@stream.command("list")
@click.argument("scope_name", metavar="SCOPE")
@click.option("--tag", default=None, help="Only the streams with this tag.")
@controller_option
@json_option
def stream_list(scope_name: str, tag: str | None, controller_uri: str | None,
                as_json: bool) -> None:
    """The streams of SCOPE."""

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> list[str]:
        return await controller.list_streams(scope_name, tag)

    streams = with_controller(controller_uri, go)
    if as_json:
        emit_json(streams)
    else:
        for name in streams:
            click.echo(name)


@stream.command("seal")
@stream_argument
@controller_option
@json_option
def stream_seal(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Seal SCOPE/STREAM: no more writes."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> None:
        await controller.seal_stream(scope_name, stream_name)

    with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "sealed": True})
    else:
        click.echo(f"stream {name} sealed")


@stream.command("delete")
@stream_argument
@controller_option
@json_option
def stream_delete(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Delete SCOPE/STREAM, which must be sealed."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> None:
        await controller.delete_stream(scope_name, stream_name)

    with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "deleted": True})
    else:
        click.echo(f"stream {name} deleted")


@stream.command("write")
@stream_argument
@click.argument("events", nargs=-1)
@click.option("--key", "routing_key", default=None, help="Routing key of every event.")
@controller_option
@json_option
def stream_write(name: str, events: tuple[str, ...], routing_key: str | None,
                 controller_uri: str | None, as_json: bool) -> None:
    """Write EVENTS (or, with none given, one event per line of stdin),
    each acknowledged once durable."""
    from quire.streams import StreamWriter

    scope_name, stream_name = split_stream(name)
    if not events and sys.stdin.isatty():
        raise click.UsageError("give EVENTS or pipe them on stdin, one a line")
    payloads = [e.encode() for e in events] if events \
        else [line.rstrip(b"\n") for line in sys.stdin.buffer]

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> int:
        writer = StreamWriter(controller, segments, scope_name, stream_name)
        await writer.start()
        try:
            for payload in payloads:
                writer.write_event(payload, routing_key)
        finally:
            await writer.close()
        return len(payloads)

    written = with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "events": written})
    else:
        click.echo(f"{written} events written to {name}")


@stream.command("cat")
@stream_argument
@hex_option
@controller_option
@json_option
def stream_cat(name: str, as_hex: bool, controller_uri: str | None, as_json: bool) -> None:
    """Print the events of SCOPE/STREAM from its head to its current end,
    one a line (in write order per routing key)."""
    from quire.streams import StreamReader

    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> list[Event]:
        reader = StreamReader(controller, segments, scope_name, stream_name)
        return [event async for event in reader.events(follow=False)]

    found = with_controller(controller_uri, go)
    if as_json:
        emit_json([event_json(e) for e in found])
        return
    for event in found:
        echo_event(event, as_hex)


@stream.command("tail")
@stream_argument
@click.option("--count", "-n", default=None, type=int,
              help="Stop after this many events (default: until the stream is sealed "
                   "and read, or Ctrl-C).")
@hex_option
@controller_option
@json_option
def stream_tail(name: str, count: int | None, as_hex: bool, controller_uri: str | None,
                as_json: bool) -> None:
    """Print the events written to SCOPE/STREAM from now on, as they come
    (with --json, one JSON object a line)."""
    from quire.streams import StreamReader

    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> None:
        reader = StreamReader(controller, segments, scope_name, stream_name, from_tail=True)
        await reader.start_cut()
        click.echo(f"tailing {name}", err=True)
        if count == 0:
            return

        async def print_new() -> None:
            seen = 0
            async for event in reader.events(follow=True):
                if as_json:
                    emit_json(event_json(event))
                else:
                    echo_event(event, as_hex)
                seen += 1
                if count is not None and seen >= count:
                    return
        await until_interrupted(print_new())

    try:
        with_controller(controller_uri, go)
    except KeyboardInterrupt:
        return  # Ctrl-C is how tail ends
