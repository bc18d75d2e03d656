"""Guided decoding in the reference Triton models, on a real tritonserver, over the exact wire forms:
the TensorRT-LLM tensors ``guided_decoding_guide_type`` / ``guided_decoding_guide`` (smollm2-135m-instruct,
synthetic-llm) and the vLLM backend's ``sampling_parameters`` keys ``structured_outputs`` and
``guided_decoding`` (smollm2-vllm).  Every guided output must parse and validate: the model (135M
parameters, sampled at temperature 0.8, asked unrelated questions) cannot get there by itself.

Kept small: the reference decodes about 18 tokens/s on one core, so schemas are bounded (maxLength,
small integer ranges, enums, maxItems) and each case sends a handful of prompts.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
from tokenizers import Tokenizer
from tritonclient.grpc import InferInput

from openai_api.embedded.launcher import EmbeddedTriton
from tests.helpers import MODELS as MODELS_DIR

TRT = "smollm2-135m-instruct"
VLLM = "smollm2-vllm"
SYNTH = "synthetic-llm"
EOS = 2
TIMEOUT_S = 180.0

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "pet": {
            "type": "object",
            "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 4}},
            "required": ["kind", "legs"],
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age", "mood", "pet", "tags"],
}
# Unrelated to JSON on purpose: left alone the model answers in prose.
QUESTIONS = ["Describe a person.", "What is the capital of France?", "Write a haiku about rain.",
             "Tell me a joke.", "List three fruits."]


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODELS_DIR / TRT / "tokenizer.json"))


def _input(name: str, value: Any, dtype: str) -> InferInput:
    np_type = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64, "BYTES": np.object_}
    arr = np.asarray(value, dtype=np_type[dtype])
    tensor = InferInput(name, list(arr.shape), dtype)
    tensor.set_data_from_numpy(arr)
    return tensor


@dataclass
class Out:
    """One request's result: token ids (TensorRT-LLM) or text (vLLM), the finish reason, errors."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    responses: int = 0
    errors: list[str] = field(default_factory=list)


async def _send(triton: EmbeddedTriton, model: str, inputs: list[InferInput], cancel_after: int | None = None,
                ) -> list[Any]:
    """One request per gRPC stream; the stream ends after the model's FINAL response."""
    async def one() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "inputs": inputs}

    items: list[Any] = []
    client = grpc_aio.InferenceServerClient(triton.grpc_url)
    try:
        async def consume() -> None:
            stream = client.stream_infer(one())
            async for res, err in stream:
                items.append(err if err is not None else res)
                if cancel_after is not None and len(items) >= cancel_after:
                    stream.cancel()
                    return

        await asyncio.wait_for(consume(), TIMEOUT_S)
    finally:
        await client.close()
    return items


async def trt(triton: EmbeddedTriton, tokenizer: Tokenizer, question: str, max_tokens: int,
              guide_type: str | None = None, guide: str | None = None, *, model: str = TRT,
              streaming: bool = True, temperature: float = 0.0, seed: int | None = None,
              extra: list[InferInput] | None = None, cancel_after: int | None = None) -> Out:
    prompt = tokenizer.encode(chat(question), add_special_tokens=False).ids
    inputs = [_input("input_ids", [prompt], "INT32"), _input("input_lengths", [[len(prompt)]], "INT32"),
              _input("request_output_len", [[max_tokens]], "INT32"), _input("end_id", [[EOS]], "INT32"),
              _input("streaming", [[streaming]], "BOOL"), _input("exclude_input_in_output", [[True]], "BOOL"),
              _input("temperature", [[temperature]], "FP32")]
    if seed is not None:
        inputs.append(_input("seed", [[seed]], "UINT64"))
    if guide_type is not None:
        inputs.append(_input("guided_decoding_guide_type", [[guide_type.encode()]], "BYTES"))
    if guide is not None:
        inputs.append(_input("guided_decoding_guide", [[guide.encode()]], "BYTES"))
    out = Out()
    for item in await _send(triton, model, inputs + (extra or []), cancel_after):
        if isinstance(item, Exception):
            out.errors.append(str(item))
            continue
        out.responses += 1
        out.ids += item.as_numpy("output_ids").reshape(-1).tolist()
    out.text = tokenizer.decode(out.ids)
    # What a TensorRT-LLM client can tell: fewer tokens than asked for means the model stopped.
    out.finish = "length" if len(out.ids) >= max_tokens else "stop"
    return out


