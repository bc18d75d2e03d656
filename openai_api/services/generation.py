"""The generation core shared by chat and completions: a request's sequences, and token ids from the
backend turned into safe text.

Per token it does O(1) work: incremental detokenization, then the stop-string matcher over the
new text plus a bounded held-back tail. A stop match closes the backend's iterator, which cancels
the Triton request so the model stops spending compute on text nobody will see.

A request with a thinking budget (`GenerationRequest.thinking_budget`) is generated in two phases
(`budgeted_chunks`, budget forcing as Qwen3's report and vLLM's `thinking_token_budget` describe it): the
reader of the chunks sees one sequence, so every API (chat, the Messages API) reads it as it reads any.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from openai_api.errors import BackendError, ContextLengthExceededError, InvalidRequestError
from openai_api.schemas.openai import _Sampling
from openai_api.services.context import Headers
from openai_api.services.guides import backend_refusal
from openai_api.services.registry import LLMRuntime
from openai_api.text.detokenizer import IncrementalDetokenizer
from openai_api.text.families import REASONING, OutputParser
from openai_api.text.stops import StopStringMatcher
from openai_api.triton.llm import GenerationChunk, GenerationRequest, Guide
from openai_api.triton.routing import session_key


class TokenLogprobs(list[float]):
    """The sampled tokens' log-probs, and in `top`, when alternatives were asked for, per token its most
    likely tokens as (token id, log-prob), most likely first (`GenerationChunk.top_logprobs`). A list, so
    that what reads only the sampled log-probs (the Responses API, usage) needs to know nothing more."""

    __slots__ = ("top",)

    def __init__(self, values: list[float] | None = None, top: list[list[tuple[int, float]]] | None = None) -> None:
        super().__init__(values or ())
        self.top = top


@dataclass(slots=True)
class TextEvent:
    """New text safe to send ("" allowed), and on the last event of a sequence its finish reason.

    `token_ids`/`logprobs` are the tokens consumed since the previous event (text held back by the
    stop matcher is reported with the event that finally releases it). `cached_tokens`: the sequence's
    prompt tokens its backend reported reading from its KV cache, as of this event (None: not reported, or
    a backend that cannot say; `GenerationChunk.cached_tokens`)."""

    text: str
    finish_reason: str | None
    completion_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: TokenLogprobs | None = None
    # The stop string that ended the sequence, when one did (Anthropic's `stop_sequence` names it).
    stop: str | None = None
    cached_tokens: int | None = None


class SequenceText:
    """One sequence's text as Triton produces it: chunks of token ids (or text) in, text safe to send out.

    `push(chunk)` detokenizes incrementally and runs the stop-string matcher over the new text; it returns
    a `TextEvent` with new text, or None while everything new is held back (a partial character, the
    possible start of a stop string). When a stop string matched, the event carries `finish_reason`
    "stop" and `stopped` is set: the caller closes the backend's iterator, which cancels the Triton
    request. `finish()` is the end of the backend's stream: the held-back tail and the finish reason.
    Push-based, so that on the per-token path it adds a call, not an async generator layer.
    """

    __slots__ = ("_detok", "_matcher", "_max_tokens", "_pending_ids", "_pending_lp", "_pending_top", "_tokenizer",
                 "_want_lp", "cached", "produced", "stopped")

    def __init__(self, rt: LLMRuntime, greq: GenerationRequest, stops: list[str]) -> None:
        self._detok = IncrementalDetokenizer(rt.tokenizer.tokenizer, prefix_ids=greq.prompt_ids, drop_ids=rt.drop_ids)
        # `ignore_eos`: the end tokens' text is no stop (a backend that keeps special tokens may write it).
        own = [t for t in rt.stop_strings if t not in rt.eos_texts] if greq.ignore_eos else rt.stop_strings
        self._matcher = StopStringMatcher([*own, *stops])
        self._tokenizer = rt.tokenizer
        self._max_tokens = greq.max_tokens
        self._want_lp = greq.return_logprobs
        self._pending_ids: list[int] = []
        self._pending_lp: list[float] = []
        # Alternatives per pending token, when asked for (None: not asked for).
        self._pending_top: list[list[tuple[int, float]]] | None = [] if greq.top_logprobs else None
        self.produced = 0
        self.stopped = False
        self.cached: int | None = None  # the backend's latest cached-prompt-token figure

    def push(self, chunk: GenerationChunk) -> TextEvent | None:
        if chunk.cached_tokens is not None:
            self.cached = chunk.cached_tokens
        if chunk.text is not None:
            self.produced += chunk.num_tokens if chunk.num_tokens is not None else len(
                self._tokenizer.encode(chunk.text))
            text = self._matcher.push(chunk.text)
        else:
            self.produced += len(chunk.token_ids)
            text = self._matcher.push(self._detok.steps(chunk.token_ids))
        if self._want_lp:
            self._pending_ids += chunk.token_ids
            self._pending_lp += chunk.logprobs or [0.0] * len(chunk.token_ids)
            if self._pending_top is not None:
                top = chunk.top_logprobs or []
                self._pending_top += top[: len(chunk.token_ids)] + [[]] * (len(chunk.token_ids) - len(top))
        if self._matcher.stopped:
            return self._stopped(text)
        return self._event(text, None) if text else None

    def finish(self) -> TextEvent:
        reason = "length" if self.produced >= self._max_tokens else "stop"
        tail = self._detok.finish()  # a character the ids left incomplete (U+FFFD), or a held batch
        text = self._matcher.push(tail) if tail else ""
        if self._matcher.stopped:
            return self._stopped(text)
        return self._event(text + self._matcher.flush(), reason)

    def _stopped(self, text: str) -> TextEvent:
        """The last event of a sequence a stop string ended (with the text before it)."""
        self.stopped = True
        ev = self._event(text, "stop")
        ev.stop = self._matcher.matched
        return ev

    def _event(self, text: str, finish_reason: str | None) -> TextEvent:
        if not self._want_lp:
            return TextEvent(text, finish_reason, self.produced, cached_tokens=self.cached)
        ev = TextEvent(text, finish_reason, self.produced, self._pending_ids,
                       TokenLogprobs(self._pending_lp, self._pending_top), cached_tokens=self.cached)
        self._pending_ids, self._pending_lp = [], []
        if self._pending_top is not None:
            self._pending_top = []
        return ev


def backend_chunks(rt: LLMRuntime, greq: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
    """The backend's chunks for `greq`: its own generator, or with a thinking budget `budgeted_chunks`, and
    with a guide `guided_chunks` (decided once per request: nothing is added per token without either)."""
    chunks = rt.backend.generate(greq) if greq.thinking_budget is None else budgeted_chunks(rt, greq)
    return chunks if greq.guide is None else guided_chunks(chunks, greq.guide)


async def guided_chunks(chunks: AsyncGenerator[GenerationChunk, None],
                        guide: Guide) -> AsyncGenerator[GenerationChunk, None]:
    """`chunks`, with the backend's refusal to compile `guide` raised as the client's 400 naming the schema
    (`guides.backend_refusal`) instead of Triton's 502. Closing this closes `chunks` (cancelling the request)."""
    try:
        async for chunk in chunks:
            yield chunk
    except BackendError as e:
        refusal = backend_refusal(guide, e)
        if refusal is None:
            raise
        raise refusal from None  # (Triton's own message was logged where it was read: `triton.errors`)
    finally:
        await chunks.aclose()


