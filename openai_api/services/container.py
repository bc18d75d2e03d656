"""The services of one config generation, over the process-lifetime parts every generation shares.

Two lifetimes (`openai_api.process` owns both): `ProcessParts` live as long as the process - the Triton client
pool (a reload's registry reuses its channels), the CPU workers with the prompt-token cache, image fetching and the
Responses store - and are built once. `Services` are one model config's: the model registry (tokenizers,
templates, parsers, assembled backends, replica sets) and one service per endpoint over it, built by
`build_services` at start-up and by `rebuild_services` for each config reload, over the same parts.
"""

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
from openai_api.services.response_background import BackgroundResponses
from openai_api.services.responses import ResponsesService
from openai_api.services.stored_responses import ResponseStore
from openai_api.services.tokenize import TokenizeService
from openai_api.settings import Settings
from openai_api.stored.factory import build_object_store
from openai_api.text.prompt_cache import PromptTokenCache
from openai_api.text.shared_segments import SharedSegments
from openai_api.text.templates import RenderLimits
from openai_api.text.workers import CPUWorkers
from openai_api.triton.client import TritonClientPool


@dataclass
class ProcessParts:
    """What every config generation's services share, for the life of the process. `preprocess` holds the CPU
    workers (`preprocess.workers`), the template render limits and the prompt-token cache (`preprocess.cache`)."""

    pool: TritonClientPool
    preprocess: Preprocessor
    images: ImageService
    store: ResponseStore | None
    background: BackgroundResponses | None = None

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> ProcessParts:
        budget = int(settings.prompt_cache_mb * 1024 * 1024)
        cache = None
        if budget > 0:
            # With --workers N the supervisor names a folder the workers share (`text.shared_segments`).
            shared = SharedSegments.from_env(budget) if settings.workers > 1 else None
            cache = PromptTokenCache(budget, shared=shared)
        pre = Preprocessor(CPUWorkers(settings.cpu_workers),
                           RenderLimits(settings.template_timeout_s, settings.template_max_chars), cache)
        store = ResponseStore(build_object_store(
            settings.responses_store_url, settings.responses_store, settings.responses_store_max_bytes,
            settings.responses_store_ttl_s, settings.redis_timeout_s)) if settings.responses_store else None
        background = BackgroundResponses(store, settings.responses_background_max) if store is not None else None
        return cls(TritonClientPool(), pre, ImageService.from_settings(settings, metrics), store, background)

    async def start(self) -> None:
        """At the process's start: the Responses store opens (an unusable folder fails the start)."""
        if self.store is not None:
            await self.store.start()

    async def close(self) -> None:
        """At the process's end: background responses, the CPU workers, image fetching, the Triton clients, the
        Responses store."""
        if self.background is not None:
            await self.background.close()
        self.preprocess.workers.close()
        self.images.close()
        await self.pool.close()
        if self.store is not None:
            await self.store.close()


@dataclass
class Services:
    """One config generation: its registry and one service per endpoint, over the process's `parts`."""

    registry: ModelRegistry
    parts: ProcessParts
    chat: ChatService
    completions: CompletionsService
    embeddings: EmbeddingsService
    rerank: RerankService
    models: ModelsService
    health: HealthService
    responses: ResponsesService
    tokenize: TokenizeService
    messages: MessagesService

    @property
    def preprocess(self) -> Preprocessor:
        return self.parts.preprocess


def build_services(config: GatewayConfig, settings: Settings, metrics: Metrics,
                   parts: ProcessParts | None = None) -> Services:
    """The registry (each model's tokenizer, template and assembled Triton backend) and one service per endpoint
    over it, on `parts` (made from `settings` when none are given: a bench or a test building services alone
    then closes them itself, `services.parts.close()`)."""
    parts = parts or ProcessParts.from_settings(settings, metrics)
    registry = ModelRegistry(config, parts.pool, metrics, settings.stream_idle_timeout_s)
    return _assemble(registry, parts, settings)


def rebuild_services(old: Services, config: GatewayConfig, settings: Settings, metrics: Metrics) -> Services:
    """The services of a new config (a reload, `openai_api.reload`): a new registry over `old`'s process parts,
    which it shares (the Triton client pool's channels are reused). No event-loop work: it may run in a thread."""
    registry = ModelRegistry(config, old.parts.pool, metrics, settings.stream_idle_timeout_s, old.registry)
    return _assemble(registry, old.parts, settings)


def _assemble(registry: ModelRegistry, parts: ProcessParts, settings: Settings) -> Services:
    pre = parts.preprocess
    chat = ChatService(registry, pre, parts.images)
    return Services(registry=registry, parts=parts, chat=chat, completions=CompletionsService(registry, pre),
                    embeddings=EmbeddingsService(registry, pre), rerank=RerankService(registry, pre),
                    models=ModelsService(registry), health=HealthService(registry),
                    responses=ResponsesService(chat, parts.store, parts.background),
                    tokenize=TokenizeService(registry, pre, chat),
                    messages=MessagesService(chat, settings.keep_billing_header))
