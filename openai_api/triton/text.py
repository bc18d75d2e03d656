"""Adapters for Triton LLMs that take prompt text and sampling parameters as tensors and answer with text:
the TensorRT-LLM `ensemble` / `tensorrt_llm_bls` interface (protocol `tensorrt_llm_text`) and any custom
model whose tensor names the model config gives (protocol `text`, a `text_protocol` block).

Both are one wire shape, a `TextWire`: which input carries the prompt, the completion budget, the stream
flag and each sampling parameter, which output carries the text (and optionally its token count), and
whether that text is a delta or cumulative. Dtypes and dims always come from Triton's model config
(`InferRequest.add`); only inputs the wire names and the config declares are sent.

`tensorrt_llm_text` (wire from `trtllm_text_wire`, names as in tensorrtllm_backend's
`all_models/inflight_batcher_llm/ensemble/config.pbtxt` and `tensorrt_llm_bls/config.pbtxt`, the newest
name first where releases differ): `text_input` BYTES [1], `max_tokens` INT32 [1] (UINT32 [-1] in
2023 releases), `stream` BOOL, `exclude_input_in_output` BOOL (sent true), `end_id`/`pad_id`, `top_k`
(`runtime_top_k`), `top_p` (`runtime_top_p`), `temperature`, `repetition_penalty`, `presence_penalty`,
`frequency_penalty`, `min_tokens` (`min_length`), `seed` UINT64 (`random_seed`), `stop_words` /
`bad_words` BYTES [-1] (one string per word; the preprocessing model tokenizes them),
`guided_decoding_guide_type` / `guided_decoding_guide` BYTES [1], `return_num_output_tokens` BOOL
asking for `num_output_tokens` INT32 [1], and `return_perf_metrics` BOOL asking for `kv_cache_reused_blocks`
INT32 [1] (the KV cache blocks the request reused; the ensemble maps both to and from its tensorrt_llm model).
With `max_batch_size > 0` every tensor gets the batch dim.
Output `text_output` BYTES: the ensemble's postprocessing model decodes each response's tokens on their
own, so a streamed `text_output` is a delta (and a token that ends inside a UTF-8 character decodes to
U+FFFD there, which nothing downstream can repair); the BLS model does the same unless its
`accumulate_tokens` parameter is true, when it decodes every token so far and `text_output` is
cumulative (read from the model config's `parameters`). `num_output_tokens` counts the response's own
tokens (a delta either way; the BLS model does not forward it). Log-probs are not taken: the text
interface returns no token ids to pair them with.

Images (`GenerationRequest.images`, TensorRT-LLM's multimodal `ensemble`, tensorrtllm_backend
docs/multimodal.md; `all_models/multimodal/ensemble/config.pbtxt`): a model takes images when its config
declares `image_url_input` (BYTES [-1]) or `image_bytes_input` (UINT8 [-1, -1, -1, -1]); `supports("images")`
says so, read from the config, never from the protocol's name. `image_url_input` is preferred: one element
per image, in prompt order ([1, n] batched), each `data:image/jpeg;base64,...` of the image the gateway
fetched and verified, re-encoded as JPEG unless it is one (`images.encode`: the preprocessing model decodes
that prefix itself and fetches any other string from the network, which must never happen). Else
`image_bytes_input`: the pixels, uint8 [1, height, width, 3] ([1, 1, h, w, 3] batched); the preprocessing
model reads that tensor as one image per batch entry, so a second image is a 400 naming the model (as is
an image past `max_num_images`, when the config's parameters carry the preprocessing model's value).
`prompt_table_extra_id` (UINT64 [1]), a stable hash of the request's images (`images.encode.prompt_table_id`),
is sent when the model declares it and its config's parameters say `enable_kv_cache_reuse: true` (the
ensemble has no such parameter of its own: an operator who turns reuse on in the tensorrt_llm model copies
it there; without reuse the preprocessing of some models, Qwen2-VL's, fails on the id). The prompt holds the
model's own image markers (`<|image|>` for Llama 3.2 Vision, `<image>` for VILA...), written by the chat
template or the model entry's `image_placeholder`. The conversions run off the event loop.

`text` (wire from the config block, `TextWire.configured`): the block names the tensors; see
docs/reference/model-config.md. Its
`image_url` (TensorRT-LLM's LLM-API model declares `image_url` BYTES [-1], and fetches http(s) URLs itself)
gets one JPEG data URL per image, as `image_url_input` does; its `reused_blocks` output (the LLM-API model's
`kv_cache_reused_block`, which it sends as a number in text whatever its config says) is read as the KV cache
blocks the request reused, asked for with its `return_perf_metrics` input when the block names one
(`sampling_param_return_perf_metrics`).

Reused blocks become `GenerationChunk.cached_tokens`: blocks x the model's `tokens_per_block`, at most the
prompt's tokens (as the gateway counts them); every response that carries them says it again.

Streaming, unary calls and cancellation are as for the vLLM adapter: decoupled models are called over one
gRPC stream per request (`stream` true when the client streams or stop strings must be matched, else one
response), others with one unary `infer`; an ensemble whose config does not say decoupled but whose
Triton refuses unary calls for it is switched to streams for good. A cumulative text is diffed into
deltas, holding back a trailing U+FFFD (a character not complete yet) until the next response or the end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult

from openai_api.errors import BackendError, InvalidRequestError
from openai_api.images.encode import jpeg_data_url, prompt_table_id, rgb_pixels
from openai_api.triton.base import SpecAdapter, is_neutral
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest, GuideKind
from openai_api.triton.rpc import TritonRPC
from openai_api.triton.tensorrt_llm import trtllm_guide
from openai_api.triton.wire import (
    INTEGER_DTYPES,
    InferRequest,
    ModelSpec,
    cached_prompt_tokens,
    output_int,
    priority_for,
)

logger = logging.getLogger(__name__)

# GenerationRequest fields a text wire can map to inputs (the keys of `TextWire.parameters`).
TEXT_PARAMS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "min_tokens", "end_id", "pad_id")
# Those a client sets (end_id / pad_id come from the model config and are sent only where declared).
_CLIENT_PARAMS = TEXT_PARAMS[:-2]

# OpenAI-side parameter -> the ensemble / BLS input names, newest release first.
_TRTLLM_TEXT_PARAMS = {
    "temperature": ("temperature",),
    "top_p": ("top_p", "runtime_top_p"),
    "top_k": ("top_k", "runtime_top_k"),
    "seed": ("seed", "random_seed"),
    "repetition_penalty": ("repetition_penalty",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "min_tokens": ("min_tokens", "min_length"),
    "end_id": ("end_id",),
    "pad_id": ("pad_id",),
}
_TRUE = frozenset({"true", "1", "t", "y", "yes"})


@dataclass(frozen=True, slots=True)
class TextWire:
    """The tensors of one text-in / text-out model (None: the model has no such input).

    `cumulative`: each response's text is everything so far (else only what is new);
    `cumulative_count`: the same for the `num_tokens` output. `return_num_tokens` is a BOOL input that
    asks for `num_tokens` (TensorRT-LLM's `return_num_output_tokens`)."""

    input: str = "text_input"
    output: str = "text_output"
    max_tokens: str = "max_tokens"
    stream: str | None = None
    exclude_input: str | None = None
    stop_words: str | None = None
    bad_words: str | None = None
    guide_type: str | None = None
    guide: str | None = None
    num_tokens: str | None = None
    return_num_tokens: str | None = None
    image_url: str | None = None
    # KV cache reuse: a BOOL input that asks for it (sent true), and the output with the reused blocks.
    perf_metrics: str | None = None
    reused_blocks: str | None = None
    cumulative: bool = False
    cumulative_count: bool = False
    parameters: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def configured(cls, block: Mapping[str, Any]) -> TextWire:
        """The wire a `text_protocol` config block describes (`config.TextProtocolConfig`, as a dict)."""
        cumulative = block.get("output_mode", "delta") == "cumulative"
        return cls(input=block["input"], output=block["output"], max_tokens=block["max_tokens"],
                   stream=block.get("stream"), exclude_input=block.get("exclude_input"),
                   stop_words=block.get("stop_words"), bad_words=block.get("bad_words"),
                   guide_type=block.get("guide_type"), guide=block.get("guide"), num_tokens=block.get("num_tokens"),
                   image_url=block.get("image_url"), perf_metrics=block.get("return_perf_metrics"),
                   reused_blocks=block.get("reused_blocks"), cumulative=cumulative, cumulative_count=cumulative,
                   parameters=dict(block.get("parameters") or {}))


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in _TRUE


def trtllm_text_wire(spec: ModelSpec) -> TextWire:
    """The wire of a TensorRT-LLM ensemble / BLS model, with the input names its release declares."""
    names = spec.inputs
    params = {p: next(n for n in cands if n in names)
              for p, cands in _TRTLLM_TEXT_PARAMS.items() if any(n in names for n in cands)}
    counted = "num_output_tokens" in spec.outputs and "return_num_output_tokens" in names
    reuse = "kv_cache_reused_blocks" in spec.outputs and "return_perf_metrics" in names

    def declared(name: str) -> str | None:
        return name if name in names else None

    return TextWire(
        stream=declared("stream"), exclude_input=declared("exclude_input_in_output"),
        stop_words=declared("stop_words"), bad_words=declared("bad_words"),
        guide_type=declared("guided_decoding_guide_type"), guide=declared("guided_decoding_guide"),
        num_tokens="num_output_tokens" if counted else None,
        return_num_tokens="return_num_output_tokens" if counted else None,
        perf_metrics="return_perf_metrics" if reuse else None,
        reused_blocks="kv_cache_reused_blocks" if reuse else None,
        # tensorrt_llm_bls: decodes all tokens so far per response when accumulate_tokens is set.
        cumulative=_flag(spec.parameters.get("accumulate_tokens")),
        parameters=params)


def wire_mismatches(wire: TextWire, spec: ModelSpec) -> list[str]:
    """Everything a `TextWire` names that the model's config lacks or types differently."""
    problems: list[str] = []

    def check(kind: str, name: str | None, dtypes: frozenset[str] | None, wording: str, key: str) -> None:
        if name is None:
            return
        declared = (spec.inputs if kind == "input" else spec.outputs).get(name)
        if declared is None:
            problems.append(f"no {kind} {name!r} (text_protocol.{key})")
        elif dtypes is not None and declared.dtype not in dtypes:
            problems.append(f"{kind} {name!r} (text_protocol.{key}) is {declared.dtype}, expected {wording}")

    text, flag = frozenset({"BYTES"}), frozenset({"BOOL"})
    check("input", wire.input, text, "BYTES", "input")
    check("output", wire.output, text, "BYTES", "output")
    check("input", wire.max_tokens, INTEGER_DTYPES, "an integer type", "max_tokens")
    check("input", wire.stream, flag, "BOOL", "stream")
    check("input", wire.exclude_input, flag, "BOOL", "exclude_input")
    for key in ("stop_words", "bad_words", "guide_type", "guide", "image_url"):
        check("input", getattr(wire, key), text, "BYTES", key)
    check("output", wire.num_tokens, INTEGER_DTYPES, "an integer type", "num_tokens")
    check("input", wire.perf_metrics, flag, "BOOL", "return_perf_metrics")
    check("output", wire.reused_blocks, INTEGER_DTYPES | text, "an integer type (or BYTES)", "reused_blocks")
    for param, name in wire.parameters.items():
        check("input", name, None, "", f"parameters.{param}")
    return problems


class TextState:
    """One request's responses as text deltas: strips an echoed prompt (only when the model cannot be told
    not to echo it) and diffs cumulative text and counts."""

    __slots__ = ("count_sent", "counted", "cumulative", "cumulative_count", "echo", "seen", "sent")

    def __init__(self, wire: TextWire, echo: str = "") -> None:
        self.cumulative = wire.cumulative
        self.cumulative_count = wire.cumulative_count
        self.echo = echo
        self.seen = ""  # cumulative: the whole text so far
        self.sent = 0  # cumulative: characters of it already yielded
        self.count_sent = 0
        self.counted = False  # the model returned a token count (then the gateway does not count)

    def text(self, raw: str, first: bool) -> str:
        if self.echo and (first or self.cumulative) and raw.startswith(self.echo):
            raw = raw[len(self.echo):]
        if not self.cumulative:
            return raw
        if not raw.startswith(self.seen[: self.sent]):
            # The model rewrote text already sent (a detokenizer cleaning up): what was sent stays, the
            # rest continues from the same position.
            logger.debug("cumulative text changed before position %d", self.sent)
        self.seen = raw
        stable = len(raw.rstrip("\ufffd"))  # a character not complete yet waits for the next response
        if stable <= self.sent:
            return ""
        delta, self.sent = raw[self.sent: stable], stable
        return delta

    def flush(self) -> str:
        """The held-back tail once the stream has ended."""
        delta, self.sent = self.seen[self.sent:], max(self.sent, len(self.seen))
        return delta

    def count(self, n: int | None) -> int | None:
        if n is None:
            return None
        self.counted = True
        if not self.cumulative_count:
            return n
        delta, self.count_sent = max(n - self.count_sent, 0), max(n, self.count_sent)
        return delta


def _first_text(result: InferResult, name: str) -> str:
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return ""
    raw = arr.reshape(-1)[0]
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)


