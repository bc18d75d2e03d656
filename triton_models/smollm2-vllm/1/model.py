"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, the vLLM backend's interface.

Wire contract (``max_batch_size: 0``: no batch dim), as the Triton vLLM backend (r24.12 and later):

* inputs: ``text_input`` BYTES [1] (the prompt, already templated); optional ``stream`` BOOL [1],
  ``sampling_parameters`` BYTES [1] (JSON of vLLM ``SamplingParams``), ``exclude_input_in_output``
  BOOL [1], ``return_finish_reason`` / ``return_cumulative_logprob`` / ``return_logprobs`` /
  ``return_num_input_tokens`` / ``return_num_output_tokens`` BOOL [1].
* ``sampling_parameters`` keys honoured: ``max_tokens`` (default 16, as vLLM; null = up to the
  context), ``temperature`` (1.0; 0 = greedy), ``top_p``, ``top_k`` (-1 or 0 = off), ``seed``,
  ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``min_tokens``,
  ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``, ``logprobs`` (0-20: how many most likely
  alternatives per token besides the sampled one, as vLLM's ``max_logprobs`` default allows),
  ``n`` (1 only), ``stop`` (empty only: stop strings are the gateway's job here), and guided decoding
  in both spellings the backend passes on to vLLM: ``structured_outputs`` (a string holding a JSON
  object: ``{"json": {schema}}``, ``{"regex": ...}``, ``{"choice": [...]}``, ``{"grammar": ...}``,
  ``{"json_object": true}``, ``{"structural_tag": ...}``) and the older ``guided_decoding`` (the same
  fields as a JSON object or a string holding one, plus ``backend``).  The exact rules are in
  ``../../smollm2-135m-instruct/1/smollm2_guide.py``.  Other keys are refused with an error naming
  them, so a client bug does not pass silently.
* outputs, per response: ``text_output`` BYTES [1] holds only the text new since the previous
  response (the prompt text is prepended to the first one unless ``exclude_input_in_output``, which
  streaming requires, as in vLLM); ``finish_reason`` BYTES [1] ("None" until the last response, then
  "stop" or "length"); ``cumulative_logprob`` FP32 [1]; ``logprobs`` BYTES [1] (JSON list, one
  ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` per new token, or "null" when
  ``sampling_parameters.logprobs`` is unset: as vLLM builds it, the sampled token first with its real
  rank, then the ``logprobs`` most likely tokens ranked 1.., the sampled one appearing once; computed
  from the logits the token was sampled from, ``log_softmax`` then top-k); ``num_input_tokens`` UINT32 [1];
  ``num_output_tokens`` UINT32 [1], the number of tokens new since the previous response.  Optional
  outputs are sent only when their ``return_*`` input is true.
* text is detokenized incrementally inside the model with the model's own ``tokenizer.json`` (a
  ``DecodeStream`` primed with the prompt's last ids), so a token that ends inside a UTF-8 character
  yields "" until the character completes.
* LoRA, as the vLLM backend takes it: ``sampling_parameters.lora_name`` names an adapter of
  ``multi_lora.json`` beside this file (name -> PEFT folder, relative paths read from the prepared models
  folder); it is loaded from its folder on first use into an LRU of ``lora_cache_size`` adapters and
  applied in every forward pass (``smollm2_lora.LoraHooks``).  Another name fails with the backend's
  words: "LoRA <name> is not supported, we currently support [...]".
* the end-of-sequence token and ``stop_token_ids`` end generation and are neither emitted as text nor
  counted in ``num_output_tokens`` (the TensorRT-LLM reference counts the same way, so usage agrees
  across the three reference models; real vLLM counts that last token).
* streaming (``stream`` true): one response per generated token, plus a last one (empty text) when
  generation ends on an end token; the last response carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
  Non-streaming: one FINAL response with the whole text.
* errors and cancellation: as ``smollm2-135m-instruct`` (the engine is shared: see
  ``../../smollm2-135m-instruct/1/smollm2_engine.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers.decoders import DecodeStream

# The engine lives in the TensorRT-LLM reference model's version folder (a top-level folder of its
# own would be taken for a model by Triton).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "smollm2-135m-instruct" / "1"))
from smollm2_engine import SmolLM2Engine
from smollm2_guide import vllm_guide
from smollm2_job import Job
from smollm2_requests import RequestError, checked_temperature, input_array, seeded_generator

# Priming the decoder with the prompt's tail gives the same leading-space handling as decoding the
# whole sequence (the gateway's own detokenizer does the same).
DECODE_PREFIX = 8
# vLLM's default `max_logprobs`: the most alternatives one request may ask for per token.
MAX_LOGPROBS = 20
_KNOWN_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty",
               "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos", "skip_special_tokens",
               "logprobs", "n", "stop", "structured_outputs", "guided_decoding", "lora_name"}


def _flag(request: Any, name: str) -> bool | None:
    arr = input_array(request, name)
    return None if arr is None or arr.size == 0 else bool(arr.reshape(-1)[0])


def _number(params: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"sampling_parameters.{key}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise RequestError(f"sampling_parameters.{key}: expected an integer, got {value!r}")
    return kind(value)


class TritonPythonModel(SmolLM2Engine):
    """Decoupled SmolLM2 generator, vLLM-backend text interface; see the module docstring."""

    TEXT_PROMPTS = True

    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        # The adapters this model serves, as the vLLM backend reads them: multi_lora.json beside this file,
        # adapter name -> PEFT folder (a relative path is read from the prepared models folder).
        self.lora_repository: dict[str, Path] = {}
        listing = Path(__file__).resolve().parent / "multi_lora.json"
        if listing.is_file():
            models = self.weights_dir.parent
            for name, where in json.loads(listing.read_text()).items():
                path = Path(where)
                self.lora_repository[str(name)] = path if path.is_absolute() else models / path
        self.logger.log_info(f"{self.model_name}: LoRA adapters {sorted(self.lora_repository)}")

    def _lora(self, params: dict[str, Any]) -> Any:
        """``sampling_parameters.lora_name``: an adapter of multi_lora.json, loaded from its folder on first use
        (and again after the LRU of ``lora_cache_size`` evicted it); another name is refused in the vLLM
        backend's words."""
        name = params.get("lora_name")
        if name is None:
            return None
        if name not in self.lora_repository:
            raise RequestError(f"LoRA {name} is not supported, we currently support {sorted(self.lora_repository)}")
        lora = self.lora_cache.get(name)
        if lora is not None:
            self._bump("lora_hits")
            return lora
        folder = self.lora_repository[name]
        if not (folder / "adapter_model.safetensors").is_file():
            raise RequestError(f"LoRA {name}: no adapter at {folder}")
        lora = self.lora_modules.from_peft(folder)
        evicted = self.lora_cache.put(name, lora)
        self._bump("lora_loads")
        if evicted:
            self._bump("lora_evictions", n=evicted)
        return lora

    def parse(self, request: Any, sender: Any) -> Job:
        text = input_array(request, "text_input")
        if text is None or text.size != 1:
            raise RequestError("text_input is required: one string, shape [1]")
        raw = text.reshape(-1)[0]
        prompt_text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        stream = bool(_flag(request, "stream"))
        exclude = _flag(request, "exclude_input_in_output")
        prepend = (not exclude) if exclude is not None else not stream
        if prepend and stream:
            raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")
        params = self._sampling_parameters(request)
        prompt = self.encode_text(prompt_text, "text_input")
        max_tokens = params.get("max_tokens", 16)
        max_new = self.max_sequence - len(prompt) if max_tokens is None else _number(params, "max_tokens", 16, int)
        if max_new < 1:
            raise RequestError(f"sampling_parameters.max_tokens must be at least 1, got {max_new}")
        self.validate_prompt(prompt, max_new, "max_tokens")
        temperature = checked_temperature(_number(params, "temperature", 1.0, float),
                                          "sampling_parameters.temperature")
        top_k = _number(params, "top_k", -1, int)
        stop_ids = params.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
            raise RequestError("sampling_parameters.stop_token_ids: expected a list of integers")
        logprobs = params.get("logprobs")
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise RequestError(f"sampling_parameters.logprobs: {logprobs} is outside 0..{MAX_LOGPROBS} (vLLM's "
                               "max_logprobs)")
        skip_special = params.get("skip_special_tokens", True) is not False
        lora = self._lora(params)
        return Job(
            lora=lora,
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=-1 if params.get("ignore_eos") else self.default_end_id,
            streaming=stream,
            temperature=temperature,
            top_k=max(top_k, 0),
            top_p=_number(params, "top_p", 1.0, float),
            repetition_penalty=_number(params, "repetition_penalty", 1.0, float),
            presence_penalty=_number(params, "presence_penalty", 0.0, float),
            frequency_penalty=_number(params, "frequency_penalty", 0.0, float),
            min_tokens=_number(params, "min_tokens", 0, int),
            stop_ids=frozenset(stop_ids),
            generator=seeded_generator(_number(params, "seed", None, int)),
            guide=vllm_guide(params),
            top_logprobs=int(logprobs) if logprobs is not None else None,
            state={
                "prompt_text": prompt_text if prepend else "",
                "decoder": DecodeStream(ids=prompt[-DECODE_PREFIX:], skip_special_tokens=skip_special),
                "decoded": 0,  # tokens of job.generated already turned into text and counted
                "logprobs": logprobs is not None,
                **{name: bool(_flag(request, name)) for name in (
                    "return_finish_reason", "return_cumulative_logprob", "return_logprobs",
                    "return_num_input_tokens", "return_num_output_tokens")},
            },
        )

    @staticmethod
    def _sampling_parameters(request: Any) -> dict[str, Any]:
        arr = input_array(request, "sampling_parameters")
        if arr is None or arr.size == 0:
            return {}
        raw = arr.reshape(-1)[0]
        try:
            params = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
        except (UnicodeDecodeError, ValueError) as exc:
            raise RequestError(f"sampling_parameters: not valid JSON ({exc})") from None
        if not isinstance(params, dict):
            raise RequestError("sampling_parameters: expected a JSON object")
        unknown = sorted(set(params) - _KNOWN_KEYS)
        if unknown:
            raise RequestError(f"sampling_parameters: not supported by this model: {', '.join(unknown)}")
        if params.get("n", 1) not in (1, None):
            raise RequestError("sampling_parameters.n: only 1 is supported by this model")
        if params.get("stop"):
            raise RequestError("sampling_parameters.stop: stop strings are not supported by this model")
        if params.get("logprobs") is not None:
            _number(params, "logprobs", 0, int)
        return params

    def _logprob_entry(self, job: Job, k: int) -> dict[str, dict[str, Any]]:
        """Generated token `k` as vllm_backend serializes vLLM's `Logprob`s: `{"<id>": {logprob, rank,
        decoded_token}}`, the sampled token first, then the alternatives (the sampled one only once)."""
        token = job.generated[k]

        def item(t: int, logprob: float, rank: int) -> dict[str, Any]:
            text = self.tokenizer.decode([t], skip_special_tokens=False)
            return {"logprob": logprob, "rank": rank, "decoded_token": text}

        entry = {str(token): item(token, job.log_probs[k], job.ranks[k])}
        for rank, (t, logprob) in enumerate(job.alternatives[k], start=1):
            entry.setdefault(str(t), item(t, logprob, rank))
        return entry

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """Text and token count since the previous response (the whole output when not streaming)."""
        state = job.state
        fresh = job.generated[state["decoded"] :]
        state["decoded"] = len(job.generated)
        decoder = state["decoder"]
        pieces = []
        for token in fresh:
            piece = decoder.step(self.tokenizer, token)
            if piece:
                pieces.append(piece)
        text = state.pop("prompt_text", "") + "".join(pieces)
        outputs = [pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=np.object_))]
        if state["return_finish_reason"]:
            reason = job.finish_reason if final else None
            outputs.append(pb_utils.Tensor("finish_reason", np.asarray([str(reason).encode()], dtype=np.object_)))
        if state["return_cumulative_logprob"]:
            outputs.append(pb_utils.Tensor("cumulative_logprob",
                                           np.asarray([sum(job.log_probs)], dtype=np.float32)))
        if state["return_logprobs"]:
            if state["logprobs"]:
                start = len(job.generated) - len(fresh)
                entries = [self._logprob_entry(job, k) for k in range(start, len(job.generated))]
                payload = json.dumps(entries)
            else:
                payload = "null"
            outputs.append(pb_utils.Tensor("logprobs", np.asarray([payload.encode()], dtype=np.object_)))
        if state["return_num_input_tokens"]:
            outputs.append(pb_utils.Tensor("num_input_tokens", np.asarray([len(job.prompt)], dtype=np.uint32)))
        if state["return_num_output_tokens"]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.asarray([len(fresh)], dtype=np.uint32)))
        self.send(job, outputs, final)
