"""The model config changed without a restart: SIGHUP, or the config file's content changed.

A config's services (the model registry: tokenizers, templates, parsers, backends, replica sets; and the
endpoint services over it) form one `Generation`. `ConfigReloader` holds the current one and, on SIGHUP or
when the watched file's content changes (its stat is polled every `RELOAD_POLL_S`, its SHA-256 compared,
so a touch that changes nothing is no reload), builds the next:

1. **Validated in full, off the event loop**: the file is parsed and checked as at start-up
   (`config.load_config`: fields, tokenizer folders, templates compiled, LoRA adapters read), then the
   registry is built from it. Any failure is one log line (`config not reloaded (...)`), the refusal is
   counted in `openai_api_config_reloads_total{result="refused"}`, and the old generation keeps serving.
2. **Checked against Triton** (each model's config read, as at start-up; bounded): a Triton that does not
   answer is a warning, not a refusal, exactly as at start-up.
3. **Swapped at once**, on the event loop with no await in between: new requests, `/v1/models` included,
   see the new generation; the in-flight limiter knows the new model names; runtime-loaded LoRA adapters
   whose base model stays are carried over.

A request is pinned to the generation that was current when it arrived (`PinGeneration`, a pure-ASGI
middleware right inside the guard: the FastAPI routes and the fast path both read the pinned services
through `http.deps.services`), and the generation counts them. A replaced generation is closed (its replica
prober stopped, Triton clients of addresses no live generation names closed) when its last request is
done, so a stream started before a reload finishes on the model, template, parser and replicas it started
with, even when its model was removed. Likewise, every `RELEASE_POLL_S`, the clients of replicas that
discovery retired are closed once their last request has ended and no live generation uses the address.

Process-lifetime things are not part of a generation and survive every swap (`openai_api.process` owns them):
the Triton client pool (the new registry reuses its channels), the CPU workers, image fetching, the Responses
store, the metrics, the keys and quotas, the admission limits. SIGHUP is the process's too: its handler there
asks for a reload here (`reload_soon`).

With `--workers N` the supervisor passes SIGHUP to every worker, and each worker watches the file itself;
a worker started after a change (a restart) loads the file as it is now, since its start-up config's digest
(`GatewayConfig.digest`) no longer matches. A Kubernetes ConfigMap mounted as a volume is updated in place
(an atomic symlink swap the poll sees), so a new config applies to running pods with no rollout.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from openai_api.config import ConfigError, GatewayConfig, load_config
from openai_api.errors import GatewayError
from openai_api.http.deps import SERVICES_KEY
from openai_api.lora import RUNTIME_STATE
from openai_api.observability import Metrics
from openai_api.services.container import Services, rebuild_services
from openai_api.services.lora import LoraService
from openai_api.settings import Settings
from openai_api.triton.replicas import ReplicaProber

logger = logging.getLogger("openai_api.reload")
RELOAD_POLL_S = 1.0
# How often the Triton clients of replicas that discovery retired, and whose last request ended, are released.
RELEASE_POLL_S = 5.0
# Each model's Triton config check (start-up and reload): long enough for a busy Triton, short enough to go on.
CHECK_TIMEOUT_S = 10.0


def file_digest(path: Path) -> str | None:
    """SHA-256 of the file's bytes; None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()  # follows symlinks: a ConfigMap's `..data` swap changes the target's inode
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def model_names(services: Services) -> set[str]:
    """The names the in-flight limiter counts per model: every LLM (adapters included) and encoder."""
    return {*services.registry.llms, *services.registry.encoders}


async def check_models(services: Services) -> None:
    """Read each model's config from Triton (bounded, concurrently): a mismatch or a Triton that does not
    answer is a warning, never fatal (`/health/ready` says so)."""
    reg = services.registry
    checks: list[tuple[str, str, Any]] = [(rt.name, rt.config.triton_name, rt.backend) for rt in reg.llms.values()]
    checks += [(e.name, e.config.triton_name, e.adapter) for e in reg.encoders.values()]

    async def one(name: str, triton_name: str, backend: Any) -> None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await backend.check()
            logger.info("model %s: Triton model %s checked", name, triton_name)
        except GatewayError as e:
            logger.warning("model %s: %s", name, e.message)
        except TimeoutError:
            logger.warning("model %s: Triton did not answer the config check in time", name)

    await asyncio.gather(*(one(*c) for c in checks))


