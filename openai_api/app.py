"""The application factory: config -> registry -> services -> routers, behind pure-ASGI middleware."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from openai_api import __version__
from openai_api.config import GatewayConfig
from openai_api.errors import GatewayError
from openai_api.http.middleware import APIKeyMiddleware, RequestIdMiddleware
from openai_api.http.responses import install_error_handlers
from openai_api.http.routers import chat, embeddings, health, models, rerank
from openai_api.services.chat import ChatService
from openai_api.services.embeddings import EmbeddingsService
from openai_api.services.models import HealthService, ModelsService
from openai_api.services.registry import ModelRegistry
from openai_api.services.rerank import RerankService
from openai_api.settings import Settings
from openai_api.triton.client import TritonClientPool

logger = logging.getLogger(__name__)


@dataclass
class Services:
    registry: ModelRegistry
    chat: ChatService
    models: ModelsService
    health: HealthService
    embeddings: EmbeddingsService
    rerank: RerankService


def build_services(config: GatewayConfig, pool: TritonClientPool) -> Services:
    registry = ModelRegistry(config, pool)
    return Services(registry=registry, chat=ChatService(registry), models=ModelsService(registry),
                    health=HealthService(registry), embeddings=EmbeddingsService(registry),
                    rerank=RerankService(registry))


def create_app(config: GatewayConfig, settings: Settings, *, cors_origins: list[str] | None = None) -> FastAPI:
    pool = TritonClientPool()
    svc = build_services(config, pool)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Check each model against Triton's own config now, so a mismatch is reported at start-up
        # rather than on the first request. Triton being down is not fatal: /health/ready says so.
        for rt in svc.registry.llms.values():
            try:
                await rt.backend.check()
                logger.info("model %s: Triton model %s checked", rt.name, rt.config.triton_name)
            except GatewayError as e:
                logger.warning("model %s: %s", rt.name, e.message)
        for enc in svc.registry.encoders.values():
            try:
                await enc.adapter.check()
                logger.info("model %s: Triton model %s checked", enc.name, enc.config.triton_name)
            except GatewayError as e:
                logger.warning("model %s: %s", enc.name, e.message)
        yield
        await pool.close()

    app = FastAPI(title="OpenAI-compatible gateway for Triton", version=__version__, lifespan=lifespan)
    app.state.services = svc
    install_error_handlers(app)
    for r in (chat.router, embeddings.router, rerank.router, models.router, health.router):
        app.include_router(r)
    # Outermost last: request id wraps everything so even a 401 carries one.
    app.add_middleware(APIKeyMiddleware, keys=settings.api_keys, open_paths=settings.open_paths)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(RequestIdMiddleware)
    return app
