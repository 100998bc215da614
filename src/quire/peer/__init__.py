"""Connections to bookies: what every reader and writer of bookies shares.

The ledger client and, in the bookie process, repair (reads of entries from
peer bookies) call bookies through this package.  Modules, one job each:

* :mod:`~quire.peer.config` -- :class:`PeerConfig`;
* :mod:`~quire.peer.answers` -- a bookie's answer made a response or a typed
  error, in one place (:func:`outcome`);
* :mod:`~quire.peer.connection` -- one pipelined connection per bookie, with
  a typed call per operation;
* :mod:`~quire.peer.pool` -- bookie ids to addresses and connections.

Rule: ``quire.peer`` imports only ``quire.protocol``, ``quire.metadata``
(for the bookie registry's records the pool follows) and the leaves
``quire.errors``, ``quire.types`` and ``quire.config``; never
``quire.client``, ``quire.bookie``, ``quire.node`` or anything above them.
"""

from quire.peer.answers import outcome
from quire.peer.config import PeerConfig
from quire.peer.connection import FLUSH_AFTER_FRAMES, BookieClient, next_request_id
from quire.peer.pool import BookiePool, BookieRegistry

__all__ = [
    "FLUSH_AFTER_FRAMES",
    "BookieClient",
    "BookiePool",
    "BookieRegistry",
    "PeerConfig",
    "next_request_id",
    "outcome",
]
