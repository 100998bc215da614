"""The tier-2 chaos workload: a fixed sequence of segment operations and its model.

:func:`generate` ``(seed, count)`` gives the first ``count`` operations of
the sequence of seed ``seed`` (a longer run has the shorter one as its
prefix), each valid against the state the earlier ones leave: ``segments``
user segments, a few table segments and ``_system`` segments are created
first; then appends with attribute updates, system-segment appends, table
puts and removals, seals, truncates, deletes, attribute updates, new
segments, and transactions (``<parent>#transaction.<n>``) that are written,
sealed (an operation of its own) and merged into their parent.  Every
operation is JSON (bytes as hex), so the chaos driver process
(``tests/support/tier2_chaos_driver.py``) and the test share the sequence
by seed.

:class:`Model` applies operations to plain dicts; :meth:`Model.render` is a
segment's state as the driver's ``state`` request shows it (length, start
offset, sealed, a digest of the bytes, attributes; a table's entries), so
a reopened container is compared with the model after some prefix of the
sequence.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

TABLES = 4
SYSTEM_SEGMENTS = 4
TABLE_KEYS = 40
ATTRIBUTE_KEYS = 4

Op = dict[str, Any]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


@dataclass
class Seg:
    kind: str
    """"user", "txn", "system" or "table"."""
    data: bytearray = field(default_factory=bytearray)
    start: int = 0
    sealed: bool = False
    attrs: dict[int, int] = field(default_factory=dict)
    table: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class Model:
    segs: dict[str, Seg] = field(default_factory=dict)

    def copy(self) -> Model:
        return Model({n: Seg(s.kind, bytearray(s.data), s.start, s.sealed, dict(s.attrs),
                             dict(s.table)) for n, s in self.segs.items()})

    def apply(self, op: Op) -> list[str]:
        """Apply ``op``; the names of the segments it touched."""
        kind = op["op"]
        if kind == "create":
            self.segs[op["name"]] = Seg(op["kind"])
            return [op["name"]]
        if kind == "merge":
            target, source = self.segs[op["target"]], self.segs.pop(op["source"])
            target.data += source.data
            return [op["target"], op["source"]]
        name = op["name"]
        if kind == "delete":
            del self.segs[name]
            return [name]
        s = self.segs[name]
        if kind == "append":
            s.data += bytes.fromhex(op["data"])
            s.attrs.update((k, v) for k, v in op["attrs"])
        elif kind == "update_attributes":
            s.attrs.update((k, v) for k, v in op["attrs"])
        elif kind == "seal":
            s.sealed = True
        elif kind == "truncate":
            s.start = max(s.start, op["offset"])
        elif kind == "table_put":
            s.table.update((bytes.fromhex(k), bytes.fromhex(v)) for k, v in op["entries"])
        elif kind == "table_remove":
            for k in op["keys"]:
                s.table.pop(bytes.fromhex(k), None)
        else:
            raise AssertionError(kind)
        return [name]

    def render_one(self, name: str) -> Any:
        s = self.segs.get(name)
        if s is None:
            return None
        if s.kind == "table":
            return {"table": sorted([k.hex(), v.hex()] for k, v in s.table.items())}
        return {"length": len(s.data), "start": s.start, "sealed": s.sealed,
                "digest": digest(bytes(s.data[s.start:])),
                "attrs": sorted([k, v] for k, v in s.attrs.items())}

    def render(self) -> dict[str, Any]:
        return {name: self.render_one(name) for name in sorted(self.segs)}


def generate(seed: int, count: int, segments: int = 200) -> list[Op]:
    """The first ``count`` operations of seed ``seed`` (see the module docstring)."""
    rng = random.Random(seed)
    model = Model()
    ops: list[Op] = []
    counter = 0
    txn_counter = 0

    def emit(op: Op) -> None:
        model.apply(op)
        ops.append(op)

    setup: list[Op] = [{"op": "create", "name": f"sc/chaos/s{i}", "kind": "user"}
                       for i in range(segments)]
    setup += [{"op": "create", "name": f"sc/chaos/t{i}", "kind": "table"} for i in range(TABLES)]
    setup += [{"op": "create", "name": f"_system/chaos/s{i}", "kind": "system"}
              for i in range(SYSTEM_SEGMENTS)]
    rng.shuffle(setup)
    next_user = segments
    for op in setup:
        if len(ops) >= count:
            return ops
        emit(op)
    choices = ["append"] * 40 + ["system"] * 10 + ["put"] * 10 + ["remove"] * 3 + \
        ["create"] * 4 + ["seal"] * 2 + ["truncate"] * 4 + ["delete"] * 2 + \
        ["attrs"] * 3 + ["txn"] * 6 + ["txn_append"] * 6
    shape: tuple[list[str], list[str], list[str]] | None = None
    while len(ops) < count:
        choice = rng.choice(choices)
        if shape is None:  # recomputed only after an operation that changes it
            shape = ([n for n, s in model.segs.items() if s.kind == "user"],
                     [n for n, s in model.segs.items() if s.kind == "user" and not s.sealed],
                     [n for n, s in model.segs.items() if s.kind == "txn"])
        live, open_, txns = shape
        emitted = len(ops)
        if choice == "append" and open_:
            counter += 1
            name = rng.choice(open_)
            emit({"op": "append", "name": name,
                  "data": rng.randbytes(rng.randint(20, 300)).hex(),
                  "attrs": [[rng.randrange(ATTRIBUTE_KEYS), counter]]})
        elif choice == "system":
            emit({"op": "append", "name": f"_system/chaos/s{rng.randrange(SYSTEM_SEGMENTS)}",
                  "data": rng.randbytes(rng.randint(10, 120)).hex(), "attrs": []})
        elif choice == "put":
            keys = rng.sample(range(TABLE_KEYS), rng.randint(1, 4))
            emit({"op": "table_put", "name": f"sc/chaos/t{rng.randrange(TABLES)}",
                  "entries": [[(b"key-%d" % k).hex(), rng.randbytes(rng.randint(0, 40)).hex()]
                              for k in keys]})
        elif choice == "remove":
            name = f"sc/chaos/t{rng.randrange(TABLES)}"
            present = sorted(model.segs[name].table)
            if present:
                emit({"op": "table_remove", "name": name,
                      "keys": [k.hex() for k in rng.sample(present, min(2, len(present)))]})
        elif choice == "create" and len(live) < segments * 3 // 2:
            emit({"op": "create", "name": f"sc/chaos/s{next_user}", "kind": "user"})
            next_user += 1
        elif choice == "seal" and len(open_) > segments // 2:
            emit({"op": "seal", "name": rng.choice(open_)})
        elif choice == "truncate" and live:
            name = rng.choice(live)
            s = model.segs[name]
            emit({"op": "truncate", "name": name,
                  "offset": rng.randint(s.start, len(s.data))})
        elif choice == "delete" and len(live) > segments // 2:
            emit({"op": "delete", "name": rng.choice(live)})
        elif choice == "attrs" and open_:
            counter += 1
            emit({"op": "update_attributes", "name": rng.choice(open_),
                  "attrs": [[rng.randrange(ATTRIBUTE_KEYS), counter]]})
        elif choice == "txn" and open_:
            if txns and rng.random() < 0.7:
                name = rng.choice(txns)
                parent = name.partition("#")[0]
                if not model.segs[name].sealed:
                    emit({"op": "seal", "name": name})
                elif parent in model.segs and not model.segs[parent].sealed:
                    emit({"op": "merge", "target": parent, "source": name})
                else:
                    emit({"op": "delete", "name": name})
            else:
                txn_counter += 1
                emit({"op": "create", "kind": "txn",
                      "name": f"{rng.choice(open_)}#transaction.{txn_counter}"})
        elif choice == "txn_append":
            writable = [n for n in txns if not model.segs[n].sealed]
            if writable:
                emit({"op": "append", "name": rng.choice(writable),
                      "data": rng.randbytes(rng.randint(20, 400)).hex(), "attrs": []})
        if len(ops) > emitted and ops[-1]["op"] in ("create", "delete", "seal", "merge"):
            shape = None
    return ops
