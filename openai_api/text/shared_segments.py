"""The prompt cache's segments shared by the worker processes of one gateway (`--workers N`).

Why: with `--workers N` the kernel spreads new connections over the workers, so an agent whose every turn
opens a new connection lands on any worker; measured with two workers (bench/results/agent-sessions-
2026-12-07-eve.md), half the turns reached the worker that had not seen the session's last few turns, and
each worker's own cache (`text.prompt_cache`) tokenized those turns again: 1.65x the CPU of a turn that
stayed. Here a worker that misses a segment in its own map looks in a folder every worker of the gateway
shares before it tokenizes it, and publishes every segment it tokenizes there.

Chosen over the alternatives:

* **Files in one folder** (the supervisor's private run directory, 0700, removed when the gateway stops),
  **one per segment**, over shared memory (a hash table in `multiprocessing.shared_memory` needs its own
  allocator and cross-process locking, and a worker killed while holding a lock stalls the others) or the
  supervisor serving them over a socket (a round trip through a third process per lookup, its CPU on the
  supervisor). The file system gives atomic publication (write a temporary name, `rename`), lookups with no
  lock, and eviction that a dead worker cannot wedge. A lookup is an `open`, a read and a CRC: ~20 us for a
  message's ids, against ~2.5 ms of tokenizing per 1k tokens; only segments a worker's own map misses are
  looked up, so a turn that stays on its worker costs nothing more than the few new segments' failed opens.
* **Routing a session to one worker** instead cannot be done here: the kernel picks the worker from the
  connection, before any header is read.

The contract:

* **Names**: the SHA-256 of (the tokenizer's identity, the segment's UTF-8), hex: segment text comes from
  clients, so it never reaches a path; the identity (`TextTokenizer.identity`: the hash of its
  tokenizer.json) keeps different tokenizers' ids apart, and a tokenizer whose file changed on a reload
  gets new names.
* **Files**: `MAGIC`, the token count and the CRC-32 of the ids (little-endian uint32 each), then the ids as
  little-endian int32 (`prompt_cache`'s own form). Written to a temporary name (its writer's pid and thread)
  and renamed, so a reader never sees a partial file; a file of the wrong length, magic or CRC is a miss
  (never an error), as is any OSError.
* **Bounded**: in bytes (`--prompt-cache-mb`, the same budget as each worker's map; a file counts as at least
  one 4 KiB block). Each worker sums what it wrote; past 1/16 of the budget it scans the folder, under a
  non-blocking `flock` so only one process scans at a time (on a thread of its own: a scan of 30k files
  takes ~100 ms, which no request should wait for), and unlinks the least recently used files
  (modification time, which a hit renews) down to 3/4 of the budget, and temporary files older than a minute
  (a writer killed mid-write). So the folder holds at most the budget + N/16 of it. Unlinking a file a
  reader has open is safe (it reads the whole old file); one that is already gone is skipped.
* **Short segments** (under `MIN_CHARS` characters) are neither looked up nor published: tokenizing them
  costs about what a file costs.

A single process (`--workers 1`) has no shared folder: nothing here runs, no system call is added.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import time
import zlib
from pathlib import Path

logger = logging.getLogger(__name__)

FOLDER_ENV = "OPENAI_API_PROMPT_SEGMENTS"  # set by the supervisor in each worker's environment
MAGIC = b"PTS1"
_HEADER = struct.Struct("<4sII")  # magic, token count, CRC-32 of the ids
MIN_CHARS = 128
BLOCK = 4096
_STALE_TMP_S = 60.0
_LOCK_NAME = ".evict.lock"


def _charged(size: int) -> int:
    """What a file of `size` bytes counts against the budget: whole 4 KiB blocks, as the disk or tmpfs holds it."""
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


class SharedSegments:
    """One gateway's shared folder of segment ids (module docstring). Thread-safe; every method swallows
    OSError (a lookup is then a miss, a publication is skipped)."""

    def __init__(self, folder: Path, max_bytes: int, *, background: bool = True) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        # Eviction scans the folder: ~100 ms for 30k files here, so not on a request's thread (`background`).
        self.background = background
        self._evictor: threading.Thread | None = None
        self._scan_every = max(BLOCK, max_bytes // 16)
        self._written = 0
        self._lock = threading.Lock()
        self._scanning = threading.Lock()
        self._dir = str(folder)

    @classmethod
    def from_env(cls, max_bytes: int) -> SharedSegments | None:
        """The folder the supervisor named for this worker (`FOLDER_ENV`), or None (a single process)."""
        folder = os.environ.get(FOLDER_ENV)
        if not folder or max_bytes <= 0:
            return None
        return cls(Path(folder), max_bytes)

    @staticmethod
    def name(identity: bytes, segment: str) -> str:
        """The file name of `segment`'s ids for the tokenizer `identity`: a hash, never the client's text."""
        h = hashlib.sha256(identity)
        h.update(b"\0")
        # A lone surrogate (JSON may carry one) is hashed as it is; no tokenizer will publish its ids anyway.
        h.update(segment.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def get(self, name: str) -> bytes | None:
        """The ids (int32 little-endian bytes) published under `name`, or None: absent, partial or corrupt.
        A hit renews the file's place in the eviction order."""
        path = os.path.join(self._dir, name)
        try:
            with open(path, "rb", buffering=0) as f:
                data = f.readall()
                with contextlib.suppress(OSError):
                    os.utime(f.fileno())
        except OSError:
            return None
        if len(data) < _HEADER.size:
            return None
        magic, count, crc = _HEADER.unpack_from(data)
        if magic != MAGIC or len(data) != _HEADER.size + 4 * count:
            return None
        ids = data[_HEADER.size:]
        if zlib.crc32(ids) != crc:
            return None
        return ids

    def put(self, name: str, ids: bytes) -> None:
        """Publish `ids` (int32 little-endian bytes) under `name`: whole or not at all."""
        data = _HEADER.pack(MAGIC, len(ids) // 4, zlib.crc32(ids)) + ids
        tmp = os.path.join(self._dir, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, os.path.join(self._dir, name))
        except OSError as e:  # a full disk, the folder gone with the supervisor: the segment stays unshared
            logger.debug("prompt segment not shared: %s", e)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        with self._lock:
            self._written += _charged(len(data))
            due = self._written >= self._scan_every
            if due:
                self._written = 0
        if due:
            if not self.background:
                self.evict()
                return
            with self._lock:
                if self._evictor is not None and self._evictor.is_alive():
                    return  # one at a time; the next due publication starts another
                self._evictor = threading.Thread(target=self.evict, name="prompt-segments-evict", daemon=True)
                self._evictor.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the background eviction running now, if any, has ended (tests)."""
        evictor = self._evictor
        if evictor is not None:
            evictor.join(timeout)

    def evict(self) -> int:
        """Bring the folder within the budget when it is over it: the least recently used files go until 3/4 of
        it is left, and stale temporary files. Skipped (0) while another thread or process evicts. Returns
        how many files this call removed."""
        if not self._scanning.acquire(blocking=False):
            return 0
        try:
            import fcntl  # POSIX only; --workers is too

            try:
                lock = os.open(os.path.join(self._dir, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                return 0
            try:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return 0  # another worker is at it
                return self._evict_locked()
            finally:
                os.close(lock)  # releases the flock
        finally:
            self._scanning.release()

    def _evict_locked(self) -> int:
        now = time.time()
        files: list[tuple[int, int, str]] = []
        total = 0
        removed = 0
        try:
            with os.scandir(self._dir) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if entry.name.startswith("."):
                        if entry.name.endswith(".tmp") and now - st.st_mtime > _STALE_TMP_S:
                            with contextlib.suppress(OSError):
                                os.unlink(entry.path)
                        continue
                    size = _charged(st.st_size)
                    total += size
                    files.append((st.st_mtime_ns, size, entry.path))
        except OSError:
            return 0
        if total <= self.max_bytes:
            return 0
        files.sort()
        target = self.max_bytes * 3 // 4
        for _, size, path in files:
            if total <= target:
                break
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= size
        return removed
