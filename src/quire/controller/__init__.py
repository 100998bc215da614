"""A Pravega-compatible controller: scopes, streams, segments, scaling
(by hand and automatic), truncation and retention, transactions (rolling
over scales) and reader groups, served as Pravega's gRPC
``ControllerService``; any number of them serve one cluster.

::

    from quire.controller import Controller, ControllerConfig
    controller = Controller(segment_store, ControllerConfig(), lambda: ("127.0.0.1", 12345))
    port = await controller.start("127.0.0.1", 9090)
    ...
    await controller.close()

Modules, each importing only those listed before it:

* :mod:`~quire.controller.metrics` -- Prometheus metrics;
* :mod:`~quire.controller.model` -- records and their rules (segment ids
  and names, key ranges, epochs, scaling, stream cuts, transaction ids);
* :mod:`~quire.controller.records` -- the records as JSON;
  :mod:`~quire.controller.cuts` -- stream cuts and retention's choice;
* :mod:`~quire.controller.state` -- the records in ``_system`` table
  segments, and the :class:`ControllerSegmentStore` seam;
* :mod:`~quire.controller.cluster` -- several controllers: who is alive,
  who leads (:class:`ControllerCluster`);
* :mod:`~quire.controller.base`, :mod:`~quire.controller.scaling`,
  :mod:`~quire.controller.transactions`, :mod:`~quire.controller.retention`,
  :mod:`~quire.controller.core` -- the operations (:class:`ControllerCore`,
  parts over one state);
* :mod:`~quire.controller.messages`, :mod:`~quire.controller.service` --
  the gRPC service; :mod:`~quire.controller.admin` -- Quire's ``Admin``
  questions;
* :mod:`~quire.controller.server` -- :class:`Controller`.
"""

from quire.controller.core import ControllerConfig, ControllerCore
from quire.controller.metrics import ControllerMetrics
from quire.controller.server import Controller
from quire.controller.service import (
    SERVICE_NAME,
    ControllerService,
    NodeAddress,
    SegmentLocator,
    fixed_locator,
)
from quire.controller.state import ControllerSegmentStore

__all__ = [
    "SERVICE_NAME",
    "Controller",
    "ControllerConfig",
    "ControllerCore",
    "ControllerMetrics",
    "ControllerSegmentStore",
    "ControllerService",
    "NodeAddress",
    "SegmentLocator",
    "fixed_locator",
]
