"""What every protocol adapter shares: the Triton model it talks to, that model's config (read and checked
against the adapter's protocol before the adapter is built: see `auto.AutoLLMBackend`), the inference
RPCs of its Triton, and the one way a request parameter becomes a model input or a 400."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Mapping

from openai_api.errors import InvalidRequestError
from openai_api.triton.llm import GenerationChunk, GenerationRequest, Guide, GuideKind
from openai_api.triton.rpc import TritonRPC
from openai_api.triton.wire import ModelSpec

# Values at which a sampling parameter changes nothing (a penalty of 0, a repetition penalty of 1, top-k
# off, top-p 1, no minimum length): many chat UIs always send them. A model without an input for such a
# parameter is then simply not sent it, never refused; any other value is refused with a 400 naming it.
NEUTRAL_VALUES: Mapping[str, tuple[float, ...]] = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "top_k": (0, -1),
    "top_p": (1,), "min_tokens": (0,),
}


def is_neutral(param: str, value: object) -> bool:
    """Whether `value` of `param` leaves the output as it would be without it."""
    return not isinstance(value, bool) and value in NEUTRAL_VALUES.get(param, ())


class SpecAdapter:
    """Base of the TensorRT-LLM, vLLM and FasterTransformer adapters.

    `protocol` names the wire protocol; `param_inputs` maps an OpenAI-side parameter to the Triton input
    names that carry it, newest release first (adapters whose protocol takes parameters as tensors set it;
    `supports` and `input_name` read it). `stream_idle_timeout_s` is the stall guard's idle time for this
    model's streams (None: never). `tokens_per_block`: the engine's tokens per KV cache block (the model entry's
    `tokens_per_block`), by which a protocol that reports reused KV blocks turns them into cached prompt
    tokens."""

    protocol = ""
    param_inputs: Mapping[str, tuple[str, ...]] = {}

    def __init__(self, rpc: TritonRPC, spec: ModelSpec, *, model: str, triton_model: str, version: str = "",
                 stream_idle_timeout_s: float | None = None, tokens_per_block: int = 32) -> None:
        self.rpc = rpc
        self.spec = spec
        self.model = model
        self.triton_model = triton_model
        self.version = version
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.tokens_per_block = tokens_per_block

    @property
    def guide_kinds(self) -> frozenset[GuideKind]:
        """The guide kinds this model enforces (none unless the protocol can carry guides)."""
        return frozenset()

    def supports(self, param: str) -> bool:
        """Whether the model's Triton config has an input for `param`. `top_logprobs` (alternatives beside
        the sampled token's log-prob) is no input: only the vLLM interface returns them (`VLLMAdapter`); nor
        is `images`, which an adapter that carries images says itself."""
        if param in ("top_logprobs", "images"):
            return False
        return any(n in self.spec.inputs for n in self.param_inputs.get(param, (param,)))

    def refuse_guide(self, guide: Guide) -> InvalidRequestError:
        """The 400 for a guide this model cannot enforce: never dropped silently."""
        return InvalidRequestError(
            f"The model {self.model!r} (Triton model {self.triton_model!r}, {self.protocol} protocol) cannot "
            f"enforce '{guide.param}': its Triton backend takes no guided-decoding input, so the output could "
            "not be guaranteed to match.", param=guide.param, code="unsupported_parameter")

    async def check(self) -> None:
        """Nothing left to check: the spec was checked against the protocol before construction."""

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """The protocol's `LLMBackend.generate` (each adapter is an async generator function)."""
        raise NotImplementedError

    def refuse(self, param: str, why: str = "") -> InvalidRequestError:
        """The 400 for a request parameter this model cannot take."""
        return InvalidRequestError(
            f"The model {self.model!r} (Triton model {self.triton_model!r}, {self.protocol} protocol) does not "
            f"accept '{param}'{why}.", param=param, code="unsupported_parameter")

    def eos_ignored(self, req: GenerationRequest) -> GenerationRequest:
        """`req` with vLLM's `ignore_eos` in a protocol that has no such switch: a minimum length of the whole
        budget (`min_tokens` = `max_tokens`), under which the backend masks the end token until `max_tokens`
        (TensorRT-LLM's `min_tokens` / `min_length`, FasterTransformer's `min_length`; genai-perf asks
        TensorRT-LLM for fixed-length outputs the same way, its `end_id` being no off switch). A model with no
        minimum-length input cannot honour it: a 400 naming `ignore_eos`."""
        if not req.ignore_eos:
            return req
        if not self.supports("min_tokens"):
            raise self.refuse("ignore_eos", ": its Triton config has no minimum-length input (min_tokens or "
                                            "min_length) to hold the end token back until max_tokens")
        return dataclasses.replace(req, min_tokens=req.max_tokens)

    def input_name(self, param: str) -> str:
        """The model's input that carries `param` (the first of `param_inputs` it declares), else a 400."""
        name = next((n for n in self.param_inputs.get(param, ()) if n in self.spec.inputs), None)
        if name is None:
            raise self.refuse(param)
        return name

    def value_input(self, param: str, value: object) -> str | None:
        """`input_name(param)`, except that a neutral value (`NEUTRAL_VALUES`) for a parameter the model
        has no input for gives None (nothing to send) instead of a 400."""
        if is_neutral(param, value) and not any(n in self.spec.inputs for n in self.param_inputs.get(param, ())):
            return None
        return self.input_name(param)
