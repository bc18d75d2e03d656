"""Several Triton replicas behind one model: routing, failover, probing, discovery and load scraping.

A model's `url` may be a list, and any entry may be `dns:///host:port` (every address of `host`;
`discovery`). Each replica gets its own adapter (same protocol, another address);
`ReplicatedLLMBackend` and `ReplicatedEncoder` choose one per request:
- the healthy replicas in the order of the model's routing policy (`routing`: least outstanding by
  default, round robin, least load, prefix affinity), the ones marked down last;
- a replica is marked down after `fail_threshold` consecutive connection failures, and a background
  probe (`/v2/health/ready` over its transport) brings it back;
- a request that failed with "unavailable" before anything was sent to the client is retried on
  the next replica; once a stream has produced its first chunk it is never retried (the client
  would see text twice);
- replicas found by discovery join after Triton says the model is ready there, and a replica whose
  address vanished leaves the set: new requests no longer see it, those in flight on it hold their
  `Replica` and finish there (nothing is cancelled; if the pod is really gone they fail as they would
  have anyway).
With one static URL none of this costs anything: the single adapter is used directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from openai_api.config import DNS_SCHEME, DiscoveryConfig, RoutingConfig
from openai_api.errors import AdapterCacheFullError, BackendUnavailableError
from openai_api.observability import Metrics
from openai_api.tracing import child_span
from openai_api.triton import discovery, loadscrape
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderBackend
from openai_api.triton.health import server_ready
from openai_api.triton.llm import GenerationChunk, GenerationRequest, GuideKind, LLMBackend
from openai_api.triton.loadscrape import TritonLoad
from openai_api.triton.routing import RoutingPolicy, make_policy
from openai_api.triton.sharedmap import table_for

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Scraped figures older than this many scrape intervals are ignored (the replica stopped answering them).
STALE_AFTER = 3.0


@dataclass(eq=False)
class Replica(Generic[T]):
    url: str
    adapter: T
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0
    requests: int = 0
    down_since: float | None = None
    # The dns:/// url this replica was found under (None: listed in the config, never retired).
    source: str | None = None
    # Triton's figures from the last scrape, when it was taken, and this process's in-flight count then.
    triton: TritonLoad | None = None
    scraped_at: float = 0.0
    outstanding_at_scrape: int = 0
    kv_weight: float = 0.0
    max_age_s: float = 0.0

    def load(self) -> float:
        """Requests in flight on the replica, as best known, plus KV pressure: Triton's own count from the
        last scrape corrected by what this process started or finished since (never less than this
        process's own count, which Triton's pending count may leave out), + `kv_weight` x KV fill."""
        own = self.outstanding
        t = self.triton
        if t is None or time.monotonic() - self.scraped_at > self.max_age_s:
            return float(own)
        return max(float(own), t.in_flight + own - self.outstanding_at_scrape) + self.kv_weight * (t.kv_fraction or 0.0)

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "healthy": self.healthy, "outstanding": self.outstanding,
                               "requests": self.requests, "consecutive_failures": self.failures}
        if self.triton is not None:
            out["load"] = round(self.load(), 3)
            out["triton_in_flight"] = self.triton.in_flight
            if self.triton.kv_fraction is not None:
                out["kv_cache_fraction"] = self.triton.kv_fraction
        return out


@dataclass
class ReplicaSet(Generic[T]):
    model: str
    transport: str
    replicas: list[Replica[T]]
    fail_threshold: int = 1
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    # The configured urls (static and dns:///), a new replica's adapter, and "is the model ready at url".
    sources: list[str] = field(default_factory=list)
    factory: Callable[[str], T] | None = None
    ready: Callable[[str], Awaitable[bool]] | None = None
    metrics: Metrics | None = None
    last_reason: str = ""  # the last `order`'s reason (the routing-decision metric's label, a traced span's)
    policy: RoutingPolicy = field(init=False)
    _refresh_lock: asyncio.Lock | None = field(default=None, init=False)
    # Replicas discovery retired, until `drained` reports them (requests may still run there).
    _retired: list[Replica[T]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        shared = table_for(self.model, self.routing.max_blocks) if self.routing.policy == "prefix_affinity" else None
        self.policy = make_policy(self.routing, shared)
        for r in self.replicas:
            self._configure(r)

    def _configure(self, r: Replica[T]) -> None:
        r.kv_weight = self.routing.kv_weight
        r.max_age_s = STALE_AFTER * self.routing.scrape_interval_s

    @property
    def discovered(self) -> bool:
        return any(u.startswith(DNS_SCHEME) for u in self.sources)

    def order(self, request: GenerationRequest | None = None) -> list[Replica[T]]:
        """Replicas to try, best first: the healthy ones in the policy's order, then the down ones (a last
        resort, which also notices a recovery before the probe does)."""
        replicas = self.replicas
        healthy = [r for r in replicas if r.healthy]
        down = sorted((r for r in replicas if not r.healthy), key=lambda r: r.down_since or 0)
        if not healthy:
            self._decided("all_down")
            return down
        ordered, reason = self.policy.order(healthy, request)
        self._decided(reason)
        return ordered + down

    def _decided(self, reason: str) -> None:
        self.last_reason = reason  # read at once by the caller of `order` (no await in between)
        if self.metrics is not None:
            self.metrics.routing_decisions.labels(self.model, self.routing.policy, reason).inc()

    def routed(self, r: Replica[T], request: GenerationRequest | None) -> None:
        self.policy.routed(r, request)

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

    async def refresh(self) -> None:
        """Re-resolve the dns:/// sources: add each new address once the model is ready there, drop the
        replicas whose address is gone (see the module docstring for those in flight)."""
        if self.factory is None or not self.discovered:
            return
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            wanted: dict[str, str | None] = {}
            for src in self.sources:
                if not src.startswith(DNS_SCHEME):
                    wanted.setdefault(src, None)
                    continue
                found = await discovery.resolve(src, self.discovery.resolve_timeout_s)
                if found is None:  # resolution failed: keep what this name had
                    found = [r.url for r in self.replicas if r.source == src]
                for u in found:
                    wanted.setdefault(u, src)
            current = {r.url for r in self.replicas}
            new = [u for u in wanted if u not in current]
            ok: list[bool] = []
            if new and self.ready is not None:
                ok = list(await asyncio.gather(*(self._ready(u) for u in new)))
            elif new:
                ok = [True] * len(new)
            added = [Replica(u, self.factory(u), source=wanted[u]) for u, good in zip(new, ok, strict=True) if good]
            for r in added:
                self._configure(r)
            gone = [r for r in self.replicas if r.url not in wanted]
            if not added and not gone:
                return
            # One assignment: a request ordering replicas now sees the old list or the new one, never a mix.
            self.replicas = [r for r in self.replicas if r.url in wanted] + added
            for r in added:
                logger.info("model %s: replica %s added (%s)", self.model, r.url, r.source)
            self._retired += gone
            for r in gone:
                self.policy.forget(r.url)
                if self.metrics is not None:
                    self.metrics.forget_replica(self.model, r.url)
                logger.info("model %s: replica %s retired (%d in flight finish there)", self.model, r.url,
                            r.outstanding)

    def addresses(self) -> set[str]:
        """Every replica address this set may still send to or hear from: its replicas', and those of the
        retired replicas `drained` has not reported yet."""
        return {r.url for r in self.replicas} | {r.url for r in self._retired}

    def drained(self) -> set[str]:
        """The addresses of retired replicas whose last request has ended, each reported once (their Triton
        clients may be closed when nothing else uses the address: `ConfigReloader`)."""
        done = {r.url for r in self._retired if r.outstanding == 0}
        if done:
            self._retired = [r for r in self._retired if r.outstanding > 0]
        return done

    async def _ready(self, url: str) -> bool:
        assert self.ready is not None
        try:
            async with asyncio.timeout(self.discovery.ready_timeout_s):
                return await self.ready(url)
        except (TimeoutError, BackendUnavailableError):
            return False

    async def scrape(self, client: httpx.AsyncClient) -> None:
        """Read every replica's load from its Triton metrics port (`routing.metrics_port`), concurrently."""
        replicas = list(self.replicas)
        scraped = [(r, port) for r in replicas if (port := self.routing.metrics_port_of(r.url)) is not None]
        if scraped:
            loads = await asyncio.gather(*(loadscrape.scrape(client, loadscrape.metrics_url(r.url, port),
                                                             self.routing.scrape_timeout_s) for r, port in scraped))
            now = time.monotonic()
            for (r, _), load in zip(scraped, loads, strict=True):
                if load is not None:
                    r.triton, r.scraped_at, r.outstanding_at_scrape = load, now, r.outstanding
        if self.metrics is not None:
            for r in replicas:
                self.metrics.replica_load(self.model, r.url, r.load(), r.outstanding,
                                          None if r.triton is None else r.triton.in_flight,
                                          None if r.triton is None else r.triton.kv_fraction)

    def states(self) -> list[dict[str, Any]]:
        return [r.state() for r in self.replicas]