async def budgeted_chunks(rt: LLMRuntime, greq: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
    """Budget forcing: the chunks of a generation whose thinking section is at most `greq.thinking_budget`
    tokens, its end included (as `ChoiceOutput.reasoning_tokens` counts it), then the answer.

    Phase 1 generates `budget - len(close)` tokens, `close` being the family's end-of-thinking text
    (`ReasoningFormat.close`, e.g. "\n</think>\n\n"). If it ends by itself (an end token, a stop word) that
    is the whole generation. If it ends by length while the model's reasoning parser, fed the prompt and
    phase 1's text, is still inside the thinking section, the gateway writes `close` as if the model had
    (one chunk of its token ids, or its text on text protocols) and phase 2 generates the rest of
    `max_tokens` from the prompt, phase 1's output and `close`; ended by length with the section already
    closed, phase 2 continues from the prompt and phase 1's output alone. The prompt is carried as the
    protocol carries it: token ids (phase 1's own ids, then `close` tokenized) or text (phase 1's text,
    then `close`). `close`'s tokens count as output (`max_tokens` bounds phase 1, them and phase 2
    together), so usage counts every token of the answer the model saw as its own; phase 2 is marked
    `prompt_counted`, so key quotas and metrics count the client's prompt once and each phase's generated
    tokens (not `close`); for the same reason phase 2's chunks carry no `cached_tokens` (its prompt is not the
    client's: what usage reports as cached is phase 1's figure). Closing this generator closes the running
    phase's backend stream, which cancels its Triton request.

    Nothing is forced (one generation, as sent) when the family has no `close` (harmony's channels, a
    model without a reasoning parser), when a guide shapes the output, or when the budget cannot bind
    (`max_tokens` fits in it) or cannot hold `close` itself; the Messages API then still caps what it sends.
    """
    budget = greq.thinking_budget or 0
    fmt = REASONING.get(rt.reasoning_parser or "")
    close = fmt.close if fmt is not None else None
    close_ids = rt.tokenizer.encode(close) if close else []
    first = budget - len(close_ids)
    if fmt is None or not close or greq.guide is not None or first < 1 or first >= greq.max_tokens:
        chunks = rt.backend.generate(greq)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()  # the reader left (a stop string, a disconnect): cancel the Triton request
        return
    phase1 = dataclasses.replace(greq, max_tokens=first, thinking_budget=None,
                                 min_tokens=min(greq.min_tokens, first) if greq.min_tokens else None)
    ids: list[int] = []
    texts: list[str] = []
    produced = 0
    chunks = rt.backend.generate(phase1)
    try:
        async for chunk in chunks:
            if chunk.text is not None:  # a text protocol: counted as `SequenceText` counts it
                texts.append(chunk.text)
                produced += chunk.num_tokens if chunk.num_tokens is not None else len(
                    rt.tokenizer.encode(chunk.text))
            else:
                ids += chunk.token_ids
                produced += len(chunk.token_ids)
            yield chunk
    finally:
        await chunks.aclose()
    if produced < first:
        return  # ended by itself: the whole answer
    output = "".join(texts) if texts else rt.tokenizer.decode(ids, skip_special_tokens=False)
    parser = OutputParser(None, fmt, prompt=greq.prompt_text)
    parser.push(output)
    inject, inject_ids = (close, close_ids) if parser.thinking else ("", [])
    room = greq.max_tokens - produced - len(inject_ids)
    if room < 1:
        return
    if texts:
        prompt_ids = [*greq.prompt_ids, *rt.tokenizer.encode(output + inject)]  # counts and routes; text is sent
    else:
        prompt_ids = [*greq.prompt_ids, *ids, *inject_ids]
    left = (greq.min_tokens or 0) - produced - len(inject_ids)
    phase2 = dataclasses.replace(greq, prompt_ids=prompt_ids, prompt_text=greq.prompt_text + output + inject,
                                 max_tokens=room, thinking_budget=None, min_tokens=left if left > 0 else None,
                                 prompt_counted=True)
    if inject:
        yield (GenerationChunk(token_ids=[], text=inject, num_tokens=len(inject_ids)) if texts
               else GenerationChunk(token_ids=list(inject_ids)))
    chunks = rt.backend.generate(phase2)
    try:
        async for chunk in chunks:
            chunk.cached_tokens = None  # phase 2's prompt is not the client's (see the docstring)
            yield chunk
    finally:
        await chunks.aclose()


async def sequence_events(rt: LLMRuntime, greq: GenerationRequest,
                          stops: list[str]) -> AsyncGenerator[TextEvent, None]:
    """A sequence's `TextEvent`s, the last one carrying its finish reason; closing early (or a stop
    string) closes the backend's iterator, which cancels the Triton request."""
    seq = SequenceText(rt, greq, stops)
    chunks = backend_chunks(rt, greq)
    try:
        async for chunk in chunks:
            ev = seq.push(chunk)
            if ev is not None:
                yield ev
                if seq.stopped:
                    return
        yield seq.finish()
    finally:
        await chunks.aclose()


class Collected(NamedTuple):
    """A whole (non-streamed) sequence: its text, finish reason, token count and sampled-token log-probs
    (with their alternatives when asked for), and its prompt tokens the backend read from its KV cache (None:
    not reported)."""

    text: str
    finish_reason: str
    completion_tokens: int
    token_ids: list[int]
    logprobs: TokenLogprobs
    cached_tokens: int | None = None


async def collect_text(rt: LLMRuntime, greq: GenerationRequest, stops: list[str]) -> Collected:
    parts: list[str] = []
    ids: list[int] = []
    lps = TokenLogprobs(top=[] if greq.return_logprobs and greq.top_logprobs else None)
    finish, produced, cached = "stop", 0, None
    async for ev in sequence_events(rt, greq, stops):
        parts.append(ev.text)
        ids += ev.token_ids
        if ev.logprobs:
            lps += ev.logprobs
            if lps.top is not None:
                lps.top += ev.logprobs.top or []
        if ev.finish_reason:
            finish, produced, cached = ev.finish_reason, ev.completion_tokens, ev.cached_tokens
    return Collected("".join(parts), finish, produced, ids, lps, cached)


def request_cached_tokens(greqs: list[GenerationRequest], cached: list[int | None]) -> int | None:
    """A request's cached prompt tokens for usage, from each sequence's figure (`cached`, one per `greqs`):
    usage counts each distinct prompt once (n > 1 sends the same prompt once per choice), so per prompt the
    fewest tokens any of its choices read from the cache (what was cached for every choice; never more than the
    prompt counted once), summed over prompts (a completions request's list of prompts). None when any sequence
    went unreported: a backend that cannot say is not a backend that cached nothing."""
    if any(c is None for c in cached):
        return None
    total = 0
    i = 0
    while i < len(greqs):
        j = i + 1
        while j < len(greqs) and greqs[j].prompt_ids is greqs[i].prompt_ids:
            j += 1
        total += min(c or 0 for c in cached[i:j])
        i = j
    return total


async def collect_choices(rt: LLMRuntime, greqs: list[GenerationRequest], stops: list[str]) -> list[Collected]:
    """Every choice of a non-streamed request, concurrently; the usual single choice runs inline
    (gather would wrap it in a task: one more event-loop hop per request for nothing)."""
    if len(greqs) == 1:
        return [await collect_text(rt, greqs[0], stops)]
    return list(await asyncio.gather(*(collect_text(rt, g, stops) for g in greqs)))


def resolve_max_tokens(rt: LLMRuntime, requested: int | None, prompt_len: int, param: str) -> int:
    """An unset budget means "up to the context limit", never a small default."""
    room = rt.context_length - prompt_len
    if requested is None:
        requested = rt.info.max_tokens if rt.info.max_tokens is not None else room
        requested = min(requested, room)
    if room <= 0 or requested > room:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {rt.context_length} tokens. However, you requested "
            f"{prompt_len + max(requested, 0)} tokens ({prompt_len} in the {param}, {max(requested, 0)} for the "
            f"completion). Please reduce the length of the {param} or the completion.", param=param)
    return requested


