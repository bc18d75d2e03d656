"""`/v1/completions`: prompts (text or token ids) -> Triton -> `text_completion` objects."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import CompletionRequest
from openai_api.services.context import RequestContext
from openai_api.services.generation import (
    TokenLogprobs,
    build_generation_request,
    collect_choices,
    refuse_vllm_extensions,
    request_cached_tokens,
    resolve_max_tokens,
)
from openai_api.services.guides import request_guide, require_support
from openai_api.services.preprocess import Preprocessor, encode_prompt
from openai_api.services.registry import LLMRuntime, ModelRegistry
from openai_api.services.streaming import StreamPlan, usage_dict
from openai_api.triton.llm import GenerationRequest

logger = logging.getLogger(__name__)


def _prompts(rt: LLMRuntime, prompt: Any, add_special_tokens: bool) -> list[tuple[str, list[int]]]:
    """(text, ids) per prompt; OpenAI's four prompt forms, with the empty cases refused. Text is tokenized with
    the tokenizer's added tokens (a Llama or Mistral tokenizer's BOS) unless `add_special_tokens` is false,
    as vLLM does: a raw prompt has no chat template to write them. Token-id prompts are sent as given."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise InvalidRequestError("'prompt' must not be empty.", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    out = []
    vocab = rt.tokenizer.vocab_size
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            if not p:
                raise InvalidRequestError(f"prompt[{i}] is an empty string.", param="prompt")
            out.append((p, encode_prompt(rt, p, "prompt", add_special_tokens)))
        else:
            if not p:
                raise InvalidRequestError(f"prompt[{i}] is an empty list of tokens.", param="prompt")
            if any(t < 0 or t >= vocab for t in p):
                raise InvalidRequestError(f"prompt[{i}] has token ids outside the vocabulary (0..{vocab - 1}).",
                                          param="prompt")
            out.append((rt.tokenizer.decode(p, skip_special_tokens=False), list(p)))
    return out


def _text_size(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str)) if isinstance(prompt, list) else 0


def completion_logprobs(rt: LLMRuntime, ids: list[int], lps: list[float] | None, offset: int) -> dict[str, Any]:
    """Legacy completions `logprobs`: each sampled token, its log-prob and its text offset; with `logprobs`
    > 0 (`TokenLogprobs.top`), per token a `{token: logprob}` object of the most likely tokens and the
    sampled one (so up to `logprobs` + 1 entries, as OpenAI documents), most likely first; else None."""
    tokens = [rt.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    token_logprobs = list(lps or [0.0] * len(ids))
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    alternatives = lps.top if isinstance(lps, TokenLogprobs) else None
    top: list[dict[str, float]] | None = None
    if alternatives is not None:
        top = []
        for k, (tok, lp) in enumerate(zip(tokens, token_logprobs, strict=True)):
            ranked = [(rt.tokenizer.decode([a], skip_special_tokens=False), alp)
                      for a, alp in (alternatives[k] if k < len(alternatives) else [])]
            ranked.append((tok, lp))
            entry: dict[str, float] = {}
            # Two ids may decode to the same text (a partial UTF-8 character): the likelier one is kept.
            for text, value in sorted(ranked, key=lambda x: -x[1]):
                entry.setdefault(text, value)
            top.append(entry)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


@dataclass(slots=True)
class CompletionStream(StreamPlan):
    """A streamed completion, prepared (`StreamPlan`, `stream_id` its completion id; a sequence per prompt and
    choice): what its chunks carry (`created`, the request's `model`), each sequence's echoed prompt (`echoes`,
    "" unless `echo`), whether they carry log-probs and whether a usage chunk ends the stream."""

    created: int
    model: str
    echoes: list[str]
    logprobs: bool
    include_usage: bool


class CompletionsService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess

    def _refuse_unsupported(self, rt: LLMRuntime, req: CompletionRequest) -> None:
        if req.suffix:
            raise InvalidRequestError("suffix is not supported: the models behind this gateway do not do "
                                      "fill-in-the-middle.", param="suffix", code="unsupported_parameter")
        refuse_vllm_extensions(req)
        if req.best_of is not None and req.best_of != req.n:
            raise InvalidRequestError("best_of is not supported (only best_of == n).", param="best_of",
                                      code="unsupported_parameter")
        if req.logprobs is not None and not rt.backend.supports("return_logprobs"):
            raise InvalidRequestError(f"The model {rt.name!r} does not return log-probabilities.",
                                      param="logprobs", code="unsupported_parameter")
        if req.logprobs and not rt.backend.supports("top_logprobs"):
            raise InvalidRequestError(
                f"logprobs > 0 asks for alternatives, but the model {rt.name!r} speaks a Triton protocol "
                f"({rt.backend.protocol}) that returns only the sampled token's log-probability: use logprobs=0.",
                param="logprobs", code="unsupported_parameter")

    async def create(self, req: CompletionRequest, ctx: RequestContext) -> dict[str, Any] | CompletionStream:
        """A `text_completion`, or when `stream` is set the prepared stream (`CompletionStream`), which the
        completions dialect encodes as its chunks (`http.dialects.openai_completions`)."""
        request_id = ctx.request_id
        rt = self.registry.llm(req.model)
        if req.unknown_fields():
            logger.debug("ignoring unknown completion fields: %s", req.unknown_fields())
        self._refuse_unsupported(rt, req)
        guide = request_guide(req)  # vLLM's guided_* / structured_outputs fields
        if guide is not None:
            require_support(rt.backend, rt.name, guide)
        prompts = await self.preprocess.run(_text_size(req.prompt), _prompts, rt, req.prompt, req.add_special_tokens)
        greqs: list[GenerationRequest] = []
        for text, ids in prompts:
            max_tokens = resolve_max_tokens(rt, req.max_tokens, len(ids), "prompt")
            for i in range(req.n):
                g = build_generation_request(rt, req, ids, max_tokens, f"{request_id}-{len(greqs)}" if greqs
                                             else request_id, i, text, ctx.headers)
                g.return_logprobs = req.logprobs is not None
                g.top_logprobs = req.logprobs or 0
                g.guide = guide
                greqs.append(g)
        stops = req.stop_list()
        completion_id = f"cmpl-{request_id}" if request_id else f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        echoes = [prompts[k // req.n][0] if req.echo else "" for k in range(len(greqs))]
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return CompletionStream(rt, greqs, stops, prompt_tokens, completion_id, created=created, model=req.model,
                                    echoes=echoes, logprobs=greqs[0].return_logprobs, include_usage=include_usage)
        if not stops and not rt.stop_strings:
            for g in greqs:
                g.stream_tokens = False  # nothing to cut at mid-way: one response from Triton is enough
        results = await collect_choices(rt, greqs, stops)
        choices = []
        completion_tokens = 0
        for k, (text, finish, produced, ids, lps, _) in enumerate(results):
            completion_tokens += produced
            logprobs = completion_logprobs(rt, ids, lps, len(echoes[k])) if greqs[k].return_logprobs else None
            choices.append({"index": k, "text": echoes[k] + text, "logprobs": logprobs, "finish_reason": finish})
        cached = request_cached_tokens(greqs, [r.cached_tokens for r in results])
        return {"id": completion_id, "object": "text_completion", "created": created, "model": req.model,
                "choices": choices, "usage": usage_dict(prompt_tokens, completion_tokens, cached_tokens=cached)}
