"""Cached prompt tokens, from the backend's own reuse figures to every API's usage (no server needed).

The adapters ask for reuse statistics only where the model's Triton config declares them (TensorRT-LLM's
`return_perf_metrics` -> `kv_cache_reused_blocks`, the ensemble's same names, a text model's configured ones,
the LLM-API model's `kv_cache_reused_block` sent as text) and turn reused blocks into tokens with the model's
`tokens_per_block`; the services put the figure in chat / completions `usage.prompt_tokens_details`, Responses
`usage.input_tokens_details` and Anthropic's `cache_read_input_tokens` (with `input_tokens` the rest of the
prompt), and the metrics count it. The figures expected here are written out from the fakes' scripts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from tokenizers import Tokenizer
from tritonclient.grpc import service_pb2

from openai_api.app import create_app
from openai_api.config import ConfigError, load_config
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.services.generation import request_cached_tokens
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationRequest
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from openai_api.triton.text import TensorRTLLMTextAdapter, TextAdapter, TextWire
from openai_api.triton.wire import cached_prompt_tokens, output_int, parse_model_config
from tests.anthropic_events import accumulate, check_stream, parse_sse, validate
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config
from tests.unit.test_protocol_adapters import (
    TRTLLM_CONFIG,
    FakeClient,
    collect,
    make,
    pb_result,
    request,
    sent,
    tensor,
)
from tests.unit.test_text_protocols import ENSEMBLE, LLMAPI, text_result
from tests.unit.test_thinking_budget import PhasedBackend

KEY = "sk-test"
PROMPT = list(range(10, 210))  # 200 prompt tokens


def with_perf(config: dict[str, Any], inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    c = json.loads(json.dumps(config))
    c["config"]["input"] += inputs
    c["config"]["output"] += outputs
    return c


# tensorrtllm_backend docs/model_config.md: return_perf_metrics BOOL [1] in, the reuse figures INT32 [1] out
# (and the times INT64 [1], which the gateway does not read).
PERF_IN = [tensor("return_perf_metrics", "BOOL", [1], True)]
PERF_OUT = [tensor("kv_cache_alloc_new_blocks", "INT32", [1]), tensor("kv_cache_reused_blocks", "INT32", [1]),
            tensor("kv_cache_alloc_total_blocks", "INT32", [1]), tensor("first_token_time_ns", "INT64", [1])]
TRTLLM_PERF = with_perf(TRTLLM_CONFIG, PERF_IN, PERF_OUT)


def trt_result(ids: list[int], reused: int | None) -> Any:
    arrays: dict[str, Any] = {"output_ids": np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)}
    if reused is not None:
        arrays["kv_cache_reused_blocks"] = np.asarray([[reused]], dtype=np.int32)
        arrays["kv_cache_alloc_total_blocks"] = np.asarray([[9]], dtype=np.int32)
    return pb_result(**arrays)


# ------------------------------------------------------------------ the wire
def response(name: str, datatype: str, raw: bytes) -> Any:
    resp = service_pb2.ModelInferResponse()
    out = resp.outputs.add()
    out.name, out.datatype = name, datatype
    resp.raw_output_contents.append(raw)
    return resp


def test_output_int_reads_the_dtype_the_response_says() -> None:
    assert output_int(response("n", "INT32", (7).to_bytes(4, "little")), "n") == 7
    assert output_int(response("n", "INT64", (2**40).to_bytes(8, "little")), "n") == 2**40
    assert output_int(response("n", "UINT32", (3).to_bytes(4, "little")), "n") == 3
    assert output_int(response("n", "FP32", np.float32(5.0).tobytes()), "n") == 5
    # The LLM-API model sends its figures as text, whatever its config declares.
    assert output_int(response("n", "BYTES", (1).to_bytes(4, "little") + b"6"), "n") == 6
    assert output_int(response("n", "BYTES", (3).to_bytes(4, "little") + b"6.0"), "n") == 6
    for resp in (response("n", "BYTES", (2).to_bytes(4, "little") + b"no"), response("n", "INT32", b"\x01"),
                 response("n", "FP32", np.float32("nan").tobytes()), response("other", "INT32", b"\x01\0\0\0")):
        assert output_int(resp, "n") is None


def test_cached_prompt_tokens_are_blocks_times_their_size_within_the_prompt() -> None:
    assert cached_prompt_tokens(3, 32, 200) == 96
    assert cached_prompt_tokens(7, 32, 200) == 200  # a partly matching last block counted whole: never past the prompt
    assert cached_prompt_tokens(0, 32, 200) == 0
    assert cached_prompt_tokens(-1, 32, 200) == 0
    assert cached_prompt_tokens(None, 32, 200) is None


# ------------------------------------------------------------------ TensorRT-LLM tensors
async def test_trtllm_asks_for_reuse_only_where_the_config_declares_it_and_streams_the_figure() -> None:
    client = FakeClient(TRTLLM_PERF, [trt_result([11], 3), trt_result([12], 3)])
    adapter = make(TensorRTLLMAdapter, client, "tensorrt_llm")
    chunks = await collect(adapter.generate(request(prompt_ids=PROMPT)))
    inputs = sent(client.requests[0])
    assert inputs["return_perf_metrics"].tolist() == [[True]]
    asked = [o.name for o in client.requests[0].pb.outputs]
    assert "kv_cache_reused_blocks" in asked and "kv_cache_alloc_total_blocks" not in asked
    assert [c.token_ids for c in chunks] == [[11], [12]]
    assert [c.cached_tokens for c in chunks] == [96, 96]

    # The same model without the perf tensors: nothing asked, nothing reported.
    plain = FakeClient(TRTLLM_CONFIG, [trt_result([11], None)])
    chunks = await collect(make(TensorRTLLMAdapter, plain, "tensorrt_llm").generate(request(prompt_ids=PROMPT)))
    assert "return_perf_metrics" not in sent(plain.requests[0])
    assert [o.name for o in plain.requests[0].pb.outputs] == ["output_ids"]
    assert [c.cached_tokens for c in chunks] == [None]

    # An output without the input that asks for it (or the reverse) is not a way to ask: nothing is sent.
    half = with_perf(TRTLLM_CONFIG, [], PERF_OUT)
    client = FakeClient(half, [trt_result([11], None)])
    await collect(make(TensorRTLLMAdapter, client, "tensorrt_llm").generate(request(prompt_ids=PROMPT)))
    assert "return_perf_metrics" not in sent(client.requests[0])


async def test_trtllm_blocks_become_tokens_with_the_models_tokens_per_block() -> None:
    client = FakeClient(TRTLLM_PERF, [trt_result([11], 2)])
    adapter = TensorRTLLMAdapter(client, parse_model_config(client.config), model="m",  # type: ignore[arg-type]
                                 triton_model="tensorrt_llm", tokens_per_block=64)
    chunks = await collect(adapter.generate(request(prompt_ids=PROMPT)))
    assert chunks[0].cached_tokens == 128
    chunks = await collect(adapter.generate(request(prompt_ids=PROMPT[:100])))
    assert chunks[0].cached_tokens == 100  # at most the prompt


async def test_trtllm_one_response_carries_the_figure_too() -> None:
    config = json.loads(json.dumps(TRTLLM_PERF))
    config["config"]["model_transaction_policy"] = {"decoupled": False}
    config["config"]["input"].append(tensor("exclude_input_in_output", "BOOL", [1], True))
    client = FakeClient(config, [trt_result([11, 12, 2], 5)])
    chunks = await collect(make(TensorRTLLMAdapter, client, "tensorrt_llm").generate(request(prompt_ids=PROMPT)))
    assert [(c.token_ids, c.cached_tokens) for c in chunks] == [([11, 12], 160)]
    assert sent(client.requests[0])["return_perf_metrics"].tolist() == [[True]]


# ------------------------------------------------------------------ text interfaces
ENSEMBLE_PERF = with_perf(ENSEMBLE, PERF_IN, PERF_OUT)


def with_reused(result: Any, name: str, value: Any) -> Any:
    resp = result.get_response()
    out = resp.outputs.add()
    out.name = name
    if isinstance(value, bytes):
        out.datatype = "BYTES"
        resp.raw_output_contents.append(len(value).to_bytes(4, "little") + value)
    else:
        out.datatype = "INT32"
        resp.raw_output_contents.append(int(value).to_bytes(4, "little"))
    return result


async def test_the_ensemble_asks_with_its_own_names_and_reports_each_response() -> None:
    client = FakeClient(ENSEMBLE_PERF, [with_reused(text_result("Hel", 1), "kv_cache_reused_blocks", 4),
                                        with_reused(text_result("", 0), "kv_cache_reused_blocks", 4)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    chunks = await collect(adapter.generate(request(prompt_ids=PROMPT)))
    assert sent(client.requests[0])["return_perf_metrics"].tolist() == [[True]]
    assert "kv_cache_reused_blocks" in [o.name for o in client.requests[0].pb.outputs]
    # The last response has no text, yet its figure is not dropped.
    assert [(c.text, c.cached_tokens) for c in chunks] == [("Hel", 128), ("", 128)]
    # Without the tensors nothing is asked.
    bare = FakeClient(ENSEMBLE, [text_result("Hel", 1)])
    await collect(make(TensorRTLLMTextAdapter, bare, "ensemble").generate(request(prompt_ids=PROMPT)))
    assert "return_perf_metrics" not in sent(bare.requests[0])


LLMAPI_PERF = with_perf(LLMAPI, [tensor("sampling_param_return_perf_metrics", "BOOL", [1], True)],
                        [tensor("kv_cache_reused_block", "INT32", [-1]), tensor("kv_cache_hit_rate", "FP32", [-1])])
LLMAPI_BLOCK = {"input": "text_input", "output": "text_output", "max_tokens": "sampling_param_max_tokens",
                "stream": "streaming", "return_perf_metrics": "sampling_param_return_perf_metrics",
                "reused_blocks": "kv_cache_reused_block"}


async def test_a_text_model_reports_through_its_configured_tensors_even_as_text() -> None:
    config = json.loads(json.dumps(LLMAPI_PERF))
    config["config"]["model_transaction_policy"] = {"decoupled": True}
    client = FakeClient(config, [with_reused(text_result("Hi"), "kv_cache_reused_block", b"3")])
    adapter = TextAdapter(client, parse_model_config(config), wire=TextWire.configured(LLMAPI_BLOCK),  # type: ignore[arg-type]
                          model="m", triton_model="tensorrt_llm", tokens_per_block=16)
    chunks = await collect(adapter.generate(request(prompt_ids=PROMPT)))
    assert sent(client.requests[0])["sampling_param_return_perf_metrics"].tolist() == [[True]]
    assert [(c.text, c.cached_tokens) for c in chunks] == [("Hi", 48)]


def test_a_text_block_that_asks_must_name_the_answer_and_the_answer_must_exist(tmp_path: Path) -> None:
    config = llm_only_config(tmp_path)
    data = json.loads(Path(str(config.source)).read_text())
    data["llm"][0]["text_protocol"] = {k: v for k, v in LLMAPI_BLOCK.items() if k != "reused_blocks"}
    (tmp_path / "model_config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="reused_blocks"):
        load_config(tmp_path / "model_config.json")
    data["llm"][0]["text_protocol"] = LLMAPI_BLOCK
    data["llm"][0]["tokens_per_block"] = 0
    (tmp_path / "model_config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="tokens_per_block"):
        load_config(tmp_path / "model_config.json")


# ------------------------------------------------------------------ per request
def test_a_request_counts_each_prompt_once_and_only_what_every_choice_read() -> None:
    one, two = [1, 2, 3], [4, 5]
    greqs = [GenerationRequest(prompt_ids=p, max_tokens=1) for p in (one, one, two, two)]
    assert request_cached_tokens(greqs, [64, 32, 0, 16]) == 32  # min per prompt, summed
    assert request_cached_tokens(greqs[:1], [64]) == 64
    assert request_cached_tokens(greqs, [64, None, 0, 16]) is None  # one choice unreported: unknown
    # Two equal prompts are two prompts (usage counts both).
    twins = [GenerationRequest(prompt_ids=[1, 2], max_tokens=1), GenerationRequest(prompt_ids=[1, 2], max_tokens=1)]
    assert request_cached_tokens(twins, [8, 8]) == 16


# ------------------------------------------------------------------ usage, through the app
@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    config = llm_only_config(tmp_path)
    app = create_app(load_config(Path(str(config.source))),
                     Settings(config_file=tmp_path, api_keys=[KEY], responses_store=4))
    yield app
    await app.state.gateway.process.close()


def script(app: FastAPI, text: str, cached: Any) -> FakeBackend:
    state = app.state.gateway
    rt = state.services.registry.llm(MODEL)
    fake = FakeBackend([[i] for i in rt.tokenizer.encode(text)], cached=cached)
    rt.backend = InstrumentedLLMBackend(fake, state.metrics, MODEL)  # type: ignore[arg-type]
    return fake


async def post(app: FastAPI, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post(path, json={"model": MODEL, **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r


def data_events(text: str) -> list[dict[str, Any]]:
    """Every JSON `data:` line of an SSE body, in order."""
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: {")]


HI = [{"role": "user", "content": "Hi"}]


async def test_chat_usage_reports_the_backends_cached_tokens_plain_and_streamed(app: FastAPI) -> None:
    script(app, "Hello there.", 8)
    plain = (await post(app, "/v1/chat/completions", {"messages": HI})).json()
    assert plain["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert plain["usage"]["prompt_tokens"] > 8
    script(app, "Hello there.", 8)
    streamed = await post(app, "/v1/chat/completions", {"messages": HI, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    usage = data_events(streamed.text)[-1]["usage"]
    assert usage == plain["usage"]


async def test_chat_usage_says_nothing_of_a_cache_the_backend_cannot_report(app: FastAPI) -> None:
    script(app, "Hello there.", None)
    plain = (await post(app, "/v1/chat/completions", {"messages": HI})).json()
    assert "prompt_tokens_details" not in plain["usage"]
    script(app, "Hello there.", None)
    streamed = await post(app, "/v1/chat/completions", {"messages": HI, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    assert "prompt_tokens_details" not in data_events(streamed.text)[-1]["usage"]


async def test_n_choices_report_what_every_choice_read(app: FastAPI) -> None:
    # Each choice is its own Triton request; choice 1 found less in the cache than choice 0.
    def cached(req: GenerationRequest) -> int:
        return 4 if req.request_id.endswith("-1") else 12

    for stream in (False, True):
        script(app, "Hi.", cached)
        r = await post(app, "/v1/chat/completions", {"messages": HI, "n": 2, "stream": stream,
                                                     "stream_options": {"include_usage": True} if stream else None})
        usage = data_events(r.text)[-1]["usage"] if stream else r.json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 4}


async def test_completions_sum_the_figures_of_their_prompts(app: FastAPI) -> None:
    def cached(req: GenerationRequest) -> int:
        return 2 if len(req.prompt_ids) < 5 else 5

    script(app, " ok", cached)
    r = (await post(app, "/v1/completions", {"prompt": ["Hi", "Once upon a time there was"], "max_tokens": 4})).json()
    assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 7}
    script(app, " ok", cached)
    r2 = await post(app, "/v1/completions", {"prompt": ["Hi", "Once upon a time there was"], "max_tokens": 4,
                                             "stream": True, "stream_options": {"include_usage": True}})
    assert data_events(r2.text)[-1]["usage"] == r["usage"]


async def test_responses_usage_reports_cached_tokens_and_zero_when_unknown(app: FastAPI) -> None:
    script(app, "Paris.", 9)
    plain = (await post(app, "/v1/responses", {"input": "Capital of France?"})).json()
    assert plain["usage"]["input_tokens_details"] == {"cached_tokens": 9, "cache_write_tokens": 0}
    script(app, "Paris.", 9)
    streamed = await post(app, "/v1/responses", {"input": "Capital of France?", "stream": True})
    done = next(e for e in data_events(streamed.text) if e["type"] == "response.completed")
    assert done["response"]["usage"] == plain["usage"]
    script(app, "Paris.", None)
    unknown = (await post(app, "/v1/responses", {"input": "Capital of France?"})).json()
    assert unknown["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


async def test_anthropic_input_tokens_exclude_the_cache_reads(app: FastAPI) -> None:
    body = {"max_tokens": 16, "messages": HI}
    script(app, "Hello.", None)
    cold = (await post(app, "/v1/messages", body)).json()
    prompt = cold["usage"]["input_tokens"]
    assert cold["usage"]["cache_read_input_tokens"] == 0 and cold["usage"]["cache_creation_input_tokens"] == 0

    script(app, "Hello.", 6)
    plain = (await post(app, "/v1/messages", body)).json()
    validate("Message", plain)
    assert plain["usage"] == {"input_tokens": prompt - 6, "output_tokens": cold["usage"]["output_tokens"],
                              "cache_creation_input_tokens": 0, "cache_read_input_tokens": 6}
    script(app, "Hello.", 6)
    streamed = await post(app, "/v1/messages", {**body, "stream": True})
    events = parse_sse(streamed.text)
    check_stream(events)
    start = events[0]["message"]["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (prompt - 6, 6)
    assert accumulate(events)["usage"] == plain["usage"]


async def test_the_thinking_budgets_second_phase_does_not_count_as_the_clients_cache(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    tok = Tokenizer.from_file(str(rt.config.path / "tokenizer.json"))

    class CachedPhases(PhasedBackend):
        async def generate(self, request: GenerationRequest) -> Any:  # type: ignore[override]
            phase = len(self.requests)
            async for chunk in super().generate(request):
                chunk.cached_tokens = (3, 7)[phase]  # phase 2 reads phase 1's blocks: not the client's prompt
                yield chunk

    thinking = list(tok.encode("First I look at the numbers, then I add them up carefully and check twice.",
                               add_special_tokens=False).ids)
    answer = list(tok.encode("The answer is 4.", add_special_tokens=False).ids)
    rt.reasoning_parser = "deepseek_r1"
    fake = CachedPhases([thinking, answer], tok)
    rt.backend = fake
    body = {"max_tokens": 64, "messages": [{"role": "user", "content": "2+2?"}],
            "thinking": {"type": "enabled", "budget_tokens": 16}}
    r = (await post(app, "/v1/messages", body)).json()
    assert len(fake.requests) == 2  # the budget was forced: two phases ran
    assert r["usage"]["cache_read_input_tokens"] == 3


async def test_metrics_count_the_cached_prompt_tokens_per_sequence(app: FastAPI) -> None:
    script(app, "Hello there.", 8)
    await post(app, "/v1/chat/completions", {"messages": HI, "n": 2})
    script(app, "Hello there.", None)
    await post(app, "/v1/chat/completions", {"messages": HI})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        text = (await c.get("/metrics", headers={"authorization": f"Bearer {KEY}"})).text
    line = next(x for x in text.splitlines() if x.startswith("openai_api_cached_prompt_tokens_total{"))
    assert f'model="{MODEL}"' in line and float(line.rsplit(" ", 1)[1]) == 16.0
