"""The Pravega controller's gRPC interface, generated code only.

``Controller.proto`` is Quire's copy of the interface the Pravega client
speaks (package ``io.pravega.controller.stream.api.grpc.v1``, service
``ControllerService``); ``Controller_pb2`` (messages, with ``.pyi`` types)
and ``Controller_pb2_grpc`` (stub and servicer) are generated from it by
``scripts/gen-proto`` and must not be edited by hand:
``tests/unit/test_controller_api.py`` fails when they differ from what the
script generates.
"""
