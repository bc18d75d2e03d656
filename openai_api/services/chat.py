"""`/v1/chat/completions`: messages -> chat template -> token ids -> Triton -> OpenAI chat objects."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage, ToolCall, ToolCallFunction
from openai_api.services.bounds import MAX_JSON_DEPTH, find_excess
from openai_api.services.context import RequestContext
from openai_api.services.generation import (
    Collected,
    TokenLogprobs,
    build_generation_request,
    collect_choices,
    refuse_vllm_extensions,
    request_cached_tokens,
    resolve_max_tokens,
)
from openai_api.services.guides import request_guide, require_support
from openai_api.services.images import ImageService, chat_image_sources
from openai_api.services.output import Assembled, ChoiceOutput, assemble
from openai_api.services.parts import ChatParts, Image, typed_messages
from openai_api.services.preprocess import IMAGE_MARK, Preprocessor, Prompt
from openai_api.services.registry import LLMRuntime, ModelRegistry
from openai_api.services.streaming import StreamPlan, usage_dict
from openai_api.services.tools import ToolPlan, apply_plan_to_messages, plan_tools
from openai_api.text import json_args
from openai_api.text.templates import ChatTemplate
from openai_api.triton.llm import GenerationRequest

logger = logging.getLogger(__name__)


def template_content(msg: ChatMessage, as_parts: bool, placeholder: bool) -> str | list[dict[str, Any]] | None:
    """Content as the chat template reads it: a string (text parts joined), or with `as_parts` the list of
    parts. An image (`parts.Image`, checked at the edge) becomes, with `placeholder` (the model config's
    `image_placeholder`), the text `IMAGE_MARK` that the preprocessor turns into the placeholder after
    rendering (so it is never read as client text), else the part `{"type": "image"}` that multimodal
    templates render as their own image tokens (as transformers and vLLM pass it); a template that reads
    content only as a string, with no placeholder configured, cannot show the model where an image goes: a
    400 naming the image, never a silently dropped image."""
    content = msg.content
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, ChatParts):  # `template_messages` typed every list of parts first
        raise TypeError(f"content parts not typed: {type(content).__name__}")
    items: list[dict[str, Any]] = []
    for part in content.parts:
        if isinstance(part, Image):
            if not (placeholder or as_parts):
                raise InvalidRequestError(
                    "This model's chat template does not render image parts, and its config names no "
                    "image_placeholder to write in their place.", param=part.where, code="unsupported_content")
            items.append({"type": "text", "text": IMAGE_MARK} if placeholder else {"type": "image"})
        else:
            items.append({"type": "text", "text": part.text})
    return items if as_parts else "".join(p["text"] for p in items)


# The names an assistant message's reasoning arrives under, in the order transformers prefers them.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def template_arguments(arguments: str, index: int, call: int) -> Any:
    """An earlier call's `arguments` (OpenAI's JSON string) as the value it encodes, as transformers and vLLM
    hand it to templates; "" is {} (vLLM's reading). Not JSON: a 400 naming the field."""
    if not arguments or arguments.isspace():
        return {}
    # (Every earlier call of an agent turn passes here on every turn: the field's name is only written for an error.)
    try:
        value = json_args.decode(arguments)  # json.loads's value; what it gives is remembered by the text
    except ValueError:
        raise InvalidRequestError(
            f"messages[{index}].tool_calls[{call}].function.arguments is not valid JSON; the model's chat template "
            "reads it as a JSON object.", param=f"messages[{index}].tool_calls[{call}].function.arguments") from None
    except RecursionError:  # past what Python's parser follows; the depth check below names the limit
        value = None
        too_deep = True
    else:
        too_deep = json_args.nested_deeper_than(  # the template walks it (tojson)
            value, MAX_JSON_DEPTH, lambda v, d: find_excess(v, d) is not None)
    if too_deep:
        param = f"messages[{index}].tool_calls[{call}].function.arguments"
        raise InvalidRequestError(f"'{param}' is nested too deeply: past the gateway's limit of {MAX_JSON_DEPTH} "
                                  "levels of JSON nesting.", param=param, code="too_deeply_nested")
    return value


def _call_dict(tc: ToolCall) -> dict[str, Any]:
    """`tc.model_dump()`, written out for the usual call with no extra fields (~0.4 us against ~3 us: an agent
    turn dumps every earlier call again)."""
    fn = tc.function
    if tc.__pydantic_extra__ or type(fn) is not ToolCallFunction or fn.__pydantic_extra__:
        return tc.model_dump()
    return {"id": tc.id, "type": tc.type, "function": {"name": fn.name, "arguments": fn.arguments}}


def template_messages(messages: list[ChatMessage], template: ChatTemplate | None = None,
                      image_placeholder: bool = False) -> list[dict[str, Any]]:
    """The messages as the model's chat template reads them (what transformers' `apply_chat_template` and vLLM
    pass): `developer` becomes `system`; content is a string (text parts joined) or, for a template that loops
    over content parts (`template.content_as_parts`), the list of text parts as sent; an assistant's
    `tool_calls` keep OpenAI's shape (`id`, `type`, `function.name`) with `function.arguments` decoded to its
    JSON value unless the template wants the string (`template.arguments_as_text`: it tests `is string` or
    only prints or concatenates it); an assistant's null content is "" (as vLLM passes it; transformers drops
    the field, which DeepSeek-V3.1's and Qwen3's templates cannot render); `name` and `tool_call_id` pass
    through, and an assistant's reasoning (`reasoning_content`, `thinking` or `reasoning`) as both
    `reasoning_content` and `thinking`. Content parts: typed (`parts.typed_messages`: the chat dialect has
    done it at the edge, so this only types what a service or a test built), then see `template_content`.
    Without a template the messages stay as OpenAI sent them (arguments as strings)."""
    parts = template is not None and template.content_as_parts
    decode = template is not None and not template.arguments_as_text
    out = []
    for i, m in enumerate(typed_messages(messages)):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                             "content": template_content(m, parts, image_placeholder)}
        if d["content"] is None:
            if m.role != "assistant":
                raise InvalidRequestError(f"messages[{i}].content is required for role {m.role!r}.",
                                          param=f"messages[{i}].content")
            d["content"] = ""  # as vLLM: templates concatenate or test content; None would print "None"
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [_call_dict(tc) for tc in m.tool_calls]
            if decode:
                for j, tc in enumerate(d["tool_calls"]):
                    tc["function"]["arguments"] = template_arguments(tc["function"]["arguments"], i, j)
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        # An earlier turn's reasoning under any of its names, given to templates under both that they read
        # (Qwen3/GLM `reasoning_content`, gpt-oss `thinking`), as transformers aliases them.
        extra = m.model_extra
        if extra and m.role == "assistant":
            reasoning = next((extra[k] for k in REASONING_FIELDS if isinstance(extra.get(k), str)), None)
            if reasoning is not None:
                d["thinking"] = extra["thinking"] if isinstance(extra.get("thinking"), str) else reasoning
                d["reasoning_content"] = reasoning
        out.append(d)
    return out


