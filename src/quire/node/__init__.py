"""Process assembly: one bookie process, as BookKeeper's embedded server.

``quire.node`` sits above ``quire.bookie`` and ``quire.client``: it opens
what the bookie library serves (metadata store, cookie, storage engine,
group committer), builds the :class:`~quire.bookie.server.BookieServer`,
listens, registers, and runs until a signal.  BP-46's boot-time fencing and
repair, which need the client's recovery and reads from peers, belong here.
"""

from quire.node.bookie_node import BookieNode
from quire.node.process import run, serve

__all__ = ["BookieNode", "run", "serve"]
