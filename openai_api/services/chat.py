"""`/v1/chat/completions`: messages -> chat template -> token ids -> Triton -> OpenAI chat objects."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from openai_api.errors import GatewayError, InvalidRequestError
from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage
from openai_api.services.generation import (
    TextEvent,
    build_generation_request,
    collect_choices,
    resolve_max_tokens,
)
from openai_api.services.guides import request_guide, require_support
from openai_api.services.preprocess import Preprocessor, Prompt
from openai_api.services.registry import LLMRuntime, ModelRegistry
from openai_api.services.streaming import DONE, ChatChunkEncoder, error_event, sse_stream, usage_dict
from openai_api.services.tools import ToolPlan, apply_plan_to_messages, plan_tools
from openai_api.text.tool_parsers import ParsedToolCall

logger = logging.getLogger(__name__)


def message_text(msg: ChatMessage, index: int) -> str | None:
    """Content as one string: a string, or a list of text parts joined; other part types are refused."""
    content = msg.content
    if content is None or isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequestError(
                f"Content part type {kind!r} is not supported by this model; only 'text' parts are.",
                param=f"messages[{index}].content[{j}]", code="unsupported_content")
        parts.append(part["text"])
    return "".join(parts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": message_text(m, i)}
        if d["content"] is None and m.role != "assistant":
            raise InvalidRequestError(f"messages[{i}].content is required for role {m.role!r}.",
                                      param=f"messages[{i}].content")
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [tc.model_dump() for tc in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


# Template variables the gateway sets from the request itself; `chat_template_kwargs` may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                      "bos_token", "eos_token", "limits", "self"})


def logprob_entries(rt: LLMRuntime, ids: list[int], lps: list[float] | None) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries: the sampled token, its log-prob and bytes (no alternatives)."""
    out = []
    for t, lp in zip(ids, lps or [0.0] * len(ids), strict=False):
        tok = rt.tokenizer.decode([t], skip_special_tokens=False)
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return out


class ChatService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess

    def _refuse_unsupported(self, rt: LLMRuntime, req: ChatCompletionRequest) -> None:
        if req.top_logprobs:
            raise InvalidRequestError(
                "top_logprobs > 0 is not supported: Triton's TensorRT-LLM protocol returns only the sampled "
                "token's log-probability. Use logprobs=true with top_logprobs=0.", param="top_logprobs",
                code="unsupported_parameter")
        if req.logprobs and not rt.backend.supports("return_logprobs"):
            raise InvalidRequestError(f"The model {rt.name!r} does not return log-probabilities.",
                                      param="logprobs", code="unsupported_parameter")

    async def prompt(self, rt: LLMRuntime, req: ChatCompletionRequest, plan: ToolPlan | None = None) -> Prompt:
        """The rendered and tokenized prompt of `req` (see `services.preprocess`)."""
        plan = plan or ToolPlan()
        extra = req.chat_template_kwargs or {}
        for key in extra:
            if key in RESERVED_TEMPLATE_KWARGS:
                raise InvalidRequestError(
                    f"chat_template_kwargs may not set {key!r}: the gateway sets it from the request itself.",
                    param=f"chat_template_kwargs.{key}")
        messages = apply_plan_to_messages(plan, template_messages(req.messages), rt)
        return await self.preprocess.chat(
            rt, messages, plan.prefill,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            continue_final_message=req.continue_final_message, tools=plan.tools, bos_token=rt.tokenizer.bos_token,
            eos_token=rt.tokenizer.eos_token, **extra)

    async def create(self, req: ChatCompletionRequest, request_id: str) -> dict[str, Any] | AsyncGenerator[bytes, None]:
        """A dict for a plain response, or an async iterator of SSE bytes when `stream` is set.

        For streams, nothing is yielded before the first tokens arrived from Triton, so a caller that
        awaits the first item still gets backend errors as exceptions (and a proper HTTP status).
        """
        rt = self.registry.llm(req.model)
        if req.unknown_fields():
            logger.debug("ignoring unknown chat fields: %s", req.unknown_fields())
        self._refuse_unsupported(rt, req)
        plan = plan_tools(rt, req)
        # A forced tool call's guide wins over the request's own (which shapes content, and there is none).
        guide = plan.guide or request_guide(req)
        if guide is not None:
            require_support(rt.backend, rt.name, guide)
        prompt = await self.prompt(rt, req, plan)
        prompt_ids = prompt.ids
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = resolve_max_tokens(rt, requested, len(prompt_ids), "messages")
        greqs = [build_generation_request(rt, req, prompt_ids, max_tokens, request_id, i, prompt.text)
                 for i in range(req.n)]
        for g in greqs:
            g.return_logprobs = req.logprobs
            g.guide = guide
        stops = req.stop_list() + plan.stops
        completion_id = f"chatcmpl-{request_id}" if request_id else f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            encoder = ChatStreamEncoder(rt, ChatChunkEncoder(completion_id, created, req.model), plan, req.n,
                                        req.logprobs, include_usage)
            return sse_stream(rt, greqs, stops, encoder, len(prompt_ids), completion_id)
        if not stops and not rt.stop_strings:
            for g in greqs:
                g.stream_tokens = False  # nothing to cut at mid-way: one response from Triton is enough
        results = await collect_choices(rt, greqs, stops)
        choices = []
        completion_tokens = 0
        for i, (text, finish, produced, ids, lps) in enumerate(results):
            completion_tokens += produced
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
            if plan.forced is not None:
                calls = plan.calls_from(text)
                if calls:  # cut by max_tokens mid-JSON, a required call does not parse: the text as produced
                    message = {"role": "assistant", "content": None, "refusal": None,
                               "tool_calls": [c.to_openai() for c in calls]}
                    finish = "tool_calls" if finish != "length" else finish
            elif plan.parser is not None:
                content, calls = plan.parser.parse(plan.prefill + text)
                if calls:
                    calls = calls if plan.parallel else calls[:1]
                    message = {"role": "assistant", "content": content, "refusal": None,
                               "tool_calls": [c.to_openai() for c in calls]}
                    finish = "tool_calls"
            logprobs = {"content": logprob_entries(rt, ids, lps), "refusal": None} if req.logprobs else None
            choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        return {"id": completion_id, "object": "chat.completion", "created": created, "model": req.model,
                "choices": choices, "usage": usage_dict(len(prompt_ids), completion_tokens)}