class Generation:
    """One config's services, and the requests pinned to them. `close()` runs once the generation is
    retired (replaced) and its last request is done."""

    def __init__(self, number: int, config: GatewayConfig, services: Services) -> None:
        self.number = number
        self.config = config
        self.services = services
        self.active = 0
        self.retired = False
        self.closed = False
        self.prober = ReplicaProber(services.registry.pool, list(services.registry.replicas.values()))
        self.on_drained: Callable[[Generation], None] | None = None

    def start(self) -> None:
        self.prober.start()

    def acquire(self) -> None:
        self.active += 1

    def release(self) -> None:
        self.active -= 1
        if self.active == 0 and self.retired and self.on_drained is not None:
            self.on_drained(self)

    def retire(self) -> None:
        """No new request gets this generation; closed when the last one pinned to it is done."""
        self.retired = True
        if self.active == 0 and self.on_drained is not None:
            self.on_drained(self)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.prober.stop()

    def urls(self) -> set[str]:
        """The Triton addresses this generation may use: its config's, and every address its replica sets hold
        (discovered ones, and retired ones with requests in flight)."""
        found = {u for m in self.config.all_models() for u in m.urls}
        for s in self.services.registry.replicas.values():
            found |= s.addresses()
        return found


class ConfigReloader:
    """Holds the current `Generation` and replaces it when asked (`reload`, `reload_soon`: SIGHUP) or when the
    file changes (see the module docstring). `on_swap(services)` is called on the event loop right after each
    swap."""

    def __init__(self, config: GatewayConfig, services: Services, settings: Settings, metrics: Metrics, *,
                 on_swap: Callable[[Services], None] | None = None, poll_s: float = RELOAD_POLL_S) -> None:
        self.settings = settings
        self.metrics = metrics
        self.on_swap = on_swap
        self.poll_s = poll_s
        self.current = Generation(1, config, services)
        self.current.on_drained = self._drained
        self.retired: list[Generation] = []  # replaced, with requests still in flight
        # The file to watch: the one the config was loaded from, by the path given (not resolved: a ConfigMap
        # mounts it through symlinks that are swapped on update). None: a config built in code, never reloaded.
        self.path: Path | None = None
        if config.source is not None:
            given = Path(settings.config_file).absolute()
            self.path = given if given.resolve() == config.source else config.source
        self._stat = _stat(self.path) if self.path is not None else None
        self._adapter_stats: dict[Path, tuple[int, int, int]] = {}  # each persist_adapters record file, as last seen
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def services(self) -> Services:
        return self.current.services

    async def start(self) -> None:
        """Start the generation's background work and the file poll. A config loaded at start-up from a file that
        has changed since (a worker restarted after a reload) is reloaded now."""
        self.current.start()
        self._spawn(self._release_every(), "triton-client-release")
        if self.path is None:
            return
        if self.current.config.digest is not None and file_digest(self.path) != self.current.config.digest:
            await self.reload("file changed since start-up")
        self._spawn(self._poll(), "config-file-poll")

    def reload_soon(self, why: str) -> None:
        """Reload the file in the background, even when its content is unchanged (SIGHUP: a template file it
        names may have changed)."""
        if self.path is not None:
            self._spawn(self.reload(why, force=True), "config-reload")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poll(self) -> None:
        assert self.path is not None
        while True:
            await asyncio.sleep(self.poll_s)
            now = _stat(self.path)
            if now is not None and now != self._stat:
                await self.reload("file changed")
            await self._sync_adapters()

    async def _sync_adapters(self) -> None:
        """Runtime LoRA loads and unloads that another worker recorded (`persist_adapters`), applied in this
        process when a base model's record file changes (`LoraService.sync`; idempotent, so this process's own
        changes cost one read of the file)."""
        gen = self.current
        for m in gen.config.llm:
            if not m.persist_adapters or m.adapters_dir is None:
                continue
            path = Path(str(m.adapters_dir)) / RUNTIME_STATE
            now = _stat(path)
            if now is None or self._adapter_stats.get(path) == now:
                continue
            self._adapter_stats[path] = now
            try:
                await LoraService(gen.services.registry).sync(m)
            except Exception:  # a poll must go on: the next change of the file tries again
                logger.warning("runtime LoRA adapters of %s not synced from %s", m.name, path, exc_info=True)

    async def reload(self, why: str = "asked", *, force: bool = False) -> bool:
        """Load the watched file again and swap to it; False (the old config stays) when it is refused or
        unchanged. Without `force`, a file whose content is what the current config was loaded from is left."""
        if self.path is None:
            return False
        async with self._lock:
            path = self.path
            self._stat = _stat(path)  # before reading: a change while reading is seen by the next poll
            digest = file_digest(path)
            if not force and digest is not None and digest == self.current.config.digest:
                return False
            old = self.current
            try:
                config, services = await asyncio.to_thread(self._build, path, old)
            except ConfigError as e:
                return self._refused(why, str(e))
            except Exception as e:  # a tokenizer, template or adapter that loads but cannot serve
                logger.debug("config reload failed", exc_info=True)
                return self._refused(why, f"{type(e).__name__}: {e}")
            await check_models(services)
            self._swap(Generation(old.number + 1, config, services), old)
            return True

    def _build(self, path: Path, old: Generation) -> tuple[GatewayConfig, Services]:
        """The new config and its services (in a thread: tokenizers and templates load here)."""
        config = load_config(path)
        endpoint = old.config.triton_endpoint
        if endpoint is not None:  # the embedded Triton: every model stays pointed at it
            config.with_triton_endpoint(*endpoint)
        return config, rebuild_services(old.services, config, self.settings, self.metrics)

    def _refused(self, why: str, error: str) -> bool:
        logger.error("config not reloaded (%s), the previous config stays: %s", why, error)
        self.metrics.config_reloads.labels("refused").inc()
        return False

    def _swap(self, new: Generation, old: Generation) -> None:
        """Make `new` current (no await from here to the end: atomic for the event loop)."""
        carried = new.services.registry.carry_adapters(old.services.registry, old.config)
        new.on_drained = self._drained
        self.current = new
        new.start()
        if self.on_swap is not None:
            self.on_swap(new.services)
        self.retired.append(old)
        old.retire()
        self.metrics.config_reloads.labels("ok").inc()
        before = {m.name for m in old.config.all_models()}
        after = {m.name for m in new.config.all_models()}
        changed = sum(1 for m in new.config.all_models() if m.name in before and _entry(old.config, m.name) != m)
        logger.info("config reloaded: generation %d, %d models (%d added, %d removed, %d changed%s); %d requests "
                    "in flight finish on generation %d", new.number, len(after), len(after - before),
                    len(before - after), changed, f", {carried} runtime adapters kept" if carried else "",
                    old.active, old.number)

    async def _release_every(self) -> None:
        while True:
            await asyncio.sleep(RELEASE_POLL_S)
            await self.release_retired()

    async def release_retired(self) -> None:
        """Close the Triton clients (gRPC channels, HTTP sessions) of replicas that discovery retired once their
        last request has ended and no live generation uses their address: in a fleet whose pods come and go,
        each retired pod's address would otherwise keep its clients for the life of the process."""
        gens = (self.current, *self.retired)
        drained: set[str] = set()
        for g in gens:
            for s in g.services.registry.replicas.values():
                drained |= s.drained()
        if drained:
            live = set().union(*(g.urls() for g in gens))
            if gone := drained - live:
                logger.info("Triton clients of retired replicas closed: %s", ", ".join(sorted(gone)))
                await self.current.services.registry.pool.close_urls(gone)

    def _drained(self, gen: Generation) -> None:
        if gen is self.current or gen.closed:
            return
        self._spawn(self._close(gen), f"config-generation-{gen.number}-close")

    async def _close(self, gen: Generation) -> None:
        await gen.close()
        if gen in self.retired:
            self.retired.remove(gen)
        # Triton clients of addresses only the closed generation named (a removed replica): closed. Addresses a
        # live generation names, or that no config names (found by discovery), are left.
        live = set().union(*(g.urls() for g in (self.current, *self.retired)))
        gone = gen.urls() - live
        if gone:
            await self.current.services.registry.pool.close_urls(gone)
        logger.info("config generation %d closed: its last request is done", gen.number)

    async def close(self) -> None:
        """Stop the poll and every generation's background work."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for gen in (*self.retired, self.current):
            await gen.close()


def _entry(config: GatewayConfig, name: str) -> Any:
    return next((m for m in config.all_models() if m.name == name), None)


class PinGeneration:
    """Pins each HTTP request to the generation current when it arrives (its services in
    `scope["state"][SERVICES_KEY]`, read by `http.deps.services`), counted until the response is done."""

    def __init__(self, app: ASGIApp, *, reloader: ConfigReloader) -> None:
        self.app = app
        self.reloader = reloader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gen = self.reloader.current
        gen.acquire()
        scope.setdefault("state", {})[SERVICES_KEY] = gen.services
        try:
            await self.app(scope, receive, send)
        finally:
            gen.release()
