"""Anthropic's Messages API end to end: the official `anthropic` Python SDK against the real gateway and a
real Triton (issue #25).

SmolLM2 (135M) answers the plain, system, stop-sequence and tool cases (a forced `tool` choice is guided,
so its input always parses); `synthetic-reasoning` (the synthetic LLM with its `<think>` section, served with
`reasoning_parser: deepseek_r1`) answers the thinking cases, and SmolLM2 under a template that opens its
`<think>` section the thinking budget (forced by the gateway: SmolLM2 never ends the section itself, so the
answer after it proves the end text and a second generation, both counted by the reference model's own
counters, on the token-ids and on the vLLM text interface). Every streamed response of these tests is
captured as raw bytes under the SDK (`Tee`) and validated event by event against Anthropic's schemas and
event grammar (`tests/anthropic_events.py`); the SDK's own stream accumulator must build the same message as
the plain call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anthropic
import pytest
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from openai_api.config import BUNDLED_TEMPLATES, LLMModel, ModelInfo
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.anthropic_events import check_stream, parse_sse, validate
from tests.e2e.conftest import API_KEY, LLM, REASONING, GatewayServer, gateway_config, read_ref_stats
from tests.helpers import MODELS

ALIAS = "claude-sonnet-4-5"
# SmolLM2 served as a thinking model, by the Triton model serving it (token ids; the vLLM interface, text).
THINKS, THINKS_TEXT = "smollm2-thinks", "smollm2-thinks-vllm"
THINKERS = {THINKS: LLM, THINKS_TEXT: "smollm2-vllm"}
THINKING = "The user wants an answer; let me think it through step by step.\n"
WEATHER: Any = {"name": "get_weather", "description": "The current weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                 "required": ["city"], "additionalProperties": False}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Current SDKs dropped `temperature` (Anthropic's newest models ignore sampling); the gateway still takes it.
GREEDY = {"temperature": 0}

# The SDK's own HTTP library: current releases of `anthropic` use the `httpx2` fork and refuse httpx objects.
try:
    import httpx2 as httpx  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    import httpx  # type: ignore[no-redef,unused-ignore]


class Tee(httpx.HTTPTransport):
    """An httpx transport that keeps a copy of every event-stream body it delivers."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            return response
        copy = bytearray()
        self.streams.append(copy)
        inner = response.stream
        assert isinstance(inner, httpx.SyncByteStream)

        class Copying(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in inner:
                    copy.extend(chunk)
                    yield chunk

            def close(self) -> None:
                inner.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Copying(),
                              extensions=response.extensions, request=request)


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """The session Triton behind a gateway that also serves the reasoning model, SmolLM2 as `ALIAS`, and
    SmolLM2 as a thinking model (`THINKS`: ids; `THINKS_TEXT`: the vLLM interface, text) under a template
    whose generation prompt opens "<think>\n", read with the qwen3 reasoning parser."""
    config = gateway_config(triton)
    next(m for m in config.llm if m.name == LLM).aliases = [ALIAS]
    config.model_infos.append(ModelInfo(name=REASONING, end_id=-1, max_len=4096))
    config.llm.append(LLMModel(name=REASONING, url=triton.grpc_url, path=MODELS / LLM,
                               chat_template=BUNDLED_TEMPLATES / "smollm2.jinja",
                               reasoning_parser="deepseek_r1"))
    template = tmp_path_factory.mktemp("thinks") / "smollm2-thinks.jinja"
    own = (BUNDLED_TEMPLATES / "smollm2.jinja").read_text(encoding="utf-8")
    template.write_text(own.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'"),
                        encoding="utf-8")
    assert "<think>" in template.read_text(encoding="utf-8")
    for name, triton_model in THINKERS.items():
        config.model_infos.append(ModelInfo(name=name, end_id=-1, max_len=8192))
        config.llm.append(LLMModel(name=name, url=triton.grpc_url, path=MODELS / LLM, chat_template=template,
                                   triton_model=triton_model, reasoning_parser="qwen3"))
    server = GatewayServer(config, [API_KEY], Settings(config_file=Path("."), api_keys=[API_KEY])).start()
    yield server
    server.stop()


@pytest.fixture
def tee() -> Iterator[Tee]:
    """The raw streams of one test; each is validated when the test ends."""
    t = Tee()
    yield t
    for raw in t.streams:
        check_stream(parse_sse(raw.decode()))


@pytest.fixture
def client(gateway: GatewayServer, tee: Tee) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=API_KEY, max_retries=0, timeout=120,
                               http_client=httpx.Client(transport=tee, timeout=120))


def plain_and_streamed(client: anthropic.Anthropic, **kw: Any) -> tuple[anthropic.types.Message,
                                                                         anthropic.types.Message]:
    plain = client.messages.create(**kw)
    validate("Message", plain.model_dump(mode="json", exclude_none=True) | {"stop_sequence": plain.stop_sequence})
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    return plain, final


def prompt_total(m: anthropic.types.Message) -> int:
    """The whole prompt's tokens: Anthropic's input_tokens leave out those read from the cache."""
    return m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) + (m.usage.cache_creation_input_tokens or 0)


