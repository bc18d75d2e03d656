"""The application factory: config -> registry -> services -> routers, behind pure-ASGI middleware."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from openai_api import __version__, logs
from openai_api.config import GatewayConfig
from openai_api.http.anthropic import AnthropicErrorMiddleware
from openai_api.http.deps import AppState
from openai_api.http.fastpath import JSONRouteMiddleware
from openai_api.http.guard import GuardMiddleware
from openai_api.http.inflight import InFlightLimiter
from openai_api.http.keys import RATELIMIT_HEADERS, KeysMiddleware
from openai_api.http.lifecycle import Lifecycle
from openai_api.http.middleware import APIKeyMiddleware, RequestContextMiddleware
from openai_api.http.openapi import ERROR_RESPONSES, HEALTH_RESPONSES
from openai_api.http.responses import install_error_handlers
from openai_api.http.routers import (
    chat,
    completions,
    embeddings,
    health,
    keys,
    lora,
    messages,
    metrics,
    models,
    rerank,
    responses,
    tokenize,
)
from openai_api.observability import Metrics
from openai_api.quota.factory import build_store
from openai_api.quota.service import QuotaService
from openai_api.reload import ConfigReloader, PinGeneration, check_models, model_names
from openai_api.services.container import Services, build_services
from openai_api.settings import Settings
from openai_api.tracing import TracingMiddleware, build_tracing

logger = logging.getLogger(__name__)
# Routes served by `JSONRouteMiddleware` without FastAPI's per-request machinery: the ones a benchmark
# against Triton itself measures, where that machinery cost as much CPU as the gateway's own work.
HOT_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/rerank",
              "/v2/rerank", "/v1/ranking", "/embed", "/rerank")


def create_app(config: GatewayConfig, settings: Settings, *, cors_origins: list[str] | None = None) -> FastAPI:
    """The gateway as an ASGI app: its `AppState` (services, metrics, lifecycle, limiter) is
    `app.state.gateway`, reached by the routers through the typed dependencies in `http.deps`."""
    logs.install()  # however the app is served: control characters a client sent never reach a log line
    metrics_ = Metrics()
    svc = build_services(config, settings, metrics_)
    lifecycle = Lifecycle()
    limiter = InFlightLimiter(settings.max_in_flight, settings.max_in_flight_per_model, settings.retry_after_s,
                              models=model_names(svc), metrics=metrics_)
    # Keys (--keys-file, --api-key): who calls, and the per-key limits and counters (openai_api/quota/).
    store = build_store(settings.redis_url, settings.redis_fail_mode, settings.redis_timeout_s) \
        if settings.keys_file else None
    quota = QuotaService(settings.keys_file, settings.api_keys, metrics_, store)
    state = AppState(settings=settings, services=svc, metrics=metrics_, lifecycle=lifecycle, limiter=limiter,
                     quota=quota)

    def swapped(new: Services) -> None:  # a config reload (openai_api/reload.py): new requests get `new`
        state.services = new
        limiter.models = model_names(new)

    reloader = ConfigReloader(config, svc, settings, metrics_, on_swap=swapped,
                              also_on_sighup=(lambda: quota.reload("SIGHUP")) if settings.keys_file else None)
    state.reloader = reloader

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Check each model against Triton's own config now, so a mismatch is reported at start-up
        # rather than on the first request. Triton being down is not fatal: /health/ready says so.
        # Bounded: a hung (not dead) Triton must not keep the gateway from starting.
        await check_models(svc)
        await svc.start()
        await quota.start()
        await reloader.start()  # the replica prober; SIGHUP and the config file's poll (after the keys' handler)
        # Everything built so far (models, tokenizers, templates, routes) lives as long as the process: out of
        # the collector's sight, a full collection no longer walks it (it cost ~55-60 ms here, landing inside
        # whatever request triggered it).
        gc.freeze()
        yield
        await reloader.close()
        await quota.close()
        await reloader.services.close()  # the process-lifetime parts every generation shared
        if tracing is not None:
            await asyncio.to_thread(tracing.shutdown)  # the last batch of spans goes out

    app = FastAPI(title="OpenAI-compatible gateway for Triton", version=__version__, lifespan=lifespan)
    app.state.gateway = state
    install_error_handlers(app)
    api_routers = (chat.router, completions.router, responses.router, embeddings.router, rerank.router,
                   tokenize.router, models.router, messages.router, keys.router, lora.router)
    for r in api_routers:
        app.include_router(r, responses=ERROR_RESPONSES)  # no prefix: each route's path is its URL path
    app.include_router(health.router, responses=HEALTH_RESPONSES)
    app.include_router(metrics.router)
    # Added innermost first. Outermost: the request context (the request id, so even a 401 carries
    # one; metrics and the access log, so they see every status), CORS, API keys (before any body is
    # read), and the guard (draining, body size, in-flight limits, disconnect cancellation) right
    # outside the routes; inside it, the direct dispatch of the hot JSON routes.
    app.add_middleware(JSONRouteMiddleware, paths=HOT_ROUTES, routes=[rt for r in api_routers for rt in r.routes],
                       handlers=app.exception_handlers)
    app.add_middleware(PinGeneration, reloader=reloader)  # each request keeps the config it arrived under
    app.add_middleware(GuardMiddleware, max_body_bytes=settings.max_body_bytes, limiter=limiter,
                       lifecycle=lifecycle, metrics=metrics_, log_prompts=settings.log_prompts)
    if settings.keys_file is not None:  # the keys file's policies (and --api-key keys, unlimited)
        app.add_middleware(KeysMiddleware, quota=quota, open_paths=settings.open_paths)
    else:
        app.add_middleware(APIKeyMiddleware, keys=settings.api_keys, open_paths=settings.open_paths)
    app.add_middleware(AnthropicErrorMiddleware)  # outside every layer that answers with an error
    origins = [*settings.cors_origins, *(cors_origins or [])]
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["X-Request-Id", "Retry-After", *RATELIMIT_HEADERS])
    tracing = build_tracing(settings.otlp_traces_endpoint)
    if tracing is not None:  # the server span of each request (nothing at all is installed when tracing is off)
        app.add_middleware(TracingMiddleware, tracing=tracing)
    app.add_middleware(RequestContextMiddleware, metrics=metrics_, access_log=settings.access_log)
    return app
