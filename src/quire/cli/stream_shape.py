"""``quire stream info|update|truncate|scale``: a stream's configuration,
segments and scaling history, and the commands that change them."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import click

from quire.cli.common import emit_json, json_option
from quire.cli.streams import (
    controller_option,
    policy_options,
    split_stream,
    stream_argument,
    tags_of,
    with_controller,
)

if TYPE_CHECKING:
    from quire.streams import ControllerClient, RemoteSegmentStore

SCALE_WAIT_S = 30.0


def history(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each epoch after the first as a scale: when, why, what it sealed and created."""
    out = []
    for before, after in itertools.pairwise(epochs):
        old = {s["id"] for s in before["segments"]}
        new = {s["id"] for s in after["segments"]}
        out.append({"epoch": after["epoch"], "time_ms": after["created_ms"],
                    "reason": after["reason"] or "scale", "sealed": sorted(old - new),
                    "created": sorted(new - old)})
    return out


@click.command("info")
@stream_argument
@controller_option
@json_option
def stream_info(name: str, controller_uri: str | None, as_json: bool) -> None:
    """A stream's configuration, open segments (key ranges, lengths), head
    cut and scaling history."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> dict[str, Any]:
        config = await controller.stream_config(scope_name, stream_name)
        current = await controller.current_segments(scope_name, stream_name)
        infos = await asyncio.gather(*(segments.get_info(s.name) for s in current))
        head = await controller.head_cut(scope_name, stream_name)
        described = await controller.admin("describeStream", {"scope": scope_name,
                                                              "stream": stream_name})
        rows = [{"id": s.id, "name": s.name, "min_key": s.min_key, "max_key": s.max_key,
                 "length": i.length, "start_offset": i.start_offset}
                for s, i in zip(current, infos, strict=True)]
        return {
            "stream": name, "scaling": config.scaling, "scaling_segments": config.segments,
            "target_rate": config.target_rate, "scale_factor": config.scale_factor,
            "retention": config.retention, "retention_param": config.retention_param,
            "retention_max": config.retention_max, "tags": list(config.tags),
            "sealed": all(i.sealed for i in infos), "segments": rows, "current_segments": rows,
            "head_cut": {str(k): v for k, v in sorted(head.items())},
            "epoch": described["epochs"][-1]["epoch"],
            "history": history(described["epochs"]),
        }

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
        return
    from rich.console import Console
    from rich.table import Table

    policy = (f"{row['scaling_segments']} segments (fixed)" if row["scaling"] == "fixed" else
              f"auto-scaled by {row['scaling']} ({row['target_rate']}/s per segment, factor "
              f"{row['scale_factor']}, at least {row['scaling_segments']} segments)")
    click.echo(f"stream {name}: {policy}, retention {row['retention']} "
               f"{row['retention_param'] or ''}".rstrip() + (", sealed" if row["sealed"] else "")
               + (f", tags {', '.join(row['tags'])}" if row["tags"] else ""))
    table = Table("id", "segment", "keys", "length", "start offset")
    for s in row["segments"]:
        table.add_row(str(s["id"]), s["name"], f"[{s['min_key']:.4f}, {s['max_key']:.4f})",
                      str(s["length"]), str(s["start_offset"]))
    Console().print(table)
    if row["history"]:
        scales = Table("epoch", "when", "reason", "sealed", "created", title="scaling history")
        for h in row["history"]:
            scales.add_row(str(h["epoch"]), time.strftime("%Y-%m-%d %H:%M:%S",
                                                          time.localtime(h["time_ms"] / 1000)),
                           h["reason"], " ".join(map(str, h["sealed"])),
                           " ".join(map(str, h["created"])))
        Console().print(scales)


@click.command("update")
@stream_argument
@policy_options(defaults=False)
@controller_option
@json_option
def stream_update(name: str, segment_count: int | None, scaling: str | None,
                  target_rate: int | None, scale_factor: int | None, retention: str | None,
                  retention_param: int | None, retention_max: int | None, tags: str | None,
                  controller_uri: str | None, as_json: bool) -> None:
    """Change SCOPE/STREAM's policies or tags (the options given; the
    others keep their values).  A changed fixed segment count scales it."""
    from dataclasses import replace

    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> dict[str, Any]:
        old = await controller.stream_config(scope_name, stream_name)
        changes: dict[str, Any] = {k: v for k, v in {
            "segments": segment_count, "scaling": scaling, "target_rate": target_rate,
            "scale_factor": scale_factor, "retention": retention,
            "retention_param": retention_param, "retention_max": retention_max,
            "tags": tags_of(tags)}.items() if v is not None}
        new = replace(old, **changes)
        if new.scaling == "fixed":
            new = replace(new, target_rate=0, scale_factor=0)
        await controller.update_stream(new)
        return {"stream": name, "updated": sorted(changes)}

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
    else:
        click.echo(f"stream {name} updated ({', '.join(row['updated']) or 'nothing'})")


def parse_cut(text: str) -> dict[int, int]:
    cut = {}
    for part in text.split(","):
        sid, sep, offset = part.partition("=")
        if not sep or not sid.strip().isdigit() or not offset.strip().isdigit():
            raise click.BadParameter(f"a stream cut is SEGMENT=OFFSET[,...], got {text!r}")
        cut[int(sid)] = int(offset)
    return cut


@click.command("truncate")
@stream_argument
@click.option("--cut", "cut_text", default=None, metavar="SEGMENT=OFFSET,...",
              help="The stream cut to truncate at (each open segment's id and offset).")
@click.option("--tail", "at_tail", is_flag=True, help="Truncate at the current tail.")
@controller_option
@json_option
def stream_truncate(name: str, cut_text: str | None, at_tail: bool,
                    controller_uri: str | None, as_json: bool) -> None:
    """Drop everything of SCOPE/STREAM before a stream cut."""
    from quire.streams import tail_cut

    if (cut_text is None) == (not at_tail):
        raise click.UsageError("give --cut or --tail")
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> dict[int, int]:
        cut = parse_cut(cut_text) if cut_text is not None else \
            await tail_cut(controller, segments, scope_name, stream_name)
        await controller.truncate_stream(scope_name, stream_name, cut)
        return cut

    cut = with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "cut": {str(k): v for k, v in sorted(cut.items())}})
    else:
        click.echo(f"stream {name} truncated at "
                   + ", ".join(f"{k}={v}" for k, v in sorted(cut.items())))


@click.command("scale")
@stream_argument
@click.argument("segment_ids", type=int, nargs=-1, required=True)
@click.option("--into", "parts", default=None, type=click.IntRange(1, 1000),
              help="Number of successors over equal parts of the segments' keys "
                   "(default: 2 for one segment, a split; 1 for several, a merge).")
@controller_option
@json_option
def stream_scale(name: str, segment_ids: tuple[int, ...], parts: int | None,
                 controller_uri: str | None, as_json: bool) -> None:
    """Seal open segments SEGMENT_IDS of SCOPE/STREAM (neighbours in key
    order) and cover their keys with --into successors: a split of one
    segment or a merge of several (waits until the scale is done)."""
    from quire.controller.scaling import split

    scope_name, stream_name = split_stream(name)
    count = parts or (2 if len(segment_ids) == 1 else 1)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore
                 ) -> dict[str, Any]:
        current = {s.id: s for s in await controller.current_segments(scope_name, stream_name)}
        missing = [sid for sid in segment_ids if sid not in current]
        if missing:
            raise click.BadParameter(f"{missing} is not an open segment of {name} "
                                     f"(open: {sorted(current)})")
        chosen = sorted((current[sid] for sid in segment_ids), key=lambda s: s.min_key)
        if any(a.max_key != b.min_key for a, b in itertools.pairwise(chosen)):
            raise click.BadParameter("the segments to merge must be neighbours in key order")
        epoch = await controller.scale(scope_name, stream_name, list(segment_ids),
                                       split(chosen[0].min_key, chosen[-1].max_key, count))
        deadline = asyncio.get_running_loop().time() + SCALE_WAIT_S
        while not await controller.scale_done(scope_name, stream_name, epoch):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the scale of {name} from epoch {epoch} is not done "
                                   f"after {SCALE_WAIT_S} s")
            await asyncio.sleep(0.1)  # polling the controller for the scale's end
        successors = await controller.successors(scope_name, stream_name, segment_ids[0])
        return {"stream": name, "sealed": sorted(segment_ids),
                "created": [{"id": s.id, "min_key": s.min_key, "max_key": s.max_key}
                            for s, _ in successors]}

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
    else:
        click.echo(f"segments {', '.join(map(str, row['sealed']))} of {name} sealed; "
                   "successors " + ", ".join(f"{c['id']} [{c['min_key']:.4f}, "
                                             f"{c['max_key']:.4f})" for c in row["created"]))