def same(a: anthropic.types.Message, b: anthropic.types.Message) -> bool:
    """The same message, but for its id and how its prompt splits into cache reads and the rest (the engine's
    prefix cache holds the first request's prompt when the second one comes)."""
    split = {"id": True, "usage": {"input_tokens", "cache_read_input_tokens"}}
    return a.model_dump(exclude=split) == b.model_dump(exclude=split) and prompt_total(a) == prompt_total(b)


def test_a_plain_and_a_streamed_message_are_the_same_message(client: anthropic.Anthropic, tee: Tee) -> None:
    plain, final = plain_and_streamed(client, model=LLM, max_tokens=24, extra_body=GREEDY, messages=QUESTION)
    assert plain.id.startswith("msg_") and plain.type == "message" and plain.role == "assistant"
    assert plain.stop_reason in ("end_turn", "max_tokens") and plain.content[0].type == "text"
    assert plain.content[0].text.strip()
    assert plain.usage.input_tokens > 0 and 0 < plain.usage.output_tokens <= 24
    # The engine's prefix cache may hold this prompt's first blocks (tests/e2e/test_prompt_cache.py): reads, no writes.
    assert plain.usage.cache_creation_input_tokens == 0 and (plain.usage.cache_read_input_tokens or 0) % 32 == 0
    assert same(plain, final), (plain, final)
    [raw] = tee.streams
    assert [e["type"] for e in parse_sse(raw.decode())][:2] == ["message_start", "ping"]


def test_a_system_prompt_is_part_of_the_prompt(client: anthropic.Anthropic) -> None:
    """(SmolLM2's template writes a default system prompt when none is given, so two given ones are compared.)"""
    line = "Answer in one word. "
    short, long = (client.messages.create(model=LLM, max_tokens=8, extra_body=GREEDY, messages=QUESTION,
                                          system=[{"type": "text", "text": text,
                                                   "cache_control": {"type": "ephemeral"}}])
                   for text in (line, line * 5))
    assert prompt_total(long) >= prompt_total(short) + 4 * 5  # 4 more lines of 5+ tokens each
    assert short.content and long.content


def test_a_stop_sequence_ends_the_answer_and_is_named(client: anthropic.Anthropic) -> None:
    free = client.messages.create(model=LLM, max_tokens=24, extra_body=GREEDY, messages=QUESTION)
    text = free.content[0].text  # type: ignore[union-attr]
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    plain, final = plain_and_streamed(client, model=LLM, max_tokens=24, extra_body=GREEDY, messages=QUESTION,
                                      stop_sequences=[stop])
    assert plain.stop_reason == "stop_sequence" and plain.stop_sequence == stop
    assert plain.content[0].text == text[: text.index(stop)].lstrip()  # type: ignore[union-attr]
    assert same(plain, final)


def test_a_tool_loop_with_a_forced_tool(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    for stream in (False, True):
        kw: Any = {"model": LLM, "max_tokens": 40, "extra_body": {"temperature": 0.8}, "messages": messages,
                   "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}}
        if stream:
            with client.messages.stream(**kw) as s:
                first = s.get_final_message()
        else:
            first = client.messages.create(**kw)
        assert first.stop_reason == "tool_use"
        [call] = [b for b in first.content if b.type == "tool_use"]
        assert call.name == "get_weather" and call.id.startswith("toolu_")
        assert isinstance(call.input, dict) and set(call.input) == {"city"}
        answer = client.messages.create(
            model=LLM, max_tokens=24, extra_body=GREEDY, tools=[WEATHER],
            messages=[*messages, {"role": "assistant", "content": first.content},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                    "content": "Sunny, 24 C"}]}])
        assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content


def test_any_tool_choice_always_calls(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model=LLM, max_tokens=60, extra_body={"temperature": 0.8}, messages=QUESTION,
                               tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]


class Stop(BaseModel):
    city: str = Field(max_length=12)
    kind: Literal["capital", "town"]


class Trip(BaseModel):
    """Nested: its schema holds `$defs` + `$ref`, which the guide of a forced call wraps (issue #34)."""

    start: Stop
    end: Stop


@pytest.mark.parametrize("choice", [{"type": "any", "disable_parallel_tool_use": True},
                                    {"type": "tool", "name": "plan_trip"}])
def test_forced_tools_with_a_nested_schema(client: anthropic.Anthropic, choice: dict[str, Any]) -> None:
    """`tool_choice` any (once a 500) and tool, with a tool whose input schema is a nested pydantic model's:
    the call comes, and its input validates."""
    trip = {"name": "plan_trip", "description": "Plan a trip.", "input_schema": Trip.model_json_schema()}
    r = client.messages.create(model=LLM, max_tokens=90, extra_body={"temperature": 0.8}, messages=QUESTION,
                               tools=[trip, WEATHER], tool_choice=choice)  # type: ignore[arg-type]
    assert r.stop_reason == "tool_use", r
    [call] = [b for b in r.content if b.type == "tool_use"]
    if call.name == "plan_trip":
        Trip.model_validate(call.input)
    else:
        assert choice["type"] == "any" and call.name == "get_weather" and set(call.input) == {"city"}  # type: ignore[arg-type]


