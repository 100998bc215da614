"""The SQLite store's file: a version 1 file (before leased records) is
upgraded in place, keeping its data."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from quire.metadata import LedgerMetadata, Versioned, open_store, serialize

# The schema as Quire wrote it before schema version 2.
VERSION_1 = (
    "CREATE TABLE ledgers (id INTEGER PRIMARY KEY, data BLOB NOT NULL, version INTEGER NOT NULL)",
    "CREATE TABLE cookies (bookie_id TEXT PRIMARY KEY, data BLOB NOT NULL,"
    " version INTEGER NOT NULL)",
    "CREATE TABLE records (key TEXT PRIMARY KEY, data BLOB NOT NULL, version INTEGER NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE bookies (bookie_id TEXT PRIMARY KEY, data BLOB NOT NULL,"
    " owner TEXT NOT NULL, expires_ms INTEGER NOT NULL)",
)


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


async def test_a_version_1_file_is_upgraded_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    md = LedgerMetadata(1, 1, 1)
    conn = sqlite3.connect(path)
    for statement in VERSION_1:
        conn.execute(statement)
    conn.execute("INSERT INTO records VALUES ('logs/a', x'00ff', 3)")
    conn.execute("INSERT INTO ledgers VALUES (7, ?, 2)", (serialize(md),))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()

    store = await open_store(f"sqlite:///{path}")
    try:
        assert await store.read_record("logs/a") == Versioned(b"\x00\xff", 3)
        assert await store.read_ledger(7) == Versioned(md, 2)
        assert await store.create_leased_record("locks/x", b"1") == 0
        assert await store.list_records("") == ["locks/x", "logs/a"]
    finally:
        await store.close()
    assert user_version(path) == 2

    again = await open_store(f"sqlite:///{path}")  # a version 2 file opens as it is
    try:
        assert await again.list_records("") == ["logs/a"]
    finally:
        await again.close()
    assert user_version(path) == 2