def _first_int(result: InferResult, name: str | None) -> int | None:
    if name is None:
        return None
    arr = result.as_numpy(name)
    return int(arr.reshape(-1)[0]) if arr is not None and arr.size else None


class TextAdapter(SpecAdapter):
    """`LLMBackend` over a text-in / text-out model described by a `TextWire` (protocol `text`)."""

    protocol = "text"

    def __init__(self, rpc: TritonRPC, spec: ModelSpec, *, wire: TextWire, model: str, triton_model: str,
                 version: str = "", stream_idle_timeout_s: float | None = None, tokens_per_block: int = 32) -> None:
        super().__init__(rpc, spec, model=model, triton_model=triton_model, version=version,
                         stream_idle_timeout_s=stream_idle_timeout_s, tokens_per_block=tokens_per_block)
        self.wire = wire
        # The output that reports the KV cache blocks a request reused, when the model declares it.
        self.reused_blocks = wire.reused_blocks if wire.reused_blocks in spec.outputs else None
        # An ensemble over a decoupled model may not say decoupled in its own config; Triton then refuses
        # unary calls, and this turns true (see `generate`).
        self._always_stream = spec.decoupled

    @property
    def guide_kinds(self) -> frozenset[GuideKind]:
        w = self.wire
        return GUIDE_KINDS if w.guide_type in self.spec.inputs and w.guide in self.spec.inputs else frozenset()

    def supports(self, param: str) -> bool:
        if param in self.wire.parameters:
            return self.wire.parameters[param] in self.spec.inputs
        if param == "stop_words":
            return True  # matched on the text by the gateway; also sent where the model takes stop words
        if param == "bad_words":
            return self.wire.bad_words in self.spec.inputs
        if param == "images":
            return self.wire.image_url in self.spec.inputs
        return False  # log-probs: text out has no token ids to pair them with

    def _input(self, name: str | None) -> str | None:
        """`name` when the model's config declares that input, else None."""
        return name if name is not None and name in self.spec.inputs else None

    async def image_inputs(self, req: GenerationRequest) -> list[tuple[str, Any]]:
        """The (input, value) pairs that carry the request's images: the wire's `image_url` input, one
        `data:image/jpeg;base64,` URL per image in order (a model without one takes no images; the services
        refuse image parts before, as `supports("images")` is false)."""
        images = req.images
        if not images:
            return []
        name = self._input(self.wire.image_url)
        if name is None:
            raise self.refuse("images", ": its Triton config declares no image input")
        return [(name, await asyncio.to_thread(lambda: [jpeg_data_url(im.data, im.mime, im.b64) for im in images]))]

    def build_request(self, req: GenerationRequest, streaming: bool,
                      extra: Sequence[tuple[str, Any]] = ()) -> InferRequest:
        req = self.eos_ignored(req)
        spec, wire = self.spec, self.wire
        if req.return_logprobs:
            raise self.refuse("logprobs", ": its text interface returns no token ids to pair log-probabilities with")
        r = InferRequest(self.triton_model, self.version, req.request_id, priority_for(self.spec))
        r.add(spec, wire.input, req.prompt_text)
        r.add(spec, wire.max_tokens, req.max_tokens)
        if stream := self._input(wire.stream):
            r.add(spec, stream, streaming)
        if exclude := self._input(wire.exclude_input):
            r.add(spec, exclude, True)
        for param in _CLIENT_PARAMS:
            value = getattr(req, param)
            if value is None:
                continue
            name = self._input(wire.parameters.get(param))
            if name is None:
                if is_neutral(param, value):
                    continue  # a value that changes nothing (what many clients always send) needs no input
                raise self.refuse(param)
            r.add(spec, name, value)
        for param in ("end_id", "pad_id"):
            value = getattr(req, param)
            name = self._input(wire.parameters.get(param))
            if value is not None and value >= 0 and name is not None:
                r.add(spec, name, value)
        stops = list(dict.fromkeys(req.stop_texts))
        if stops and (stop_words := self._input(wire.stop_words)):
            r.add(spec, stop_words, stops)
        if req.bad_words or req.bad_texts:
            bad_words = self._input(wire.bad_words)
            if bad_words is None or not req.bad_texts:
                raise self.refuse("bad_words", " (bad words need the model's bad_words text input)")
            r.add(spec, bad_words, list(dict.fromkeys(req.bad_texts)))
        if req.guide is not None:
            guide_type, guide = self._input(wire.guide_type), self._input(wire.guide)
            if guide_type is None or guide is None:
                raise self.refuse_guide(req.guide)
            kind, text = trtllm_guide(req.guide)
            r.add(spec, guide_type, kind)
            r.add(spec, guide, text)
        for name, value in extra:
            r.add(spec, name, value)
        count = wire.num_tokens if wire.num_tokens in spec.outputs else None
        if count is not None and (ask := self._input(wire.return_num_tokens)):
            r.add(spec, ask, True)
        r.output(wire.output, *([count] if count is not None else []))
        if self.reused_blocks is not None:
            if ask := self._input(wire.perf_metrics):
                r.add(spec, ask, True)
            r.output(self.reused_blocks)
        return r

    def _chunk(self, state: TextState, result: InferResult, first: bool, req: GenerationRequest) -> GenerationChunk:
        chunk = GenerationChunk(token_ids=[], text=state.text(_first_text(result, self.wire.output), first),
                                num_tokens=state.count(_first_int(result, self.wire.num_tokens)))
        if (name := self.reused_blocks) is not None:
            chunk.cached_tokens = cached_prompt_tokens(output_int(result.get_response(), name), self.tokens_per_block,
                                                       len(req.prompt_ids))
        return chunk

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        if not request.prompt_text:
            raise InvalidRequestError(f"The model {self.model!r} takes text prompts ({self.protocol} protocol); this "
                                      "request has token ids only.", param="prompt", code="unsupported_parameter")
        # The prompt is stripped from the output only when the model cannot be told not to echo it.
        echo = "" if self.wire.exclude_input in self.spec.inputs else request.prompt_text
        state = TextState(self.wire, echo)
        extra = await self.image_inputs(request)
        if not self._always_stream:
            try:
                result = await self.rpc.infer(self.build_request(request, False, extra), model=self.model,
                                              timeout_s=request.timeout_s)
            except BackendError as e:
                if "decoupled" not in (e.detail or "").lower():
                    raise
                logger.info("model %s: Triton model %s answers over streams only; streaming from now on",
                            self.model, self.triton_model)
                self._always_stream = True
            else:
                chunk = self._chunk(state, result, True, request)
                chunk.text = (chunk.text or "") + state.flush()
                yield chunk
                return
        # A decoupled model can still answer with one response (stream false) when nobody needs the
        # tokens as they come; without a stream input it streams as it likes.
        streaming = request.stream_tokens or self.wire.stream not in self.spec.inputs
        responses = self.rpc.stream(self.build_request(request, streaming, extra), model=self.model,
                                    timeout_s=request.timeout_s, idle_s=self.stream_idle_timeout_s)
        first = True
        # aclosing: closing this generator early must close the stream (and so cancel the request) now.
        async with aclosing(responses):
            async for result in responses:
                chunk = self._chunk(state, result, first, request)
                first = False
                if chunk.text or chunk.num_tokens or chunk.cached_tokens is not None:
                    yield chunk
        tail = state.flush()
        if tail:
            yield GenerationChunk(token_ids=[], text=tail, num_tokens=0 if state.counted else None)


