"""The application factory: the process's objects (`process.GatewayProcess`) -> routers, behind pure-ASGI middleware."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from openai_api import __version__, logs
from openai_api.config import GatewayConfig
from openai_api.http.batch_runner import BatchRunner
from openai_api.http.deps import AppState
from openai_api.http.docs import install_docs
from openai_api.http.fastpath import JSONRouteMiddleware
from openai_api.http.guard import GuardMiddleware
from openai_api.http.keys import RATELIMIT_HEADERS, KeysMiddleware
from openai_api.http.middleware import APIKeyMiddleware, RequestContextMiddleware
from openai_api.http.openapi import ERROR_RESPONSES, HEALTH_RESPONSES
from openai_api.http.responses import install_error_handlers
from openai_api.http.routers import (
    batches,
    chat,
    completions,
    embeddings,
    files,
    health,
    keys,
    lora,
    message_batches,
    messages,
    metrics,
    models,
    rerank,
    responses,
    status,
    tokenize,
)
from openai_api.process import GatewayProcess
from openai_api.reload import PinGeneration
from openai_api.services.batches import BatchService
from openai_api.services.container import Services
from openai_api.settings import Settings
from openai_api.tracing import TracingMiddleware

logger = logging.getLogger(__name__)
# Routes served by `JSONRouteMiddleware` without FastAPI's per-request machinery: the ones a benchmark
# against Triton itself measures, where that machinery cost as much CPU as the gateway's own work, and
# Anthropic's Messages, whose coding-agent bodies (~500 KB at 117k tokens) FastAPI parsed with the stdlib's
# json.loads before validating them, a few ms per agent turn that grew with the conversation.
HOT_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/rerank",
              "/v2/rerank", "/v1/ranking", "/embed", "/rerank", "/v1/messages", "/v1/messages/count_tokens")


def create_app(config: GatewayConfig, settings: Settings, *, cors_origins: list[str] | None = None) -> FastAPI:
    """The gateway as an ASGI app over one `GatewayProcess` (the composition root: what lives as long as the
    process, and SIGHUP), started and closed by the app's lifespan. Its `AppState` (services, metrics, lifecycle,
    limiter, quotas) is `app.state.gateway`, reached by the routers through the typed dependencies in `http.deps`."""
    logs.install()  # however the app is served: control characters a client sent never reach a log line
    process = GatewayProcess(config, settings)
    state = AppState(settings=settings, services=process.services, metrics=process.metrics,
                     lifecycle=process.lifecycle, limiter=process.limiter, quota=process.quota,
                     reloader=process.reloader, status=process.status, process=process)
    # The Batch API (/v1/files, /v1/batches, /v1/messages/batches); the runner is made below, over the whole app.
    state.batches = batch_service = BatchService.from_settings(settings)

    def swapped(new: Services) -> None:  # a config reload (openai_api/reload.py): new requests get `new`
        state.services = new

    process.on_swap(swapped)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await process.start()
        await runner.start()
        # Everything built so far (models, tokenizers, templates, routes) lives as long as the process: out of
        # the collector's sight, a full collection no longer walks it (it cost ~55-60 ms here, landing inside
        # whatever request triggered it).
        gc.freeze()
        yield
        await runner.close()
        await batch_service.store.close()
        await process.close()

    # Swagger UI and ReDoc with their assets served here (http/docs.py): FastAPI's own pages load them from a CDN.
    app = FastAPI(title="OpenAI-compatible gateway for Triton", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.gateway = state
    if settings.docs:
        install_docs(app)
    install_error_handlers(app)
    api_routers = (chat.router, completions.router, responses.router, embeddings.router, rerank.router,
                   tokenize.router, models.router, messages.router, keys.router, lora.router, files.router,
                   batches.router, message_batches.router)
    for r in api_routers:
        app.include_router(r, responses=ERROR_RESPONSES)  # no prefix: each route's path is its URL path
    app.include_router(health.router, responses=HEALTH_RESPONSES)
    app.include_router(metrics.router)
    if settings.status_page:
        app.include_router(status.router)
    # Added innermost first. Outermost: the request context (the request id, so even a 401 carries
    # one; metrics and the access log, so they see every status), CORS, API keys (before any body is
    # read), and the guard (draining, body size, in-flight limits, disconnect cancellation) right
    # outside the routes; inside it, the direct dispatch of the hot JSON routes.
    app.add_middleware(JSONRouteMiddleware, paths=HOT_ROUTES, routes=[rt for r in api_routers for rt in r.routes],
                       handlers=app.exception_handlers)
    app.add_middleware(PinGeneration, reloader=process.reloader)  # each request keeps the config it arrived under
    app.add_middleware(GuardMiddleware, max_body_bytes=settings.max_body_bytes, limiter=process.limiter,
                       lifecycle=process.lifecycle, metrics=process.metrics, log_prompts=settings.log_prompts)
    if settings.keys_file is not None:  # the keys file's policies (and --api-key keys, unlimited)
        app.add_middleware(KeysMiddleware, quota=process.quota, open_paths=settings.open_paths)
    else:
        app.add_middleware(APIKeyMiddleware, keys=settings.api_keys, open_paths=settings.open_paths)
    origins = [*settings.cors_origins, *(cors_origins or [])]
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["X-Request-Id", "Retry-After", *RATELIMIT_HEADERS])
    if process.tracing is not None:  # the server span of each request (nothing at all is installed when tracing is off)
        app.add_middleware(TracingMiddleware, tracing=process.tracing)
    app.add_middleware(RequestContextMiddleware, metrics=process.metrics, access_log=settings.access_log)
    # Batch lines run through this whole app (every middleware above), as the key that made their job.
    runner = BatchRunner(app, batch_service, process.quota, settings.batch_concurrency, settings.batch_running_jobs)
    return app
