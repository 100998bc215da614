"""Autorecovery: BookKeeper's auditor and replication workers.

* :mod:`~quire.node.autorecovery.records` -- marks and locks in the metadata store;
* :mod:`~quire.node.autorecovery.auditor` -- the elected auditor, marking the
  ledgers of lost bookies;
* :mod:`~quire.node.autorecovery.worker` -- workers copying a lost bookie's
  entries to a new one (the entry copier) and swapping it into the ensemble;
* :mod:`~quire.node.autorecovery.service` -- both in one process;
* :mod:`~quire.node.autorecovery.decommission` -- re-replicating a bookie
  that is still up, then retiring it.
"""

from quire.node.autorecovery.auditor import Auditor, lost_bookies, mark_ledgers_of
from quire.node.autorecovery.records import UnderReplicated, UnderReplication
from quire.node.autorecovery.service import Autorecovery, AutorecoverySettings
from quire.node.autorecovery.worker import ReplicationWorker

__all__ = [
    "Auditor",
    "Autorecovery",
    "AutorecoverySettings",
    "ReplicationWorker",
    "UnderReplicated",
    "UnderReplication",
    "lost_bookies",
    "mark_ledgers_of",
]
