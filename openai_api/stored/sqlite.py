"""Owned objects in one SQLite file, shared by every worker of one host (`--workers N`), kept across restarts.

The file is `objects.sqlite3` in the store's folder. Every worker opens it on its own: WAL mode, so readers
never wait for a writer and one writer at a time appends (`BEGIN IMMEDIATE`, waiting up to `BUSY_S` for the
lock while another worker writes); `synchronous=NORMAL`, so a write costs no fsync of its own (a power cut
may lose the last writes, never corrupt the file). The bounds are kept exactly across processes: triggers
keep a one-row `totals` table (entries, bytes) in step with `objects`, and each `put` evicts the oldest rows
(by insertion) in its own transaction until both bounds hold, after dropping what expired. Reads check the
owner and the expiry in their `WHERE`.

Off the event loop: every statement runs on this store's one thread (with its own connection); a call waits
on that thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from openai_api.stored.base import DEFAULT_TTL_S, StoredObject, StoreUnavailableError

logger = logging.getLogger("openai_api.stored")
FILE_NAME = "objects.sqlite3"
BUSY_S = 5.0
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL, id TEXT NOT NULL, owner TEXT NOT NULL, model TEXT NOT NULL,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL,
  UNIQUE (kind, id));
CREATE INDEX IF NOT EXISTS objects_expiry ON objects (expires_at);
CREATE TABLE IF NOT EXISTS totals (one INTEGER PRIMARY KEY CHECK (one = 1), entries INTEGER NOT NULL,
  bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0);
CREATE TRIGGER IF NOT EXISTS objects_added AFTER INSERT ON objects BEGIN
  UPDATE totals SET entries = entries + 1, bytes = bytes + new.size; END;
CREATE TRIGGER IF NOT EXISTS objects_removed AFTER DELETE ON objects BEGIN
  UPDATE totals SET entries = entries - 1, bytes = bytes - old.size; END;
CREATE TRIGGER IF NOT EXISTS objects_replaced AFTER UPDATE OF size ON objects BEGIN
  UPDATE totals SET bytes = bytes - old.size + new.size; END;
"""


class SQLiteOnThread:
    """One SQLite file used from one thread of its own (a connection made there on first use): WAL,
    `synchronous=NORMAL`, `schema` created in one `BEGIN IMMEDIATE` transaction (several workers may create it at
    once), `make` (the file's folder, or one below it) made with mode 0700 first. `_run` calls a function on that
    thread from the event loop; what SQLite or the disk refuses is a `StoreUnavailableError` saying
    `unavailable`, logged as "the <what> <where> failed". The object store and the batch store are both this."""

    def __init__(self, path: Path, schema: str, make: Path, thread_name: str, what: str, where: Path,
                 unavailable: str, log: logging.Logger = logger) -> None:
        self._db_path = path
        self._log = log
        self._schema = schema
        self._make = make
        self._what, self._where, self._unavailable = what, where, unavailable
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=thread_name)
        self._db: sqlite3.Connection | None = None  # used on `_thread` only

    # --- on the store's thread ---------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._make.mkdir(mode=0o700, parents=True, exist_ok=True)
            db = sqlite3.connect(self._db_path, timeout=BUSY_S, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            try:  # one transaction: several workers may create the schema at once
                db.executescript("BEGIN IMMEDIATE;" + self._schema + "COMMIT;")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
                raise
            self._db = db
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # --- on the event loop -------------------------------------------------------------------------------
    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        except (sqlite3.Error, OSError) as e:  # locked past BUSY_S, unwritable, full disk, not a folder
            self._log.error("the %s %s failed: %s", self._what, self._where, e)
            raise StoreUnavailableError(self._unavailable, headers={"Retry-After": "1"}) from None

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=False)


class SQLiteObjectStore(SQLiteOnThread):
    """See the module docstring. `folder` is made (mode 0700) when missing."""

    def __init__(self, folder: Path, max_entries: int, max_bytes: int, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.path = Path(folder) / FILE_NAME
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        super().__init__(self.path, _SCHEMA, self.path.parent, "object-store", "object store", self.path,
                         "The gateway's store of responses is unavailable; retry shortly.")

    # --- on the store's thread ---------------------------------------------------------------------------

    def _put(self, obj: StoredObject) -> bool:
        size = len(obj.data)
        if size > self.max_bytes:
            return False
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM objects WHERE expires_at <= ?", (time.time(),))
            cur = db.execute(
                "INSERT INTO objects (kind, id, owner, model, created_at, expires_at, size, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, id) DO UPDATE SET model = excluded.model, "
                "created_at = excluded.created_at, expires_at = excluded.expires_at, size = excluded.size, "
                "data = excluded.data WHERE objects.owner = excluded.owner",
                (obj.kind, obj.id, obj.owner, obj.model, obj.created_at, obj.created_at + self.ttl_s, size,
                 obj.data))
            kept = cur.rowcount == 1
            self._evict(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return kept

    def _evict(self, db: sqlite3.Connection) -> None:
        entries, total = db.execute("SELECT entries, bytes FROM totals").fetchone()
        while entries > self.max_entries or total > self.max_bytes:
            rows = db.execute("SELECT seq, size FROM objects ORDER BY seq LIMIT 64").fetchall()
            cut: list[int] = []
            for seq, size in rows:
                if entries <= self.max_entries and total <= self.max_bytes:
                    break
                cut.append(seq)
                entries, total = entries - 1, total - size
            db.executemany("DELETE FROM objects WHERE seq = ?", [(s,) for s in cut])

    def _get(self, kind: str, owner: str, object_id: str) -> StoredObject | None:
        row = self._conn().execute(
            "SELECT model, data, created_at FROM objects WHERE kind = ? AND id = ? AND owner = ? AND expires_at > ?",
            (kind, object_id, owner, time.time())).fetchone()
        return None if row is None else StoredObject(kind, object_id, owner, row[0], bytes(row[1]), row[2])

    def _delete(self, kind: str, owner: str, object_id: str) -> bool:
        cur = self._conn().execute("DELETE FROM objects WHERE kind = ? AND id = ? AND owner = ?",
                                   (kind, object_id, owner))
        return cur.rowcount > 0

    # --- on the event loop -------------------------------------------------------------------------------
    async def put(self, obj: StoredObject) -> bool:
        kept: bool = await self._run(self._put, obj)
        return kept

    async def get(self, kind: str, owner: str, object_id: str) -> StoredObject | None:
        found: StoredObject | None = await self._run(self._get, kind, owner, object_id)
        return found

    async def delete(self, kind: str, owner: str, object_id: str) -> bool:
        gone: bool = await self._run(self._delete, kind, owner, object_id)
        return gone

    async def start(self) -> None:
        await self._run(self._conn)  # the file and its schema now: a bad folder is reported at start-up
