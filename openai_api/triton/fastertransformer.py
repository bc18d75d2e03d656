"""Adapter for the legacy FasterTransformer GPT tensor interface (protocol `fastertransformer`).

Wire contract (see design/triton-protocols.md): token ids in, token ids out, in the dtypes the model's
config declares (UINT32 ids and scalars in FasterTransformer's own configs). With `max_batch_size > 0`
every tensor carries a leading batch dim of 1 (`input_ids` [1, L], scalars [1, 1], words lists
[1, 2, N]). Sampling inputs: `temperature`, `runtime_top_k`, `runtime_top_p`, `repetition_penalty`,
`random_seed`, `min_length`, `is_return_log_probs`, `stop_words_list`, `bad_words_list`; only those the
config declares are accepted, a request using another is refused with a 400 naming the parameter.
FasterTransformer has no greedy temperature: `temperature == 0` is sent as `runtime_top_k = 1`.

Outputs: `output_ids` [1, beams, T] holds the prompt AND the generation, `sequence_length` [1, beams]
its valid length. Decoupled models stream over one gRPC stream per request and every response
resends the whole sequence so far (cumulative, not a delta): `CumulativeDiff` strips the prompt and
what was already yielded, so chunks hold only new token ids. Other models get one unary `infer`
whose output is trimmed by `sequence_length` and stripped of the prompt the same way.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from numpy.typing import NDArray
from tritonclient.grpc import InferResult

from openai_api.triton.base import SpecAdapter
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from openai_api.triton.wire import InferRequest, priority_for, words_tensor

logger = logging.getLogger(__name__)

# OpenAI-side parameter -> FasterTransformer input names (first declared one wins).
_PARAM_INPUTS = {
    "temperature": ("temperature",),
    "top_p": ("runtime_top_p",),
    "top_k": ("runtime_top_k",),
    "seed": ("random_seed", "seed"),
    "repetition_penalty": ("repetition_penalty",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "min_tokens": ("min_length",),
    "stop_words": ("stop_words_list",),
    "bad_words": ("bad_words_list",),
    "return_logprobs": ("is_return_log_probs",),
}
_MAX_ID = 2**31 - 1  # a UINT32 -1 pad (4294967295) or anything else past it is not a token


def _first_beam(arr: NDArray[Any] | None) -> list[Any] | None:
    """[batch, beams, T] / [beams, T] / [T] -> the first beam's T values."""
    if arr is None:
        return None
    if arr.ndim == 0:
        return [arr.item()]
    values: list[Any] = arr.reshape(-1, arr.shape[-1])[0].tolist()
    return values


class CumulativeDiff:
    """Turns FasterTransformer's cumulative `output_ids` (prompt + everything so far) into new tokens.

    Whether the output starts with the prompt is decided on the first non-empty response (it always
    does in FasterTransformer; a model that sends only the generation works too). The generation is
    cut at the first `end_id` or pad value, so an end token is never yielded.
    """

    __slots__ = ("end_id", "includes_prompt", "prompt", "sent")

    def __init__(self, prompt_ids: Sequence[int], end_id: int | None = None) -> None:
        self.prompt = prompt_ids
        self.end_id = end_id
        self.includes_prompt: bool | None = None
        self.sent = 0  # generated tokens yielded so far

    def generation(self, ids: list[int], seq_len: int | None = None) -> list[int]:
        """The whole generation in one cumulative response."""
        if seq_len is not None:
            ids = ids[: max(seq_len, 0)]
        if self.includes_prompt is None and ids:
            n = len(self.prompt)
            self.includes_prompt = len(ids) >= n and ids[:n] == self.prompt
        gen = ids[len(self.prompt):] if self.includes_prompt else ids
        for i, t in enumerate(gen):
            if t == self.end_id or t < 0 or t > _MAX_ID:
                return gen[:i]
        return gen

    def push(self, ids: list[int], seq_len: int | None = None) -> tuple[int, list[int]]:
        """(index of the first new token in the generation, the new tokens) for one response."""
        gen = self.generation(ids, seq_len)
        start = self.sent
        if len(gen) <= start:
            return start, []
        self.sent = len(gen)
        return start, gen[start:]


class FasterTransformerAdapter(SpecAdapter):
    """`LLMBackend` over a FasterTransformer-style model; see the module docstring for the wire contract."""

    protocol = "fastertransformer"
    param_inputs = _PARAM_INPUTS

    def build_request(self, req: GenerationRequest) -> InferRequest:
        req = self.eos_ignored(req)
        spec = self.spec
        names = spec.inputs
        r = InferRequest(self.triton_model, self.version, req.request_id, priority_for(self.spec))
        r.add(spec, "input_ids", req.prompt_ids)
        r.add(spec, "request_output_len", req.max_tokens)
        if "input_lengths" in names:
            r.add(spec, "input_lengths", len(req.prompt_ids))
        if req.end_id is not None and req.end_id >= 0 and "end_id" in names:
            r.add(spec, "end_id", req.end_id)
        values: dict[str, Any] = {p: getattr(req, p) for p in _PARAM_INPUTS}
        if req.temperature == 0:
            # No greedy temperature in FasterTransformer (it divides by it): greedy is top-k 1.
            values["temperature"] = None
            if "runtime_top_k" in names:
                values["top_k"] = 1
            elif "runtime_top_p" in names:
                values["top_p"] = 0.0  # top-k 0 (unsent) with top-p 0 is greedy as well
        for param, value in values.items():
            if value is None or value is False or value == []:
                continue
            name = self.value_input(param, value)
            if name is not None:
                r.add(spec, name, words_tensor(value) if param in ("stop_words", "bad_words") else value)
        wanted = ["output_ids", "sequence_length"]
        if req.return_logprobs:
            wanted.append("output_log_probs")
        r.output(*(n for n in wanted if n in spec.outputs))
        return r

    @staticmethod
    def chunk_from(result: InferResult, diff: CumulativeDiff, want_logprobs: bool) -> GenerationChunk | None:
        """The new tokens in one cumulative response (None when there are none)."""
        ids = _first_beam(result.as_numpy("output_ids"))
        if ids is None:
            return None
        seq = _first_beam(result.as_numpy("sequence_length"))
        start, new = diff.push([int(t) for t in ids], int(seq[0]) if seq else None)
        if not new:
            return None
        logprobs = None
        if want_logprobs:
            lp = _first_beam(result.as_numpy("output_log_probs"))
            if lp is not None and len(lp) >= start + len(new):
                logprobs = [float(x) for x in lp[start:start + len(new)]]
        return GenerationChunk(new, logprobs)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        infer_request = self.build_request(request)
        diff = CumulativeDiff(request.prompt_ids, request.end_id)
        if not self.spec.decoupled:
            result = await self.rpc.infer(infer_request, model=self.model, timeout_s=request.timeout_s)
            chunk = self.chunk_from(result, diff, request.return_logprobs)
            yield chunk if chunk is not None else GenerationChunk([])
            return
        responses = self.rpc.stream(infer_request, model=self.model, timeout_s=request.timeout_s,
                                    idle_s=self.stream_idle_timeout_s)
        # aclosing: closing this generator early must close the stream (and so cancel the request) now.
        async with aclosing(responses):
            async for result in responses:
                chunk = self.chunk_from(result, diff, request.return_logprobs)
                if chunk is not None:
                    yield chunk
