"""Adapter for the Triton vLLM backend (protocol `vllm`): text in, text out.

Wire contract (see design/triton-protocols.md; the backend's own auto-completed config): no batch dim
(`max_batch_size 0`). Inputs: `text_input` BYTES [1] (the templated prompt), `stream` BOOL [1],
`sampling_parameters` BYTES [1] (JSON of vLLM SamplingParams; `max_tokens` is always sent because
vLLM's default is 16), `exclude_input_in_output` BOOL [1] (true: the prompt is never echoed), and
`return_finish_reason` / `return_num_output_tokens` / `return_logprobs` BOOL [1]. Only inputs the
model's config declares are sent. With log-probs asked for, `sampling_parameters.logprobs` is the number
of alternatives wanted per token (0: the sampled token's alone) and the `logprobs` output (BYTES, JSON)
holds per new token a `{"<token id>": {"logprob", "rank", "decoded_token"}}` object, the sampled token
first, then the most likely ones (vllm_backend's `docs/additional_outputs.md`, `src/utils/request.py`).
Each response's `text_output` holds the text new since the previous response and `num_output_tokens`
the number of tokens that text took (a delta as well).

Decoupled models are called over one gRPC stream per request with `stream=true`; others get one
unary `infer` with `stream=false` whose single response is the whole text. Chunks carry `text` and
`num_tokens` (None when the model does not return `num_output_tokens`: the gateway then counts with
the tokenizer); with log-probs asked for, also the sampled token ids and their log-probs, and with
alternatives asked for, each token's most likely alternatives.

Images (`GenerationRequest.images`) go in the optional `image` input the backend declares for
multimodal models (BYTES [-1]): one element per image, the image file's bytes base64-encoded without a
`data:` prefix, in the order of the prompt's image placeholders (vllm_backend `src/utils/request.py`
decodes each with Pillow into `multi_modal_data["image"]`). A model whose config has no such input takes
no images (`supports("images")` is false, and the services refuse image parts by name).

Cached prompt tokens: the vLLM backend has no output for them (its `num_input_tokens` counts the prompt, not
what vLLM's prefix cache held; vllm_backend src/utils/request.py as of 2026-01), so chunks never carry
`cached_tokens` and usage says the count is unknown.

Stop strings are matched by the gateway on the text (and the stream closed, which cancels the
request); single-token stop words and `end_id` go to vLLM as `stop_token_ids`. Token-id bad words
cannot be expressed in SamplingParams, so a model with bad words configured refuses requests. A request's
`ignore_eos` is `sampling_parameters.ignore_eos` (as Triton's own OpenAI frontend passes it), and `end_id`
is then not sent as a stop token id, which vLLM would still stop at.

LoRA: a request on an adapter carries `sampling_parameters.lora_name` (where vllm_backend reads it; the
adapter must be in the backend's `multi_lora.json`). The backend's refusal of a name it does not serve is a
404 naming the adapter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from tritonclient.grpc import InferResult

from openai_api.errors import BackendError, InvalidRequestError, ModelNotFoundError
from openai_api.triton.base import SpecAdapter, is_neutral
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest, Guide, GuideKind
from openai_api.triton.rpc import TritonRPC
from openai_api.triton.wire import InferRequest, ModelSpec, priority_for

logger = logging.getLogger(__name__)

# GenerationRequest fields that map onto vLLM SamplingParams keys of the same meaning.
_SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "min_tokens": "min_tokens",
}


def sampling_parameters(req: GenerationRequest) -> dict[str, Any]:
    """The SamplingParams JSON object for one request: `max_tokens` always, the rest only when set."""
    params: dict[str, Any] = {"max_tokens": int(req.max_tokens)}
    for field_name, key in _SAMPLING_KEYS.items():
        value = getattr(req, field_name)
        if value is not None:
            params[key] = value
    if params.get("top_k") == 0:
        params["top_k"] = -1  # "off": 0 is TensorRT-LLM's spelling, older vLLM rejects it
    stop_ids = [w[0] for w in req.stop_words if len(w) == 1]
    if req.ignore_eos:
        # vLLM then stops at neither the model's EOS nor generation_config's extra EOS ids; its explicit
        # stop_token_ids still stop it, so the end id is not sent as one (the services left out the others).
        params["ignore_eos"] = True
    elif req.end_id is not None and req.end_id >= 0:
        stop_ids.insert(0, req.end_id)
    if stop_ids:
        params["stop_token_ids"] = list(dict.fromkeys(stop_ids))
    if req.return_logprobs:
        params["logprobs"] = req.top_logprobs  # alternatives per token beside the sampled one (0: none)
    if req.keep_special_tokens:
        # The parser reads the family's marker tokens from the text; vLLM would drop them, and by default
        # put spaces around them.
        params["skip_special_tokens"] = False
        params["spaces_between_special_tokens"] = False
    return params


# How the Triton vLLM backend passes a guide to vLLM, by vLLM release: current vLLM reads
# `structured_outputs` (which the backend JSON-decodes from a string), older vLLM `guided_decoding` (an
# object). Same keys inside: json (a schema object), json_object, regex, choice, grammar.
GUIDE_KEYS = ("structured_outputs", "guided_decoding")


def vllm_guide(guide: Guide, key: str) -> Any:
    """The value of `sampling_parameters[key]` for a guide."""
    if guide.kind == "json_schema":
        body: dict[str, Any] = {"json": json.loads(guide.value or "{}")}
    elif guide.kind == "json_object":
        body = {"json_object": True}
    elif guide.kind == "choice":
        body = {"choice": json.loads(guide.value or "[]")}
    else:
        body = {"regex" if guide.kind == "regex" else "grammar": guide.value or ""}
    return json.dumps(body, separators=(",", ":")) if key == "structured_outputs" else body


# What a log-prob of -inf (a token masked out) becomes: JSON has no infinity; OpenAI and vLLM send this.
MIN_LOGPROB = -9999.0

Alternatives = list[list[tuple[int, float]]]


def _logprob(info: Any) -> float:
    value = float(info["logprob"] if isinstance(info, dict) else info)
    return value if value >= MIN_LOGPROB else MIN_LOGPROB  # -inf, and NaN, too


def _rank(info: Any) -> int | None:
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def parse_logprobs(raw: Any, top: int = 0) -> tuple[list[int], list[float], Alternatives | None] | None:
    """vLLM's `logprobs` output: JSON, one `{"<token id>": {"logprob", "rank", "decoded_token"}}` per new
    token, the sampled token first (vLLM builds each dict that way), then the most likely tokens (where the
    sampled one is among them it appears once). Returns the sampled ids, their log-probs, and with `top` > 0
    per token its `top` most likely tokens as (id, log-prob), by vLLM's rank (by log-prob where a backend
    gives no ranks), which leaves out a sampled token ranked below them."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    data = json.loads(raw)
    if data is None:
        return None
    ids: list[int] = []
    lps: list[float] = []
    alternatives: Alternatives | None = [] if top > 0 else None
    for entry in data:
        if not entry:
            continue
        token, info = next(iter(entry.items()))
        ids.append(int(token))
        lps.append(_logprob(info))
        if alternatives is not None:
            ranked = [(int(t), _logprob(i), _rank(i)) for t, i in entry.items()]
            if all(r is not None for _, _, r in ranked):
                ranked.sort(key=lambda x: x[2] or 0)
            else:
                ranked.sort(key=lambda x: -x[1])
            alternatives.append([(t, lp) for t, lp, _ in ranked[:top]])
    return ids, lps, alternatives


