"""Which object store a process uses (`build_object_store`), from `--responses-store-url`: apart from the stores,
so that a process that keeps objects in memory never imports SQLite's or Redis's."""

from __future__ import annotations

from pathlib import Path

from openai_api.stored.base import MemoryObjectStore, ObjectStore

SCHEMES = ("memory", "sqlite", "redis", "rediss", "unix")


def store_kind(url: str | None) -> str:
    """`memory`, `sqlite` or `redis` for a store URL (None: memory); ValueError for anything else."""
    if not url or url == "memory" or url.startswith("memory:"):
        return "memory"
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        if not sqlite_folder(url).parts:
            raise ValueError(f"{url!r} names no folder: sqlite:///ABSOLUTE/DIR or sqlite:RELATIVE/DIR")
        return "sqlite"
    if scheme in ("redis", "rediss", "unix"):
        return "redis"
    raise ValueError(f"{url!r} is not a store URL: memory, sqlite:///DIR (a folder) or redis://HOST:PORT/DB")


def sqlite_folder(url: str) -> Path:
    """The folder of `sqlite:///abs/dir` (absolute) or `sqlite:rel/dir` (relative to the working directory)."""
    rest = url.split(":", 1)[1]
    if rest.startswith("//"):
        rest = rest[2:]  # sqlite:///abs -> /abs
    return Path(rest) if rest else Path()


def build_object_store(url: str | None, max_entries: int, max_bytes: int, ttl_s: float,
                       redis_timeout_s: float = 1.0) -> ObjectStore:
    kind = store_kind(url)
    if kind == "sqlite":
        from openai_api.stored.sqlite import SQLiteObjectStore

        assert url is not None
        return SQLiteObjectStore(sqlite_folder(url), max_entries, max_bytes, ttl_s)
    if kind == "redis":
        from openai_api.stored.redis import RedisObjectStore  # the client costs start-up time where unused

        assert url is not None
        return RedisObjectStore(url, max_entries, max_bytes, ttl_s, redis_timeout_s)
    return MemoryObjectStore(max_entries, max_bytes, ttl_s)
