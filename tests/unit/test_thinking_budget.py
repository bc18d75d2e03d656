"""The thinking budget forced in two phases (`services.generation.budgeted_chunks`), through the real app and
a fake backend that honours `max_tokens` and plays one script per Triton request: an open thinking section
gets the family's end text and a second generation from the prompt, phase 1's output and that text (token
ids, or text on a text protocol); a closed one a plain continuation; a natural stop one generation. The
plain and the streamed answers are the same blocks. The expected token ids and texts come from SmolLM2's
own tokenizer loaded here with `tokenizers`, and the end text is written out, not read from the parsers."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from tokenizers import Tokenizer

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.quota.caller import Caller, TokenMeter, bind_caller, unbind_caller
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.services.generation import backend_chunks
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from tests.anthropic_events import accumulate, check_stream, parse_sse, validate
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

KEY = "sk-test"
CLOSE = "\n</think>\n\n"  # Qwen3's and DeepSeek-R1's end of thinking
THINKING = "First I look at the numbers, then I add them up carefully and check the sum twice over."
ANSWER = "The answer is 4."


class PhasedBackend(FakeBackend):
    """Plays `phases[k]` (token ids) to the k-th request, at most its `max_tokens` of them; on a text
    `protocol` as text chunks of one token each (`num_tokens` 1), as the vLLM backend sends them."""

    def __init__(self, phases: list[list[int]], tok: Tokenizer, protocol: str = "tensorrt_llm") -> None:
        super().__init__([])
        self.phases = phases
        self.tok = tok
        self.protocol = protocol
        self.closed: list[int] = []  # the requests whose stream the gateway closed early (Triton cancels them)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        k = len(self.requests)
        self.requests.append(request)
        try:
            for i in self.phases[k][: request.max_tokens]:
                if self.protocol == "vllm":
                    yield GenerationChunk(token_ids=[], text=self.tok.decode([i]), num_tokens=1)
                else:
                    yield GenerationChunk(token_ids=[i])
        except GeneratorExit:
            self.closed.append(k)
            raise


@pytest.fixture
def tok() -> Tokenizer:
    """SmolLM2's tokenizer, read from the model folder the bundled config names."""
    entry = next(e for e in json.loads(BUNDLED_CONFIG.read_text())["llm"] if e["name"] == MODEL)
    return Tokenizer.from_file(str(BUNDLED_CONFIG.parent / entry["path"] / "tokenizer.json"))


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    config = llm_only_config(tmp_path)
    app = create_app(load_config(Path(str(config.source))), Settings(config_file=tmp_path, api_keys=[KEY]))
    yield app
    await app.state.gateway.process.close()


def ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def install(app: FastAPI, phases: list[list[int]], tok: Tokenizer, protocol: str, reasoning: str) -> PhasedBackend:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.reasoning_parser = reasoning
    fake = PhasedBackend(phases, tok, protocol)
    rt.backend = fake
    return fake


async def post(app: FastAPI, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, json={"model": MODEL, **body}, headers=headers)


async def both(app: FastAPI, phases: list[list[int]], tok: Tokenizer, protocol: str, reasoning: str,
               body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], PhasedBackend]:
    """The plain answer, the message the streamed events build (each event checked) and the streamed run's fake."""
    install(app, phases, tok, protocol, reasoning)
    plain = await post(app, body)
    assert plain.status_code == 200, plain.text
    validate("Message", plain.json())
    fake = install(app, phases, tok, protocol, reasoning)
    streamed = await post(app, {**body, "stream": True})
    assert streamed.status_code == 200, streamed.text
    events = parse_sse(streamed.text)
    check_stream(events)
    return plain.json(), accumulate(events), fake


def ask(budget: int, max_tokens: int = 64) -> dict[str, Any]:
    return {"max_tokens": max_tokens, "messages": [{"role": "user", "content": "2+2?"}],
            "thinking": {"type": "enabled", "budget_tokens": budget}}


