"""The committed gRPC modules are exactly what scripts/gen-proto makes of
Controller.proto, and they carry the Pravega client's names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from quire.controller_api import Controller_pb2, Controller_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "src" / "quire" / "controller_api"
GENERATED = ("Controller_pb2.py", "Controller_pb2.pyi", "Controller_pb2_grpc.py")


def test_regenerating_gives_the_committed_bytes(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(tmp_path)], check=True,
                   env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    for name in GENERATED:
        fresh = (tmp_path / "quire" / "controller_api" / name).read_bytes()
        assert fresh == (API / name).read_bytes(), f"{name} differs: run scripts/gen-proto"


def test_the_interface_has_the_pravega_names_and_field_numbers() -> None:
    service = Controller_pb2.DESCRIPTOR.services_by_name["ControllerService"]
    assert service.full_name == "io.pravega.controller.stream.api.grpc.v1.ControllerService"
    assert {"createScope", "getSegmentsImmediatelyFollowing", "createTransaction",
            "getStreamConfiguration"} <= {m.name for m in service.methods}
    txn = Controller_pb2.TxnRequest.DESCRIPTOR
    assert [(f.name, f.number) for f in txn.fields] == \
        [("streamInfo", 1), ("txnId", 2), ("writerId", 3), ("timestamp", 4)]
    # a known encoding: SegmentId{segmentId = (1 << 32) | 3} with an empty StreamInfo
    encoded = Controller_pb2.SegmentId(streamInfo=Controller_pb2.StreamInfo(),
                                       segmentId=(1 << 32) | 3).SerializeToString()
    assert encoded == bytes.fromhex("0a00") + bytes.fromhex("1083808080 10".replace(" ", ""))
    assert hasattr(Controller_pb2_grpc, "ControllerServiceStub")
