"""Deterministic simulation of the stream path (test-only): segment stores,
tier-2 and controllers on the simulated ledger cluster.

What runs is the real code of the processes the stream tier is made of,
assembled as their hosts assemble them: each segment store a
:class:`~quire.segmentstore.SegmentStore` whose containers log to the real
:class:`~quire.log.NamedDataLog` over the real ledger client and the
simulated bookies, flushed by the real storage writer to a simulated
tier-2 (:mod:`quire.simulation.tier2`), served by the real wire server and
owned through the real :class:`~quire.segmentstore.ContainerOwnership` on
a metadata session whose lease expires on virtual time
(:class:`~quire.simulation.metadata.NodeMetadataStore`); each controller the
real :class:`~quire.controller.ControllerCore` and ``ControllerService``
reaching the segment stores over the wire (the real
:class:`~quire.streams.RemoteSegmentStore`); each client the real streams
client (writers, transactions, readers, tables) whose gRPC calls are
exchanges over the simulated network.  ``python -m quire.simulation
--layer streams`` runs it (:mod:`quire.simulation.streams.run`).
"""