def place_system_messages(messages: list[dict[str, Any]], template: ChatTemplate | None) -> list[dict[str, Any]]:
    """System messages after the first message (Claude Code's and Codex's mid-conversation instructions;
    `developer` is `system` by now), where the model's template can take them.

    A template that renders a system message where it stands (`ChatTemplate.renders_system_anywhere`,
    decided once per template by a probe render) gets them in place. Any other (one that allows a system
    message only first, raises on it, drops it or hoists it) gets them folded into the first message, the
    system prompt, in order and a blank line apart; a conversation without a leading system message gets
    one made of them. Nothing changes when no system message follows the first message."""
    if template is None or not any(m["role"] == "system" for m in messages[1:]) \
            or template.renders_system_anywhere:
        return messages
    head = messages[0] if messages[0]["role"] == "system" else None
    folded = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages[1 if head is not None else 0:] if m["role"] != "system"]
    if all(isinstance(c, str) for c in folded):
        content: Any = "\n\n".join(folded)
    else:  # a template that reads content parts: the parts in order, a blank line between messages
        content = []
        for k, c in enumerate(folded):
            content += ([{"type": "text", "text": "\n\n"}] if k else []) \
                + ([{"type": "text", "text": c}] if isinstance(c, str) else list(c))
    return [{**(head or {}), "role": "system", "content": content}, *rest]


# Template variables the gateway sets from the request itself; `chat_template_kwargs` may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                      "bos_token", "eos_token", "limits", "self"})


