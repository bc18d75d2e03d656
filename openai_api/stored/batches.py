"""The Batch API's state: uploaded files, batch jobs and each job's per-line answers, owned by the key that made them.

**Embedded (the default):** one SQLite file (`batches.sqlite3`) and a `files/` folder under `--batch-dir`, shared by
every worker of one host (WAL, `BEGIN IMMEDIATE`, as `stored.sqlite`). File contents live in the folder, never in
the database: a 200 MB upload is one file write and a streamed download, and the database stays small.

**Owners.** Every file and job carries its owner (`Caller.owner`); every read names the owner and answers None for
another's, so the routes answer 404 as for an id never issued.

**Exactly once.** A job's line is answered when its row is in `results` (`record`: `INSERT OR IGNORE` on
`(batch_id, idx)`: a second answer of the same line, from a gateway that lost its lease mid-line, is dropped).
A runner starting on a job skips every line already recorded, so a restart resumes at the first unanswered one.

**Pins.** A file past its `expires_at` is a 404 to its owner at once, but its bytes stay while an unfinished job
has it as input (`expired_files` leaves it out): a job holds its input for its whole life, as OpenAI's do, so a
restart after the file's expiry resumes the job rather than failing it. The sweep deletes it once the job ends.
Its owner's delete of such a file (`retire_file`) expires it at once instead, with the same effect. The pin is
taken with the job, in the transaction that checks the file is still live (`create_batch`), and the sweep deletes
a file only if, in its own transaction, it is still expired and unpinned (`sweep_file`): a file deleted or expiring
just as a job is made gives a 404 to `batches.create` or stays with the job, never a job without its input.

**Leases.** A gateway runs a job while it holds the job's lease (`claim`, renewed every few seconds, given back
when the gateway stops); a lease that is not renewed runs out (`LEASE_S`) and another gateway takes the job.

Off the event loop: every statement runs on this store's one thread, as in `stored.sqlite`.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openai_api.stored.sqlite import SQLiteOnThread

logger = logging.getLogger("openai_api.batches")
DB_NAME = "batches.sqlite3"
LEASE_S = 15.0
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
# A line's outcome as `results` keeps it.
SUCCEEDED, ERRORED, CANCELED, EXPIRED = 1, 0, 2, 3
# What `create_batch` did.
Created = Literal["created", "too_many", "no_file"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
  bytes INTEGER NOT NULL, lines INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS files_owner ON files (owner, created_at);
CREATE TABLE IF NOT EXISTS batches (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
  created_at INTEGER NOT NULL, lease_owner TEXT, lease_until REAL NOT NULL DEFAULT 0, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, kind, created_at);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS file_expiry (id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS file_expiry_at ON file_expiry (expires_at);
CREATE TABLE IF NOT EXISTS results (
  batch_id TEXT NOT NULL, idx INTEGER NOT NULL, outcome INTEGER NOT NULL, line TEXT NOT NULL,
  PRIMARY KEY (batch_id, idx));
"""


# A file's columns and its expiry (the expiry in a table of its own: stores made before it keep working).
_FILES = "SELECT f.*, e.expires_at FROM files f LEFT JOIN file_expiry e ON e.id = f.id"
# The input files of unfinished jobs: pinned, never swept (read from the jobs themselves, so jobs made before the
# pin existed are pinned too; `IS NOT NULL` because one NULL would make every `NOT IN` unknown).
_PINNED = ("SELECT json_extract(data, '$.input_file_id') FROM batches WHERE status IN ({marks}) AND "
           "json_extract(data, '$.input_file_id') IS NOT NULL")