class ChatStreamEncoder:
    """`chat.completion.chunk` events (the envelope is `services.streaming.sse_stream`): the role chunks
    open the stream, then per choice content deltas (with log-probs when asked for) or tool-call deltas,
    its finish chunk, and at the end a usage chunk (`stream_options.include_usage`) and `[DONE]`."""

    def __init__(self, rt: LLMRuntime, chunks: ChatChunkEncoder, plan: ToolPlan, n: int, logprobs: bool,
                 include_usage: bool) -> None:
        self.rt = rt
        self.chunks = chunks
        self.n = n
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.tools: list[_StreamTools] | list[_ForcedCallStream] | None = None
        if plan.forced is not None:
            self.tools = [_ForcedCallStream(plan) for _ in range(n)]
        elif plan.parser is not None:
            self.tools = [_StreamTools(plan) for _ in range(n)]

    def event(self, index: int, ev: TextEvent, first: bool) -> bytes:
        enc = self.chunks
        out = [enc.role(j) for j in range(self.n)] if first else []
        if self.tools is not None:
            out += self.tools[index].push(enc, index, ev.text, ev.finish_reason is not None)
        elif self.logprobs and (ev.text or ev.token_ids):
            out.append(enc.delta(index, {"content": ev.text},
                                 {"content": logprob_entries(self.rt, ev.token_ids, ev.logprobs), "refusal": None}))
        elif ev.text:
            out.append(enc.content(index, ev.text))
        if ev.finish_reason:
            called = self.tools is not None and self.tools[index].calls and ev.finish_reason != "length"
            out.append(enc.finish(index, "tool_calls" if called else ev.finish_reason))
        return out[0] if len(out) == 1 else b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return error_event(err)

    def end(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (self.chunks.usage(prompt_tokens, completion_tokens) + DONE) if self.include_usage else DONE


class _ForcedCallStream:
    """Per-choice deltas of a forced call's guided output: a named call's arguments stream as they come
    (the id, type and name first); a `required` call is sent whole once its JSON is complete. Output that
    does not parse at the end (cut by max_tokens) is sent as content, as the plain answer has it."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.calls = 0
        self._held: list[str] = []

    def push(self, enc: ChatChunkEncoder, index: int, text: str, last: bool) -> list[bytes]:
        plan = self.plan
        if plan.forced == "named":
            out = []
            if not self.calls and (text or last):
                self.calls = 1
                call = ParsedToolCall(plan.forced_name, "")
                out.append(enc.delta(index, {"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                                                             "function": {"name": call.name, "arguments": ""}}]}))
            if text:
                out.append(enc.delta(index, {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}))
            return out
        self._held.append(text)
        if not last:
            return []
        whole = "".join(self._held)
        calls = plan.calls_from(whole)
        if not calls:
            return [enc.content(index, whole)] if whole else []
        out = []
        for k, call in enumerate(calls):
            out.append(enc.delta(index, {"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                                         "function": {"name": call.name, "arguments": ""}}]}))
            out.append(enc.delta(index, {"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]}))
        self.calls = len(calls)
        return out


class _StreamTools:
    """Per-choice tool-call streaming: content deltas, then for each call a delta with id, type and
    name, followed by its arguments; half-parsed call text never reaches `content`."""

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.parser is not None
        self.parser = plan.parser.streamer()
        self.parallel = plan.parallel
        self.calls = 0
        if plan.prefill:
            self.parser.push(plan.prefill)

    def push(self, enc: ChatChunkEncoder, index: int, text: str, last: bool) -> list[bytes]:
        events = [self.parser.push(text)] if text else []
        if last:
            events.append(self.parser.finish())
        out = []
        for ev in events:
            if ev.content:
                out.append(enc.content(index, ev.content))
            for call in ev.calls:
                if self.calls and not self.parallel:
                    continue
                k = self.calls
                self.calls += 1
                out.append(enc.delta(index, {"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                                             "function": {"name": call.name, "arguments": ""}}]}))
                out.append(enc.delta(index, {"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]}))
        return out
