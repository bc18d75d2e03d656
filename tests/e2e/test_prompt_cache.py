"""Cached prompt tokens end to end (issue #36 item 3): the reference SmolLM2 engine's prefix KV cache behind the
real tritonserver reports the blocks it reused as TensorRT-LLM does (`return_perf_metrics` ->
`kv_cache_reused_blocks`), and the gateway turns them into each API's usage, read here through the clients people
use: the `openai` client (chat, streamed chat, Responses), the `anthropic` SDK (plain and streamed), and the
TensorRT-LLM text interface (the ensemble's tensors). Anthropic `cache_control` reaches the engine as
TensorRT-LLM's KV-cache retention tensors, recorded by the engine.

Every conversation starts with a system prompt of its own (a random nonce first), so no other test's prompt
shares its first block: its first turn is a cold prefill (0 cached), and its second turn, which repeats the
first turn's prompt and adds a short turn, must find >= 90% of that prompt in the cache. The engine's own counter
of reused blocks (its stats file) is the oracle for the number the gateway reports. Outputs are compared cold
and warm with greedy decoding and their log-probs: a cache hit must not change a token (log-probs agree within
float32 rounding). Kept cheap: ~600-token prompts, a few output tokens."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from tokenizers import Tokenizer

from openai_api.triton.tensorrt_llm import RETENTION_PRIORITY
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.helpers import MODELS

BLOCK = 32  # the engine's tokens_per_block (triton_models/smollm2-135m-instruct/config.pbtxt) and the gateway's
TEXT_LLM = "smollm2-135m-instruct-trtllm-text"  # the same engine behind TensorRT-LLM's ensemble tensors


def system_prompt() -> str:
    """~570 tokens of a system prompt no other request sent: a fresh nonce comes first."""
    facts = " ".join(f"Fact {i}: the {c} box on shelf {i % 7} holds {i * 3} marbles." for i, c in
                     enumerate(["red", "green", "blue", "yellow", "white", "black"] * 5))
    return f"Session {uuid.uuid4().hex}. You answer questions about a store room. {facts}"


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=API_KEY, max_retries=0, timeout=300)


def reused_blocks(ref_stats: Callable[[], dict[str, Any]]) -> int:
    return int(ref_stats()["kv_reused_blocks"])


def chat_turn(client: openai.OpenAI, messages: list[dict[str, Any]], model: str = LLM, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=messages, **{"max_tokens": 4, "temperature": 0, **kw})


def test_a_chats_second_turn_reads_the_first_turns_prompt_from_the_cache(
        client: openai.OpenAI, ref_stats: Callable[[], dict[str, Any]]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()},
                                      {"role": "user", "content": "How many marbles are in the red box?"}]
    first = chat_turn(client, messages)
    assert first.usage.prompt_tokens > 10 * BLOCK
    assert first.usage.prompt_tokens_details is not None and first.usage.prompt_tokens_details.cached_tokens == 0

    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And in the blue one?"}]
    before = reused_blocks(ref_stats)
    second = chat_turn(client, messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.9 * first.usage.prompt_tokens
    assert cached <= second.usage.prompt_tokens
    # The engine's own count of the blocks this request reused is what the gateway reported.
    assert reused_blocks(ref_stats) - before == cached // BLOCK and cached % BLOCK == 0

    # Streamed, with the usage chunk: the same figure (the third request finds even more: turn 2's blocks).
    stream = chat_turn(client, messages, stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens >= cached


def test_greedy_output_and_log_probs_are_the_same_cold_and_warm(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": "Which box holds 12 marbles? Answer in one sentence."}]
    cold = chat_turn(client, messages, logprobs=True, max_tokens=12)
    warm = chat_turn(client, messages, logprobs=True, max_tokens=12)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    # The same prompt again: every full block but the one holding its last token was reused.
    assert warm.usage.prompt_tokens_details.cached_tokens == (cold.usage.prompt_tokens - 1) // BLOCK * BLOCK
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert [e.token for e in warm.choices[0].logprobs.content] == [e.token for e in cold.choices[0].logprobs.content]
    # The reused blocks are the cold request's own numbers; the prompt's tail is computed in a smaller forward pass,
    # whose float32 sums round differently (~1e-6): the same tokens, the same log-probs within that.
    assert [e.logprob for e in warm.choices[0].logprobs.content] == \
        pytest.approx([e.logprob for e in cold.choices[0].logprobs.content], abs=1e-4)


def test_responses_report_cached_input_tokens(client: openai.OpenAI) -> None:
    instructions = system_prompt()
    first = client.responses.create(model=LLM, instructions=instructions, input="How many boxes are red?",
                                    max_output_tokens=4, temperature=0)
    assert first.usage.input_tokens_details.cached_tokens == 0
    history: list[Any] = [{"role": "user", "content": "How many boxes are red?"},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "And green?"}]
    second = client.responses.create(model=LLM, instructions=instructions, input=history, max_output_tokens=4,
                                     temperature=0)
    assert second.usage.input_tokens_details.cached_tokens >= 0.9 * first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens <= second.usage.input_tokens


def test_anthropic_reports_cache_reads_apart_from_input_tokens(claude: anthropic.Anthropic) -> None:
    system = system_prompt()
    turn = [{"role": "user", "content": "How many marbles are in the white box?"}]
    first = claude.messages.create(model=LLM, system=system, messages=turn, max_tokens=4)
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens == 0
    prompt = first.usage.input_tokens
    conversation = [*turn, {"role": "assistant", "content": first.content[0].text if first.content else "?"},
                    {"role": "user", "content": "And the black one?"}]
    with claude.messages.stream(model=LLM, system=system, messages=conversation, max_tokens=4) as stream:
        second = stream.get_final_message()
    read = second.usage.cache_read_input_tokens or 0
    assert read >= 0.9 * prompt
    # Anthropic's input_tokens leaves the cache reads out: together they are the whole prompt.
    assert second.usage.input_tokens > 0 and second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens + read > prompt


def test_anthropic_cache_control_becomes_the_engines_kv_retention(
        claude: anthropic.Anthropic, ref_stats: Callable[[], dict[str, Any]]) -> None:
    """A `cache_control` breakpoint (1 h) on the system prompt reaches the engine as TensorRT-LLM's retention
    tensors: one range from token 0 to the token just after the system text, as SmolLM2's own tokenizer counts
    the ChatML prefix `<|im_start|>system\n` + the text (the engine's stats file records what it received); a
    request without a breakpoint sends none."""
    system = system_prompt()
    before = int(ref_stats().get("kv_retention_requests", 0))
    turn = [{"role": "user", "content": "How many marbles are in the red box?"}]
    claude.messages.create(model=LLM, messages=turn, max_tokens=1, system=[
        {"type": "text", "text": system, "cache_control": {"type": "ephemeral", "ttl": "1h"}}])
    stats = ref_stats()
    tokenizer = Tokenizer.from_file(str(MODELS / LLM / "tokenizer.json"))
    end = len(tokenizer.encode(f"<|im_start|>system\n{system}", add_special_tokens=False).ids)
    assert stats["kv_retention_requests"] == before + 1
    assert stats["kv_retention"] == {"token_range_starts": [0], "token_range_ends": [end],
                                     "token_range_priorities": [RETENTION_PRIORITY],
                                     "token_range_durations_ms": [3_600_000]}
    claude.messages.create(model=LLM, system=system, messages=turn, max_tokens=1)
    assert ref_stats()["kv_retention_requests"] == before + 1


def test_the_ensemble_text_interface_reports_reuse_too(client: openai.OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()},
                                      {"role": "user", "content": "Name one box."}]
    first = chat_turn(client, messages, model=TEXT_LLM)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = chat_turn(client, messages, model=TEXT_LLM)
    assert second.usage.prompt_tokens_details.cached_tokens >= 0.9 * first.usage.prompt_tokens


def test_a_protocol_without_reuse_figures_says_nothing(client: openai.OpenAI) -> None:
    # The vLLM backend has no cached-token output: chat usage leaves prompt_tokens_details out, not a false 0.
    r = client.chat.completions.create(model="smollm2-135m-instruct-vllm", max_tokens=2, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert r.usage is not None and r.usage.prompt_tokens_details is None