def default_batch_dir() -> Path:
    """`$XDG_STATE_HOME/openai-api/batches` (`~/.local/state/...` without it)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "openai-api" / "batches"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    lines: int
    created_at: int
    expires_at: int | None = None  # deleted then (`expired_files`); None: kept until deleted


@dataclass(slots=True)
class BatchRecord:
    """A job: its columns, and `data` (the wire object's fields the store does not look at)."""

    id: str
    owner: str
    kind: str  # "openai" | "anthropic"
    status: str
    created_at: int
    data: dict[str, Any]


def _live(rec: FileRecord, now: float) -> bool:
    """Whether a file is still there for its owner at `now` (not past its `expires_at`)."""
    return rec.expires_at is None or rec.expires_at > now


class BatchStore(SQLiteOnThread):
    """See the module docstring. `folder` is made (mode 0700) on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.files_dir = self.folder / "files"
        super().__init__(self.folder / DB_NAME, _SCHEMA, self.files_dir, "batch-store", "batch store", self.folder,
                         "The gateway's batch store is unavailable; retry shortly.", logger)

    # --- on the store's thread ---------------------------------------------------------------------------

    def _tx(self, fn: Any, *args: Any) -> Any:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db, *args)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return out

    def exists(self) -> bool:
        """Whether the store was made yet (a runner polls nothing before)."""
        return (self.folder / DB_NAME).exists()

    def path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def _put_file(self, rec: FileRecord, content: bytes) -> None:
        self._conn()
        tmp = self.files_dir / f".{rec.id}.tmp"
        tmp.write_bytes(content)
        os.replace(tmp, self.path(rec.id))  # whole or absent, never half a file
        self._conn().execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (rec.id, rec.owner, rec.purpose, rec.filename, rec.bytes, rec.lines, rec.created_at))
        if rec.expires_at is not None:
            self._conn().execute("INSERT INTO file_expiry VALUES (?, ?)", (rec.id, rec.expires_at))

    def _get_file(self, owner: str, file_id: str) -> FileRecord | None:
        row = self._conn().execute(_FILES + " WHERE f.id = ? AND f.owner = ?", (file_id, owner)).fetchone()
        return None if row is None else FileRecord(*row)

    def _list_files(self, owner: str, purpose: str | None, limit: int) -> list[FileRecord]:
        q = _FILES + " WHERE f.owner = ?" + (" AND f.purpose = ?" if purpose else "") + \
            " ORDER BY f.created_at DESC, f.rowid DESC LIMIT ?"
        args: tuple[Any, ...] = (owner, purpose, limit) if purpose else (owner, limit)
        return [FileRecord(*r) for r in self._conn().execute(q, args).fetchall()]

    def _delete_file(self, owner: str, file_id: str) -> bool:
        gone = self._conn().execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)).rowcount > 0
        if gone:
            self._conn().execute("DELETE FROM file_expiry WHERE id = ?", (file_id,))
            self.path(file_id).unlink(missing_ok=True)
        return gone

    def _retire_file(self, db: sqlite3.Connection, owner: str, file_id: str, now: int) -> bool:
        if db.execute("SELECT 1 FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone() is None:
            return False
        marks = ",".join("?" * len(ACTIVE))
        if db.execute(f"SELECT 1 WHERE ? IN ({_PINNED.format(marks=marks)})", (file_id, *ACTIVE)).fetchone():
            db.execute("INSERT OR REPLACE INTO file_expiry VALUES (?, ?)", (file_id, now))
            return True
        return self._delete_file(owner, file_id)

    def _expired_files(self, now: int, most: int) -> list[tuple[str, str]]:
        marks = ",".join("?" * len(ACTIVE))
        rows = self._conn().execute(
            "SELECT e.id, f.owner FROM file_expiry e JOIN files f ON f.id = e.id WHERE e.expires_at <= ? AND e.id "
            f"NOT IN ({_PINNED.format(marks=marks)}) ORDER BY e.expires_at LIMIT ?", (now, *ACTIVE, most)).fetchall()
        return [(str(i), str(o)) for i, o in rows]

    def _read(self, file_id: str) -> bytes:
        return self.path(file_id).read_bytes()

    def _sweep_file(self, db: sqlite3.Connection, owner: str, file_id: str, now: int) -> bool:
        marks = ",".join("?" * len(ACTIVE))
        if db.execute(f"SELECT 1 FROM file_expiry WHERE id = ? AND expires_at <= ? AND id NOT IN "
                      f"({_PINNED.format(marks=marks)})", (file_id, now, *ACTIVE)).fetchone() is None:
            return False
        return self._delete_file(owner, file_id)

    def _create_batch(self, db: sqlite3.Connection, rec: BatchRecord, max_active: int, now: float) -> Created:
        file_id = rec.data.get("input_file_id")
        if file_id is not None:
            row = db.execute(_FILES + " WHERE f.id = ? AND f.owner = ?", (file_id, rec.owner)).fetchone()
            if row is None or not _live(FileRecord(*row), now):
                return "no_file"
        marks = ",".join("?" * len(ACTIVE))
        (active,) = db.execute(f"SELECT count(*) FROM batches WHERE owner = ? AND status IN ({marks})",
                               (rec.owner, *ACTIVE)).fetchone()
        if active >= max_active:
            return "too_many"
        db.execute("INSERT INTO batches (id, owner, kind, status, created_at, data) VALUES (?, ?, ?, ?, ?, ?)",
                   (rec.id, rec.owner, rec.kind, rec.status, rec.created_at, json.dumps(rec.data)))
        return "created"

    @staticmethod
    def _batch(row: tuple[Any, ...]) -> BatchRecord:
        return BatchRecord(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def _get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        q = "SELECT id, owner, kind, status, created_at, data FROM batches WHERE id = ?"
        row = self._conn().execute(q + (" AND owner = ?" if owner is not None else ""),
                                   (batch_id, owner) if owner is not None else (batch_id,)).fetchone()
        return None if row is None else self._batch(row)

    def _list_batches(self, owner: str, kind: str, limit: int) -> list[BatchRecord]:
        rows = self._conn().execute(
            "SELECT id, owner, kind, status, created_at, data FROM batches WHERE owner = ? AND kind = ? "
            "ORDER BY created_at DESC, rowid DESC LIMIT ?", (owner, kind, limit)).fetchall()
        return [self._batch(r) for r in rows]

    def _update(self, db: sqlite3.Connection, batch_id: str, status: str | None, fields: dict[str, Any],
                only_if: tuple[str, ...] | None) -> BatchRecord | None:
        row = db.execute("SELECT id, owner, kind, status, created_at, data FROM batches WHERE id = ?",
                         (batch_id,)).fetchone()
        if row is None:
            return None
        rec = self._batch(row)
        if only_if is not None and rec.status not in only_if:
            return rec
        rec.data.update(fields)
        if status is not None:
            rec.status = status
        db.execute("UPDATE batches SET status = ?, data = ? WHERE id = ?", (rec.status, json.dumps(rec.data),
                                                                          batch_id))
        return rec

    def _delete_batch(self, db: sqlite3.Connection, owner: str, batch_id: str) -> bool:
        if db.execute("DELETE FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)).rowcount == 0:
            return False
        db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
        return True

    def _candidates(self, now: float, most: int) -> list[tuple[str, str]]:
        marks = ",".join("?" * len(ACTIVE))
        rows = self._conn().execute(
            f"SELECT id, owner FROM batches WHERE status IN ({marks}) AND (lease_owner IS NULL OR lease_until < ?) "
            "ORDER BY created_at, rowid LIMIT ?", (*ACTIVE, now, most)).fetchall()
        return [(str(i), str(o)) for i, o in rows]

    def _claim(self, db: sqlite3.Connection, node: str, ids: list[str], now: float, most: int) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        got: list[str] = []
        for job_id in ids:
            if len(got) >= most:
                break
            cur = db.execute(f"UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND status IN "
                             f"({marks}) AND (lease_owner IS NULL OR lease_until < ?)",
                             (node, now + LEASE_S, job_id, *ACTIVE, now))
            if cur.rowcount == 1:
                got.append(job_id)
        return got

    def _renew(self, batch_id: str, node: str) -> str | None:
        """Extend `node`'s lease; the job's status, or None when the lease is no longer `node`'s."""
        db = self._conn()
        cur = db.execute("UPDATE batches SET lease_until = ? WHERE id = ? AND lease_owner = ?",
                         (time.time() + LEASE_S, batch_id, node))
        if cur.rowcount == 0:
            return None
        row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else str(row[0])

    def _release(self, batch_id: str, node: str) -> None:
        self._conn().execute("UPDATE batches SET lease_owner = NULL, lease_until = 0 WHERE id = ? AND "
                             "lease_owner = ?", (batch_id, node))

    def _record(self, batch_id: str, idx: int, outcome: int, line: str) -> bool:
        cur = self._conn().execute("INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?)", (batch_id, idx, outcome,
                                                                                         line))
        return cur.rowcount == 1

    def _done(self, batch_id: str) -> set[int]:
        return {r[0] for r in self._conn().execute("SELECT idx FROM results WHERE batch_id = ?", (batch_id,))}

    def _counts(self, batch_id: str) -> dict[int, int]:
        rows = self._conn().execute("SELECT outcome, count(*) FROM results WHERE batch_id = ? GROUP BY outcome",
                                    (batch_id,)).fetchall()
        return {int(o): int(n) for o, n in rows}

    def _results(self, batch_id: str, outcomes: tuple[int, ...] | None) -> list[str]:
        q = "SELECT line FROM results WHERE batch_id = ?" + (
            "" if outcomes is None else f" AND outcome IN ({','.join('?' * len(outcomes))})") + " ORDER BY idx"
        return [r[0] for r in self._conn().execute(q, (batch_id, *(outcomes or ())))]

    # --- on the event loop -------------------------------------------------------------------------------
    async def _read_op(self, empty: Any, fn: Any, *args: Any) -> Any:
        """A read: `empty` while the store was never made (reads make nothing on disk; only writes do)."""
        if self._db is None and not self.exists():
            return empty
        return await self._run(fn, *args)

    async def put_file(self, rec: FileRecord, content: bytes) -> None:
        await self._run(self._put_file, rec, content)

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        found: FileRecord | None = await self._read_op(None, self._get_file, owner, file_id)
        return found

    async def list_files(self, owner: str, purpose: str | None, limit: int) -> list[FileRecord]:
        found: list[FileRecord] = await self._read_op([], self._list_files, owner, purpose, limit)
        return found

    async def delete_file(self, owner: str, file_id: str) -> bool:
        gone: bool = await self._read_op(False, self._delete_file, owner, file_id)
        return gone

    async def retire_file(self, owner: str, file_id: str, now: int) -> bool:
        """A delete by the file's owner: the file is deleted, or, while an unfinished job has it as input, expired
        at `now` (gone for its owner at once; its bytes swept once the job ends, as for any pinned file). False when
        `owner` has no such file."""
        gone: bool = await self._read_op(False, self._tx, self._retire_file, owner, file_id, now)
        return gone

    async def expired_files(self, now: int, most: int) -> list[tuple[str, str]]:
        """(id, owner) of up to `most` files whose `expires_at` is `now` or before, the longest expired first; never
        the input file of an unfinished job (pinned: the job reads it again when it resumes after a restart, and
        for the custom ids of the lines it never ran when it ends cancelled or expired). Swept once the job ends."""
        found: list[tuple[str, str]] = await self._read_op([], self._expired_files, now, most)
        return found

    async def read(self, file_id: str) -> bytes:
        data: bytes = await self._run(self._read, file_id)
        return data

    async def sweep_file(self, owner: str, file_id: str, now: int) -> bool:
        """Delete an expired file, only if it is still expired at `now` and no unfinished job pins it, in one
        transaction: a job made since `expired_files` listed it (by a gateway whose clock is behind) keeps it."""
        gone: bool = await self._read_op(False, self._tx, self._sweep_file, owner, file_id, now)
        return gone

    async def create_batch(self, rec: BatchRecord, max_active: int, now: float) -> Created:
        """Make the job, pinning its input file (`data["input_file_id"]`), in one transaction: `"no_file"` when that
        file is not `rec.owner`'s or not live at `now` (deleted or expired since the caller looked: the job would
        have no input), `"too_many"` when the owner has `max_active` unfinished jobs, else `"created"`."""
        made: Created = await self._run(self._tx, self._create_batch, rec, max_active, now)
        return made

    async def get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        found: BatchRecord | None = await self._read_op(None, self._get_batch, owner, batch_id)
        return found

    async def list_batches(self, owner: str, kind: str, limit: int) -> list[BatchRecord]:
        found: list[BatchRecord] = await self._read_op([], self._list_batches, owner, kind, limit)
        return found

    async def update(self, batch_id: str, status: str | None = None, fields: dict[str, Any] | None = None,
                     only_if: tuple[str, ...] | None = None) -> BatchRecord | None:
        """Set `status` and `fields` of a job (only when its status is in `only_if`, if given); the job after."""
        rec: BatchRecord | None = await self._run(self._tx, self._update, batch_id, status, fields or {}, only_if)
        return rec

    async def delete_batch(self, owner: str, batch_id: str) -> bool:
        """Forget `owner`'s job and its answers (not its files); False when there was none of that owner."""
        gone: bool = await self._read_op(False, self._tx, self._delete_batch, owner, batch_id)
        return gone

    async def candidates(self, most: int) -> list[tuple[str, str]]:
        """(id, owner) of up to `most` unfinished jobs no gateway holds a lease on, oldest first."""
        found: list[tuple[str, str]] = await self._read_op([], self._candidates, time.time(), most)
        return found

    async def claim(self, node: str, ids: list[str], most: int) -> list[str]:
        """Take the lease of up to `most` of `ids`, in that order, for `node`: those it got (a job another gateway
        claimed since, or that ended, is skipped)."""
        got: list[str] = await self._run(self._tx, self._claim, node, ids, time.time(), most)
        return got

    async def renew(self, batch_id: str, node: str) -> str | None:
        status: str | None = await self._run(self._renew, batch_id, node)
        return status

    async def release(self, batch_id: str, node: str) -> None:
        await self._run(self._release, batch_id, node)

    async def record(self, batch_id: str, idx: int, outcome: int, line: str) -> bool:
        """Keep line `idx`'s answer; False when it was already answered (the first answer stays)."""
        kept: bool = await self._run(self._record, batch_id, idx, outcome, line)
        return kept

    async def done(self, batch_id: str) -> set[int]:
        found: set[int] = await self._run(self._done, batch_id)
        return found

    async def counts(self, batch_id: str) -> dict[int, int]:
        """A job's answered lines per outcome (`SUCCEEDED`, `ERRORED`, ...)."""
        found: dict[int, int] = await self._run(self._counts, batch_id)
        return found

    async def results(self, batch_id: str, outcomes: tuple[int, ...] | None = None) -> list[str]:
        """A job's recorded answers in line order (of these outcomes, or all)."""
        found: list[str] = await self._run(self._results, batch_id, outcomes)
        return found


def iter_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(0-based index, line) of a JSONL file's non-blank lines."""
    idx = 0
    for raw in data.split(b"\n"):
        if raw.strip():
            yield idx, raw
            idx += 1