def _first(*values: Any) -> Any:
    """Request value, else the config's model_infos, else the model's generation_config.json."""
    return next((v for v in values if v is not None), None)


def refuse_vllm_extensions(req: _Sampling) -> None:
    """400 for vLLM's `skip_special_tokens: false`: the Triton protocols here do not carry it (its default,
    which many vLLM clients always send, is what every request gets). `ignore_eos` is carried: see
    `build_generation_request`."""
    if not req.skip_special_tokens:
        raise InvalidRequestError("skip_special_tokens=false is not supported: special tokens are always left "
                                  "out of the text.", param="skip_special_tokens", code="unsupported_parameter")


def _cache_key(req: _Sampling) -> str | None:
    """OpenAI's `prompt_cache_key` (chat, completions and Responses send it beside the documented fields)."""
    key = (req.model_extra or {}).get("prompt_cache_key")
    return key if isinstance(key, str) and key else None


def build_generation_request(rt: LLMRuntime, req: _Sampling, prompt_ids: Sequence[int], max_tokens: int,
                             request_id: str, choice_index: int = 0, prompt_text: str = "",
                             headers: Headers = ()) -> GenerationRequest:
    info, gdefaults = rt.info, rt.tokenizer.generation_defaults
    # A bias of 0 changes nothing (some clients send {} or zeros by default): only a real bias is refused.
    if req.logit_bias and any(v != 0 for v in req.logit_bias.values()):
        raise InvalidRequestError("logit_bias is not supported by this model's Triton backend.",
                                  param="logit_bias", code="unsupported_parameter")
    if req.min_tokens and req.min_tokens > max_tokens:
        raise InvalidRequestError(f"min_tokens ({req.min_tokens}) must not be more than the completion's token "
                                  f"budget ({max_tokens}).", param="min_tokens")
    temperature = _first(req.temperature, info.temperature, gdefaults.get("temperature"))
    top_k = _first(req.top_k, info.top_k, gdefaults.get("top_k"))
    if top_k is not None and top_k < 0:
        top_k = 0  # -1 is vLLM's "off"; TensorRT-LLM's "off" is 0
    seed = req.seed
    if seed is not None and choice_index:
        seed = (seed + choice_index) % 2**64  # n > 1 with a seed: reproducible, yet distinct choices
    stop_words, stop_texts = rt.stop_token_words, [*rt.stop_strings, *req.stop_list()]
    if req.ignore_eos:
        # As vLLM: past every end-of-sequence token (the config's stop words that are one, as the seed's
        # `stop_words: [[2]]` often is, and their text), to max_tokens; other stop words and strings still stop.
        stop_words = [w for w in stop_words if not (len(w) == 1 and w[0] in rt.eos_ids)]
        stop_texts = [t for t in rt.stop_strings if t not in rt.eos_texts] + req.stop_list()
    return GenerationRequest(
        prompt_ids=prompt_ids,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        request_id=request_id if not choice_index else f"{request_id}-{choice_index}",
        keep_special_tokens=rt.drop_ids is not None,
        end_id=rt.end_id,
        pad_id=rt.pad_id,
        temperature=temperature,
        top_p=_first(req.top_p, info.top_p, gdefaults.get("top_p")),
        top_k=top_k,
        seed=seed,
        repetition_penalty=_first(req.repetition_penalty, info.repetition_penalty),
        presence_penalty=_first(req.presence_penalty, info.presence_penalty),
        frequency_penalty=_first(req.frequency_penalty, info.frequency_penalty),
        min_tokens=req.min_tokens or None,
        ignore_eos=req.ignore_eos,
        stop_words=stop_words,
        bad_words=rt.bad_token_words,
        stop_texts=stop_texts,
        bad_texts=rt.bad_strings,
        timeout_s=rt.config.timeout_s,
        session=session_key(rt.config.routing, req.user, _cache_key(req), headers),
    )
