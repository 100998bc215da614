"""The ``sqlite://`` driver: the embedded default.

``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (the
SQLAlchemy convention); missing parent directories are created, unless the
store is opened only to read (``create=False``): then a missing file, or
one without Quire's schema, is :class:`~quire.errors.NoMetadataError` and
nothing is created.  Several
processes on one host may share the file: it runs in WAL mode, every write
is one ``BEGIN IMMEDIATE`` transaction, and a writer waits up to
``busy_timeout_ms`` for the lock.  Each store drives its connection from one
private thread (sqlite3 connections are not thread safe).  Watches poll every
``poll_interval_ms``; bookie leases and sessions (which leased records belong
to) expire ``lease_ms`` after the last renewal (wall clock, shared by the
processes of one host).

Schema version 2 added the ``sessions`` and ``record_leases`` tables; a
version 1 file is upgraded in place when opened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from quire.errors import ConfigError, MetadataError, NoMetadataError
from quire.metadata._embedded import EmbeddedStore, Key, Lease, Row, Table, Txn

R = TypeVar("R")

SCHEME = "sqlite:///"
_MIGRATIONS = (
    # version 1
    ("CREATE TABLE ledgers (id INTEGER PRIMARY KEY, data BLOB NOT NULL,"
     " version INTEGER NOT NULL)",
     "CREATE TABLE cookies (bookie_id TEXT PRIMARY KEY, data BLOB NOT NULL,"
     " version INTEGER NOT NULL)",
     "CREATE TABLE records (key TEXT PRIMARY KEY, data BLOB NOT NULL,"
     " version INTEGER NOT NULL)",
     "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
     "CREATE TABLE bookies (bookie_id TEXT PRIMARY KEY, data BLOB NOT NULL,"
     " owner TEXT NOT NULL, expires_ms INTEGER NOT NULL)"),
    # version 2: leased records
    ("CREATE TABLE sessions (session TEXT PRIMARY KEY, expires_ms INTEGER NOT NULL)",
     "CREATE TABLE record_leases (key TEXT PRIMARY KEY, session TEXT NOT NULL)",
     "CREATE INDEX record_leases_by_session ON record_leases (session)"),
)
"""The statements that take the schema from version ``i`` to ``i + 1``."""
SCHEMA_VERSION = len(_MIGRATIONS)
_LIVE_SESSIONS = "SELECT session FROM sessions WHERE expires_ms > ?"
# (table name, key column) of each versioned table
_TABLES = {Table.LEDGERS: ("ledgers", "id"), Table.COOKIES: ("cookies", "bookie_id"),
           Table.RECORDS: ("records", "key")}


class _SqliteTxn(Txn):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, table: Table, key: Key) -> Row | None:
        name, column = _TABLES[table]
        row = self._conn.execute(
            f"SELECT data, version FROM {name} WHERE {column} = ?", (key,)).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def put(self, table: Table, key: Key, data: bytes, version: int) -> None:
        name, column = _TABLES[table]
        self._conn.execute(
            f"INSERT INTO {name} ({column}, data, version) VALUES (?, ?, ?) ON CONFLICT"
            f" ({column}) DO UPDATE SET data = excluded.data, version = excluded.version",
            (key, data, version))

    def delete(self, table: Table, key: Key) -> None:
        name, column = _TABLES[table]
        self._conn.execute(f"DELETE FROM {name} WHERE {column} = ?", (key,))
        if table is Table.RECORDS:
            self._conn.execute("DELETE FROM record_leases WHERE key = ?", (key,))

    def ledger_ids(self) -> list[int]:
        return [row[0] for row in self._conn.execute("SELECT id FROM ledgers ORDER BY id")]

    def cookie_ids(self) -> list[str]:
        return [row[0] for row in
                self._conn.execute("SELECT bookie_id FROM cookies ORDER BY bookie_id")]

    def record_keys(self, prefix: str) -> list[str]:
        keys = []
        # TEXT compares as UTF-8 bytes, i.e. in code point order like str
        for (key,) in self._conn.execute(
                "SELECT key FROM records WHERE key >= ? ORDER BY key", (prefix,)):
            if not key.startswith(prefix):
                break
            keys.append(key)
        return keys

    def next_counter(self, name: str) -> int:
        row = self._conn.execute(
            "INSERT INTO counters (name, value) VALUES (?, 1) ON CONFLICT (name)"
            " DO UPDATE SET value = value + 1 RETURNING value", (name,)).fetchone()
        return int(row[0])

    def get_lease(self, bookie_id: str) -> Lease | None:
        row = self._conn.execute(
            "SELECT bookie_id, data, owner, expires_ms FROM bookies WHERE bookie_id = ?",
            (bookie_id,)).fetchone()
        return None if row is None else Lease(row[0], bytes(row[1]), row[2], row[3])

    def put_lease(self, lease: Lease) -> None:
        self._conn.execute("INSERT OR REPLACE INTO bookies (bookie_id, data, owner, expires_ms)"
                           " VALUES (?, ?, ?, ?)", lease)

    def delete_lease(self, bookie_id: str) -> None:
        self._conn.execute("DELETE FROM bookies WHERE bookie_id = ?", (bookie_id,))

    def live_leases(self, now_ms: int) -> list[Lease]:
        rows = self._conn.execute(
            "SELECT bookie_id, data, owner, expires_ms FROM bookies WHERE expires_ms > ?"
            " ORDER BY bookie_id", (now_ms,))
        return [Lease(r[0], bytes(r[1]), r[2], r[3]) for r in rows]

    def session_expiry(self, session: str) -> int | None:
        row = self._conn.execute(
            "SELECT expires_ms FROM sessions WHERE session = ?", (session,)).fetchone()
        return None if row is None else int(row[0])

    def put_session(self, session: str, expires_ms: int) -> None:
        self._conn.execute("INSERT OR REPLACE INTO sessions (session, expires_ms)"
                           " VALUES (?, ?)", (session, expires_ms))

    def delete_session(self, session: str) -> None:
        self._conn.execute("DELETE FROM records WHERE key IN"
                           " (SELECT key FROM record_leases WHERE session = ?)", (session,))
        self._conn.execute("DELETE FROM record_leases WHERE session = ?", (session,))
        self._conn.execute("DELETE FROM sessions WHERE session = ?", (session,))

    def lease_record(self, key: str, session: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO record_leases (key, session)"
                           " VALUES (?, ?)", (key, session))

    def record_expiry(self, key: str) -> int | None:
        row = self._conn.execute(
            "SELECT coalesce(s.expires_ms, 0) FROM record_leases l"
            " LEFT JOIN sessions s ON s.session = l.session WHERE l.key = ?",
            (key,)).fetchone()
        return None if row is None else int(row[0])

    def dead_leased_keys(self, now_ms: int) -> list[str]:
        return [row[0] for row in self._conn.execute(
            f"SELECT key FROM record_leases WHERE session NOT IN ({_LIVE_SESSIONS})",
            (now_ms,))]

    def drop_expired_leases(self, now_ms: int) -> None:
        self._conn.execute(
            "DELETE FROM records WHERE key IN (SELECT key FROM record_leases"
            f" WHERE session NOT IN ({_LIVE_SESSIONS}))", (now_ms,))
        self._conn.execute(
            f"DELETE FROM record_leases WHERE session NOT IN ({_LIVE_SESSIONS})", (now_ms,))
        self._conn.execute("DELETE FROM sessions WHERE expires_ms <= ?", (now_ms,))


class SqliteStore(EmbeddedStore):
    """A :class:`~quire.metadata.store.MetadataStore` in one SQLite file."""

    def __init__(self, uri: str, path: Path, *, lease_ms: int, poll_interval_ms: int,
                 busy_timeout_ms: int, create: bool = True) -> None:
        super().__init__(uri, lease_ms=lease_ms, poll_interval_ms=poll_interval_ms)
        self._path = path
        self._create = create
        self.initialised = False
        """Whether this open created the store (a new file or an empty one)."""
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._thread: concurrent.futures.ThreadPoolExecutor | None = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quire-sqlite"))

    async def _on_thread(self, fn: Callable[[], R]) -> R:
        if self._thread is None:
            raise MetadataError(f"{self.uri}: store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def _write(self, fn: Callable[[Txn], R]) -> R:
        return await self._on_thread(lambda: self._transact("BEGIN IMMEDIATE", fn))

    async def _read(self, fn: Callable[[Txn], R]) -> R:
        return await self._on_thread(lambda: self._transact("BEGIN", fn))

    def _transact(self, begin: str, fn: Callable[[Txn], R]) -> R:
        conn = self._conn
        assert conn is not None
        try:
            conn.execute(begin)
            result = fn(_SqliteTxn(conn))
            conn.execute("COMMIT")
            return result
        except sqlite3.Error as e:
            raise MetadataError(f"{self.uri}: {e}") from e
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    async def _open(self) -> None:
        self._conn = await self._on_thread(self._connect)

    def _connect(self) -> sqlite3.Connection:
        if not self._create and not self._path.is_file():
            raise NoMetadataError(self.uri)
        try:
            if self._create:
                self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self._path, timeout=self._busy_timeout_ms / 1000,
                                   isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise MetadataError(f"{self.uri}: cannot open {self._path}: {e}") from e
        # Two processes creating the file at once can see "database is
        # locked" from the WAL switch, which SQLite does not retry itself.
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                self._initialise(conn)
                break
            except sqlite3.OperationalError as e:
                if "locked" in str(e) and time.monotonic() < deadline:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    time.sleep(0.01)
                    continue
                conn.close()
                raise MetadataError(f"{self.uri}: cannot initialise {self._path}: {e}") from e
            except sqlite3.DatabaseError as e:
                conn.close()
                if not self._create:  # not an SQLite file at all
                    raise NoMetadataError(self.uri) from e
                raise MetadataError(f"{self.uri}: cannot initialise {self._path}: {e}") from e
            except BaseException:
                conn.close()
                raise
        return conn

    def _initialise(self, conn: sqlite3.Connection) -> None:
        if not self._create and conn.execute("PRAGMA user_version").fetchone()[0] == 0:
            raise NoMetadataError(self.uri)  # an empty file, or not Quire's: left as it is
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("BEGIN IMMEDIATE")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        self.initialised = version == 0
        if version > SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            raise MetadataError(f"{self.uri}: schema version {version} is newer than "
                                f"this program's ({SCHEMA_VERSION})")
        for statements in _MIGRATIONS[version:]:
            for statement in statements:
                conn.execute(statement)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")

    async def _release(self) -> None:
        thread, conn = self._thread, self._conn
        try:
            if conn is not None:
                await self._on_thread(conn.close)
        finally:
            self._thread = self._conn = None
            if thread is not None:
                thread.shutdown(wait=False)


async def open_sqlite(uri: str, *, lease_ms: int = 3000, busy_timeout_ms: int = 5000,
                      poll_interval_ms: int = 250, create: bool = True) -> SqliteStore:
    """Open the SQLite store at ``uri``, creating it if needed (``create``)
    or NoMetadataError if it is not there (not ``create``)."""
    if not uri.startswith(SCHEME) or uri == SCHEME:
        raise ConfigError(f"bad SQLite URI {uri!r}: expected sqlite:///relative/path.db "
                          "or sqlite:////absolute/path.db")
    store = SqliteStore(uri, Path(uri[len(SCHEME):]), lease_ms=lease_ms,
                        poll_interval_ms=poll_interval_ms, busy_timeout_ms=busy_timeout_ms,
                        create=create)
    try:
        await store._open()
    except BaseException:
        await store._release()
        raise
    return store
