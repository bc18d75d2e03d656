"""`/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the same chat pipeline.

A Messages request becomes a chat request (`MessagesCall.chat`), as the Responses API's does; from there it is
`ChatService.prepare` (template, tokens, tool plan, guides), the shared generation path and one choice's
`Delta`s from `PreparedChat.output()` (the model family's reasoning and tool-call parsers). Only the edges
are Anthropic's:

* **In**: the dialect at the HTTP edge (`http.dialects.anthropic_messages`) parses a body once into a
  `MessagesCall`: the chat request (messages from typed parts, `services.parts`), and what only Anthropic's
  answer needs (the client's model name, stop sequences, the thinking budget and display, context edits, the
  path of each image block for errors).
* **Reasoning controls** (`services.effort`, set only where the model's template reads them): `thinking`
  `{type: enabled, budget_tokens}`, `adaptive` or `between_tools` (no budget) switch thinking on, `disabled` off
  (`enable_thinking` for Qwen3-style templates, `thinking` for DeepSeek-V3.1's); `output_config.effort` (low /
  medium / high / max) is gpt-oss's `reasoning_effort`, and switches thinking when `thinking` does not.
  `thinking.display` `omitted` and `updates` send thinking blocks with their signature and no text; other
  displays (`summarized`) send the text. * **Structured output**: `output_config.format` (or the beta's
  top-level `output_format`) `{type: json_schema, schema}` is chat's `response_format` json_schema: the answer's
  text block follows the schema, plain and streamed, through the same guide; a schema that cannot be compiled,
  or a backend without guided decoding, is a 400 naming the field. A `strict: true` tool's `input_schema` is
  checked as that guide too (a 400 for what cannot be compiled); a forced call of it is guided by it, as every
  forced call is; under `tool_choice` auto the model's calls are parsed, not constrained, as on chat. *
  **Context editing**: `context_management.edits` (`clear_thinking_20251015`, `clear_tool_uses_20250919`) are
  applied to the history before the prompt is rendered and reported in the answer's
  `context_management.applied_edits` (`services.context_edits`); count_tokens counts the edited prompt.
* **Thinking budget**: enforced by generating in two phases (`services.generation.budgeted_chunks`, the
  shared generation core; chat's `thinking_token_budget` is the same knob). Phase 1 generates
  `budget_tokens` minus the tokens of the family's end-of-thinking text (`ReasoningFormat.close`, e.g.
  Qwen3's and DeepSeek-R1's "\n</think>\n\n"). Ended by length with the thinking still open (the model's
  reasoning parser says so), the gateway appends that text and phase 2 generates the answer, up to what is
  left of `max_tokens`, from the prompt, phase 1's output and the end text; ended by length with the
  thinking closed, phase 2 just continues; ended by itself, there is no phase 2. So the thinking, its end
  tag included, is at most `budget_tokens` tokens and an answer follows it. The client sees one answer
  (thinking block, then text / tool_use blocks), streamed or plain; `output_tokens` counts both phases'
  generated tokens and the injected end text's tokens (`max_tokens` bounds all of them); `stop_reason` is
  the last phase's. A family whose section cannot be closed from outside (harmony's channels), or a
  budget too small to hold the end text, is capped as a fallback: past the budget the thinking is
  generated (and counted) but not sent.
* **Out**: a `message` (`msg_<request id>`) with `thinking` blocks (a `signature`: an opaque digest of
  the thinking, nothing a client can verify), `text` blocks and `tool_use` blocks (`toolu_...` ids from
  the parser's `call_...` ids; a family that writes its own ids, Kimi K2's, keeps them), in the order
  generated; `stop_reason` `end_turn`, `max_tokens`, `stop_sequence` (with `stop_sequence` set to the
  request's sequence that matched) or `tool_use`; `usage` as Anthropic splits the prompt: `cache_read_input_tokens`
  the prompt tokens the backend reported reading from its KV cache (`GenerationChunk.cached_tokens`; 0 where
  the backend cannot say), `input_tokens` the rest of the prompt (Anthropic's `input_tokens` excludes the
  cached ones: the three add up to the prompt), `cache_creation_input_tokens` 0 (the engines keep every
  prefilled block on their own, at no charge; nothing here is the paid write at a `cache_control` breakpoint
  that field counts), `output_tokens`. The plain answer and the streamed one are built by the same
  `BlockBuilder` from the same deltas (a stream's, the dialect's `StreamedBlocks`, writes its events as well), so
  they are one answer.
* **Streaming**: Anthropic's event grammar with `event:` lines: `message_start` and a `ping`, then per
  block `content_block_start`, its `content_block_delta`s (`thinking_delta` then one `signature_delta`,
  `text_delta`, `input_json_delta`), `content_block_stop`; then `message_delta` (stop reason, the final usage,
  every count: `message_start`'s cache figure is the backend's as of the first tokens) and
  `message_stop`. A stream with nothing to send for `PING_INTERVAL_S` gets a `ping` (`PING`, written by
  the dialect's stream writer, `http.dialects.anthropic_messages`, which encodes the stream,
  `MessagesStream`). An error after the stream began is an
  `error` event in Anthropic's shape. Per token a plain answer (no tools, no reasoning parser) costs what chat's
  does: its text goes straight to a `text_delta` whose bytes are built from a per-block prefix, with no parser
  pass.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import ChatCompletionRequest, ChatMessage
from openai_api.services.chat import ChatService, PreparedChat, count_tokens
from openai_api.services.context import RequestContext
from openai_api.services.context_edits import Applied, Edit, apply_edits, needs_prompt_tokens
from openai_api.services.generation import sequence_events
from openai_api.services.images import chat_image_sources
from openai_api.services.output import ChoiceOutput, Delta
from openai_api.services.registry import LLMRuntime
from openai_api.services.retention import strip_marks
from openai_api.services.streaming import StreamPlan
from openai_api.services.tools import plan_tools
from openai_api.text.templates import ChatTemplate

# `thinking.display` values that send thinking blocks without their text: `omitted`, and `updates` (only the
# progress notes a Claude model writes between tool calls are shown, which a self-hosted model has none of).
# Any other display (`summarized`, the default; newer ones) sends the text.
HIDDEN_THINKING = ("omitted", "updates")


@dataclass(slots=True)
class MessagesCall:
    """A Messages (or count_tokens) request as the dialect parsed it: the chat request it is, and what only
    Anthropic's answer needs. `images`: the client's path of each image block, in order (the k-th image part of
    `chat` is the k-th); `format_param`: the client's field of the structured output's schema."""

    chat: ChatCompletionRequest
    model: str  # as the client named it (an alias stays an alias in the answer)
    stream: bool
    stop_sequences: list[str]
    thinking_budget: int | None
    omit_thinking: bool  # `thinking.display` omitted / updates: the blocks, without their text
    edits: list[Edit]
    images: list[str]
    format_param: str


# The chat field a structured output travels in, as the client named it.
_FORMAT_PARAM = "response_format.json_schema.schema"


def _named_block(err: InvalidRequestError, call: MessagesCall, chat_req: ChatCompletionRequest) -> InvalidRequestError:
    """A refusal of one of chat's image parts (the fetcher's, or an adapter's image cap) named as the client's
    own image block: the k-th image part of the chat request is the k-th image block of the Messages request
    (system and tool_result blocks shift chat's indices, never the order). Anthropic's error carries no
    `param`, so the block's path leads the message as the dialect's other 400s do. Other errors unchanged."""
    chat_params = [s.param for s in chat_image_sources(chat_req.messages)]
    if err.param not in chat_params:
        return err
    path = call.images[chat_params.index(err.param)]
    return InvalidRequestError(f"{path}: {err.message}", param=path, code=err.code)


def _format_error(err: InvalidRequestError, call: MessagesCall) -> InvalidRequestError:
    """A refusal of the structured output's guide (a backend without guided decoding) named by the client's
    own field rather than chat's."""
    if err.param != _FORMAT_PARAM:
        return err
    where = call.format_param
    return InvalidRequestError(err.message.replace(_FORMAT_PARAM, where), param=where, code=err.code)


def anthropic_call_id(call_id: str) -> str:
    """Anthropic's `toolu_` prefix on the parser's `call_` ids; an id the model wrote itself stays as it is."""
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


def signature(thinking: str) -> str:
    """An opaque `signature` for a thinking block (Anthropic's are encrypted; clients only pass them back)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


class BlockBuilder:
    """Deltas -> Anthropic content blocks, in order (the plain answer's; a stream's builder, in the dialect,
    `http.dialects.anthropic_events.StreamedBlocks`, writes the events that build them through the `_on_*` hooks).

    One block is open at a time; a new kind of delta closes it and opens the next, so blocks keep the order
    they were generated in. Text that is only whitespace does not open a text block until more text follows
    (the blank between a thinking section and a tool call is no answer): plain and streamed answers drop it
    alike. Thinking past `budget` tokens (counted by the `ChoiceOutput`) is not sent."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking  # `thinking.display: omitted`: the blocks, without their text
        self.blocks: list[dict[str, Any]] = []
        self.calls = 0
        self._open: str | None = None
        self._parts: list[str] = []
        self._blank = ""

    def text(self, text: str) -> list[bytes]:
        """`push` of one content delta (a plain answer's per-token path)."""
        if self._open == "text" and text:
            self._parts.append(text)
            return []
        return self.push([Delta("content", text)]) if text else []

    def push(self, deltas: list[Delta]) -> list[bytes]:
        """Add `deltas` to the blocks; what the hooks wrote for them (nothing here)."""
        out: list[bytes] = []
        for d in deltas:
            if d.kind == "reasoning":
                if not d.text:
                    continue
                if self._open != "thinking":
                    self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}, out)
                if self.omit_thinking:
                    continue
                self._parts.append(d.text)
                self._on_delta(b'"thinking_delta","thinking":', d.text, out)
            elif d.kind == "content":
                if self._open != "text":
                    pending = self._blank + d.text
                    if not pending.strip():
                        self._blank = pending
                        continue
                    text = pending.lstrip()
                    self._start("text", {"type": "text", "text": ""}, out)
                else:
                    text = d.text
                self._parts.append(text)
                self._on_delta(b'"text_delta","text":', text, out)
            elif d.kind == "call":
                self.calls += 1
                self._start("tool_use", {"type": "tool_use", "id": anthropic_call_id(d.call_id), "name": d.name,
                                         "input": {}}, out)
            elif d.text:  # a call's arguments
                self._parts.append(d.text)
                self._on_delta(b'"input_json_delta","partial_json":', d.text, out)
        return out

    def _start(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        out += self.close()
        self._blank = ""
        self._open, self._parts = kind, []
        self.blocks.append(block)
        self._on_start(len(self.blocks) - 1, block, out)

    def close(self) -> list[bytes]:
        """Close the open block (its final content); what the hooks wrote for it (nothing here)."""
        if self._open is None:
            return []
        out: list[bytes] = []
        index = len(self.blocks) - 1
        text = "".join(self._parts)
        block = dict(self.blocks[index])
        if self._open == "thinking":
            block["thinking"], block["signature"] = text, signature(text)
        elif self._open == "text":
            block["text"] = text
        else:
            try:
                args = json.loads(text) if text.strip() else {}
            except ValueError:
                args = {}  # cut by max_tokens mid-call: the arguments as far as they parse are none
            block["input"] = args if isinstance(args, dict) else {}
        self.blocks[index] = block
        self._open, self._parts = None, []
        self._on_stop(index, block, out)
        return out

    # What a stream writes as its blocks are built (nothing for a plain answer).
    def _on_start(self, index: int, block: dict[str, Any], out: list[bytes]) -> None:
        """Block `index` opened (`block` as it starts)."""

    def _on_delta(self, head: bytes, text: str, out: list[bytes]) -> None:
        """`text` added to the open block; `head`: its delta's type and field, as JSON up to the value."""

    def _on_stop(self, index: int, block: dict[str, Any], out: list[bytes]) -> None:
        """Block `index` closed (`block` whole)."""


def stop_reason(finish: str, stop: str | None, stops: list[str], calls: int) -> tuple[str, str | None]:
    """Chat's finish reason as Anthropic's `stop_reason` and `stop_sequence`."""
    if finish == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if stop is not None and stop in stops:
        return "stop_sequence", stop
    return "end_turn", None


class MessagesService:
    def __init__(self, chat: ChatService, keep_billing_header: bool = False) -> None:
        self.chat = chat
        self.keep_billing_header = keep_billing_header
        self.aliases: dict[str, str] = {}
        for m in chat.registry.config.llm:
            for alias in getattr(m, "aliases", None) or ():
                self.aliases[alias] = m.name

    def model(self, name: str) -> str:
        """The served model a request's `model` names: itself, or the model whose `aliases` list it."""
        return name if name in self.chat.registry.llms else self.aliases.get(name, name)

    def takes_images(self, model: str) -> bool:
        """Whether the served `model` takes images (a 404 when there is no such model)."""
        return self.chat.registry.llm(model).backend.supports("images")

    def template(self, model: str) -> ChatTemplate | None:
        """The served `model`'s chat template (None: no such model, or none), for its reasoning controls."""
        rt = self.chat.registry.llms.get(model)
        return rt.template if rt is not None else None

    async def edited(self, call: MessagesCall) -> tuple[ChatCompletionRequest, Applied | None]:
        """The chat request after the call's `context_management` edits (`services.context_edits`), and what
        they cleared; unchanged and None without edits."""
        chat_req, edits = call.chat, call.edits
        if not edits:
            return chat_req, None
        rt = self.chat.registry.llm(chat_req.model)

        async def tokens(text: str) -> int:
            text = strip_marks(text)[0]  # a cache_control breakpoint's marker is no prompt text
            return await self.chat.preprocess.run(len(text), count_tokens, rt, text)

        prompt_tokens = None
        if needs_prompt_tokens(edits):
            try:
                prompt_tokens = len((await self.chat.prompt(rt, chat_req, plan_tools(rt, chat_req))).ids)
            except InvalidRequestError as e:
                raise _named_block(e, call, chat_req) from None
        messages = [m.model_dump(exclude_none=True) for m in chat_req.messages]
        edited, applied = await apply_edits(edits, messages, prompt_tokens, tokens)
        return chat_req.model_copy(update={"messages": [ChatMessage.model_validate(m) for m in edited]}), applied

    async def count_tokens(self, call: MessagesCall) -> dict[str, Any]:
        """`{input_tokens}`: the prompt through the model's template and tokenizer, as `/v1/messages` sends it
        (after its context edits)."""
        chat_req, _ = await self.edited(call)
        rt = self.chat.registry.llm(chat_req.model)
        try:
            prompt = await self.chat.prompt(rt, chat_req, plan_tools(rt, chat_req))
        except InvalidRequestError as e:
            raise _named_block(e, call, chat_req) from None
        return {"input_tokens": len(prompt.ids)}

    async def create(self, call: MessagesCall, ctx: RequestContext) -> dict[str, Any] | MessagesStream:
        """A `message`, or when the call streams the prepared stream (`MessagesStream`)."""
        chat_req, applied = await self.edited(call)
        try:
            prepared = await self.chat.prepare(chat_req, ctx)
        except InvalidRequestError as e:
            raise _named_block(_format_error(e, call), call, chat_req) from None
        answer = MessageAnswer(call, prepared, ctx.request_id, applied)
        if call.stream:  # encoded by the dialect (`http.dialects.anthropic_messages.encode`)
            return MessagesStream(prepared.rt, prepared.greqs, prepared.stops, prepared.prompt_tokens, answer.id,
                                  answer)
        greq = prepared.greqs[0]
        if not prepared.stops and not prepared.rt.stop_strings:
            greq.stream_tokens = False  # nothing to cut at mid-way: one response from Triton is enough (as chat)
        parts: list[str] = []
        finish, produced, stop, cached = "stop", 0, None, None
        async for ev in sequence_events(prepared.rt, greq, prepared.stops):
            parts.append(ev.text)
            if ev.finish_reason:
                finish, produced, stop, cached = ev.finish_reason, ev.completion_tokens, ev.stop, ev.cached_tokens
        text = "".join(parts)
        deltas = answer.output.push(text, last=True, cut=finish == "length")
        answer.blocks.push(answer.cap_plain(deltas, prepared.rt))
        answer.blocks.close()
        return answer.message(finish, stop, produced, cached)


class MessageAnswer:
    """One answer's state: its id, its choice output (parsers), its blocks and the thinking budget."""

    def __init__(self, call: MessagesCall, prepared: PreparedChat, request_id: str,
                 applied: Applied | None = None) -> None:
        self.call = call
        self.applied = applied
        self.prepared = prepared
        self.id = f"msg_{request_id}"
        self.output: ChoiceOutput = prepared.output()
        self.blocks = BlockBuilder(call.omit_thinking)  # a stream's encoder puts its own in (it writes events)
        self.budget = call.thinking_budget
        self.capped = False

    def cap_stream(self, deltas: list[Delta]) -> list[Delta]:
        """Streamed: reasoning deltas stop once the thinking's generated tokens pass the budget (the fallback
        where the generation core could not force the budget; forced, the thinking never passes it)."""
        if self.budget is None:
            return deltas
        if not self.capped and self.output.reasoning_tokens > self.budget:
            self.capped = True
        return [d for d in deltas if d.kind != "reasoning"] if self.capped else deltas

    def cap_plain(self, deltas: list[Delta], rt: LLMRuntime) -> list[Delta]:
        """Plain: the thinking cut to its first `budget` tokens (re-tokenized, as Triton sent it at once)."""
        if self.budget is None:
            return deltas
        out = []
        for d in deltas:
            if d.kind == "reasoning":
                ids = rt.tokenizer.encode(d.text)
                if len(ids) > self.budget:
                    d = Delta("reasoning", rt.tokenizer.decode(ids[: self.budget]))
            out.append(d)
        return out

    def usage(self, output_tokens: int, cached: int | None) -> dict[str, Any]:
        """Anthropic's usage (module docstring): the prompt split into cache reads and the rest."""
        read = min(cached or 0, self.prepared.prompt_tokens)
        return {"input_tokens": self.prepared.prompt_tokens - read, "output_tokens": output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": read}

    def message(self, finish: str, stop: str | None, produced: int, cached: int | None) -> dict[str, Any]:
        reason, sequence = stop_reason(finish, stop, self.call.stop_sequences, self.blocks.calls)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.call.model,
                "content": self.blocks.blocks, "stop_reason": reason, "stop_sequence": sequence,
                "usage": self.usage(produced, cached), **self.context_management()}

    def context_management(self) -> dict[str, Any]:
        """`{context_management: {applied_edits}}` when the request asked for edits, else nothing."""
        return {"context_management": self.applied.body()} if self.applied is not None else {}


@dataclass(slots=True)
class MessagesStream(StreamPlan):
    """A streamed `/v1/messages` answer, prepared (`StreamPlan`, `stream_id` the message id): `answer` holds its
    state (blocks, parsers, the thinking budget) for the dialect's encoder."""

    answer: MessageAnswer
