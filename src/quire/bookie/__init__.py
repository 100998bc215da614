"""The bookie library: a server over an open storage engine and group
committer (``quire.node`` assembles the process around it).  Never imports
the client, the peer layer or the node."""
