"""The composition root: what lives as long as the gateway process, built once, started and closed in order, and
the one owner of SIGHUP.

Two lifetimes:
* **the process's**, built here once and never swapped: the metrics registry, tracing, the Triton client pool, the
  CPU workers with the prompt-token cache, image fetching and the Responses store (`services.container
  .ProcessParts`), the keys and quotas with their counter store, the drain state (`http.lifecycle`) and the
  in-flight limits (`http.inflight`);
* **a config's**, which a reload swaps: the model registry and the services over it (`services.container.Services`,
  one `reload.Generation` each), built over the same process parts. `ConfigReloader` holds the current one;
  `on_swap` listeners (the HTTP layer's state) hear of each swap, right after it, on the event loop.

SIGHUP has one handler, installed by `start()` where the event loop runs in the main thread (a real gateway
process; with `--workers` the supervisor passes its SIGHUP to each worker): it reloads the keys file
(`--keys-file`), then the model config, even when the file is unchanged (a template file it names may have
changed). Before `start()` (`cli`, `worker`) and after `close()` SIGHUP is ignored, never the default kill.

`start()`, in order: each model checked against Triton (bounded; a Triton that does not answer is a warning, as
`/health/ready` says), the Responses store opened (an unusable folder fails the start), the quota store and the
keys file's poll, the config reloader (replica probers, the config file's poll), SIGHUP. `close()` undoes it in
reverse, then sends the last batch of spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from openai_api.config import GatewayConfig
from openai_api.http.inflight import InFlightLimiter
from openai_api.http.lifecycle import Lifecycle
from openai_api.http.scheduler import Scheduler
from openai_api.observability import Metrics
from openai_api.quota.factory import build_store
from openai_api.quota.service import QuotaService
from openai_api.reload import ConfigReloader, check_models, model_names
from openai_api.services.container import ProcessParts, Services, build_services
from openai_api.services.status import StatusService
from openai_api.settings import Settings
from openai_api.tracing import Tracing, build_tracing


class GatewayProcess:
    """The process's objects (module docstring), built from the start-up config and the settings."""

    def __init__(self, config: GatewayConfig, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics(vllm_names=settings.vllm_metrics)
        self.tracing: Tracing | None = build_tracing(settings.otlp_traces_endpoint)
        self.parts = ProcessParts.from_settings(settings, self.metrics)
        services = build_services(config, settings, self.metrics, self.parts)
        self.lifecycle = Lifecycle()
        self.limiter = InFlightLimiter(settings.max_in_flight, settings.max_in_flight_per_model,
                                       settings.retry_after_s, models=model_names(services), metrics=self.metrics)
        self.limiter.scheduler = Scheduler(self.limiter, max_queue=settings.max_queue_per_model,
                                           timeout_s=settings.queue_timeout_s,
                                           shares={"standard": settings.standard_slot_share,
                                                   "batch": settings.batch_slot_share},
                                           adaptive={"floor": settings.batch_share_min,
                                                     "target": settings.batch_ttft_target,
                                                     "quantile": settings.batch_ttft_quantile}
                                           if settings.batch_share_adaptive else None,
                                           batch_prefills=settings.batch_prefills_per_model)
        # Keys (--keys-file, --api-key): who calls, and the per-key limits and counters (openai_api/quota/).
        store = build_store(settings.redis_url, settings.redis_fail_mode, settings.redis_timeout_s) \
            if settings.keys_file else None
        self.quota = QuotaService(settings.keys_file, settings.api_keys, self.metrics, store)
        self.reloader = ConfigReloader(config, services, settings, self.metrics, on_swap=self._swapped)
        self.metrics.catalog = lambda: self.services.registry.served()  # the vLLM view names what is served now
        # The status page's data (services/status.py): its sampler runs from start() to close().
        self.status = StatusService(self.metrics) if settings.status_page else None
        self._listeners: list[Callable[[Services], None]] = []
        self._sighup = False
        self._closed = False

    @property
    def services(self) -> Services:
        """The current config generation's services (new requests get these)."""
        return self.reloader.services

    def on_swap(self, listener: Callable[[Services], None]) -> None:
        """Call `listener(services)` after each config reload's swap, on the event loop."""
        self._listeners.append(listener)

    def _swapped(self, new: Services) -> None:
        self.limiter.models = model_names(new)
        for listener in self._listeners:
            listener(new)

    async def start(self) -> None:
        await check_models(self.services)
        await self.parts.start()
        await self.quota.start()
        await self.reloader.start()
        if self.status is not None:
            self.status.start()  # samples the request counter for the page's recent error rates
        if self.settings.keys_file is not None or self.reloader.path is not None:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                # Only where this loop runs in the main thread (a real gateway process; not a test's thread).
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.sighup)
                self._sighup = True

    def sighup(self) -> None:
        """SIGHUP: the keys file, then the model config, loaded again (each refused with one log line when bad)."""
        if self.settings.keys_file is not None:
            self.quota.reload("SIGHUP")
        self.reloader.reload_soon("SIGHUP")

    async def close(self) -> None:
        """Everything `start()` started, stopped in reverse, and the process parts closed (once; again: nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._sighup:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # removing it restored the default: a kill
            self._sighup = False
        if self.status is not None:
            await self.status.close()
        await self.reloader.close()
        await self.quota.close()
        await self.parts.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the last batch of spans goes out
