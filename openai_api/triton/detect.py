"""Which LLM wire protocol a Triton model speaks, judged from its config alone, and what does not match.

Detection rules (`detect_protocol`), first match wins:

1. `text_input` and `sampling_parameters` inputs -> `vllm` (the Triton vLLM backend).
2. `text_input` and `max_tokens` inputs and no `input_ids` -> `tensorrt_llm_text` (TensorRT-LLM's
   `ensemble` and `tensorrt_llm_bls` models: the vLLM backend has no `max_tokens` input, the token
   interface no `text_input`).
3. `input_ids` input and any input only TensorRT-LLM has (`streaming`, `return_log_probs`,
   `exclude_input_in_output`, `seed`, `min_tokens`, `num_return_sequences`, ...) -> `tensorrt_llm`.
   Older TensorRT-LLM releases with UINT32 scalars and `random_seed` land here too: they all declare
   `streaming`.
4. `input_ids` input of dtype UINT32, or an `is_return_log_probs` input -> `fastertransformer`.
5. Anything else -> `tensorrt_llm` (the default; `require_protocol` then says what is missing).

`text` (a custom text model) is never detected from Triton's config: its tensor names are the
operator's to give, in the entry's `text_protocol` block, which selects it (see `auto.AutoLLMBackend`).

`protocol_mismatches` lists, in words, every required tensor that is absent or of the wrong dtype for
a protocol; `require_protocol` raises that list as a `BackendUnavailableError`, so a wrong
`protocol` in the config (or a model that speaks none of them) is reported at start-up by name.
"""

from __future__ import annotations

from typing import Literal

from openai_api.errors import BackendUnavailableError
from openai_api.triton.text import TextWire, wire_mismatches
from openai_api.triton.wire import INTEGER_DTYPES, ModelSpec

Protocol = Literal["tensorrt_llm", "vllm", "fastertransformer", "tensorrt_llm_text", "text"]
PROTOCOLS: tuple[Protocol, ...] = ("tensorrt_llm", "vllm", "fastertransformer", "tensorrt_llm_text", "text")

# Inputs that exist in TensorRT-LLM's tensor interface (any release) and never in FasterTransformer's.
_TRTLLM_ONLY = frozenset({"streaming", "return_log_probs", "exclude_input_in_output", "seed", "min_tokens",
                          "num_return_sequences", "return_context_logits", "return_generation_logits",
                          "prompt_embedding_table", "lora_task_id", "return_kv_cache_reuse_stats"})
_FT_ONLY = frozenset({"is_return_log_probs"})

_INTEGER = "an integer type"
# tensor name -> (allowed dtypes, how to say them)
_Rule = dict[str, tuple[frozenset[str], str]]
# protocol -> (required inputs, required outputs)
_REQUIRED: dict[str, tuple[_Rule, _Rule]] = {
    "tensorrt_llm": (
        {"input_ids": (INTEGER_DTYPES, _INTEGER), "request_output_len": (INTEGER_DTYPES, _INTEGER)},
        {"output_ids": (INTEGER_DTYPES, _INTEGER)},
    ),
    "fastertransformer": (
        {"input_ids": (INTEGER_DTYPES, _INTEGER), "input_lengths": (INTEGER_DTYPES, _INTEGER),
         "request_output_len": (INTEGER_DTYPES, _INTEGER)},
        {"output_ids": (INTEGER_DTYPES, _INTEGER)},
    ),
    "vllm": (
        {"text_input": (frozenset({"BYTES"}), "BYTES")},
        {"text_output": (frozenset({"BYTES"}), "BYTES")},
    ),
    "tensorrt_llm_text": (
        {"text_input": (frozenset({"BYTES"}), "BYTES"), "max_tokens": (INTEGER_DTYPES, _INTEGER)},
        {"text_output": (frozenset({"BYTES"}), "BYTES")},
    ),
}
_TEXT_HINT = ("for a custom text model, set protocol \"text\" with a text_protocol block naming its tensors")


def detect_protocol(spec: ModelSpec) -> Protocol:
    names = spec.inputs.keys()
    if "text_input" in names and "sampling_parameters" in names:
        return "vllm"
    if "text_input" in names and "max_tokens" in names and "input_ids" not in names:
        return "tensorrt_llm_text"
    if "input_ids" in names:
        if names & _TRTLLM_ONLY:
            return "tensorrt_llm"
        if spec.inputs["input_ids"].dtype == "UINT32" or names & _FT_ONLY:
            return "fastertransformer"
    return "tensorrt_llm"


def protocol_mismatches(protocol: str, spec: ModelSpec, wire: TextWire | None = None) -> list[str]:
    """Everything about `spec` that stops the gateway speaking `protocol` to it (empty: it fits). The
    `text` protocol is judged against its `wire` (the entry's text_protocol block)."""
    if protocol == "text":
        return wire_mismatches(wire, spec) if wire is not None else ["no text_protocol block in the model config"]
    if protocol not in _REQUIRED:
        return [f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})"]
    problems: list[str] = []
    required_inputs, required_outputs = _REQUIRED[protocol]
    for kind, declared, required in (("input", spec.inputs, required_inputs),
                                     ("output", spec.outputs, required_outputs)):
        for name, (dtypes, wording) in required.items():
            tensor = declared.get(name)
            if tensor is None:
                problems.append(f"no {kind} {name!r} ({wording})")
            elif tensor.dtype not in dtypes:
                problems.append(f"{kind} {name!r} is {tensor.dtype}, expected {wording}")
    if problems and "input_ids" not in spec.inputs and protocol in ("tensorrt_llm", "fastertransformer"):
        if "text_input" in spec.inputs and "max_tokens" in spec.inputs:
            problems.append("it takes text_input and max_tokens, like the TensorRT-LLM ensemble/BLS text "
                            "interface: set protocol \"tensorrt_llm_text\" (or \"auto\")")
        elif any(t.dtype == "BYTES" for t in spec.inputs.values()):
            problems.append(f"it takes text: {_TEXT_HINT}")
    return problems


def require_protocol(protocol: str, spec: ModelSpec, triton_model: str, *, detected: bool = False,
                     wire: TextWire | None = None) -> None:
    """Raise a BackendUnavailableError naming every mismatch between `spec` and `protocol`."""
    problems = protocol_mismatches(protocol, spec, wire)
    if problems:
        how = "detected" if detected else "configured"
        raise BackendUnavailableError(
            f"Triton model {triton_model!r} does not speak the {how} protocol {protocol!r}: "
            f"{'; '.join(problems)} ({spec.describe()})")
