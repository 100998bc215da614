"""The controller's records as the JSON values of its tables (sans-IO).

A stream record (``_system/_tables/<scope>/streams``, key: the stream)::

    {"config": {"min_segments", "retention", "retention_param", "retention_max",
                "tags", "scale_type", "target_rate", "scale_factor"},
     "state": "creating" | "active" | "sealed",
     "epochs": [[epoch, created_ms, [[id, min_key, max_key], ...], reason], ...],
     "next_number": n,
     "scale": {"sealed", "epoch", "created_ms", "created", "reason"}      (if pending)
     "roll": {"txn", "created_ms", "duplicates", "actives"}             (if pending)
     "head": [[id, offset], ...], "truncated_ms", "sealed_bytes",
     "retention_cuts": [[time_ms, size, [[id, offset], ...]], ...],
     "cold": [[id, until_ms], ...]}

A transaction record (``.../<stream>/transactions``, key: its id in 32 hex
digits)::

    {"id": "<32 hex>", "segments": [id, ...], "state": "OPEN" | ..., "lease_expiry_ms",
     "completed_ms"}

Keys added since the first version are optional, so older records read.
"""

from __future__ import annotations

import json
from typing import Any

from quire.controller.model import (
    Epoch,
    PendingRoll,
    PendingScale,
    RecordedCut,
    RetentionType,
    ScaleType,
    SegmentRange,
    StreamConfig,
    StreamRecord,
    StreamState,
    TxnRecord,
    TxnState,
)


def _range_json(s: SegmentRange) -> list[float | int]:
    return [s.id, s.min_key, s.max_key]


def _range_of(r: list[Any]) -> SegmentRange:
    return SegmentRange(int(r[0]), float(r[1]), float(r[2]))


def _ranges(rs: list[Any]) -> tuple[SegmentRange, ...]:
    return tuple(_range_of(r) for r in rs)


def config_json(c: StreamConfig) -> dict[str, Any]:
    return {"min_segments": c.min_segments, "retention": c.retention.value,
            "retention_param": c.retention_param, "retention_max": c.retention_max,
            "tags": list(c.tags), "scale_type": c.scale_type.value,
            "target_rate": c.target_rate, "scale_factor": c.scale_factor}


def config_of(c: dict[str, Any]) -> StreamConfig:
    return StreamConfig(c["min_segments"], RetentionType(c["retention"]), c["retention_param"],
                        c["retention_max"], tuple(c["tags"]),
                        ScaleType(c.get("scale_type", 0)), c.get("target_rate", 0),
                        c.get("scale_factor", 0))


def stream_to_json(record: StreamRecord) -> bytes:
    doc: dict[str, Any] = {
        "config": config_json(record.config),
        "state": record.state.value,
        "epochs": [[e.epoch, e.created_ms, [_range_json(s) for s in e.segments], e.reason]
                   for e in record.epochs],
        "next_number": record.next_number,
        "head": [[sid, offset] for sid, offset in sorted(record.head.items())],
        "truncated_ms": record.truncated_ms,
        "sealed_bytes": record.sealed_bytes,
        "retention_cuts": [[r.time_ms, r.size, sorted(r.cut.items())]
                           for r in record.retention_cuts],
        "cold": sorted(record.cold.items()),
    }
    if record.creator:
        doc["creator"] = [record.creator, record.creator_ms]
    if record.scale is not None:
        s = record.scale
        doc["scale"] = {"sealed": list(s.sealed), "epoch": s.epoch, "created_ms": s.created_ms,
                        "created": [_range_json(r) for r in s.created], "reason": s.reason}
    if record.roll is not None:
        r = record.roll
        doc["roll"] = {"txn": f"{r.txn_id:032x}", "created_ms": r.created_ms,
                       "duplicates": [_range_json(x) for x in r.duplicates],
                       "actives": [_range_json(x) for x in r.actives]}
    return json.dumps(doc, separators=(",", ":")).encode()


def stream_from_json(data: bytes) -> StreamRecord:
    doc = json.loads(data)
    scale = roll = None
    if "scale" in doc:
        s = doc["scale"]
        scale = PendingScale(tuple(s["sealed"]), _ranges(s["created"]), s["epoch"],
                             s["created_ms"], s.get("reason", "manual"))
    if "roll" in doc:
        r = doc["roll"]
        roll = PendingRoll(int(r["txn"], 16), _ranges(r["duplicates"]), _ranges(r["actives"]),
                           r["created_ms"])
    epochs = [Epoch(e[0], e[1], _ranges(e[2]), e[3] if len(e) > 3 else "")
              for e in doc["epochs"]]
    return StreamRecord(config_of(doc["config"]), StreamState(doc["state"]), epochs,
                        doc["next_number"], scale, roll,
                        {sid: off for sid, off in doc["head"]}, doc["truncated_ms"],
                        doc["sealed_bytes"],
                        [RecordedCut(t, size, {sid: off for sid, off in cut})
                         for t, size, cut in doc["retention_cuts"]],
                        {sid: until for sid, until in doc.get("cold", [])},
                        *doc.get("creator", ("", 0)))


def txn_to_json(txn: TxnRecord) -> bytes:
    return json.dumps({"id": f"{txn.txn_id:032x}", "segments": list(txn.segments),
                       "state": txn.state.value, "lease_expiry_ms": txn.lease_expiry_ms,
                       "completed_ms": txn.completed_ms}, separators=(",", ":")).encode()


def txn_from_json(data: bytes) -> TxnRecord:
    doc = json.loads(data)
    return TxnRecord(int(doc["id"], 16), tuple(doc["segments"]), TxnState(doc["state"]),
                     doc["lease_expiry_ms"], doc["completed_ms"])