def test_thinking_blocks_on_a_reasoning_model(client: anthropic.Anthropic) -> None:
    # No budget here: a budget is forced by a second generation from the prompt and the thinking so far, which
    # this prompt-blind stand-in cannot follow (it starts over); SmolLM2 shows it below.
    kw: Any = {"model": REASONING, "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}],
               "thinking": {"type": "adaptive"}}
    plain, final = plain_and_streamed(client, **kw)
    thinking = plain.content[0]
    assert thinking.type == "thinking" and thinking.thinking == THINKING and thinking.signature
    assert plain.content[1].type == "text" and "<think>" not in plain.content[1].text
    assert same(plain, final)
    # A budget too small to hold the end of thinking itself: not forced; the thinking sent is cut to it (the
    # fallback), the answer still follows.
    small, small_final = plain_and_streamed(client, **{**kw, "thinking": {"type": "enabled", "budget_tokens": 5}})
    for m in (small, small_final):
        cut = m.content[0]
        assert cut.type == "thinking" and THINKING.startswith(cut.thinking) and len(cut.thinking) < len(THINKING)
        assert m.content[1].type == "text" and m.content[1].text == plain.content[1].text
    # Thinking passed back in history (with its signature) is accepted.
    again = client.messages.create(model=REASONING, max_tokens=40, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": plain.content},
        {"role": "user", "content": "And again?"}])
    assert again.content


def _completed(folder: Path, model: str, at_least: int) -> int:
    """The reference model's `completed` counter once it reached `at_least` (it is written as a request ends,
    which can be just after its last response reached the gateway); as it is after 10 s otherwise."""
    deadline = time.monotonic() + 10
    while (n := int(read_ref_stats(folder, model)["completed"])) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


@pytest.mark.parametrize("model", [THINKS, THINKS_TEXT])
def test_a_thinking_budget_ends_the_thinking_and_the_answer_follows(client: anthropic.Anthropic, model: str,
                                                                    ref_stats_dir: Path) -> None:
    """SmolLM2 never closes a `<think>` section by itself: with a budget, the gateway ends it (the thinking
    tokenizes, with the model's own tokenizer read here, to at most the budget) and a second generation on
    the model's side writes the answer; streamed and plain alike."""
    budget = 24
    tokenizer = Tokenizer.from_file(str(MODELS / LLM / "tokenizer.json"))
    kw: Any = {"model": model, "max_tokens": 64, "extra_body": GREEDY,
               "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
               "thinking": {"type": "enabled", "budget_tokens": budget}}
    before = _completed(ref_stats_dir, THINKERS[model], 0)
    plain = client.messages.create(**kw)
    middle = _completed(ref_stats_dir, THINKERS[model], before + 2)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert middle - before == 2 and _completed(ref_stats_dir, THINKERS[model], middle + 2) - middle == 2
    for m in (plain, final):
        assert [b.type for b in m.content] == ["thinking", "text"], m.content
        thinking, text = m.content
        assert thinking.type == "thinking" and text.type == "text"
        assert thinking.thinking.strip() and "</think>" not in thinking.thinking and thinking.signature
        assert len(tokenizer.encode(thinking.thinking, add_special_tokens=False).ids) <= budget
        assert text.text.strip() and "think>" not in text.text
        assert m.usage.output_tokens <= 64
    assert same(plain, final)


def test_count_tokens_equals_the_answers_input_tokens(client: anthropic.Anthropic) -> None:
    kw: Any = {"model": LLM, "system": "You are a weather bot.", "messages": QUESTION, "tools": [WEATHER]}
    count = client.messages.count_tokens(**kw)
    answer = client.messages.create(max_tokens=8, extra_body=GREEDY, **kw)
    assert count.input_tokens == prompt_total(answer) > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK warns of the Claude model's retirement
def test_an_alias_serves_the_model(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model=ALIAS, max_tokens=8, extra_body=GREEDY, messages=QUESTION)
    assert r.model == ALIAS and r.content


def test_an_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-opus-9", max_tokens=8, messages=QUESTION)
    validate("ErrorResponse", e.value.body)


@pytest.mark.parametrize("style", ["x-api-key", "authorization"])
def test_a_bad_key_is_an_authentication_error(gateway: GatewayServer, style: str) -> None:
    kw: Any = {"api_key": "wrong"} if style == "x-api-key" else {"auth_token": "wrong", "api_key": None}
    bad = anthropic.Anthropic(base_url=gateway.url, max_retries=0, **kw)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=LLM, max_tokens=8, messages=QUESTION)
    validate("ErrorResponse", e.value.body)
    good = anthropic.Anthropic(base_url=gateway.url, max_retries=0,
                               **({"api_key": API_KEY} if style == "x-api-key" else {"auth_token": API_KEY}))
    assert good.messages.create(model=LLM, max_tokens=4, messages=QUESTION).content is not None


def test_an_over_long_prompt_is_an_invalid_request(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=LLM, max_tokens=8, messages=[{"role": "user", "content": "word " * 12000}])
    validate("ErrorResponse", e.value.body)
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