@pytest.mark.parametrize("protocol", ["tensorrt_llm", "vllm"])
async def test_an_open_thinking_section_is_closed_at_the_budget_and_the_answer_follows(
        app: FastAPI, tok: Tokenizer, protocol: str) -> None:
    budget, close = 16, ids(tok, CLOSE)
    thinking, answer = ids(tok, THINKING), ids(tok, ANSWER)
    assert len(thinking) > budget  # the model would think on past the budget
    first = thinking[: budget - len(close)]
    # deepseek_r1: the template opened the thinking section, so the output starts inside it.
    plain, streamed, fake = await both(app, [thinking, answer], tok, protocol, "deepseek_r1", ask(budget))
    assert {**streamed, "id": ""} == {**plain, "id": ""}
    think, text = plain["content"]
    assert think["type"] == "thinking" and think["thinking"] == tok.decode(first) + "\n" and think["signature"]
    assert text == {"type": "text", "text": ANSWER}
    assert plain["stop_reason"] == "end_turn"
    assert plain["usage"]["output_tokens"] == len(first) + len(close) + len(answer)
    one, two = fake.requests
    assert one.max_tokens == budget - len(close)
    assert two.max_tokens == 64 - budget
    if protocol == "vllm":  # text in: the prompt is the text, its ids only count
        assert two.prompt_text == one.prompt_text + tok.decode(first) + CLOSE
    else:
        assert two.prompt_ids == one.prompt_ids + first + close


async def test_a_closed_thinking_section_is_continued_without_an_end_text(app: FastAPI, tok: Tokenizer) -> None:
    head, rest = "<think>Easy.</think>The answer", " is 4."
    out, more = ids(tok, head), ids(tok, rest)
    budget = len(out) + len(ids(tok, CLOSE))  # phase 1 ends by length just after the section closed
    # qwen3: the section is the model's own choice (the prompt does not open it).
    plain, streamed, fake = await both(app, [out + more, more], tok, "tensorrt_llm", "qwen3", ask(budget))
    assert {**streamed, "id": ""} == {**plain, "id": ""}
    assert [b["type"] for b in plain["content"]] == ["thinking", "text"]
    assert plain["content"][0]["thinking"] == "Easy." and plain["content"][1]["text"] == "The answer is 4."
    one, two = fake.requests
    assert two.prompt_ids == one.prompt_ids + out and two.max_tokens == 64 - len(out)
    assert plain["usage"]["output_tokens"] == len(out) + len(more)


async def test_a_natural_stop_within_the_budget_is_one_generation(app: FastAPI, tok: Tokenizer) -> None:
    out = ids(tok, "Short thought." + CLOSE + "Four.")
    plain, streamed, fake = await both(app, [out], tok, "tensorrt_llm", "deepseek_r1", ask(len(out) + 10))
    assert {**streamed, "id": ""} == {**plain, "id": ""}
    assert len(fake.requests) == 1 and fake.requests[0].max_tokens == len(out) + 10 - len(ids(tok, CLOSE))
    assert plain["content"][0]["thinking"] == "Short thought.\n" and plain["content"][1]["text"] == "Four."
    assert plain["usage"]["output_tokens"] == len(out) and plain["stop_reason"] == "end_turn"


async def test_max_tokens_in_phase_two_is_the_stop_reason(app: FastAPI, tok: Tokenizer) -> None:
    thinking, answer = ids(tok, THINKING), ids(tok, ANSWER * 10)
    plain, streamed, fake = await both(app, [thinking, answer], tok, "tensorrt_llm", "deepseek_r1", ask(12, 20))
    assert {**streamed, "id": ""} == {**plain, "id": ""}
    assert plain["stop_reason"] == "max_tokens" and plain["usage"]["output_tokens"] == 20
    assert fake.requests[1].max_tokens == 20 - 12 and plain["content"][1]["type"] == "text"


