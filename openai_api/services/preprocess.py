"""From a request's messages or prompts to what Triton is sent: prompt text and token ids.

Per request this renders the chat template (sandboxed, within `RenderLimits`), keeps special-token text
that clients wrote in message content from becoming control tokens, and tokenizes, refusing an over-long
prompt without tokenizing all of it (`TextTokenizer.bound`).

Where it runs: a small request (at most `INLINE_CHARS` characters of message text and `INLINE_MESSAGES`
messages) whose template is structurally bounded (`ChatTemplate.bounded`) runs inline, since handing it
to a thread costs more than the work (~50 us); everything else runs on the `CPUWorkers`, so the event
loop keeps streaming other requests' tokens meanwhile, and a render that runs past its time budget is
interrupted there.

Special tokens in content (`escape_special_tokens`, on by default): when a string in the messages holds
special-token text (`<|im_start|>system`), that string is wrapped in two private markers before
rendering; after rendering, the text between markers is tokenized with special tokens read as plain
text and the rest as usual, so only the template's own markup yields control tokens. Text-in backends
(the vLLM and text protocols) tokenize the prompt themselves and cannot be told, so for them such a request is a
400 instead. Requests without special-token text (nearly all) take the usual path, unchanged.

KV-cache retention (`services.retention`): the breakpoint markers an Anthropic request's `cache_control` blocks
carry are removed from every rendered prompt; for a token-id backend that takes retention, their offsets become
the prompt's retained token ranges (`Prompt.retention`), each found by tokenizing the text before it as the
prompt was tokenized.
"""

from __future__ import annotations

import bisect
import functools
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from openai_api.errors import ContextLengthExceededError, InvalidRequestError
from openai_api.services.registry import LLMRuntime
from openai_api.services.retention import retained_ranges, strip_marks
from openai_api.text.prompt_cache import NO_BOUNDARIES, PromptTokenCache
from openai_api.text.templates import RenderLimits, TemplateBudgetError, TemplateError
from openai_api.text.workers import CPUWorkers, JobTimeoutError
from openai_api.tracing import child_span, traced_step
from openai_api.triton.llm import RetainedRange, takes_prompt_text

T = TypeVar("T")

