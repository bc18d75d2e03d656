"""`ignore_eos: true` (vLLM's extension; AIPerf / genai-perf and Triton's own frontend tests send it for
fixed-length outputs), against the real tritonserver through the `openai` client:
- the vLLM backend interface (`smollm2-135m-instruct-vllm`, Triton model `smollm2-vllm`) gets it as
  `sampling_parameters.ignore_eos`, which the reference model honours as vLLM does (its end id no longer ends the
  sequence; model.py `_job`), so a greedy answer that ends on EOS well before `max_tokens` runs on to
  `max_tokens`: finish_reason "length", and the model's own counter of generated tokens says so;
- the TensorRT-LLM interface (`smollm2-135m-instruct`), which has no such switch, gets a minimum length of the
  whole budget (`min_tokens`), under which the end token is masked: the answer goes on past where it ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import API_KEY, LLM, GatewayServer, read_ref_stats
from tests.helpers import requires_models

pytestmark = requires_models("smollm2-135m-instruct")

VLLM, VLLM_TRITON = "smollm2-135m-instruct-vllm", "smollm2-vllm"
MAX = 40
# A message SmolLM2 answers greedily in ten tokens ("Hello! How can I assist you today?"), then its end token.
SHORT: list[Any] = [{"role": "user", "content": "Hi!"}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": MAX}


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _short_answer(client: openai.OpenAI, model: str) -> tuple[str, int]:
    r = client.chat.completions.create(model=model, messages=SHORT, **GREEDY)
    assert r.usage is not None and r.choices[0].finish_reason == "stop", r
    assert r.usage.completion_tokens < MAX // 2, "the premise: the plain answer ends on EOS well before max_tokens"
    return r.choices[0].message.content or "", r.usage.completion_tokens


def test_vllm_interface_runs_to_max_tokens_past_eos(client: openai.OpenAI, ref_stats_dir: Path) -> None:
    text, produced = _short_answer(client, VLLM)
    before = read_ref_stats(ref_stats_dir, VLLM_TRITON)["tokens_generated"]
    r = client.chat.completions.create(model=VLLM, messages=SHORT, **GREEDY, extra_body={"ignore_eos": True})
    generated = read_ref_stats(ref_stats_dir, VLLM_TRITON)["tokens_generated"] - before
    assert r.choices[0].finish_reason == "length" and r.usage is not None
    assert r.usage.completion_tokens == MAX == generated  # counted by the model itself, past its end token
    assert (r.choices[0].message.content or "").startswith(text)  # greedy: the same answer up to the EOS
    # The completions route, as genai-perf's completions endpoint sends it.
    c = client.completions.create(model=VLLM, prompt="The capital of France is", **GREEDY,
                                  extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length" and c.usage is not None and c.usage.completion_tokens == MAX
    assert produced < MAX


def test_vllm_interface_aiperf_style_stream(client: openai.OpenAI) -> None:
    # AIPerf / genai-perf's recipe for a fixed output length: max_tokens = min_tokens = N and ignore_eos, streamed
    # with usage.
    finish, usage, pieces = None, None, 0
    for chunk in client.chat.completions.create(model=VLLM, messages=SHORT, stream=True, temperature=0,
                                                max_tokens=MAX, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True, "min_tokens": MAX}):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            pieces += 1
        usage = chunk.usage or usage
    assert finish == "length" and usage is not None and usage.completion_tokens == MAX and pieces > 1


def test_tensorrt_llm_interface_holds_the_end_token_back(client: openai.OpenAI) -> None:
    text, _ = _short_answer(client, LLM)
    r = client.chat.completions.create(model=LLM, messages=SHORT, **GREEDY, extra_body={"ignore_eos": True})
    longer = r.choices[0].message.content or ""
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == MAX
    assert longer.startswith(text) and len(longer) > len(text)  # the same answer, then on where it had ended