async def test_a_family_without_an_end_text_or_no_budget_is_one_generation(app: FastAPI, tok: Tokenizer) -> None:
    thinking = ids(tok, THINKING)
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = install(app, [thinking], tok, "tensorrt_llm", "deepseek_r1")
    greq = GenerationRequest(prompt_ids=[1, 2], max_tokens=64)
    plain_gen = backend_chunks(rt, greq)  # no budget: the backend's own generator, nothing wrapped around it
    assert plain_gen.ag_code is PhasedBackend.generate.__code__  # type: ignore[attr-defined]
    await plain_gen.aclose()
    rt.reasoning_parser = None  # no thinking section to close: the budget cannot be forced
    greq.thinking_budget = 8
    got = [c.token_ids[0] async for c in backend_chunks(rt, greq)]
    assert got == thinking and [r.max_tokens for r in fake.requests] == [64]  # (the first never ran)


async def test_closing_the_stream_in_phase_two_cancels_phase_twos_request(app: FastAPI, tok: Tokenizer) -> None:
    thinking, answer = ids(tok, THINKING), ids(tok, ANSWER)
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = install(app, [thinking, answer], tok, "tensorrt_llm", "deepseek_r1")
    gen = backend_chunks(rt, GenerationRequest(prompt_ids=ids(tok, "<think>\n"), max_tokens=64, thinking_budget=16))
    seen = 0
    async for _ in gen:
        seen += 1
        if len(fake.requests) == 2:  # the first chunk of phase 2 (after phase 1's 11 and the end text)
            break
    await gen.aclose()
    assert seen == 11 + 1 + 1 and fake.closed == [1]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_completions_take_the_budget_as_vllms_thinking_token_budget(app: FastAPI, tok: Tokenizer,
                                                                              stream: bool) -> None:
    thinking, answer = ids(tok, THINKING), ids(tok, ANSWER)
    fake = install(app, [thinking, answer], tok, "tensorrt_llm", "deepseek_r1")
    r = await post(app, {"max_tokens": 64, "messages": [{"role": "user", "content": "2+2?"}], "stream": stream,
                         "thinking_token_budget": 16}, "/v1/chat/completions")
    assert r.status_code == 200, r.text
    if stream:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.splitlines()
                  if line.startswith("data: {") and json.loads(line[6:])["choices"]]
        reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
        content = "".join(d.get("content") or "" for d in deltas)
    else:
        message = r.json()["choices"][0]["message"]
        reasoning, content = message["reasoning_content"], message["content"]
    assert reasoning == tok.decode(thinking[: 16 - len(ids(tok, CLOSE))]) + "\n" and content == ANSWER
    assert [q.max_tokens for q in fake.requests] == [11, 48]


async def test_a_keys_quota_counts_the_prompt_once_and_each_phases_generated_tokens(app: FastAPI,
                                                                                    tok: Tokenizer) -> None:
    thinking, answer, prompt = ids(tok, THINKING), ids(tok, ANSWER), ids(tok, "2+2?")
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = install(app, [thinking, answer], tok, "tensorrt_llm", "deepseek_r1")
    rt.backend = InstrumentedLLMBackend(fake, app.state.gateway.metrics, MODEL)  # type: ignore[arg-type]
    reserved: list[int] = []

    async def reserve(tokens: int) -> object:
        reserved.append(tokens)
        return None

    meter = TokenMeter(reserve)
    bound = bind_caller(Caller("k", meter=meter))
    try:
        got = [c async for c in backend_chunks(rt, GenerationRequest(prompt_ids=prompt, max_tokens=64,
                                                                     thinking_budget=16))]
    finally:
        unbind_caller(bound)
    assert len(got) == 11 + 1 + len(answer) and [r.prompt_counted for r in fake.requests] == [False, True]
    assert reserved == [len(prompt) + 11, 64 - 16]  # phase 2: its room only, the prompt was reserved by phase 1
    assert (meter.prompt_tokens, meter.completion_tokens) == (len(prompt), 11 + len(answer))
