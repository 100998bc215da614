"""Named logs over ledgers (DistributedLog's model; Pravega's tier-1 log).

A log is a name and an ordered list of ledgers kept in the metadata store;
it has one writer at a time (fenced by epochs), any number of readers that
can follow its tail, truncation from the front, and all-or-nothing bulk
appends of ledgers written elsewhere (Spark jobs)::

    import quire
    from quire.log import LogStore, Position

    client = await quire.Client.connect(uri)
    logs = LogStore(client)
    writer = await logs.open_writer("events", roll_bytes=64 << 20)
    position = await writer.append(b"hello")
    await writer.close()
    reader = await logs.open_reader("events", Position.START, follow=False)
    async for record in reader:
        print(record.position, record.payload)

Modules, each importing only those listed before it:

* :mod:`~quire.log.position`, :mod:`~quire.log.errors`,
  :mod:`~quire.log.records` (the metadata layout and its JSON);
* :mod:`~quire.log.catalog` -- head and ledger records, conditional
  transactions, epochs and the writer's hold (:class:`LogCatalog`);
  :mod:`~quire.log.ledgers` -- recovering and deleting ledgers;
* :mod:`~quire.log.writer` (:class:`LogWriter`), :mod:`~quire.log.reader`
  (:class:`LogReader`);
* :mod:`~quire.log.store` -- :class:`LogStore`: create, delete, truncate,
  bulk append, writers and readers;
* :mod:`~quire.log.jobs` -- :class:`LogJobs`: write jobs and stream sinks
  (the Spark source's protocol).

The tier-1 log seam a segment container writes its operations to is
:class:`DurableDataLog` (:mod:`~quire.log.durable_data_log`, a
``typing.Protocol``); :class:`NamedDataLog` (:mod:`~quire.log.named_data_log`,
on a writer and readers) implements it on a named log.
"""

from quire.log.catalog import LogCatalog, LogInfo
from quire.log.durable_data_log import DurableDataLog
from quire.log.errors import (
    JobClosedError,
    LogBusyError,
    LogError,
    LogExistsError,
    LogFencedError,
    LogNotFoundError,
    LogTruncatedError,
    LogWriterClosedError,
)
from quire.log.jobs import GarbageReport, Job, LogJobs
from quire.log.named_data_log import NamedDataLog
from quire.log.position import Position
from quire.log.reader import LogReader, LogRecord
from quire.log.records import HeadRecord, LedgerRecord
from quire.log.store import LogStore
from quire.log.writer import LogWriter, WriterOptions

__all__ = [
    "DurableDataLog",
    "GarbageReport",
    "HeadRecord",
    "Job",
    "JobClosedError",
    "LedgerRecord",
    "LogBusyError",
    "LogCatalog",
    "LogError",
    "LogExistsError",
    "LogFencedError",
    "LogInfo",
    "LogJobs",
    "LogNotFoundError",
    "LogReader",
    "LogRecord",
    "LogStore",
    "LogTruncatedError",
    "LogWriter",
    "LogWriterClosedError",
    "NamedDataLog",
    "Position",
    "WriterOptions",
]