def logprob_entries(rt: LLMRuntime, ids: list[int], lps: list[float] | None) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries: the sampled token, its log-prob and bytes, and in `top_logprobs` the
    most likely tokens, each `{token, logprob, bytes}`, most likely first (`TokenLogprobs.top`; [] when not
    asked for)."""
    top = lps.top if isinstance(lps, TokenLogprobs) else None
    out = []
    for k, (t, lp) in enumerate(zip(ids, lps or [0.0] * len(ids), strict=False)):
        tok = rt.tokenizer.decode([t], skip_special_tokens=False)
        alternatives = []
        for a, alp in top[k] if top is not None and k < len(top) else ():
            atok = rt.tokenizer.decode([a], skip_special_tokens=False)
            alternatives.append({"token": atok, "logprob": alp, "bytes": list(atok.encode())})
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alternatives})
    return out


@dataclass(slots=True)
class PreparedChat:
    rt: LLMRuntime
    plan: ToolPlan
    greqs: list[GenerationRequest]
    stops: list[str]
    prompt_tokens: int
    prompt_text: str = ""

    def output(self) -> ChoiceOutput:
        """A new reader of one choice's output (its reasoning, content and tool calls)."""
        return ChoiceOutput(self.plan, self.rt.reasoning_parser, self.rt.tool_parser, self.prompt_text,
                            self.rt.control_markers)


@dataclass(slots=True)
class ChatStream(StreamPlan):
    """A streamed chat, prepared (`StreamPlan`, `stream_id` its completion id): what its chunks carry (`created`,
    the request's `model`) and how they are cut (`n` choices, `logprobs`, `include_usage`); `prepared` gives
    each choice's output reader (`PreparedChat.output`)."""

    prepared: PreparedChat
    created: int
    model: str
    n: int
    logprobs: bool
    include_usage: bool


async def collect_plain(rt: LLMRuntime, greqs: list[GenerationRequest], stops: list[str]) -> list[Collected]:
    """Every choice of a non-streamed answer, whole."""
    if not stops and not rt.stop_strings:
        for g in greqs:
            g.stream_tokens = False  # nothing to cut at mid-way: one response from Triton is enough
    return await collect_choices(rt, greqs, stops)


