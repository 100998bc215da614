"""A local cluster of real processes: the sandbox, and the test harness.

* :mod:`.processes`: :class:`ServiceProcess` runs one ``quire <service>
  start`` as a child process and waits for its ready line
  (:class:`BookieProcess`, :class:`SegmentStoreProcess`,
  :class:`ControllerProcess`); ports, :func:`start_all`, :func:`stop_all`.
  A child ends when its parent does, however that ends (a parent-death
  signal, :func:`parent_death_prefix`); :class:`LineReader` reads a
  child's output lines with a deadline.
* :mod:`.cluster`: :class:`Sandbox`, the whole system as ``pravega
  standalone`` runs it, with stable names and ports kept in one directory
  so a restart finds its data.
* :mod:`.supervisor`: :class:`ServiceSupervisor` restarts the processes
  that exit, with backoff (:class:`RestartPolicy`).
"""

from quire.sandbox.cluster import Sandbox
from quire.sandbox.processes import (
    CONTROLLER_HTTP_PORT,
    CONTROLLER_PORT,
    CONTROLLERS_HOST,
    LOCAL_BOOKIE_SETTINGS,
    NO_JOURNAL_SETTINGS,
    BookieProcess,
    ControllerProcess,
    LineReader,
    SegmentStoreProcess,
    ServiceProcess,
    _ephemeral_ports,
    autoscale_settings,
    free_port,
    parent_death_prefix,
    preferred_port,
    resolves_to,
    sqlite_uri,
    start_all,
    stop_all,
    tier1_quorums,
)
from quire.sandbox.supervisor import RestartPolicy, ServiceSupervisor

__all__ = [
    "CONTROLLERS_HOST", "CONTROLLER_HTTP_PORT", "CONTROLLER_PORT", "LOCAL_BOOKIE_SETTINGS",
    "NO_JOURNAL_SETTINGS", "BookieProcess", "ControllerProcess", "LineReader", "RestartPolicy",
    "Sandbox", "SegmentStoreProcess", "ServiceProcess", "ServiceSupervisor", "_ephemeral_ports",
    "autoscale_settings", "free_port", "parent_death_prefix", "preferred_port", "resolves_to",
    "sqlite_uri", "start_all", "stop_all", "tier1_quorums",
]
