"""Errors of the named-log layer (:mod:`quire.log`), all under
:class:`~quire.errors.QuireError` through :class:`LogError`.

They live here rather than in :mod:`quire.errors` because only this layer
(and the layers above it) raise them; they are re-exported by
:mod:`quire.log`.
"""

from __future__ import annotations

from quire.errors import QuireError


class LogError(QuireError):
    """Root of the errors the log layer raises on purpose."""


class LogNotFoundError(LogError):
    """The named log does not exist (a definite answer from the metadata store)."""


class LogExistsError(LogError):
    """``create`` found a log of that name already."""


class LogFencedError(LogError):
    """This writer was fenced out: another writer took the log (the log's
    epoch in the metadata store is no longer this writer's).  A ledger fenced
    while the epoch is still the writer's is not this error: the writer rolls
    to a new ledger.  Appends that failed with this error have an *unknown*
    outcome (recovery may have kept them); appends acknowledged before are in
    the log."""


class LogBusyError(LogError):
    """A writer holds the log, so an operation that needs the log to itself
    (bulk append, overwrite, delete) is refused.  Close the writer, or call
    :meth:`~quire.log.LogStore.recover` to fence out a writer that died."""


class LogTruncatedError(LogError):
    """The requested position was removed from the log (by ``truncate`` or by
    an overwrite): the entries there cannot be read any more."""


class LogWriterClosedError(LogError):
    """The log writer was closed (or failed) and takes no more appends."""


class JobClosedError(LogError):
    """The write job is no longer open: it was committed, aborted or
    garbage-collected, so no ledger can join it and it cannot commit."""