def _text(result: InferResult) -> str:
    arr = result.as_numpy("text_output")
    if arr is None or arr.size == 0:
        return ""
    raw = arr.reshape(-1)[0]
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)


def _count(result: InferResult, name: str) -> int | None:
    arr = result.as_numpy(name)
    return int(arr.reshape(-1)[0]) if arr is not None and arr.size else None


class VLLMAdapter(SpecAdapter):
    """`LLMBackend` over the Triton vLLM backend; see the module docstring for the wire contract."""

    protocol = "vllm"

    def __init__(self, rpc: TritonRPC, spec: ModelSpec, *, model: str, triton_model: str, version: str = "",
                 stream_idle_timeout_s: float | None = None, guide_key: str = "auto", tokens_per_block: int = 32
                 ) -> None:
        super().__init__(rpc, spec, model=model, triton_model=triton_model, version=version,
                         stream_idle_timeout_s=stream_idle_timeout_s, tokens_per_block=tokens_per_block)
        # "auto": the current spelling, until the backend refuses it by name (then the older one, for good).
        self.guide_key = GUIDE_KEYS[0] if guide_key == "auto" else guide_key
        self._guide_key_fixed = guide_key != "auto"

    @property
    def guide_kinds(self) -> frozenset[GuideKind]:
        return GUIDE_KINDS if "sampling_parameters" in self.spec.inputs else frozenset()

    def supports(self, param: str) -> bool:
        spec = self.spec
        if param == "bad_words":
            return False
        if param == "images":
            return "image" in spec.inputs and spec.inputs["image"].dtype == "BYTES"
        if param in ("return_logprobs", "top_logprobs"):
            # Alternatives come in the same output, as many as `sampling_parameters.logprobs` asks for.
            return "return_logprobs" in spec.inputs and "logprobs" in spec.outputs and (
                param == "return_logprobs" or "sampling_parameters" in spec.inputs)
        if param in _SAMPLING_KEYS or param in ("stop_words", "lora", "ignore_eos"):
            return "sampling_parameters" in spec.inputs
        return False

    def build_request(self, req: GenerationRequest, streaming: bool) -> InferRequest:
        spec = self.spec
        names = spec.inputs
        if req.bad_words:
            raise self.refuse("bad_words", ": vLLM takes bad words as text, not token ids")
        if req.return_logprobs and not self.supports("return_logprobs"):
            raise self.refuse("return_logprobs")
        if req.return_logprobs and req.top_logprobs and not self.supports("top_logprobs"):
            raise self.refuse("top_logprobs", " (its Triton config has no sampling_parameters input)")
        params = sampling_parameters(req)
        if req.guide is not None:
            if not self.guide_kinds:
                raise self.refuse_guide(req.guide)
            params[self.guide_key] = vllm_guide(req.guide, self.guide_key)
        if "sampling_parameters" not in names:
            extra = sorted(k for k in set(params) - {"max_tokens", "stop_token_ids"} if not is_neutral(k, params[k]))
            if extra:
                raise self.refuse(extra[0], " (its Triton config has no sampling_parameters input)")
            logger.warning("model %s: Triton model %s has no sampling_parameters input; vLLM's default "
                           "max_tokens (16) applies", self.model, self.triton_model)
        if req.lora is not None:
            if "sampling_parameters" not in names:
                raise InvalidRequestError(f"The model {req.lora.name!r} is a LoRA adapter of {self.model!r}, whose "
                                          f"Triton model {self.triton_model!r} has no sampling_parameters input to "
                                          "name it in.", param="model", code="lora_not_supported")
            params["lora_name"] = req.lora.lora_name
        r = InferRequest(self.triton_model, self.version, req.request_id, priority_for(self.spec))
        r.add(spec, "text_input", req.prompt_text)
        if req.images:
            if not self.supports("images"):
                raise self.refuse(req.images[0].param, ": its Triton config declares no BYTES `image` input")
            r.add(spec, "image", [im.b64 for im in req.images])
        if "stream" in names:
            r.add(spec, "stream", streaming)
        if "sampling_parameters" in names:
            r.add(spec, "sampling_parameters", json.dumps(params, separators=(",", ":")))
        if "exclude_input_in_output" in names:
            r.add(spec, "exclude_input_in_output", True)
        for flag, output in (("return_finish_reason", "finish_reason"),
                             ("return_num_output_tokens", "num_output_tokens")):
            if flag in names and output in spec.outputs:
                r.add(spec, flag, True)
        if req.return_logprobs:
            r.add(spec, "return_logprobs", True)
        wanted = ["text_output", "finish_reason", "num_output_tokens"]
        if req.return_logprobs:
            wanted.append("logprobs")
        r.output(*(n for n in wanted if n in spec.outputs))
        return r

    def _chunk(self, result: InferResult, req: GenerationRequest) -> GenerationChunk:
        chunk = GenerationChunk(token_ids=[], text=_text(result), num_tokens=_count(result, "num_output_tokens"))
        if req.return_logprobs:
            arr = result.as_numpy("logprobs")
            parsed = parse_logprobs(arr.reshape(-1)[0] if arr is not None and arr.size else None, req.top_logprobs)
            if parsed is not None:
                chunk.token_ids, chunk.logprobs, chunk.top_logprobs = parsed
        return chunk

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        spec = self.spec
        if not request.prompt_text:
            raise InvalidRequestError(f"The model {self.model!r} takes text prompts (vLLM backend); this "
                                      "request has token ids only.", param="prompt", code="unsupported_parameter")
        if not spec.decoupled:
            try:
                result = await self.rpc.infer(self.build_request(request, streaming=False), model=self.model,
                                              timeout_s=request.timeout_s)
            except BackendError as e:
                raise self._unknown_lora(request, e) or e from None
            chunk = self._chunk(result, request)
            if "exclude_input_in_output" not in spec.inputs and chunk.text and \
                    chunk.text.startswith(request.prompt_text):
                chunk.text = chunk.text[len(request.prompt_text):]  # an old backend that always echoes the prompt
            yield chunk
            return
        sent = False
        while True:
            responses = self.rpc.stream(self.build_request(request, streaming=True), model=self.model,
                                        timeout_s=request.timeout_s, idle_s=self.stream_idle_timeout_s)
            try:
                # aclosing: closing this generator early must close the stream (and so cancel the request) now.
                async with aclosing(responses):
                    async for result in responses:
                        chunk = self._chunk(result, request)
                        if chunk.text or chunk.num_tokens or chunk.token_ids:
                            sent = True
                            yield chunk
                return
            except BackendError as e:
                unknown = self._unknown_lora(request, e)
                if unknown is not None:
                    raise unknown from None
                if sent or request.guide is None or not self._older_spelling(e):
                    raise

    def _unknown_lora(self, req: GenerationRequest, err: BackendError) -> ModelNotFoundError | None:
        """The 404 for an adapter the Triton model does not serve (the vLLM backend: "LoRA <name> is not
        supported, we currently support [...]", or "LoRA feature is not enabled."), else None."""
        detail = err.detail or ""
        if req.lora is None or "LoRA" not in detail or ("not supported" not in detail and "not enabled" not in detail):
            return None
        return ModelNotFoundError(f"The model {req.lora.name!r} does not exist on its backend: the Triton model "
                                  f"{self.triton_model!r} does not serve the LoRA adapter {req.lora.lora_name!r} "
                                  "(not in its multi_lora.json).", param="model")

    def _older_spelling(self, err: BackendError) -> bool:
        """Whether `err` is the backend refusing the guide's key by name: then switch to the older spelling
        (a vLLM before `structured_outputs`) for this and every later request, and say so once."""
        if self._guide_key_fixed or self.guide_key != GUIDE_KEYS[0] or GUIDE_KEYS[0] not in (err.detail or ""):
            return False
        logger.warning("model %s: Triton model %s refused sampling_parameters.%s; using %s from now on",
                       self.model, self.triton_model, GUIDE_KEYS[0], GUIDE_KEYS[1])
        self.guide_key = GUIDE_KEYS[1]
        self._guide_key_fixed = True
        return True
