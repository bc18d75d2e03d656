"""Every service of one gateway, built together from the model config and the settings."""

from __future__ import annotations

from dataclasses import dataclass

from openai_api.config import GatewayConfig
from openai_api.observability import Metrics
from openai_api.services.chat import ChatService
from openai_api.services.completions import CompletionsService
from openai_api.services.embeddings import EmbeddingsService
from openai_api.services.images import ImageService
from openai_api.services.messages import MessagesService
from openai_api.services.models import HealthService, ModelsService
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import ModelRegistry
from openai_api.services.rerank import RerankService
from openai_api.services.responses import ResponsesService
from openai_api.services.stored_responses import ResponseStore
from openai_api.services.tokenize import TokenizeService
from openai_api.settings import Settings
from openai_api.stored.factory import build_object_store
from openai_api.text.prompt_cache import PromptTokenCache
from openai_api.text.templates import RenderLimits
from openai_api.text.workers import CPUWorkers
from openai_api.triton.client import TritonClientPool


@dataclass
class Services:
    registry: ModelRegistry
    preprocess: Preprocessor
    chat: ChatService
    completions: CompletionsService
    embeddings: EmbeddingsService
    rerank: RerankService
    models: ModelsService
    health: HealthService
    responses: ResponsesService
    tokenize: TokenizeService
    messages: MessagesService

    async def start(self) -> None:
        """At the process's start: the Responses store opens (an unusable folder fails the start)."""
        if self.responses.store is not None:
            await self.responses.store.start()

    async def close(self) -> None:
        """At the process's end: the process-lifetime parts (CPU workers, image fetching, Triton clients, the
        Responses store)."""
        self.preprocess.workers.close()
        self.chat.images.close()
        await self.registry.pool.close()
        if self.responses.store is not None:
            await self.responses.store.close()


def build_services(config: GatewayConfig, settings: Settings, metrics: Metrics,
                   pool: TritonClientPool | None = None) -> Services:
    """The registry (each model's tokenizer, template and assembled Triton backend), the preprocessing
    workers, and one service per endpoint over them."""
    registry = ModelRegistry(config, pool or TritonClientPool(), metrics, settings.stream_idle_timeout_s)
    cache = PromptTokenCache(int(settings.prompt_cache_mb * 1024 * 1024)) if settings.prompt_cache_mb > 0 else None
    pre = Preprocessor(CPUWorkers(settings.cpu_workers),
                       RenderLimits(settings.template_timeout_s, settings.template_max_chars), cache)
    store = ResponseStore(build_object_store(
        settings.responses_store_url, settings.responses_store, settings.responses_store_max_bytes,
        settings.responses_store_ttl_s, settings.redis_timeout_s)) if settings.responses_store else None
    return _assemble(registry, pre, ImageService.from_settings(settings, metrics), store, settings)


def rebuild_services(old: Services, config: GatewayConfig, settings: Settings, metrics: Metrics) -> Services:
    """The services of a new config (a reload, `openai_api.reload`): a new registry over `old`'s process-lifetime
    parts, which it shares: the Triton client pool (its channels are reused), the CPU workers, image fetching
    and the Responses store. No event-loop work: it may run in a thread."""
    registry = ModelRegistry(config, old.registry.pool, metrics, settings.stream_idle_timeout_s, old.registry)
    return _assemble(registry, old.preprocess, old.chat.images, old.responses.store, settings)


def _assemble(registry: ModelRegistry, pre: Preprocessor, images: ImageService,
              store: ResponseStore | None, settings: Settings) -> Services:
    chat = ChatService(registry, pre, images)
    return Services(registry=registry, preprocess=pre, chat=chat, completions=CompletionsService(registry, pre),
                    embeddings=EmbeddingsService(registry, pre), rerank=RerankService(registry, pre),
                    models=ModelsService(registry), health=HealthService(registry),
                    responses=ResponsesService(chat, store), tokenize=TokenizeService(registry, pre, chat),
                    messages=MessagesService(chat, settings.keep_billing_header))