class _Replicated(Generic[T]):
    def __init__(self, model: str, transport: str, adapters: Sequence[tuple[str, T]], **options: Any) -> None:
        self.model = model
        self.set: ReplicaSet[T] = ReplicaSet(model, transport, [Replica(u, a) for u, a in adapters], **options)
        self._exemplar: T | None = adapters[0][1] if adapters else None

    def exemplar(self) -> T:
        """An adapter to answer the model's static questions (protocol, batch size): a current replica's,
        else the last one seen, else one made for the first source (never sent traffic)."""
        if self.set.replicas:
            self._exemplar = self.set.replicas[0].adapter
        if self._exemplar is None:
            assert self.set.factory is not None
            self._exemplar = self.set.factory(self.set.sources[0])
        return self._exemplar

    async def _discover(self) -> None:
        if not self.set.replicas:
            await self.set.refresh()
        if not self.set.replicas:
            raise BackendUnavailableError(f"No replica of model {self.model!r} is available (none found at "
                                          f"{', '.join(self.set.sources)}).")

    def _none_left(self) -> BackendUnavailableError:
        return BackendUnavailableError(f"No replica of model {self.model!r} is available.")


class ReplicatedLLMBackend(_Replicated[LLMBackend]):
    """An `LLMBackend` over several replicas of the same Triton model."""

    @property
    def protocol(self) -> str:
        return self.exemplar().protocol

    @property
    def guide_kinds(self) -> frozenset[GuideKind] | None:
        return self.exemplar().guide_kinds

    def supports(self, param: str) -> bool:
        return self.exemplar().supports(param)

    async def check(self) -> None:
        await self._discover()
        errors = []
        replicas = list(self.set.replicas)
        for r in replicas:
            try:
                await r.adapter.check()
                self.set.succeeded(r)
            except BackendUnavailableError as e:
                self.set.failed(r)
                errors.append(e)
        if len(errors) == len(replicas):
            raise errors[0]

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """The first replica in the policy's order that answers. Before the first chunk, an unavailable replica
        (marked down) or one whose LoRA adapter cache is full (not its fault: left as it is) hands the request
        to the next; after it, the error is the client's, since part of the answer is already out."""
        last: BackendUnavailableError | AdapterCacheFullError | None = None
        with child_span("routing", **{"gen_ai.request.model": self.model,
                                      "openai_api.routing.policy": self.set.routing.policy}) as span:
            order = self.set.order(request)
            if span is not None:  # traced requests only
                span.set_attributes({"openai_api.routing.reason": self.set.last_reason,
                                     "openai_api.routing.replica": order[0].url if order else ""})
        for r in order:
            self.set.routed(r, request)
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
            except AdapterCacheFullError as e:
                if sent:
                    raise
                last = e
                logger.info("model %s: replica %s has no room for adapter %s, trying another", self.model, r.url,
                            request.lora.name if request.lora is not None else "?")
            finally:
                r.outstanding -= 1
        raise last or self._none_left()


