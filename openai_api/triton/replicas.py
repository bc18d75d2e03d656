"""Several Triton replicas behind one model: least-outstanding balancing, failover and probing.

A model's `url` may be a list. Each replica gets its own adapter (same protocol, another address);
`ReplicatedLLMBackend` and `ReplicatedEncoder` choose one per request:
- the healthy replica with the fewest requests in flight (ties go round-robin);
- a replica is marked down after `fail_threshold` consecutive connection failures, and a background
  probe (`/v2/health/ready` over its transport) brings it back;
- a request that failed with "unavailable" before anything was sent to the client is retried on
  another replica; once a stream has produced its first chunk it is never retried (the client
  would see text twice).
With one URL none of this costs anything: the single adapter is used directly.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from openai_api.errors import BackendUnavailableError
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderBackend
from openai_api.triton.health import server_ready
from openai_api.triton.llm import GenerationChunk, GenerationRequest, GuideKind, LLMBackend

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Replica(Generic[T]):
    url: str
    adapter: T
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0
    requests: int = 0
    down_since: float | None = None

    def state(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "outstanding": self.outstanding,
                "requests": self.requests, "consecutive_failures": self.failures}


@dataclass
class ReplicaSet(Generic[T]):
    model: str
    transport: str
    replicas: list[Replica[T]]
    fail_threshold: int = 1
    _rr: itertools.count[int] = field(default_factory=itertools.count)

    def order(self) -> list[Replica[T]]:
        """Replicas to try, best first: healthy by fewest in flight (round-robin among equals), then
        the down ones (a last resort, which also notices a recovery before the probe does)."""
        turn = next(self._rr)
        n = len(self.replicas)
        rotated = [self.replicas[(turn + i) % n] for i in range(n)]
        healthy = sorted((r for r in rotated if r.healthy), key=lambda r: r.outstanding)
        down = sorted((r for r in rotated if not r.healthy), key=lambda r: r.down_since or 0)
        return healthy + down

    def succeeded(self, r: Replica[T]) -> None:
        r.failures = 0
        if not r.healthy:
            logger.info("model %s: replica %s is back", self.model, r.url)
        r.healthy, r.down_since = True, None

    def failed(self, r: Replica[T]) -> None:
        r.failures += 1
        if r.healthy and r.failures >= self.fail_threshold:
            logger.warning("model %s: replica %s marked down", self.model, r.url)
            r.healthy, r.down_since = False, time.monotonic()

    async def probe(self, pool: TritonClientPool) -> None:
        for r in self.replicas:
            if not r.healthy and await server_ready(pool, self.transport, r.url):
                self.succeeded(r)

    def states(self) -> list[dict[str, Any]]:
        return [r.state() for r in self.replicas]


class ReplicatedLLMBackend:
    """An `LLMBackend` over several replicas of the same Triton model."""

    def __init__(self, model: str, transport: str, adapters: Sequence[tuple[str, LLMBackend]]) -> None:
        self.model = model
        self.set: ReplicaSet[LLMBackend] = ReplicaSet(model, transport, [Replica(u, a) for u, a in adapters])

    @property
    def protocol(self) -> str:
        return self.set.replicas[0].adapter.protocol

    @property
    def guide_kinds(self) -> frozenset[GuideKind] | None:
        return self.set.replicas[0].adapter.guide_kinds

    def supports(self, param: str) -> bool:
        return self.set.replicas[0].adapter.supports(param)

    async def check(self) -> None:
        errors = []
        for r in self.set.replicas:
            try:
                await r.adapter.check()
                self.set.succeeded(r)
            except BackendUnavailableError as e:
                self.set.failed(r)
                errors.append(e)
        if len(errors) == len(self.set.replicas):
            raise errors[0]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        last: BackendUnavailableError | None = None
        for r in self.set.order():
            r.outstanding += 1
            r.requests += 1
            sent = False
            try:
                async for chunk in r.adapter.generate(request):
                    if not sent:
                        sent = True
                        self.set.succeeded(r)
                    yield chunk
                if not sent:
                    self.set.succeeded(r)
                return
            except BackendUnavailableError as e:
                self.set.failed(r)
                if sent:
                    raise  # the client already has part of this answer: never resend it elsewhere
                last = e
                logger.info("model %s: replica %s unavailable, trying another", self.model, r.url)
            finally:
                r.outstanding -= 1
        raise last or BackendUnavailableError(f"No replica of model {self.model!r} is available.")


class ReplicatedEncoder:
    """An `EncoderBackend` over several replicas; every call is retried elsewhere on "unavailable"."""

    def __init__(self, model: str, transport: str, adapters: Sequence[tuple[str, EncoderBackend]]) -> None:
        self.model = model
        self.set: ReplicaSet[EncoderBackend] = ReplicaSet(model, transport, [Replica(u, a) for u, a in adapters])

    @property
    def max_batch_size(self) -> int | None:
        return self.set.replicas[0].adapter.max_batch_size

    async def check(self) -> None:
        await self._call(lambda a: a.check())

    async def infer(self, features: Any) -> Any:
        return await self._call(lambda a: a.infer(features))

    async def _call(self, fn: Callable[[Any], Any]) -> Any:
        last: BackendUnavailableError | None = None
        for r in self.set.order():
            r.outstanding += 1
            r.requests += 1
            try:
                result = await fn(r.adapter)
                self.set.succeeded(r)
                return result
            except BackendUnavailableError as e:
                self.set.failed(r)
                last = e
            finally:
                r.outstanding -= 1
        raise last or BackendUnavailableError(f"No replica of model {self.model!r} is available.")


class ReplicaProber:
    """Background task: every `interval_s`, probe the replicas that are marked down."""

    def __init__(self, pool: TritonClientPool, sets: list[ReplicaSet[Any]], interval_s: float = 2.0) -> None:
        self.pool, self.sets, self.interval_s = pool, sets, interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.sets and self._task is None:
            self._task = asyncio.create_task(self._run(), name="replica-prober")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for s in self.sets:
                try:
                    await s.probe(self.pool)
                except Exception:
                    logger.debug("replica probe failed", exc_info=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
