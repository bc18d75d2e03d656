"""The application's one typed state, and the typed dependencies routers declare to reach it.

`create_app` builds one `AppState` and keeps it as `app.state.gateway`; nothing else lives on
`app.state`. A router names what it uses in its signature (`chat: ChatSvc`, `admission: AdmissionDep`,
`ctx: Ctx`), so the HTTP layer's dependence on the services is visible where it is used. Every
dependency is a plain function of the request: FastAPI resolves them, and so does the fast path
(`http.fastpath`) for the hot routes, without FastAPI's per-request machinery.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import Depends, Request

from openai_api.http.admission import Admission
from openai_api.http.inflight import InFlightLimiter, request_ticket
from openai_api.http.keys import presented_key
from openai_api.http.lifecycle import Lifecycle
from openai_api.http.scheduler import CLASSES, OBJECTIVE_HEADER
from openai_api.observability import Metrics
from openai_api.quota.caller import Caller
from openai_api.quota.keys import ANONYMOUS, API_KEY_NAME, api_key_digest
from openai_api.quota.service import QuotaService
from openai_api.services.batches import BatchService
from openai_api.services.chat import ChatService
from openai_api.services.completions import CompletionsService
from openai_api.services.container import Services
from openai_api.services.context import RequestContext
from openai_api.services.embeddings import EmbeddingsService
from openai_api.services.messages import MessagesService
from openai_api.services.models import HealthService, ModelsService
from openai_api.services.rerank import RerankService
from openai_api.services.responses import ResponsesService
from openai_api.services.status import StatusService
from openai_api.services.tokenize import TokenizeService
from openai_api.settings import Settings


class Reloader(Protocol):
    """What the app's state keeps of its config reloader (`openai_api.reload.ConfigReloader`, which imports this
    module: a protocol here instead of that import keeps the http layer below the app)."""

    @property
    def services(self) -> Services: ...


class Process(Protocol):
    """What the app's state keeps of the composition root that built it (`openai_api.process.GatewayProcess`, above
    this layer): started and closed by the app's lifespan; a test that builds an app without serving it closes it."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


# scope["state"] key of the pinned services (set by `openai_api.reload.PinGeneration`).
SERVICES_KEY = "services"


@dataclass
class AppState:
    """Everything a request may need beyond its own body, built once per app."""

    settings: Settings
    services: Services
    metrics: Metrics
    lifecycle: Lifecycle
    limiter: InFlightLimiter
    quota: QuotaService
    # Swaps `services` on SIGHUP or a config file change (openai_api/reload.py); None: never reloaded.
    reloader: Reloader | None = None
    # The status page's data (services/status.py); None with --no-status-page.
    status: StatusService | None = None
    process: Process | None = None
    # The Batch API's files and jobs (services/batches.py; the runner is http/batch_runner.py).
    batches: BatchService | None = None


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What a route knows of its request besides the body: the services' explicit request context (`request`:
    id, caller, headers; `services.context`) and how its SSE writes are coalesced."""

    request: RequestContext
    flush_interval_s: float

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def caller(self) -> Caller:
        return self.request.caller


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


def request_context(request: Request) -> RouteContext:
    rid = request.scope.get("state", {}).get("request_id")
    context = RequestContext(rid if isinstance(rid, str) else uuid.uuid4().hex, caller(request),
                             request.scope.get("headers", ()))
    return RouteContext(context, app_state(request).settings.stream_flush_interval_s)


def caller(request: Request) -> Caller:
    """Who is calling: the key the keys middleware found; without a keys file an `--api-key` key (unlimited, told
    apart by a digest of the key, which `APIKeyMiddleware` already checked) or, without keys, the anonymous one."""
    found = request.scope.get("state", {}).get("caller")
    if isinstance(found, Caller):
        return found
    if not app_state(request).settings.api_keys:
        return Caller(ANONYMOUS)
    secret = presented_key(request.scope)
    return Caller(API_KEY_NAME, key_digest=api_key_digest(secret) if secret else "")


def services(request: Request) -> Services:
    """The services of the config generation this request was pinned to when it arrived (`reload.PinGeneration`),
    so a config reload mid-request never mixes two configs in one request; the current ones where unpinned."""
    pinned = request.scope.get("state", {}).get(SERVICES_KEY)
    return pinned if isinstance(pinned, Services) else app_state(request).services


def quota_service(request: Request) -> QuotaService:
    return app_state(request).quota


# scope["state"] key of a class every request of this scope runs as (the Batch API's in-process calls: `batch`).
PRIORITY_CLASS_KEY = "priority_class"


def admission(request: Request) -> Admission:
    forced = request.scope.get("state", {}).get(PRIORITY_CLASS_KEY)
    return Admission(request_ticket(request.scope), app_state(request).settings,
                     request.headers.get(OBJECTIVE_HEADER), forced if forced in CLASSES else None)


def chat_service(request: Request) -> ChatService:
    return services(request).chat


def completions_service(request: Request) -> CompletionsService:
    return services(request).completions


def embeddings_service(request: Request) -> EmbeddingsService:
    return services(request).embeddings


def rerank_service(request: Request) -> RerankService:
    return services(request).rerank


def responses_service(request: Request) -> ResponsesService:
    return services(request).responses


def messages_service(request: Request) -> MessagesService:
    return services(request).messages


def tokenize_service(request: Request) -> TokenizeService:
    return services(request).tokenize


def models_service(request: Request) -> ModelsService:
    return services(request).models


def health_service(request: Request) -> HealthService:
    return services(request).health


def batch_service(request: Request) -> BatchService:
    found = app_state(request).batches
    assert found is not None  # the batch routers are registered only with one
    return found


def metrics(request: Request) -> Metrics:
    return app_state(request).metrics


Ctx = Annotated[RouteContext, Depends(request_context)]
AdmissionDep = Annotated[Admission, Depends(admission)]
ChatSvc = Annotated[ChatService, Depends(chat_service)]
CompletionsSvc = Annotated[CompletionsService, Depends(completions_service)]
EmbeddingsSvc = Annotated[EmbeddingsService, Depends(embeddings_service)]
RerankSvc = Annotated[RerankService, Depends(rerank_service)]
TokenizeSvc = Annotated[TokenizeService, Depends(tokenize_service)]
ModelsSvc = Annotated[ModelsService, Depends(models_service)]
ResponsesSvc = Annotated[ResponsesService, Depends(responses_service)]
MessagesSvc = Annotated[MessagesService, Depends(messages_service)]
HealthSvc = Annotated[HealthService, Depends(health_service)]
MetricsDep = Annotated[Metrics, Depends(metrics)]
CallerDep = Annotated[Caller, Depends(caller)]
QuotaDep = Annotated[QuotaService, Depends(quota_service)]
BatchesSvc = Annotated[BatchService, Depends(batch_service)]
