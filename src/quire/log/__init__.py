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

Modules: :mod:`~quire.log.store` (LogStore, bulk append, truncation, write
jobs), :mod:`~quire.log.writer`, :mod:`~quire.log.reader`,
:mod:`~quire.log.records` (the metadata layout), :mod:`~quire.log.errors`.
"""

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
from quire.log.position import Position
from quire.log.reader import LogReader, LogRecord
from quire.log.records import HeadRecord, LedgerRecord
from quire.log.store import GarbageReport, Job, LogInfo, LogStore
from quire.log.writer import LogWriter, WriterOptions

__all__ = [
    "GarbageReport",
    "HeadRecord",
    "Job",
    "JobClosedError",
    "LedgerRecord",
    "LogBusyError",
    "LogError",
    "LogExistsError",
    "LogFencedError",
    "LogInfo",
    "LogNotFoundError",
    "LogReader",
    "LogRecord",
    "LogStore",
    "LogTruncatedError",
    "LogWriter",
    "LogWriterClosedError",
    "Position",
    "WriterOptions",
]
