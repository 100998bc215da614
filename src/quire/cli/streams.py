"""``quire scope create|list|delete`` and
``quire stream create|list|info|scale|seal|delete|write|cat|tail``.

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

import asyncio
import base64
import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.cli.common import emit_json, json_option, run_async

if TYPE_CHECKING:  # imported where used: every `quire` command imports this module
    from quire.streams import ControllerClient, Event, RemoteSegmentStore

T = TypeVar("T")
SCALE_WAIT_S = 30.0

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


@stream.command("create")
@stream_argument
@click.option("--segments", "segment_count", default=1, show_default=True, type=int,
              help="Number of segments (fixed scaling policy).")
@click.option("--retention", type=click.Choice(["none", "time", "size"]), default="none",
              show_default=True, help="Retention policy.")
@click.option("--retention-param", default=0, type=int,
              help="Milliseconds (time) or bytes (size) to keep.")
@controller_option
@json_option
def stream_create(name: str, segment_count: int, retention: str, retention_param: int,
                  controller_uri: str | None, as_json: bool) -> None:
    """Create stream SCOPE/STREAM (nothing to do if it exists)."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> bool:
        return await controller.create_stream(scope_name, stream_name, segment_count,
                                              retention, retention_param)

    created = with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "created": created})
    else:
        click.echo(f"stream {name} " + ("created" if created else "exists already"))


@stream.command("list")
@click.argument("scope_name", metavar="SCOPE")
@controller_option
@json_option
def stream_list(scope_name: str, controller_uri: str | None, as_json: bool) -> None:
    """The streams of SCOPE."""

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> list[str]:
        return await controller.list_streams(scope_name)

    streams = with_controller(controller_uri, go)
    if as_json:
        emit_json(streams)
    else:
        for name in streams:
            click.echo(name)


@stream.command("info")
@stream_argument
@controller_option
@json_option
def stream_info(name: str, controller_uri: str | None, as_json: bool) -> None:
    """A stream's configuration, open segments (key ranges, lengths) and head cut."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> dict[str, Any]:
        config = await controller.stream_config(scope_name, stream_name)
        current = await controller.current_segments(scope_name, stream_name)
        infos = await asyncio.gather(*(segments.get_info(s.name) for s in current))
        head = await controller.head_cut(scope_name, stream_name)
        return {
            "stream": name, "scaling_segments": config.segments,
            "retention": config.retention, "retention_param": config.retention_param,
            "tags": list(config.tags), "sealed": all(i.sealed for i in infos),
            "segments": [{"id": s.id, "name": s.name, "min_key": s.min_key,
                          "max_key": s.max_key, "length": i.length,
                          "start_offset": i.start_offset}
                         for s, i in zip(current, infos, strict=True)],
            "head_cut": {str(k): v for k, v in sorted(head.items())},
        }

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
        return
    from rich.console import Console
    from rich.table import Table

    click.echo(f"stream {name}: {row['scaling_segments']} segments (fixed), retention "
               f"{row['retention']} {row['retention_param'] or ''}".rstrip()
               + (", sealed" if row["sealed"] else ""))
    table = Table("id", "segment", "keys", "length", "start offset")
    for s in row["segments"]:
        table.add_row(str(s["id"]), s["name"], f"[{s['min_key']:.4f}, {s['max_key']:.4f})",
                      str(s["length"]), str(s["start_offset"]))
    Console().print(table)


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


@stream.command("scale")
@stream_argument
@click.argument("segment_id", type=int)
@click.option("--into", "parts", default=2, show_default=True, type=click.IntRange(1, 1000),
              help="Number of successors, over equal parts of the segment's key range.")
@controller_option
@json_option
def stream_scale(name: str, segment_id: int, parts: int, controller_uri: str | None,
                 as_json: bool) -> None:
    """Seal open segment SEGMENT_ID of SCOPE/STREAM and split its key range
    into --into successors (waits until the scale is done)."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore
                 ) -> dict[str, Any]:
        current = {s.id: s for s in await controller.current_segments(scope_name, stream_name)}
        if segment_id not in current:
            raise click.BadParameter(f"{segment_id} is not an open segment of {name} "
                                     f"(open: {sorted(current)})")
        low, high = current[segment_id].min_key, current[segment_id].max_key
        bounds = [low + (high - low) * i / parts for i in range(parts)] + [high]
        epoch = await controller.scale(scope_name, stream_name, [segment_id],
                                       list(itertools.pairwise(bounds)))
        deadline = asyncio.get_running_loop().time() + SCALE_WAIT_S
        while not await controller.scale_done(scope_name, stream_name, epoch):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the scale of {name} from epoch {epoch} is not done "
                                   f"after {SCALE_WAIT_S} s")
            await asyncio.sleep(0.1)  # polling the controller for the scale's end
        successors = await controller.successors(scope_name, stream_name, segment_id)
        return {"stream": name, "sealed": [segment_id],
                "created": [{"id": s.id, "min_key": s.min_key, "max_key": s.max_key}
                            for s, _ in successors]}

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
    else:
        click.echo(f"segment {segment_id} of {name} sealed; successors "
                   + ", ".join(f"{c['id']} [{c['min_key']:.4f}, {c['max_key']:.4f})"
                               for c in row["created"]))


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
        seen = 0
        if count == 0:
            return
        async for event in reader.events(follow=True):
            if as_json:
                emit_json(event_json(event))
            else:
                echo_event(event, as_hex)
            seen += 1
            if count is not None and seen >= count:
                return

    try:
        with_controller(controller_uri, go)
    except KeyboardInterrupt:
        return  # Ctrl-C is how tail ends