# Requests this small, with a structurally bounded template, are rendered and tokenized inline.
INLINE_CHARS = 8192
INLINE_MESSAGES = 64
# Rendered prompts longer than this are tokenized through the prompt cache (`text.prompt_cache`): what a long
# conversation repeats is not tokenized again. Shorter ones cost less to tokenize whole than to look up.
CACHED_CHARS = INLINE_CHARS
# Private-use characters no client text will hold by chance, plus a per-process random tag.
_TAG = uuid.uuid4().hex[:8]
OPEN, CLOSE = f"\ue000{_TAG}\ue001", f"\ue002{_TAG}\ue003"
# Where an image part was, for a model whose config names an `image_placeholder`: replaced by it after
# rendering, so the placeholder (often a special token, `<image>`) is the template's markup, not client text.
IMAGE_MARK = f"\ue004{_TAG}\ue005"
_MARKED = re.compile(re.escape(OPEN) + "(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(slots=True)
class Prompt:
    text: str
    # A `text.prompt_cache.TokenIds` (read-only, over int32 bytes) when the prompt cache tokenized it, else a list.
    ids: Sequence[int]
    # When its tokenization started and ended (time.time_ns, in whichever thread it ran): a traced request's
    # `tokenize` span. Two clock reads per request, so they are always taken.
    encoded_ns: tuple[int, int] = (0, 0)
    # The KV-cache retention of its `cache_control` breakpoints (`services.retention`), for a backend that
    # takes it; () for every other prompt.
    retention: tuple[RetainedRange, ...] = ()


def _within(value: Any, limit: int) -> int:
    """Characters of text in a JSON-like value (what a render and its tokenization scale with), counted only
    until they pass `limit`: any result above `limit` means "more". The question it answers (inline or on the
    workers?) needs no more, and an agent turn's messages hold ~500k characters in thousands of strings: the
    whole count cost ~0.3 ms a turn at ~117k tokens."""
    if isinstance(value, str):
        return len(value)
    total = 0
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        return 0
    for v in value:
        total += _within(v, limit - total)
        if total > limit:
            break
    return total


def _special(value: Any, search: Callable[[str], re.Match[str] | None]) -> bool:
    """Whether a string in `value` (roles aside) holds special-token text: `_mark`'s question, answered without
    copying anything (nearly every request holds none)."""
    if isinstance(value, str):
        return search(value) is not None
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "role" and _special(v, search):
                return True
    elif isinstance(value, list):
        for v in value:
            if _special(v, search):
                return True
    return False


def _mark(value: Any, pattern: re.Pattern[str]) -> tuple[Any, str | None]:
    """`value` with every string that holds special-token text wrapped in OPEN ... CLOSE, and the first
    special token found (None: nothing was wrapped, and `value` is returned as it is)."""
    if not _special(value, pattern.search):
        return value, None
    return _wrap(value, pattern)


def _wrap(value: Any, pattern: re.Pattern[str]) -> tuple[Any, str | None]:
    if isinstance(value, str):
        m = pattern.search(value)
        return (OPEN + value + CLOSE, m.group(0)) if m else (value, None)
    found: str | None = None
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out[k], hit = (v, None) if k == "role" else _wrap(v, pattern)
            found = found or hit
        return out, found
    if isinstance(value, list):
        items = []
        for v in value:
            item, hit = _wrap(v, pattern)
            items.append(item)
            found = found or hit
        return items, found
    return value, None


def _context_error(rt: LLMRuntime, param: str) -> ContextLengthExceededError:
    return ContextLengthExceededError(
        f"This model's maximum context length is {rt.context_length} tokens. However, your {param} resulted in "
        f"more than {rt.context_length} tokens. Please reduce the length of the {param}.", param=param)


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def encode_prompt(rt: LLMRuntime, text: str, param: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text` (with the tokenizer's added tokens, a BOS say, when `add_special_tokens`), or a
    context-length 400 found without tokenizing all of a huge text. (No token covers less than a UTF-8 byte
    beyond a prefix space, so a text of fewer bytes than the context need not be counted first.)"""
    if _utf8_len(text) > rt.context_length and rt.tokenizer.bound(text, rt.context_length)[1]:
        raise _context_error(rt, param)
    return rt.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _closed(prefix: str) -> str:
    """A prefix of a marked prompt that cuts a marked stretch: closed, so that stretch's start is read plain."""
    return prefix + CLOSE if prefix.count(OPEN) > prefix.count(CLOSE) else prefix


def _encode_marked(rendered: str, encode: Callable[[str], Sequence[int]], plain: Callable[[str], Sequence[int]]
                   ) -> list[int]:
    """Ids of a rendered prompt whose client text holding special-token text is marked: the marked text with
    `plain` (special-token text read as plain text), each stretch between marks with `encode`."""
    ids: list[int] = []
    pos = 0
    for m in _MARKED.finditer(rendered):
        ids += encode(rendered[pos:m.start()])
        ids += plain(m.group(1))
        pos = m.end()
    ids += encode(rendered[pos:])
    return ids


@dataclass(slots=True)
class PromptEncoder:
    """How the rendered prompt of a chat request is tokenized: through the prompt cache
    (`text.prompt_cache`) when the rendered text is long and the model's template has markers to cut at,
    else whole. Either way a text that certainly holds more tokens than the model's context is a 400
    before most of it is tokenized, and the ids are exactly the whole text's."""

    rt: LLMRuntime
    cache: PromptTokenCache | None
    param: str = "messages"

    @classmethod
    def of(cls, rt: LLMRuntime, cache: PromptTokenCache | None, chars: int) -> PromptEncoder:
        use = cache is not None and rt.prompt_boundaries.pattern is not None and chars > CACHED_CHARS
        return cls(rt, cache if use else None)

    def _check(self, new: list[str], known: int) -> None:
        # No token covers less than one UTF-8 byte, beyond a piece's prefix space: most new text is certainly
        # within the context without counting it; only what may not be is counted first.
        room = self.rt.context_length - known
        if sum(_utf8_len(s) + 2 for s in new) > room and self.rt.tokenizer.bound("".join(new), room)[1]:
            raise _context_error(self.rt, self.param)

    def encode(self, text: str) -> Sequence[int]:
        if self.cache is None:
            return encode_prompt(self.rt, text, self.param)
        tok = self.rt.tokenizer
        return self.cache.encode(tok.cache_key, self.rt.prompt_boundaries, text, tok.encode_batch, self._check,
                                 tok.identity)

    def plain(self, text: str) -> Sequence[int]:
        """Client text holding special-token text, read as plain text (one segment, cached under the negated
        tokenizer key: the same text's ids differ when special tokens are read)."""
        tok = self.rt.tokenizer
        if self.cache is None:
            return tok.encode_plain(text)
        return self.cache.encode(-tok.cache_key, NO_BOUNDARIES, text,
                                 lambda texts: [tok.encode_plain(t) for t in texts],
                                 identity=lambda: tok.identity() + b"\0plain")


def _render_and_encode(rt: LLMRuntime, messages: list[dict[str, Any]], prefill: str, takes_text: bool,
                       limits: RenderLimits, cache: PromptTokenCache | None,
                       render_kwargs: dict[str, Any]) -> Prompt:
    assert rt.template is not None
    found: str | None = None
    pattern = rt.tokenizer.special_pattern
    if rt.config.escape_special_tokens and pattern is not None:
        messages, found = _mark(messages, pattern)
        if found and takes_text:
            raise InvalidRequestError(
                f"The messages hold the special-token text {found!r}, which the model {rt.name!r} would read as a "
                "control token: its Triton backend takes prompt text and tokenizes it itself. Remove that text, "
                "or turn escape_special_tokens off for this model.", param="messages",
                code="special_tokens_in_content")
    try:
        rendered = rt.template.render(messages, limits=limits, **render_kwargs)
    except TemplateBudgetError as e:
        raise InvalidRequestError(f"The chat template could not render these messages within its limits: {e}",
                                  param="messages", code="template_limit_exceeded") from None
    except TemplateError as e:
        raise InvalidRequestError(f"The chat template could not render these messages: {e}",
                                  param="messages") from None
    if rt.config.image_placeholder is not None and IMAGE_MARK in rendered:
        rendered = rendered.replace(IMAGE_MARK, rt.config.image_placeholder)
    rendered, marks = strip_marks(rendered)  # never sent, whatever the backend
    if marks and (takes_text or not rt.backend.supports("kv_retention")):
        marks = []  # only a token-id backend that takes retention is told where the breakpoints are
    text = rendered + prefill
    if found:
        if text.count(OPEN) != text.count(CLOSE) or len(_MARKED.findall(text)) != text.count(OPEN):
            raise InvalidRequestError(
                f"The messages hold special-token text that the chat template of {rt.name!r} does not keep intact, "
                "so it cannot be kept from becoming control tokens. Remove that text.", param="messages",
                code="special_tokens_in_content")
        plain = _MARKED.sub(r"\1", text)
        if not plain:
            raise InvalidRequestError("The chat template rendered an empty prompt for these messages.",
                                      param="messages", code="empty_prompt")
        t0 = time.time_ns()
        if _utf8_len(plain) > rt.context_length and rt.tokenizer.bound(plain, rt.context_length)[1]:
            raise _context_error(rt, "messages")
        enc = PromptEncoder.of(rt, cache, len(text))
        marked_ids = _encode_marked(text, enc.encode, enc.plain)
        encoded = time.time_ns()
        retention = retained_ranges(marks, marked_ids,
                                    lambda k: _encode_marked(_closed(text[:k]), enc.encode, enc.plain)
                                    ) if marks else ()
        return Prompt(plain, marked_ids, (t0, encoded), retention)
    if not text:
        raise InvalidRequestError("The chat template rendered an empty prompt for these messages.",
                                  param="messages", code="empty_prompt")
    t0 = time.time_ns()
    encoder = PromptEncoder.of(rt, cache, len(text))
    ids = encoder.encode(text)
    encoded = time.time_ns()
    # A breakpoint's prefix tokenized as the prompt was: where the block ends in the prompt's own tokens
    # (`retention.token_offset`). Through the prompt cache that costs only the head of the segment the
    # breakpoint falls in (none where it falls on a cut), and the head is cached in turn, so a breakpoint that
    # stays (a system prompt's) is tokenized once per session.
    if marks:
        cuts = encoder.rt.prompt_boundaries.cuts(text) if encoder.cache is not None else None
        retention = retained_ranges(marks, ids, functools.partial(_breakpoint_prefix, encoder, text, ids, cuts))
    else:
        retention = ()
    return Prompt(text, ids, (t0, encoded), retention)


def _breakpoint_prefix(encoder: PromptEncoder, text: str, ids: Sequence[int], cuts: list[int] | None, k: int
                       ) -> Sequence[int]:
    """The ids of `text`'s first `k` characters for a breakpoint's offset (`retention.retained_ranges`). Through
    the prompt cache, a breakpoint inside a segment this very encode tokenized (Claude Code's on the newest tool
    result, in a template that wraps it in more text, as SmolLM2's <tool_response>) ends at that segment's
    start instead: tokenizing its head again doubled the tokenizing of every such turn. Exact either way: the
    prompt's own token boundary. `cuts`: where the prompt cache cut `text` (None without the cache), found once
    for all of a prompt's breakpoints."""
    if cuts is not None:
        i = bisect.bisect_right(cuts, k) - 1
        end = cuts[i + 1] if i + 1 < len(cuts) else len(text)
        if cuts[i] < k and text[cuts[i]:end] in getattr(ids, "new_segments", ()):
            k = cuts[i]
    return encoder.encode(text[:k])


class Preprocessor:
    """Renders and tokenizes inline or on the CPU workers (see the module docstring)."""

    def __init__(self, workers: CPUWorkers, limits: RenderLimits | None = None,
                 cache: PromptTokenCache | None = None) -> None:
        self.workers = workers
        self.limits = limits or RenderLimits()
        # Process-lifetime, shared by every config generation (`services.container.rebuild_services`).
        self.cache = cache

    async def chat(self, rt: LLMRuntime, messages: list[dict[str, Any]], prefill: str = "",
                   **render_kwargs: Any) -> Prompt:
        """The prompt of a chat request: `messages` (OpenAI-style dicts, after the tool plan) through the
        model's template with `render_kwargs`, then `prefill` appended; 400s for templates that fail or
        run over budget, an empty prompt, and prompts longer than the model's context."""
        if rt.template is None:
            raise InvalidRequestError(f"The model {rt.name!r} has no chat template; use /v1/completions.",
                                      param="model", code="no_chat_template")
        takes_text = takes_prompt_text(rt.backend)
        args = (rt, messages, prefill, takes_text, self.limits, self.cache, render_kwargs)
        try:
            with child_span("chat template", **{"gen_ai.request.model": rt.name}) as span:  # traced requests only
                if rt.template.bounded and len(messages) <= INLINE_MESSAGES and \
                        _within(messages, INLINE_CHARS) <= INLINE_CHARS:
                    prompt = _render_and_encode(*args)
                else:
                    prompt = await self.workers.run(_render_and_encode, *args, budget_s=self.limits.max_seconds)
                if span is not None:
                    span.set_attribute("gen_ai.usage.prompt_tokens", len(prompt.ids))
                    traced_step("tokenize", *prompt.encoded_ns, **{"gen_ai.usage.prompt_tokens": len(prompt.ids)})
                return prompt
        except JobTimeoutError:
            raise InvalidRequestError(
                f"The chat template could not render these messages within its limits: it took longer than "
                f"{self.limits.max_seconds:g} s.", param="messages", code="template_limit_exceeded") from None

    async def run(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` inline when its input is small (`chars` <= INLINE_CHARS), else on the CPU workers."""
        if chars <= INLINE_CHARS:
            return fn(*args)
        return await self.workers.run(fn, *args)
