"""Which LLM wire protocol a Triton model speaks, judged from its config alone, and what does not match.

Detection rules (`detect_protocol`), first match wins:

1. `text_input` and `sampling_parameters` inputs -> `vllm` (the Triton vLLM backend).
2. `input_ids` input and any input only TensorRT-LLM has (`streaming`, `return_log_probs`,
   `exclude_input_in_output`, `seed`, `min_tokens`, `num_return_sequences`, ...) -> `tensorrt_llm`.
   Older TensorRT-LLM releases with UINT32 scalars and `random_seed` land here too: they all declare
   `streaming`.
3. `input_ids` input of dtype UINT32, or an `is_return_log_probs` input -> `fastertransformer`.
4. Anything else -> `tensorrt_llm` (the default; `require_protocol` then says what is missing).

`protocol_mismatches` lists, in words, every required tensor that is absent or of the wrong dtype for
a protocol; `require_protocol` raises that list as a `BackendUnavailableError`, so a wrong
`protocol` in the config (or a model that speaks none of them) is reported at start-up by name.
"""

from __future__ import annotations

from typing import Literal

from openai_api.errors import BackendUnavailableError
from openai_api.triton.wire import INTEGER_DTYPES, ModelSpec

Protocol = Literal["tensorrt_llm", "vllm", "fastertransformer"]
PROTOCOLS: tuple[Protocol, ...] = ("tensorrt_llm", "vllm", "fastertransformer")

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
}


def detect_protocol(spec: ModelSpec) -> Protocol:
    names = spec.inputs.keys()
    if "text_input" in names and "sampling_parameters" in names:
        return "vllm"
    if "input_ids" in names:
        if names & _TRTLLM_ONLY:
            return "tensorrt_llm"
        if spec.inputs["input_ids"].dtype == "UINT32" or names & _FT_ONLY:
            return "fastertransformer"
    return "tensorrt_llm"


def protocol_mismatches(protocol: str, spec: ModelSpec) -> list[str]:
    """Everything about `spec` that stops the gateway speaking `protocol` to it (empty: it fits)."""
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
    if protocol != "vllm" and "input_ids" not in spec.inputs and "text_input" in spec.inputs:
        problems.append("it takes text_input without sampling_parameters, like the TensorRT-LLM ensemble/BLS "
                        "text interface, which the gateway does not speak: point triton_model at the model "
                        "that takes input_ids")
    return problems


def require_protocol(protocol: str, spec: ModelSpec, triton_model: str, *, detected: bool = False) -> None:
    """Raise a BackendUnavailableError naming every mismatch between `spec` and `protocol`."""
    problems = protocol_mismatches(protocol, spec)
    if problems:
        how = "detected" if detected else "configured"
        raise BackendUnavailableError(
            f"Triton model {triton_model!r} does not speak the {how} protocol {protocol!r}: "
            f"{'; '.join(problems)} ({spec.describe()})")
