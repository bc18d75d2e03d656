"""The prefix map of `routing.PrefixAffinity` shared by the worker processes of one gateway (`--workers N`).

With N workers each keeping its own map, a conversation's next turn reaches a worker that never saw its
prefix N-1 times in N (the kernel spreads connections over workers, and clients open new ones), and that
worker then picks by load: affinity is lost exactly when it matters. So the workers share one table: a
file in the workers' shared directory (the supervisor's fresh `PROMETHEUS_MULTIPROC_DIR`), mapped into
every worker with `mmap`, one per model. Layout: `slots` entries of `SLOT` bytes, each the block hash (int64,
0 = empty) and `HOLDERS` replica ids (int64: a hash of the replica's url, the same in every process; 0 =
none), most recent first. A block's entry lives in one of `WAYS` slots after `hash & (slots - 1)`; a full
set overwrites the way the hash picks (a cheap stand-in for LRU).

No lock: a reader may see an entry half written by another worker (a torn holder list). That costs one
routing guess, never a failed request (an id that names no current replica is skipped), and this runs
once per request on the event loop, where a cross-process lock could stall every stream.
Session keys (strings) are hashed with BLAKE2b: Python's `hash(str)` differs per process.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path

HOLDERS = 4
WAYS = 4
WIDTH = 1 + HOLDERS  # int64s per entry: the key, then the holders
SLOT = 8 * WIDTH


def stable_id(text: str) -> int:
    """A non-zero signed 64-bit id of `text`, equal in every process."""
    v = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
    return v or 1


def _key(h: int) -> int:
    # Python hashes are signed 64-bit already; 0 marks an empty slot.
    return h or 1


class SharedTable:
    """A fixed-size hash -> holder ids table in a shared file (see the module docstring)."""

    def __init__(self, path: Path, capacity: int) -> None:
        slots = 1
        while slots < 2 * capacity:
            slots <<= 1
        self.slots, self.mask = slots, slots - 1
        size = slots * SLOT
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # every worker asks for the same size; zero-filled = empty
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # int64 view: entry i is q[i * WIDTH] (the key) and the HOLDERS ids after it (indexing, no tuples).
        self.q = memoryview(self.mm).cast("q")

    def _find(self, key: int) -> tuple[int, bool]:
        """(index of the key's entry, True) if present, else (index of the entry to take for it, False)."""
        q, mask, width = self.q, self.mask, WIDTH
        base = key & mask
        empty = -1
        for way in range(WAYS):
            i = ((base + way) & mask) * width
            k = q[i]
            if k == key:
                return i, True
            if k == 0 and empty < 0:
                empty = i
        if empty < 0:
            empty = ((base + ((key >> 32) % WAYS)) & mask) * width
        return empty, False

    def get(self, h: int) -> tuple[int, ...]:
        i, found = self._find(_key(h))
        if not found:
            return ()
        q = self.q
        return tuple(x for x in q[i + 1:i + 1 + HOLDERS] if x)

    def put(self, h: int, holder: int) -> None:
        """`holder` (an id) was sent the prefix `h`: first among its holders."""
        key = _key(h)
        i, found = self._find(key)
        q = self.q
        if found and q[i + 1] == holder:
            return
        held = [x for x in q[i + 1:i + 1 + HOLDERS] if x and x != holder] if found else []
        ids = [holder, *held][:HOLDERS]
        ids += [0] * (HOLDERS - len(ids))
        q[i] = key
        q[i + 1:i + 1 + HOLDERS] = memoryview(struct.pack(f"{HOLDERS}q", *ids)).cast("q")

    def close(self) -> None:
        self.q.release()
        self.mm.close()


def shared_dir() -> Path | None:
    """The directory every worker of this gateway shares (None: one process, nothing to share)."""
    from openai_api.observability import MULTIPROC_ENV

    folder = os.environ.get(MULTIPROC_ENV)
    return Path(folder) if folder else None


def table_for(model: str, capacity: int) -> SharedTable | None:
    """Model `model`'s shared prefix table when running as one of several workers, else None."""
    folder = shared_dir()
    if folder is None:
        return None
    return SharedTable(folder / f"routing-{stable_id(model) & 0xFFFFFFFFFFFF:012x}.bin", capacity)