class ReplicatedEncoder(_Replicated[EncoderBackend]):
    """An `EncoderBackend` over several replicas; every call is retried elsewhere on "unavailable"."""

    @property
    def max_batch_size(self) -> int | None:
        return self.exemplar().max_batch_size

    async def check(self) -> None:
        await self._discover()
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
        raise last or self._none_left()


class ReplicaProber:
    """Background tasks of the replica sets: every `interval_s` probe the replicas marked down; every
    `routing.scrape_interval_s` scrape the load of the sets that have a `metrics_port` (and refresh the
    per-replica gauges of all); every `discovery.interval_s` re-resolve the sets with dns:/// urls."""

    def __init__(self, pool: TritonClientPool, sets: list[ReplicaSet[Any]], interval_s: float = 2.0) -> None:
        self.pool, self.sets, self.interval_s = pool, sets, interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None

    def start(self) -> None:
        if not self.sets or self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._every(self.interval_s, self._probe), name="replica-prober"))
        self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=64), trust_env=False)
        for s in self.sets:
            self._tasks.append(asyncio.create_task(self._every(s.routing.scrape_interval_s, self._scraper(s)),
                                                   name=f"replica-load-{s.model}"))
            if s.discovered:
                self._tasks.append(asyncio.create_task(self._every(s.discovery.interval_s, s.refresh),
                                                       name=f"replica-discovery-{s.model}"))

    def _scraper(self, s: ReplicaSet[Any]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            assert self._http is not None
            await s.scrape(self._http)
        return run

    async def _probe(self) -> None:
        for s in self.sets:
            await s.probe(self.pool)

    @staticmethod
    async def _every(interval_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await fn()
            except Exception:
                logger.debug("replica background task failed", exc_info=True)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.aclose()
            self._http = None