class TensorRTLLMTextAdapter(TextAdapter):
    """`LLMBackend` over TensorRT-LLM's `ensemble` / `tensorrt_llm_bls` text interface (see the module
    docstring); its wire is read from the model's config."""

    protocol = "tensorrt_llm_text"

    def __init__(self, rpc: TritonRPC, spec: ModelSpec, *, model: str, triton_model: str, version: str = "",
                 stream_idle_timeout_s: float | None = None, tokens_per_block: int = 32) -> None:
        super().__init__(rpc, spec, wire=trtllm_text_wire(spec), model=model, triton_model=triton_model,
                         version=version, stream_idle_timeout_s=stream_idle_timeout_s,
                         tokens_per_block=tokens_per_block)
        self.image_input = _trtllm_image_input(spec)
        self.prompt_table_ids = (_PROMPT_TABLE_ID in spec.inputs
                                 and _flag(spec.parameters.get("enable_kv_cache_reuse")))
        # Pixels: the preprocessing reads one image per batch entry. URLs: as many as the preprocessing model's
        # `max_num_images` (the engine's limit), when the operator copies it into this config too.
        cap = (spec.parameters.get("max_num_images") or "").strip()
        self.max_images = 1 if self.image_input == _IMAGE_BYTES else int(cap) if cap.isdigit() and int(cap) else None

    def supports(self, param: str) -> bool:
        if param == "images":
            return self.image_input is not None
        return super().supports(param)

    async def image_inputs(self, req: GenerationRequest) -> list[tuple[str, Any]]:
        """The request's images as the multimodal ensemble takes them (module docstring)."""
        images = req.images
        if not images:
            return []
        if self.image_input is None:
            return await super().image_inputs(req)
        if self.max_images is not None and len(images) > self.max_images:
            how = (f"takes images as pixels ({_IMAGE_BYTES}), one per request" if self.image_input == _IMAGE_BYTES
                   else f"says max_num_images {self.max_images}")
            raise InvalidRequestError(
                f"The model {self.model!r} takes at most {self.max_images} image(s) per request (its Triton model "
                f"{self.triton_model!r} {how}); this request has {len(images)}.",
                param=images[self.max_images].param, code="too_many_images")
        if self.image_input == _IMAGE_URL:
            urls = await asyncio.to_thread(lambda: [jpeg_data_url(im.data, im.mime, im.b64) for im in images])
            out: list[tuple[str, Any]] = [(_IMAGE_URL, urls)]
        else:
            pixels = await asyncio.to_thread(rgb_pixels, images[0].data)
            out = [(_IMAGE_BYTES, pixels[np.newaxis, ...])]
        if self.prompt_table_ids:
            out.append((_PROMPT_TABLE_ID, prompt_table_id([im.digest for im in images])))
        return out


# TensorRT-LLM's multimodal ensemble: its image inputs, and the id of a request's prompt table for KV reuse.
_IMAGE_URL, _IMAGE_BYTES, _PROMPT_TABLE_ID = "image_url_input", "image_bytes_input", "prompt_table_extra_id"


def _trtllm_image_input(spec: ModelSpec) -> str | None:
    """The image input the gateway sends a multimodal ensemble: `image_url_input` when declared BYTES, else
    `image_bytes_input` when declared UINT8 with four dims (images x height x width x channels)."""
    url, pixels = spec.inputs.get(_IMAGE_URL), spec.inputs.get(_IMAGE_BYTES)
    if url is not None and url.dtype == "BYTES":
        return _IMAGE_URL
    if pixels is not None and pixels.dtype == "UINT8" and len(pixels.dims) == 4:
        return _IMAGE_BYTES
    return None