class ChatService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor, images: ImageService | None = None) -> None:
        self.registry = registry
        self.preprocess = preprocess
        self.images = images or ImageService()

    def _refuse_unsupported(self, rt: LLMRuntime, req: ChatCompletionRequest) -> None:
        refuse_vllm_extensions(req)
        if req.top_logprobs and not req.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true.", param="top_logprobs")
        if req.logprobs and not rt.backend.supports("return_logprobs"):
            raise InvalidRequestError(f"The model {rt.name!r} does not return log-probabilities.",
                                      param="logprobs", code="unsupported_parameter")
        if req.top_logprobs and not rt.backend.supports("top_logprobs"):
            raise InvalidRequestError(
                f"top_logprobs > 0 is not supported by the model {rt.name!r}: its Triton protocol "
                f"({rt.backend.protocol}) returns only the sampled token's log-probability. Use logprobs=true "
                "with top_logprobs=0.", param="top_logprobs", code="unsupported_parameter")

    async def prompt(self, rt: LLMRuntime, req: ChatCompletionRequest, plan: ToolPlan | None = None) -> Prompt:
        """The rendered and tokenized prompt of `req` (see `services.preprocess`)."""
        plan = plan or ToolPlan()
        extra = req.chat_template_kwargs or {}
        for key in extra:
            if key in RESERVED_TEMPLATE_KWARGS:
                raise InvalidRequestError(
                    f"chat_template_kwargs may not set {key!r}: the gateway sets it from the request itself.",
                    param=f"chat_template_kwargs.{key}")
        # OpenAI's top-level `reasoning_effort` reaches templates that read it (gpt-oss), as in vLLM.
        # (From the extra fields directly: getattr on a pydantic model raises and catches when it is absent.)
        effort = (req.model_extra or {}).get("reasoning_effort")
        if isinstance(effort, str) and "reasoning_effort" not in extra:
            extra = {**extra, "reasoning_effort": effort}
        typed = typed_messages(req.messages)
        sources = chat_image_sources(typed)
        if sources and not rt.backend.supports("images"):
            raise InvalidRequestError(
                f"The model {rt.name!r} does not take images: its Triton backend ({rt.backend.protocol}) has no "
                "image input.", param=sources[0].param, code="unsupported_content")
        placeholder = rt.config.image_placeholder is not None
        messages = template_messages(typed, rt.template, placeholder)
        messages = apply_plan_to_messages(plan, place_system_messages(messages, rt.template), rt)
        return await self.preprocess.chat(
            rt, messages, plan.prefill,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            continue_final_message=req.continue_final_message, tools=plan.tools, bos_token=rt.tokenizer.bos_token,
            eos_token=rt.tokenizer.eos_token, **extra)

    async def prepare(self, req: ChatCompletionRequest, ctx: RequestContext) -> PreparedChat:
        """Everything before generation, shared by chat and the Responses API: the model, the tool plan,
        the output guide, the prompt (rendered and tokenized) and one `GenerationRequest` per choice."""
        rt = self.registry.llm(req.model)
        if req.unknown_fields():
            logger.debug("ignoring unknown chat fields: %s", req.unknown_fields())
        self._refuse_unsupported(rt, req)
        plan = plan_tools(rt, req)
        # A forced tool call's guide wins over the request's own (which shapes content, and there is none).
        guide = plan.guide or request_guide(req)
        if guide is not None:
            require_support(rt.backend, rt.name, guide)
        typed = typed_messages(req.messages)  # the chat dialect typed them at the edge; a service's may not be
        if typed is not req.messages:
            req = req.model_copy(update={"messages": typed})
        prompt = await self.prompt(rt, req, plan)
        sources = chat_image_sources(req.messages)
        self.images.refuse_count(sources)
        # Vision tokens are context too: each image costs the config's image_tokens beyond its placeholder.
        prompt_tokens = len(prompt.ids) + len(sources) * rt.config.image_tokens
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = resolve_max_tokens(rt, requested, prompt_tokens, "messages")
        images = await self.images.load(sources) if sources else []
        greqs = [build_generation_request(rt, req, prompt.ids, max_tokens, ctx.request_id, i, prompt.text, ctx.headers)
                 for i in range(req.n)]
        for g in greqs:
            g.return_logprobs = req.logprobs
            g.top_logprobs = (req.top_logprobs or 0) if req.logprobs else 0
            g.guide = guide
            g.images = images
            g.thinking_budget = req.thinking_token_budget
            g.retention = prompt.retention  # Anthropic cache_control breakpoints (services.retention); else ()
        return PreparedChat(rt, plan, greqs, req.stop_list() + plan.stops, prompt_tokens, prompt.text)

    async def count_reasoning(self, rt: LLMRuntime, out: ChoiceOutput, whole: str) -> int:
        """A whole answer's reasoning tokens: its thinking section (tags included, as a stream counts it)
        re-tokenized, since Triton sent the tokens at once; off the event loop when long."""
        text = whole[: out.thinking_chars]
        return await self.preprocess.run(len(text), count_tokens, rt, text) if text else 0

    async def create(self, req: ChatCompletionRequest, ctx: RequestContext) -> dict[str, Any] | ChatStream:
        """A dict for a plain response (a `chat.completion`), or when `stream` is set the prepared stream
        (`ChatStream`), which the chat dialect encodes as `chat.completion.chunk` events
        (`http.dialects.openai_chat`). Errors in the request raise here, before anything is sent."""
        p = await self.prepare(req, ctx)
        request_id = ctx.request_id
        rt, greqs, stops, prompt_tokens = p.rt, p.greqs, p.stops, p.prompt_tokens
        completion_id = f"chatcmpl-{request_id}" if request_id else f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ChatStream(rt, greqs, stops, prompt_tokens, completion_id, prepared=p, created=created,
                              model=req.model, n=req.n, logprobs=req.logprobs, include_usage=include_usage)
        results = await collect_plain(rt, greqs, stops)
        choices = []
        completion_tokens = reasoning_tokens = 0
        for i, (text, finish, produced, ids, lps, _) in enumerate(results):
            completion_tokens += produced
            out = p.output()
            message, finish = chat_message(assemble(out.push(text, last=True, cut=finish == "length")), finish,
                                           rt.reasoning_parser is not None)
            reasoning_tokens += await self.count_reasoning(rt, out, text)
            logprobs = {"content": logprob_entries(rt, ids, lps), "refusal": None} if req.logprobs else None
            choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        usage = usage_dict(prompt_tokens, completion_tokens, reasoning_tokens if rt.reasoning_parser else None,
                           request_cached_tokens(greqs, [r.cached_tokens for r in results]))
        return {"id": completion_id, "object": "chat.completion", "created": created, "model": req.model,
                "choices": choices, "usage": usage}


def chat_message(answer: Assembled, finish: str, reasoning: bool) -> tuple[dict[str, Any], str]:
    """A plain answer's `message` and its finish reason ("tool_calls" when it holds calls, unless cut by
    max_tokens: then "length" and the calls as produced)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if reasoning:
        message["reasoning_content"] = answer.reasoning or None
    if answer.calls:
        message["content"] = answer.content.strip() or None
        message["tool_calls"] = [c.to_openai() for c in answer.calls]
        if finish != "length":
            finish = "tool_calls"
    return message, finish


def count_tokens(rt: LLMRuntime, text: str) -> int:
    """Tokens of a piece of the output (the reasoning), for usage details."""
    return len(rt.tokenizer.encode(text)) if text else 0
