"""`/v1/chat/completions`: messages -> chat template -> token ids -> Triton -> OpenAI chat objects."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from openai_api.errors import GatewayError, InvalidRequestError, error_response_bytes
from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage
from openai_api.services.generation import (
    TextEvent,
    build_generation_request,
    generate_text,
    merge_streams,
    resolve_max_tokens,
)
from openai_api.services.registry import LLMRuntime, ModelRegistry
from openai_api.services.streaming import DONE, ChatChunkEncoder, usage_dict
from openai_api.text.templates import TemplateError

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


class ChatService:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def _refuse_unsupported(self, req: ChatCompletionRequest) -> None:
        if req.logprobs or req.top_logprobs:
            raise InvalidRequestError("logprobs are not supported on chat completions yet.", param="logprobs",
                                      code="unsupported_parameter")
        if req.tools:
            raise InvalidRequestError("tools are not supported by this gateway yet.", param="tools",
                                      code="unsupported_parameter")
        if req.response_format and req.response_format.get("type") not in (None, "text"):
            raise InvalidRequestError("response_format other than 'text' is not supported by this backend.",
                                      param="response_format", code="unsupported_parameter")

    def render_prompt(self, rt: LLMRuntime, req: ChatCompletionRequest) -> str:
        if rt.template is None:
            raise InvalidRequestError(f"The model {rt.name!r} has no chat template; use /v1/completions.",
                                      param="model", code="no_chat_template")
        try:
            return rt.template.render(
                template_messages(req.messages), add_generation_prompt=req.add_generation_prompt
                and not req.continue_final_message, continue_final_message=req.continue_final_message,
                bos_token=rt.tokenizer.bos_token, eos_token=rt.tokenizer.eos_token, **(req.chat_template_kwargs or {}))
        except TemplateError as e:
            raise InvalidRequestError(f"The chat template could not render these messages: {e}",
                                      param="messages") from None

    async def create(self, req: ChatCompletionRequest, request_id: str) -> dict[str, Any] | AsyncIterator[bytes]:
        """A dict for a plain response, or an async iterator of SSE bytes when `stream` is set.

        For streams, nothing is yielded before the first tokens arrived from Triton, so a caller that
        awaits the first item still gets backend errors as exceptions (and a proper HTTP status).
        """
        rt = self.registry.llm(req.model)
        if req.unknown_fields():
            logger.debug("ignoring unknown chat fields: %s", req.unknown_fields())
        self._refuse_unsupported(req)
        prompt = self.render_prompt(rt, req)
        prompt_ids = rt.tokenizer.encode(prompt)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = resolve_max_tokens(rt, requested, len(prompt_ids), "messages")
        greqs = [build_generation_request(rt, req, prompt_ids, max_tokens, request_id, i, prompt) for i in range(req.n)]
        stops = req.stop_list()
        completion_id = f"chatcmpl-{request_id}" if request_id else f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return self._stream(rt, greqs, stops, completion_id, created, req.model, include_usage)
        results = await asyncio.gather(*(self._collect(rt, g, stops) for g in greqs))
        choices = []
        completion_tokens = 0
        for i, (text, finish, produced) in enumerate(results):
            completion_tokens += produced
            choices.append({"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                            "logprobs": None, "finish_reason": finish})
        return {"id": completion_id, "object": "chat.completion", "created": created, "model": req.model,
                "choices": choices, "usage": usage_dict(len(prompt_ids), completion_tokens)}

    @staticmethod
    async def _collect(rt: LLMRuntime, greq: Any, stops: list[str]) -> tuple[str, str, int]:
        parts: list[str] = []
        finish, produced = "stop", 0
        async for ev in generate_text(rt, greq, stops):
            parts.append(ev.text)
            if ev.finish_reason:
                finish, produced = ev.finish_reason, ev.completion_tokens
        return "".join(parts), finish, produced

    async def _stream(self, rt: LLMRuntime, greqs: list[Any], stops: list[str], completion_id: str, created: int,
                      model: str, include_usage: bool) -> AsyncIterator[bytes]:
        enc = ChatChunkEncoder(completion_id, created, model)
        prompt_tokens = len(greqs[0].prompt_ids)
        if len(greqs) == 1:
            events: AsyncIterator[tuple[int, TextEvent]] = _tagged(generate_text(rt, greqs[0], stops))
        else:
            events = merge_streams([generate_text(rt, g, stops) for g in greqs])
        produced = [0] * len(greqs)
        started = False
        try:
            async for i, ev in events:
                if not started:
                    started = True
                    yield b"".join(enc.role(j) for j in range(len(greqs)))
                if ev.text:
                    yield enc.content(i, ev.text)
                if ev.finish_reason:
                    produced[i] = ev.completion_tokens
                    yield enc.finish(i, ev.finish_reason)
        except GatewayError as e:
            if not started:
                raise
            logger.warning("stream %s ended by backend error: %s", completion_id, e.message)
            yield b"data: " + error_response_bytes(e) + b"\n\n"
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        if include_usage:
            yield enc.usage(prompt_tokens, sum(produced))
        yield DONE


async def _tagged(it: AsyncIterator[TextEvent]) -> AsyncIterator[tuple[int, TextEvent]]:
    try:
        async for ev in it:
            yield 0, ev
    finally:
        await it.aclose()  # type: ignore[attr-defined]
