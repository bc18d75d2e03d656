"""The text-in / text-out protocols: TensorRT-LLM's ensemble / BLS interface (`tensorrt_llm_text`) and
custom text models described by the config (`text`), against fake Triton clients and the model configs
real deployments serve (no server needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult

from openai_api.config import BUNDLED_CONFIG, BUNDLED_TEMPLATES, ConfigError, load_config
from openai_api.errors import BackendError, BackendUnavailableError, InvalidRequestError
from openai_api.triton.auto import AutoLLMBackend
from openai_api.triton.detect import detect_protocol, protocol_mismatches
from openai_api.triton.llm import Guide
from openai_api.triton.rpc import InferRequest
from openai_api.triton.text import TensorRTLLMTextAdapter, TextAdapter, TextState, TextWire, trtllm_text_wire
from openai_api.triton.wire import parse_model_config
from tests.helpers import REPO
from tests.unit.test_protocol_adapters import FakeClient, FakePool, collect, make, pb_result, request, sent, tensor


def opt(name: str, dtype: str, dims: list[int] | None = None) -> dict[str, Any]:
    return tensor(name, dtype, dims or [1], True)


# tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt, current release (the inputs the
# gateway can use, and a few it never sends), as Triton serves it over gRPC.
ENSEMBLE = {"config": {
    "name": "ensemble", "platform": "ensemble", "max_batch_size": 64,
    "model_transaction_policy": {"decoupled": True},
    "input": [tensor("text_input", "STRING", [1]), tensor("max_tokens", "INT32", [1]),
              opt("decoder_text_input", "STRING"), opt("num_return_sequences", "INT32"),
              opt("bad_words", "STRING", [-1]), opt("stop_words", "STRING", [-1]),
              opt("exclude_input_in_output", "BOOL"), opt("end_id", "INT32"), opt("pad_id", "INT32"),
              opt("top_k", "INT32"), opt("top_p", "FP32"), opt("temperature", "FP32"), opt("length_penalty", "FP32"),
              opt("repetition_penalty", "FP32"), opt("min_tokens", "INT32"), opt("presence_penalty", "FP32"),
              opt("frequency_penalty", "FP32"), opt("seed", "UINT64"), opt("return_log_probs", "BOOL"),
              opt("return_num_input_tokens", "BOOL"), opt("return_num_output_tokens", "BOOL"),
              opt("beam_width", "INT32"), opt("stream", "BOOL"), opt("lora_task_id", "UINT64"),
              opt("guided_decoding_guide_type", "STRING"), opt("guided_decoding_guide", "STRING")],
    "output": [tensor("text_output", "STRING", [-1]), tensor("cum_log_probs", "FP32", [-1]),
               tensor("output_log_probs", "FP32", [-1, -1]), tensor("num_input_tokens", "INT32", [1]),
               tensor("num_output_tokens", "INT32", [1])],
}}

# The 2023/early-2024 ensemble (fca166c): UINT32 max_tokens [-1], top_k, min_length, random_seed, no
# exclude_input_in_output, no guides, no token counts.
OLD_ENSEMBLE = {"config": {
    "name": "ensemble", "platform": "ensemble", "max_batch_size": 128,
    "input": [tensor("text_input", "STRING", [-1]), tensor("max_tokens", "UINT32", [-1]),
              opt("bad_words", "STRING", [-1]), opt("stop_words", "STRING", [-1]), opt("end_id", "UINT32"),
              opt("pad_id", "UINT32"), opt("top_k", "UINT32"), opt("top_p", "FP32"), opt("temperature", "FP32"),
              opt("length_penalty", "FP32"), opt("repetition_penalty", "FP32"), opt("min_length", "UINT32"),
              opt("presence_penalty", "FP32"), opt("random_seed", "UINT64"), opt("return_log_probs", "BOOL"),
              opt("beam_width", "UINT32"), opt("stream", "BOOL")],
    "output": [tensor("text_output", "STRING", [-1]), tensor("cum_log_probs", "FP32", [-1]),
               tensor("output_log_probs", "FP32", [-1, -1])],
}}

# tensorrt_llm_bls with accumulate_tokens: every streamed text_output decodes all tokens so far.
BLS = copy.deepcopy(ENSEMBLE)
BLS["config"].update(name="tensorrt_llm_bls", backend="python", platform="",
                     parameters={"accumulate_tokens": {"string_value": "true"},
                                 "tensorrt_llm_model_name": {"string_value": "tensorrt_llm"}})

# TensorRT-LLM's LLM-API model: text in, SamplingParams as sampling_param_* tensors. No max_tokens: not
# the ensemble interface, and not detected (it is a `text` model with a text_protocol block).
LLMAPI = {"config": {
    "name": "tensorrt_llm", "backend": "python", "max_batch_size": 64,
    "input": [tensor("text_input", "STRING", [-1]), opt("streaming", "BOOL"),
              opt("sampling_param_temperature", "FP32"), opt("sampling_param_max_tokens", "INT32")],
    "output": [tensor("text_output", "STRING", [-1])],
}}

# A custom Python-backend model (no batch dim): names of its own, cumulative output.
CUSTOM = {"config": {
    "name": "my_llm", "backend": "python", "max_batch_size": 0, "model_transaction_policy": {"decoupled": True},
    "input": [tensor("prompt", "STRING", [1]), tensor("max_new_tokens", "INT64", [1]), opt("stream", "BOOL"),
              opt("temperature", "FP32"), opt("seed", "INT64"), opt("stop", "STRING", [-1])],
    "output": [tensor("completion", "STRING", [1]), tensor("generated_tokens", "UINT32", [1])],
}}
CUSTOM_BLOCK: dict[str, Any] = {
    "input": "prompt", "output": "completion", "max_tokens": "max_new_tokens", "stream": "stream",
    "stop_words": "stop", "num_tokens": "generated_tokens", "output_mode": "cumulative",
    "parameters": {"temperature": "temperature", "seed": "seed"}}


def text_result(text: str, n: int | None = None, *, batched: bool = True, output: str = "text_output",
                count: str = "num_output_tokens", count_dtype: Any = np.int32) -> InferResult:
    """One response: `output` holding `text` and, when `n` is given, `count` holding it."""
    shape = (1, 1) if batched else (1,)
    arrays: dict[str, Any] = {output: np.asarray([text.encode()], dtype=np.object_).reshape(shape)}
    if n is not None:
        arrays[count] = np.asarray([n], dtype=count_dtype).reshape(shape)
    return pb_result(**arrays)


def custom_adapter(client: FakeClient, **block: Any) -> TextAdapter:
    wire = TextWire.configured({**CUSTOM_BLOCK, **block})
    return TextAdapter(client, parse_model_config(client.config), wire=wire,  # type: ignore[arg-type]
                       model="m", triton_model="my_llm")


# ------------------------------------------------------------------ detection
@pytest.mark.parametrize(("config", "protocol"), [
    (ENSEMBLE, "tensorrt_llm_text"), (OLD_ENSEMBLE, "tensorrt_llm_text"), (BLS, "tensorrt_llm_text"),
    (LLMAPI, "tensorrt_llm"), (CUSTOM, "tensorrt_llm"),
])
def test_detects_the_ensemble_and_bls_text_interface_and_nothing_else(config: dict[str, Any], protocol: str) -> None:
    spec = parse_model_config(config)
    assert detect_protocol(spec) == protocol
    assert (protocol_mismatches("tensorrt_llm_text", spec) == []) == (protocol == "tensorrt_llm_text")


def test_text_models_that_are_not_detected_are_told_how_to_configure_them() -> None:
    llmapi = protocol_mismatches("tensorrt_llm", parse_model_config(LLMAPI))
    assert "no input 'input_ids' (an integer type)" in llmapi
    assert any('protocol "text" with a text_protocol block' in p for p in llmapi)
    ensemble = protocol_mismatches("tensorrt_llm", parse_model_config(ENSEMBLE))
    assert any('"tensorrt_llm_text"' in p for p in ensemble)
    assert protocol_mismatches("text", parse_model_config(CUSTOM)) == ["no text_protocol block in the model config"]


def test_the_wire_takes_each_release_s_input_names() -> None:
    new = trtllm_text_wire(parse_model_config(ENSEMBLE))
    assert new.parameters == {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
                              "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                              "frequency_penalty": "frequency_penalty", "min_tokens": "min_tokens",
                              "end_id": "end_id", "pad_id": "pad_id"}
    assert (new.stream, new.exclude_input, new.num_tokens, new.return_num_tokens) == (
        "stream", "exclude_input_in_output", "num_output_tokens", "return_num_output_tokens")
    assert (new.guide_type, new.guide, new.cumulative) == ("guided_decoding_guide_type", "guided_decoding_guide", False)
    old = trtllm_text_wire(parse_model_config(OLD_ENSEMBLE))
    assert old.parameters["seed"] == "random_seed" and old.parameters["min_tokens"] == "min_length"
    assert "frequency_penalty" not in old.parameters
    assert old.exclude_input is None and old.num_tokens is None and old.guide_type is None
    assert trtllm_text_wire(parse_model_config(BLS)).cumulative  # accumulate_tokens: "true"


# ------------------------------------------------------------------ tensorrt_llm_text on the wire
async def test_ensemble_request_carries_every_tensor_in_its_declared_dtype_with_the_batch_dim() -> None:
    client = FakeClient(ENSEMBLE, [text_result("The", 1), text_result(" capital", 1), text_result("", 0)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    greq = request(temperature=0.0, top_p=0.9, top_k=0, seed=2**63 + 1, repetition_penalty=1.1,
                   presence_penalty=0.5, frequency_penalty=0.25, min_tokens=2, pad_id=0,
                   stop_texts=["<|im_end|>", "Paris", "Paris"], bad_texts=["darn"], bad_words=[[99]])
    chunks = await collect(adapter.generate(greq))
    assert [(c.text, c.num_tokens, c.token_ids) for c in chunks] == [("The", 1, []), (" capital", 1, [])]
    t = sent(client.requests[0])
    assert t["text_input"].tolist() == [[b"Hi there"]] and t["max_tokens"].tolist() == [[8]]
    assert t["max_tokens"].dtype == np.int32 and t["seed"].dtype == np.uint64 and t["seed"].tolist() == [[2**63 + 1]]
    assert t["stream"].tolist() == [[True]] and t["exclude_input_in_output"].tolist() == [[True]]
    assert t["end_id"].tolist() == [[2]] and t["pad_id"].tolist() == [[0]] and t["top_k"].tolist() == [[0]]
    assert t["temperature"].tolist() == [[0.0]] and t["min_tokens"].tolist() == [[2]]
    assert t["top_p"].tolist() == [[pytest.approx(0.9)]] and t["frequency_penalty"].tolist() == [[0.25]]
    assert t["stop_words"].tolist() == [[b"<|im_end|>", b"Paris"]] and t["bad_words"].tolist() == [[b"darn"]]
    assert t["return_num_output_tokens"].tolist() == [[True]]
    assert "return_log_probs" not in t and "guided_decoding_guide" not in t
    assert [o.name for o in client.requests[0].pb.outputs] == ["text_output", "num_output_tokens"]
    assert client.streams[0].cancelled  # closed (a no-op once finished) so a live request never lingers


async def test_ensemble_guides_travel_as_the_two_guide_tensors() -> None:
    client = FakeClient(ENSEMBLE, [text_result('{"a": 1}', 6)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    assert adapter.guide_kinds and adapter.protocol == "tensorrt_llm_text"
    schema = '{"type": "object"}'
    await collect(adapter.generate(request(guide=Guide("json_schema", schema))))
    t = sent(client.requests[0])
    assert t["guided_decoding_guide_type"].tolist() == [[b"json_schema"]]
    assert t["guided_decoding_guide"].tolist() == [[schema.encode()]]
    await collect(adapter.generate(request(guide=Guide("choice", '["yes", "no"]'))))
    t = sent(client.requests[1])
    assert t["guided_decoding_guide_type"].tolist() == [[b"ebnf_grammar"]]
    assert t["guided_decoding_guide"].tolist() == [[b'root ::= "yes" | "no"']]


async def test_old_ensemble_gets_uint32_and_its_old_names_and_refuses_what_it_lacks() -> None:
    client = FakeClient(OLD_ENSEMBLE, [text_result("Paris")])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    [chunk] = await collect(adapter.generate(request(seed=7, min_tokens=1, top_k=40)))
    assert (chunk.text, chunk.num_tokens) == ("Paris", None)  # None: the gateway counts with its tokenizer
    t = sent(client.requests[0])
    assert t["max_tokens"].dtype == np.uint32 and t["end_id"].dtype == np.uint32 and t["top_k"].dtype == np.uint32
    assert t["random_seed"].tolist() == [[7]] and t["min_length"].tolist() == [[1]]
    assert "exclude_input_in_output" not in t and "return_num_output_tokens" not in t
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(frequency_penalty=0.5)))
    assert e.value.param == "frequency_penalty" and e.value.code == "unsupported_parameter"
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(guide=Guide("regex", "[0-9]+"))))
    assert e.value.param == "response_format" and not adapter.guide_kinds
    assert not adapter.supports("frequency_penalty") and adapter.supports("seed") and adapter.supports("stop_words")


@pytest.mark.parametrize(("config", "name"), [(ENSEMBLE, "min_tokens"), (OLD_ENSEMBLE, "min_length")],
                         ids=["ensemble", "old-ensemble"])
async def test_ensemble_ignore_eos_is_a_minimum_length_of_the_whole_budget(config: dict[str, Any], name: str) -> None:
    client = FakeClient(config, [text_result("Paris")])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    await collect(adapter.generate(request(ignore_eos=True)))
    assert sent(client.requests[0])[name].tolist() == [[8]]
    without = copy.deepcopy(config)
    without["config"]["input"] = [i for i in without["config"]["input"] if i["name"] != name]
    with pytest.raises(InvalidRequestError) as e:
        await collect(make(TensorRTLLMTextAdapter, FakeClient(without), "ensemble").generate(request(ignore_eos=True)))
    assert e.value.param == "ignore_eos"


async def test_log_probs_and_token_id_prompts_are_refused_not_dropped() -> None:
    adapter = make(TensorRTLLMTextAdapter, FakeClient(ENSEMBLE), "ensemble")
    assert not adapter.supports("return_logprobs")
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(return_logprobs=True)))
    assert e.value.param == "logprobs"
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(prompt_text="")))
    assert e.value.param == "prompt"
    with pytest.raises(InvalidRequestError) as e:  # bad words as ids only: nothing to send as text
        await collect(adapter.generate(request(bad_words=[[5]])))
    assert e.value.param == "bad_words"


async def test_ensemble_not_streaming_asks_for_one_response() -> None:
    client = FakeClient(ENSEMBLE, [text_result("The capital of France is Paris.", 8)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    [chunk] = await collect(adapter.generate(request(stream_tokens=False)))
    assert (chunk.text, chunk.num_tokens) == ("The capital of France is Paris.", 8)
    assert sent(client.requests[0])["stream"].tolist() == [[False]]


class RefusesUnary(FakeClient):
    """A Triton that serves this ensemble over streams only (its composing model is decoupled)."""

    async def infer(self, request: InferRequest, *, model: str, timeout_s: float | None) -> InferResult:
        self.requests.append(request)
        raise BackendError("Triton failed the request", detail="ModelInfer RPC doesn't support models with "
                                                              "decoupled transaction policy")


async def test_ensemble_that_does_not_say_decoupled_falls_back_to_streams_for_good() -> None:
    cfg = copy.deepcopy(ENSEMBLE)
    del cfg["config"]["model_transaction_policy"]
    client = RefusesUnary(cfg, [text_result("Paris", 1)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    [chunk] = await collect(adapter.generate(request()))
    assert chunk.text == "Paris" and len(client.requests) == 2 and len(client.streams) == 1
    await collect(adapter.generate(request()))
    assert len(client.requests) == 3 and len(client.streams) == 2  # no unary try any more


async def test_unary_model_without_exclude_input_has_the_echoed_prompt_stripped() -> None:
    cfg = copy.deepcopy(OLD_ENSEMBLE)
    client = FakeClient(cfg, [text_result("Hi there The answer")])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    [chunk] = await collect(adapter.generate(request()))
    assert chunk.text == " The answer" and sent(client.requests[0])["stream"].tolist() == [[False]]


async def test_bls_accumulated_text_becomes_deltas_holding_back_an_incomplete_character() -> None:
    client = FakeClient(BLS, [text_result("The", 1), text_result("The caf", 1), text_result("The caf\ufffd", 1),
                              text_result("The café", 1), text_result("The café\ufffd", 1)])
    adapter = make(TensorRTLLMTextAdapter, client, "bls")
    chunks = await collect(adapter.generate(request()))
    # Counts stay deltas (the tensorrt_llm model's own per response); the U+FFFD at the very end is
    # what the model finally said, so it is flushed.
    assert [(c.text, c.num_tokens) for c in chunks] == [("The", 1), (" caf", 1), ("", 1), ("é", 1), ("", 1),
                                                        ("\ufffd", 0)]


def test_text_state_diffs_cumulative_text_and_counts() -> None:
    state = TextState(TextWire(cumulative=True, cumulative_count=True))
    assert [state.text(t, i == 0) for i, t in enumerate(["a", "ab", "ab\ufffd\ufffd", "abé", "abé!"])] == \
        ["a", "b", "", "é", "!"]
    assert [state.count(n) for n in (1, 2, 4, 5)] == [1, 1, 2, 1] and state.flush() == ""
    echo = TextState(TextWire(), echo="PROMPT")
    assert echo.text("PROMPTx", True) == "x" and echo.text("PROMPTy", False) == "PROMPTy"  # first response only


# ------------------------------------------------------------------ text: wire from the config block
async def test_custom_model_gets_its_own_names_and_dtypes_and_cumulative_text_is_diffed() -> None:
    def res(text: str, n: int) -> InferResult:
        return text_result(text, n, batched=False, output="completion", count="generated_tokens",
                           count_dtype=np.uint32)

    client = FakeClient(CUSTOM, [res("Par", 1), res("Paris", 2), res("Paris.", 3), res("Paris.", 3)])
    adapter = custom_adapter(client)
    assert adapter.protocol == "text" and not adapter.guide_kinds
    chunks = await collect(adapter.generate(request(temperature=0.5, seed=-3, stop_texts=["\n\n"])))
    assert [(c.text, c.num_tokens) for c in chunks] == [("Par", 1), ("is", 1), (".", 1)]
    t = sent(client.requests[0])
    assert set(t) == {"prompt", "max_new_tokens", "stream", "temperature", "seed", "stop"}
    assert t["prompt"].tolist() == [b"Hi there"] and t["max_new_tokens"].dtype == np.int64
    assert t["max_new_tokens"].tolist() == [8] and t["seed"].tolist() == [-3] and t["stop"].tolist() == [b"\n\n"]
    assert [o.name for o in client.requests[0].pb.outputs] == ["completion", "generated_tokens"]
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(top_p=0.9)))  # not mapped by the block
    assert e.value.param == "top_p"
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(guide=Guide("json_object", None))))
    assert e.value.param == "response_format"


async def test_neutral_values_of_parameters_a_text_model_lacks_are_not_sent_and_not_refused() -> None:
    # What many clients send with every request (issue #20): values that change nothing need no input.
    neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "top_p": 1.0,
               "top_k": 0}
    client = FakeClient(CUSTOM, [text_result("x", batched=False, output="completion")])
    await collect(custom_adapter(client).generate(request(seed=5, **neutral)))
    t = sent(client.requests[0])
    assert t["seed"].tolist() == [5] and not set(neutral) & set(t)
    # The 2023 ensemble has no frequency_penalty input: 0 is dropped, 0.5 is refused.
    client = FakeClient(OLD_ENSEMBLE, [text_result("x")])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    await collect(adapter.generate(request(frequency_penalty=0.0, presence_penalty=0.0)))
    t = sent(client.requests[0])
    assert "frequency_penalty" not in t and t["presence_penalty"].tolist() == [[0.0]]
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(frequency_penalty=0.5)))
    assert e.value.param == "frequency_penalty"


def test_block_tensors_the_model_lacks_are_named_with_their_config_key() -> None:
    wire = TextWire.configured({**CUSTOM_BLOCK, "max_tokens": "max_len", "stream": "temperature",
                                "parameters": {"top_k": "k"}})
    assert protocol_mismatches("text", parse_model_config(CUSTOM), wire) == [
        "no input 'max_len' (text_protocol.max_tokens)",
        "input 'temperature' (text_protocol.stream) is FP32, expected BOOL",
        "no input 'k' (text_protocol.parameters.top_k)"]
    assert protocol_mismatches("text", parse_model_config(CUSTOM), TextWire.configured(CUSTOM_BLOCK)) == []


async def test_auto_with_a_text_block_speaks_text_and_a_mismatch_stops_start_up() -> None:
    client = FakeClient(CUSTOM)
    auto = AutoLLMBackend(FakePool(client), "u", "m", "my_llm",  # type: ignore[arg-type]
                          text_wire=TextWire.configured(CUSTOM_BLOCK))
    await auto.check()
    assert isinstance(auto.adapter, TextAdapter) and auto.protocol == "text"
    for cfg in (ENSEMBLE, LLMAPI):
        bad = AutoLLMBackend(FakePool(FakeClient(cfg)), "u", "m", "t", protocol="text",  # type: ignore[arg-type]
                             text_wire=TextWire.configured(CUSTOM_BLOCK))
        with pytest.raises(BackendUnavailableError) as e:
            await bad.check()
        assert "configured protocol 'text'" in e.value.message and "'prompt' (text_protocol.input)" in e.value.message
    ens = AutoLLMBackend(FakePool(FakeClient(ENSEMBLE)), "u", "m", "ensemble")  # type: ignore[arg-type]
    await ens.check()
    assert isinstance(ens.adapter, TensorRTLLMTextAdapter) and ens.protocol == "tensorrt_llm_text"


# ------------------------------------------------------------------ the config block
def _config(tmp_path: Path, **entry: Any) -> Path:
    base = {"name": "m", "url": "127.0.0.1:8001", "path": str(REPO / "models" / "smollm2-135m-instruct"),
            "chat_template": str(BUNDLED_TEMPLATES / "smollm2.jinja")}
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps({"llm": [{**base, **entry}]}), encoding="utf-8")
    return path


@pytest.mark.parametrize(("entry", "field", "words"), [
    ({"protocol": "text"}, "llm[0]", "needs a text_protocol block"),
    ({"protocol": "vllm", "text_protocol": {"input": "p", "output": "o", "max_tokens": "n"}}, "llm[0]",
     'text_protocol is for protocol "text"'),
    ({"protocol": "text", "text_protocol": {"input": "p", "output": "o"}}, "llm[0].text_protocol.max_tokens",
     "missing required field"),
    ({"protocol": "text", "text_protocol": {"input": "p", "output": "o", "max_tokens": "n",
                                            "parameters": {"temprature": "t"}}},
     "llm[0].text_protocol.parameters.temprature", ""),
    ({"protocol": "text", "text_protocol": {"input": "p", "output": "o", "max_tokens": "n", "guide": "g"}},
     "llm[0].text_protocol", "set both or neither"),
    ({"protocol": "text", "text_protocol": {"input": "p", "output": "o", "max_tokens": "n", "outptu_mode": "x"}},
     "llm[0].text_protocol.outptu_mode", "unknown field"),
])
def test_bad_text_blocks_are_config_errors_naming_the_field(tmp_path: Path, entry: dict[str, Any], field: str,
                                                           words: str) -> None:
    if not (REPO / "models" / "smollm2-135m-instruct").is_dir():
        pytest.skip("the bundled models are not prepared")
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, **entry))
    assert e.value.field.startswith(field) and words in e.value.reason, str(e.value)


def test_the_bundled_config_declares_both_reference_text_models() -> None:
    if not (REPO / "models" / "smollm2-135m-instruct").is_dir():
        pytest.skip("the bundled models are not prepared")
    config = load_config(BUNDLED_CONFIG)
    entries = {m.name: m for m in config.llm}
    assert entries["smollm2-135m-instruct-trtllm-text"].protocol == "auto"
    text = entries["smollm2-135m-instruct-text"]
    assert text.protocol == "text" and text.text_protocol is not None
    wire = TextWire.configured(text.text_protocol.model_dump())
    assert wire.cumulative and wire.input == "prompt" and wire.parameters["min_tokens"] == "min_new_tokens"
