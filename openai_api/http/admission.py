"""Admission: a route's one decision, after its body was validated, of whether this request runs now.

In order: the count limits of the body (`--max-messages`, `--max-embedding-inputs`, `--max-rerank-documents`: a
400 naming the field) and its nesting depth (`services.bounds`), then the caller's allow-list (a model the key may
not use is a 404, as an unknown one), then the in-flight slots of the request's ticket (`http.inflight`: a 429
past a limit, the share a key's priority allows), taken through the priority scheduler (`http.scheduler`: the
request's class from its `priority`, `service_tier` or `x-gateway-inference-objective`, capped by the key's
`max_class`; with a queue configured, a wait ordered by class). The request's model is recorded for its metrics
and access log, and a traced request gets an `admission` span. Without the guard middleware (a bare app in a
test) there is no ticket: nothing is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import BaseModel

from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.http.inflight import Ticket
from openai_api.http.scheduler import capped_class, requested_class
from openai_api.observability import current_stats
from openai_api.quota.caller import PriorityClass, current_caller
from openai_api.schemas.dialects import RankingRequest, RootRerankRequest, TEIEmbedRequest
from openai_api.schemas.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    ResponsesRequest,
)
from openai_api.services.bounds import check_body_depth
from openai_api.settings import Settings
from openai_api.tracing import child_span


class Admission:
    """One request's admission, decided once by its route after the body was validated (see the module
    docstring). Without the guard middleware (a bare app in a test) there is no ticket: nothing is counted."""

    __slots__ = ("forced", "objective", "settings", "ticket")

    def __init__(self, ticket: Ticket | None, settings: Settings, objective: str | None = None,
                 forced: PriorityClass | None = None) -> None:
        self.ticket = ticket
        self.settings = settings
        self.objective = objective  # the x-gateway-inference-objective header
        self.forced = forced  # the Batch API's lines: always `batch`, whatever their bodies ask for

    @staticmethod
    def allowed(model: str) -> None:
        """The key's allow-list alone (with a keys file): a model it may not use does not exist for it, the same 404
        as an unknown one. Every `_admit` checks it; a route that must look at the model before it can be admitted
        (Anthropic's Messages: whether the model takes images) calls this first, so nothing it answers tells
        whether a model it may not use exists."""
        caller = current_caller()
        if caller is not None and not caller.allows(model):
            raise ModelNotFoundError(f"The model {model!r} does not exist.", param="model")

    def request_class(self, body: BaseModel | None) -> PriorityClass:
        """The scheduler class of this request (`http.scheduler`): what it asks for, capped by its key."""
        caller = current_caller()
        policy = caller.policy if caller is not None else None
        if self.forced is not None:
            return self.forced
        extra = (body.model_extra or {}) if body is not None else {}
        asked = requested_class(self.objective, getattr(body, "service_tier", None) or extra.get("service_tier"),
                                extra.get("priority"))
        if policy is None:
            return asked or "standard"
        return capped_class(asked, policy.default_class, policy.max_class)

    async def _admit(self, model: str, sequences: int = 1, param: str = "n", body: BaseModel | None = None,
                     first_token: bool = False) -> None:
        """Admit the request to `model` (`http.scheduler`). `first_token`: a generation, whose first token the
        scheduler may wait for (an interactive one's holds batch starts, a batch one's is its prefill's end)."""
        self.allowed(model)
        klass = self.request_class(body)
        caller = current_caller()
        share = caller.share if caller is not None else 1.0
        stats = current_stats()
        if stats is not None:
            stats.priority_class = klass  # the Triton adapters send it as the request's `priority`
        if stats is not None and not stats.model and (self.ticket is None or model in self.ticket.limiter.models):
            stats.model = model
        if self.ticket is not None:
            with child_span("admission", **{"gen_ai.request.model": model, "openai_api.sequences": sequences}):
                # traced requests only: a refusal ends it in error
                await self.ticket.acquire(model, sequences, param, share, klass,
                                          caller.owner if caller is not None else "")
            scheduler = self.ticket.limiter.scheduler
            if stats is not None and self.ticket.model == model and scheduler.counts_start(klass) \
                    and (first_token or klass == "interactive"):
                # the adaptive batch share's signal (`http.batch_share`), or a batch line's prefill done
                stats.on_first_token = partial(scheduler.first_token, self.ticket, model)

    def detach(self) -> Callable[[], None]:
        """Hand the request's in-flight slots to work that outlives its response (a background response): the
        guard no longer gives them back when the response is done; the function returned does."""
        ticket = self.ticket
        if ticket is None:
            return lambda: None
        moved = Ticket(ticket.limiter)
        moved.model, moved.sequences, moved.cls, moved.awaiting = (ticket.model, ticket.sequences, ticket.cls,
                                                                   ticket.awaiting)
        stats = current_stats()
        if stats is not None and stats.on_first_token is not None and ticket.model is not None:
            # the first token the scheduler waits for comes in the work that now holds the slots
            stats.on_first_token = partial(ticket.limiter.scheduler.first_token, moved, ticket.model)
        ticket.awaiting = False
        ticket.model, ticket.sequences = None, 0
        return moved.release

    async def chat(self, body: ChatCompletionRequest) -> None:
        _check_count(len(body.messages), self.settings.max_messages, "messages", "messages")
        check_body_depth(body)  # before anything walks its JSON (templates, schema checks, copies)
        await self._admit(body.model, body.n, "n", body, first_token=True)

    async def completions(self, body: CompletionRequest) -> None:
        prompts = _prompt_count(body.prompt)
        check_body_depth(body)
        await self._admit(body.model, prompts * body.n, "prompt" if prompts > 1 else "n", body, first_token=True)

    async def responses(self, body: ResponsesRequest) -> None:
        check_body_depth(body)
        await self._admit(body.model, body=body, first_token=True)

    async def embeddings(self, body: EmbeddingRequest) -> None:
        _check_count(_embedding_inputs(body), self.settings.max_embedding_inputs, "input", "inputs")
        await self._admit(body.model, body=body)

    async def rerank(self, body: RerankRequest) -> None:
        _check_count(len(body.documents), self.settings.max_rerank_documents, "documents", "documents")
        await self._admit(body.model)

    async def tei_embed(self, body: TEIEmbedRequest, model: str) -> None:
        """TEI `/embed`; `model` is the one serving it (TEI's body names none)."""
        count = 1 if isinstance(body.inputs, str) else len(body.inputs)
        _check_count(count, self.settings.max_embedding_inputs, "inputs", "inputs")
        await self._admit(model)

    async def ranking(self, body: RankingRequest) -> None:
        """NIM `/v1/ranking`."""
        _check_count(len(body.passages), self.settings.max_rerank_documents, "passages", "passages")
        await self._admit(body.model)

    async def root_rerank(self, body: RootRerankRequest, model: str) -> None:
        """`/rerank`: TEI's `texts` or Infinity's `documents`; `model` is the one serving it."""
        param = "texts" if body.texts is not None else "documents"
        count = len(body.texts if body.texts is not None else body.documents or [])
        _check_count(count, self.settings.max_rerank_documents, param, param)
        await self._admit(model)

    async def tokenize(self, model: str, messages: int = 0, body: BaseModel | None = None) -> None:
        """`/tokenize` and `/detokenize`: tokenizer work only, but a request in flight like any other."""
        _check_count(messages, self.settings.max_messages, "messages", "messages")
        if body is not None:
            check_body_depth(body)
        await self._admit(model)


def _check_count(count: int, limit: int | None, param: str, what: str) -> None:
    if limit is not None and count > limit:
        raise InvalidRequestError(f"'{param}' has {count} {what}; this server accepts at most {limit}.",
                                  param=param, code="too_many_items")


def _embedding_inputs(body: EmbeddingRequest) -> int:
    inp = body.input
    if isinstance(inp, str) or (inp and all(isinstance(x, int) for x in inp)):
        return 1
    return len(inp)


def _prompt_count(prompt: Any) -> int:
    """How many prompts a completions `prompt` holds: a string or one list of token ids is one."""
    if isinstance(prompt, str) or not prompt or all(isinstance(x, int) for x in prompt):
        return 1
    return len(prompt)