async def vllm(triton: EmbeddedTriton, question: str, max_tokens: int, *, stream: bool = False,
               temperature: float = 0.0, seed: int | None = None, **params: Any) -> Out:
    sampling = {"max_tokens": max_tokens, "temperature": temperature, **params}
    if seed is not None:
        sampling["seed"] = seed
    inputs = [_input("text_input", [chat(question).encode()], "BYTES"), _input("stream", [stream], "BOOL"),
              _input("sampling_parameters", [json.dumps(sampling).encode()], "BYTES"),
              _input("exclude_input_in_output", [True], "BOOL"), _input("return_finish_reason", [True], "BOOL")]
    out = Out()
    for item in await _send(triton, VLLM, inputs):
        if isinstance(item, Exception):
            out.errors.append(str(item))
            continue
        out.responses += 1
        out.text += item.as_numpy("text_output")[0].decode()
        out.finish = item.as_numpy("finish_reason")[0].decode()
    return out


def assert_valid(out: Out, schema: dict[str, Any]) -> Any:
    assert not out.errors, out.errors
    assert out.finish == "stop", f"the grammar did not finish: {out.text!r}"
    value = json.loads(out.text)
    jsonschema.validate(value, schema)
    return value


# ------------------------------------------------------------------ JSON schema, sampled
@pytest.mark.parametrize(("question", "streaming"), [(QUESTIONS[0], True), (QUESTIONS[1], False), (QUESTIONS[2], True)])
async def test_trtllm_json_schema_sampled(triton: EmbeddedTriton, tokenizer: Tokenizer, question: str,
                                          streaming: bool) -> None:
    out = await trt(triton, tokenizer, question, 100, "json_schema", json.dumps(SCHEMA), streaming=streaming,
                    temperature=0.8, seed=7)
    assert_valid(out, SCHEMA)
    if streaming:
        assert out.responses >= len(out.ids)  # one token per response


@pytest.mark.parametrize(("question", "spelling", "stream"), [
    (QUESTIONS[1], "structured_outputs", False), (QUESTIONS[3], "structured_outputs", True),
    (QUESTIONS[2], "guided_decoding", True), (QUESTIONS[4], "guided_decoding", False),
])
async def test_vllm_json_schema_sampled(triton: EmbeddedTriton, question: str, spelling: str, stream: bool) -> None:
    guide = {"json": SCHEMA}
    # structured_outputs must be a JSON string (the backend json-decodes it); guided_decoding may be
    # either: send one of each form.
    value: Any = json.dumps(guide) if spelling == "structured_outputs" or stream else guide
    out = await vllm(triton, question, 100, stream=stream, temperature=0.8, seed=11, **{spelling: value})
    assert_valid(out, SCHEMA)


