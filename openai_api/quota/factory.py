"""Which counter store a process uses (`build_store`): apart from the stores themselves, so that the
store protocol does not import its Redis and shared-memory implementations (which import it)."""

from __future__ import annotations

import os

from openai_api.quota.shared import SOCKET_ENV, SharedStore
from openai_api.quota.store import MemoryStore, Store


def build_store(redis_url: str | None, fail_mode: str, redis_timeout_s: float = 1.0) -> Store:
    """The store this process uses: Redis when given, else the supervisor's (a worker of `--workers N`:
    its socket is in the environment), else this process's memory."""
    if redis_url:
        # imported here: the redis client costs start-up time in every gateway that does not use it
        from openai_api.quota.redis_store import RedisStore

        return RedisStore(redis_url, fail_mode, timeout_s=redis_timeout_s)
    path = os.environ.get(SOCKET_ENV)
    return SharedStore(path) if path else MemoryStore()