# ------------------------------------------------------------------ other guide kinds
async def test_trtllm_json_gives_an_object_or_array(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    # TensorRT-LLM's "json" is xgrammar's built-in JSON grammar: an object or an array; the guide is unused.
    out = await trt(triton, tokenizer, QUESTIONS[1], 60, "json")
    assert not out.errors and out.finish == "stop", out.text
    assert isinstance(json.loads(out.text), dict | list)


@pytest.mark.parametrize("spelling", ["structured_outputs", "guided_decoding"])
async def test_vllm_json_object(triton: EmbeddedTriton, spelling: str) -> None:
    out = await vllm(triton, QUESTIONS[1], 60, **{spelling: json.dumps({"json_object": True})})
    assert not out.errors and out.finish == "stop", out.text
    assert isinstance(json.loads(out.text), dict)


REGEX = r"[0-9]{3}-[a-z]{2,4}"


async def test_regex_on_both_interfaces(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    out = await trt(triton, tokenizer, QUESTIONS[0], 20, "regex", REGEX, temperature=0.8, seed=3)
    assert not out.errors and out.finish == "stop" and re.fullmatch(REGEX, out.text), out.text
    for spelling in ("structured_outputs", "guided_decoding"):
        res = await vllm(triton, QUESTIONS[0], 20, temperature=0.8, seed=3, **{spelling: json.dumps({"regex": REGEX})})
        assert not res.errors and res.finish == "stop" and re.fullmatch(REGEX, res.text), res.text


GRAMMAR = 'root ::= "The answer is " ("yes" | "no" | "maybe") "."'


async def test_ebnf_grammar_on_both_interfaces(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    pattern = r"The answer is (yes|no|maybe)\."
    out = await trt(triton, tokenizer, QUESTIONS[3], 20, "ebnf_grammar", GRAMMAR, streaming=False)
    assert not out.errors and out.finish == "stop" and re.fullmatch(pattern, out.text), out.text
    res = await vllm(triton, QUESTIONS[3], 20, guided_decoding={"grammar": GRAMMAR})
    assert not res.errors and res.finish == "stop" and re.fullmatch(pattern, res.text), res.text


async def test_vllm_choice_in_both_spellings(triton: EmbeddedTriton) -> None:
    choices = ["red", "green", 'a "quoted" \\ one']
    for spelling, value in (("structured_outputs", json.dumps({"choice": choices})),
                            ("guided_decoding", {"choice": choices, "backend": "xgrammar"})):
        for temperature in (0.0, 1.0):
            res = await vllm(triton, QUESTIONS[1], 20, temperature=temperature, seed=5, **{spelling: value})
            assert not res.errors and res.finish == "stop" and res.text in choices, res.text


async def test_vllm_structural_tag(triton: EmbeddedTriton) -> None:
    # xgrammar's structural tag, as vLLM takes it: a string. This one forces <f>{schema}</f>.
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                "content": {"type": "json_schema", "json_schema": city}}}
    res = await vllm(triton, "Which city is the capital of Italy?", 20,
                     structured_outputs=json.dumps({"structural_tag": json.dumps(tag)}))
    assert not res.errors and res.finish == "stop" and res.text.startswith("<f>") and res.text.endswith("</f>")
    jsonschema.validate(json.loads(res.text[3:-4]), city)


# ------------------------------------------------------------------ streaming, limits, other options
async def test_streamed_and_whole_agree(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    guide = json.dumps(SCHEMA)
    streamed = await trt(triton, tokenizer, QUESTIONS[4], 100, "json_schema", guide, temperature=0.8, seed=21)
    whole = await trt(triton, tokenizer, QUESTIONS[4], 100, "json_schema", guide, temperature=0.8, seed=21,
                      streaming=False)
    assert streamed.ids == whole.ids and whole.responses == 1
    assert_valid(whole, SCHEMA)
    v_streamed = await vllm(triton, QUESTIONS[4], 100, stream=True, structured_outputs=json.dumps({"json": SCHEMA}))
    v_whole = await vllm(triton, QUESTIONS[4], 100, structured_outputs=json.dumps({"json": SCHEMA}))
    assert v_streamed.text == v_whole.text and v_streamed.responses > 1
    assert_valid(v_whole, SCHEMA)


async def test_budget_running_out_mid_json_finishes_with_length(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    out = await trt(triton, tokenizer, QUESTIONS[0], 6, "json_schema", json.dumps(SCHEMA))
    assert not out.errors and len(out.ids) == 6 and out.finish == "length"
    assert out.text.startswith('{"name": "')
    with pytest.raises(ValueError):
        json.loads(out.text)
    res = await vllm(triton, QUESTIONS[0], 6, structured_outputs=json.dumps({"json": SCHEMA}))
    assert not res.errors and res.finish == "length" and res.text == out.text


async def test_guide_with_bad_words_min_tokens_stop_words_and_seed(triton: EmbeddedTriton,
                                                                   tokenizer: Tokenizer) -> None:
    guide = 'root ::= "alpha beta gamma" | "alpha delta"'
    plain = await trt(triton, tokenizer, QUESTIONS[1], 20, "ebnf_grammar", guide)
    assert plain.text in ("alpha beta gamma", "alpha delta") and plain.finish == "stop"

    def words(kind: str, token: int) -> InferInput:
        return _input(f"{kind}_words_list", [[[token], [1]]], "INT32")

    # bad words: banning the greedy answer's second token makes it take another, still in the grammar.
    assert len(plain.ids) >= 3 and plain.ids[0] != plain.ids[1]
    banned = await trt(triton, tokenizer, QUESTIONS[1], 20, "ebnf_grammar", guide, extra=[words("bad", plain.ids[1])])
    assert not banned.errors and banned.text in ("alpha beta gamma", "alpha delta") and plain.ids[1] not in banned.ids
    # stop words end a guided output early (TensorRT-LLM keeps the stop word).
    stopped = await trt(triton, tokenizer, QUESTIONS[1], 20, "ebnf_grammar", guide,
                        extra=[words("stop", plain.ids[1])])
    assert not stopped.errors and stopped.ids == plain.ids[:2]
    # min_tokens cannot outlast a finished grammar: the end id is the only token left, so it stops.
    short = await trt(triton, tokenizer, QUESTIONS[1], 20, "regex", "ok", extra=[_input("min_tokens", [[8]], "INT32")])
    assert not short.errors and short.text == "ok" and short.finish == "stop"
    # the same seed gives the same sampled, guided output.
    a = await trt(triton, tokenizer, QUESTIONS[2], 30, "regex", "[a-z]{3,12}", temperature=1.0, seed=99)
    b = await trt(triton, tokenizer, QUESTIONS[2], 30, "regex", "[a-z]{3,12}", temperature=1.0, seed=99)
    assert a.ids == b.ids and re.fullmatch("[a-z]{3,12}", a.text)


async def test_cancelling_a_guided_stream(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    out = await trt(triton, tokenizer, QUESTIONS[0], 100, "json_schema", json.dumps(SCHEMA), cancel_after=3)
    assert out.responses == 3 and not out.errors
    after = await trt(triton, tokenizer, QUESTIONS[0], 20, "regex", REGEX)
    assert re.fullmatch(REGEX, after.text)


async def test_guided_beside_unguided(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    alone = await trt(triton, tokenizer, QUESTIONS[1], 24)
    guided, unguided = await asyncio.gather(
        trt(triton, tokenizer, QUESTIONS[1], 100, "json_schema", json.dumps(SCHEMA), temperature=0.8, seed=5),
        trt(triton, tokenizer, QUESTIONS[1], 24))
    assert_valid(guided, SCHEMA)
    assert unguided.ids == alone.ids and not unguided.text.lstrip().startswith("{")


# ------------------------------------------------------------------ invalid guides
@pytest.mark.parametrize(("guide_type", "guide", "expected"), [
    ("json_schema", '{"type": "object", "properties": ', "not valid JSON"),
    ("json_schema", '{"type": "frobnicate"}', 'Unsupported type "frobnicate"'),
    ("json_schema", None, "guided_decoding_guide is required"),
    ("regex", "(unclosed", "regex cannot be compiled"),
    ("ebnf_grammar", 'root ::= "open', "EBNF grammar cannot be compiled"),
    ("structural_tag", "{}", "'structural_tag' is not supported"),
    (None, '{"type": "object"}', "without guided_decoding_guide_type"),
])
async def test_trtllm_invalid_guides_are_request_errors(triton: EmbeddedTriton, tokenizer: Tokenizer,
                                                        guide_type: str | None, guide: str | None,
                                                        expected: str) -> None:
    out = await trt(triton, tokenizer, QUESTIONS[0], 10, guide_type, guide)
    # (ModelStreamInfer carries the error's message, not its code.)
    assert out.responses == 0 and len(out.errors) == 1 and expected in out.errors[0], out.errors
    ok = await trt(triton, tokenizer, QUESTIONS[0], 3)  # the model keeps serving
    assert not ok.errors and len(ok.ids) == 3


@pytest.mark.parametrize(("params", "expected"), [
    ({"structured_outputs": json.dumps({"json": {"type": "frobnicate"}})}, 'Unsupported type "frobnicate"'),
    ({"structured_outputs": {"json": SCHEMA}}, "expected a string holding a JSON object"),
    ({"guided_decoding": {"regex": "a", "choice": ["b"]}}, "exactly one of"),
    ({"guided_decoding": {"json": json.dumps(SCHEMA)}}, "must be a JSON schema object"),
    ({"guided_decoding": {"regex": "a", "backend": "outlines"}}, "backend 'outlines' is not supported"),
    ({"guided_decoding": '{"grammar": "root ::= "}'}, "EBNF grammar cannot be compiled"),
    ({"guided_decoding": {"choice": ["a"], "frobnicate": 1}}, "unknown field(s) frobnicate"),
    ({"guided_json": {"type": "object"}}, "not supported by this model: guided_json"),
])
async def test_vllm_invalid_guides_are_request_errors(triton: EmbeddedTriton, params: dict[str, Any],
                                                      expected: str) -> None:
    out = await vllm(triton, QUESTIONS[0], 10, **params)
    assert out.responses == 0 and len(out.errors) == 1 and expected in out.errors[0], out.errors
    ok = await vllm(triton, QUESTIONS[0], 3)
    assert not ok.errors and ok.finish == "length"


# ------------------------------------------------------------------ synthetic-llm
async def test_synthetic_llm_emits_a_json_object_when_guided(triton: EmbeddedTriton, tokenizer: Tokenizer) -> None:
    for n in (8, 40, 300):
        out = await trt(triton, tokenizer, "x", n, "json_schema", json.dumps(SCHEMA), model=SYNTH)
        # end_id is set: the object takes n - 1 tokens and the request ends on the end id.
        assert not out.errors and len(out.ids) == n - 1 and out.responses == n
        value = json.loads(out.text)
        assert list(value) == ["text"] and value["text"].startswith(" The quick")
    short = await trt(triton, tokenizer, "x", 3, "json", model=SYNTH)
    assert len(short.ids) == 3 and short.text == '{"text":'  # too short for the object: cut, as a model's would be
    bad = await trt(triton, tokenizer, "x", 8, "frobnicate", "x", model=SYNTH)
    assert bad.errors and "guided_decoding_guide_type 'frobnicate' is not supported" in bad.errors[0]
