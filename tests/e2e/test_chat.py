"""Chat completions through the gateway, the real tritonserver and the real SmolLM2, with the official
`openai` client (sync and async) and raw HTTP where the exact bytes on the wire matter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from openai_api.config import BUNDLED_TEMPLATES
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.helpers import MODELS

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_folder(MODELS / LLM)


def prompt_tokens(tokenizer: TextTokenizer, messages: list[dict[str, Any]]) -> int:
    prompt = ChatTemplate.from_file(BUNDLED_TEMPLATES / "smollm2.jinja").render(messages)
    return len(tokenizer.encode(prompt))


def sse_events(resp: httpx.Response) -> list[bytes]:
    """The `data:` payloads of an SSE response, in order, [DONE] included."""
    events = []
    for block in resp.read().split(b"\n\n"):
        if block.strip():
            assert block.startswith(b"data: "), block
            events.append(block[len(b"data: "):])
    return events


def test_non_streaming_answer_is_real_and_counted(client: openai.OpenAI, tokenizer: TextTokenizer) -> None:
    r = client.chat.completions.create(model=LLM, messages=QUESTION, temperature=0, max_tokens=40)
    text = r.choices[0].message.content
    assert text and "Paris" in text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None
    assert r.usage.prompt_tokens == prompt_tokens(tokenizer, QUESTION)
    assert 0 < r.usage.completion_tokens <= 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_non_streaming_body_matches_openai_schema(http: httpx.Client, openai_schema: Callable[..., None]) -> None:
    r = http.post("/v1/chat/completions", json={"model": LLM, "messages": QUESTION, "max_tokens": 8})
    assert r.status_code == 200, r.text
    openai_schema("CreateChatCompletionResponse", r.json())


def test_stream_chunk_sequence_is_exact(http: httpx.Client, openai_schema: Callable[..., None],
                                        tokenizer: TextTokenizer) -> None:
    body = {"model": LLM, "messages": QUESTION, "stream": True, "temperature": 0, "max_tokens": 30,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    for c in chunks:
        openai_schema("CreateChatCompletionStreamResponse", c)
        assert c["object"] == "chat.completion.chunk" and c["model"] == LLM
    assert len({c["id"] for c in chunks}) == 1
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert middle, "token-by-token content chunks expected"
    assert all(set(c["choices"][0]["delta"]) == {"content"} and c["choices"][0]["finish_reason"] is None
               for c in middle)
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == []
    text = "".join(c["choices"][0]["delta"]["content"] for c in middle)
    assert "Paris" in text
    assert usage["usage"]["prompt_tokens"] == prompt_tokens(tokenizer, QUESTION)
    assert usage["usage"]["completion_tokens"] >= len(middle)


def test_stream_without_include_usage_has_no_usage_chunk(http: httpx.Client) -> None:
    body = {"model": LLM, "messages": QUESTION, "stream": True, "max_tokens": 5}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        events = sse_events(resp)
    assert events[-1] == b"[DONE]"
    assert all(orjson.loads(e)["choices"] for e in events[:-1])


def test_streaming_equals_non_streaming_when_greedy(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": LLM, "messages": QUESTION, "temperature": 0, "max_tokens": 25}
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
              if c.choices]
    assert "".join(pieces) == whole


async def test_async_client_streams_and_answers(gateway: GatewayServer) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0) as aclient:
        r = await aclient.chat.completions.create(model=LLM, messages=QUESTION, temperature=0, max_tokens=20)
        assert "Paris" in (r.choices[0].message.content or "")
        stream = await aclient.chat.completions.create(model=LLM, messages=QUESTION, temperature=0, max_tokens=20,
                                                       stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text == r.choices[0].message.content
        assert usage is not None and usage.completion_tokens == r.usage.completion_tokens  # type: ignore[union-attr]


def test_max_tokens_is_honoured_with_finish_reason_length(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Write a long story about a dragon."}]
    r = client.chat.completions.create(model=LLM, messages=messages, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5
    r2 = client.chat.completions.create(model=LLM, messages=messages, max_completion_tokens=3, temperature=0)
    assert r2.choices[0].finish_reason == "length" and r2.usage and r2.usage.completion_tokens == 3


def test_stop_string_never_appears_in_output(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": LLM, "messages": QUESTION, "temperature": 0, "max_tokens": 30}
    full = client.chat.completions.create(**kwargs).choices[0].message.content or ""
    assert "Paris" in full
    stop = "Paris"
    r = client.chat.completions.create(stop=[stop], **kwargs)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[: full.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, stop=stop, **kwargs) if c.choices)
    assert stop not in streamed and streamed == full[: full.index(stop)]
    # A stop that is a suffix of a token sequence split across tokens ("ari") must not leak either.
    partial = client.chat.completions.create(stop="ari", **kwargs).choices[0].message.content or ""
    assert "ari" not in partial and partial == full[: full.index("ari")]


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": LLM, "messages": [{"role": "user", "content": "Tell me a fun fact."}],
                              "temperature": 1.0, "max_tokens": 20, "seed": 1234}
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_n_gives_independent_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=LLM, messages=QUESTION, n=3, max_tokens=8, seed=7, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content for c in r.choices)
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model=LLM, messages=QUESTION, n=3, max_tokens=8, seed=7,
                                                temperature=1.0, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert sorted(streamed) == [0, 1, 2] and all(streamed.values())
    assert [streamed[i] for i in range(3)] == [c.message.content for c in r.choices]


def test_temperature_zero_is_deterministic(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": LLM, "messages": [{"role": "user", "content": "Name three colours."}],
                              "temperature": 0, "max_tokens": 20}
    answers = {client.chat.completions.create(**kwargs).choices[0].message.content for _ in range(3)}
    assert len(answers) == 1


def test_missing_api_key_is_401(gateway: GatewayServer, openai_schema: Callable[..., None]) -> None:
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": LLM, "messages": QUESTION})
    assert r.status_code == 401
    openai_schema("ErrorResponse", r.json())
    bad = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=LLM, messages=QUESTION)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_malformed_bodies_are_400(http: httpx.Client, openai_schema: Callable[..., None]) -> None:
    cases: list[tuple[bytes, str | None]] = [
        (b"{not json", None),
        (b"[1, 2]", None),
        (orjson.dumps({"model": LLM}), "messages"),
        (orjson.dumps({"model": LLM, "messages": []}), "messages"),
        (orjson.dumps({"model": LLM, "messages": QUESTION, "temperature": 5}), "temperature"),
        (orjson.dumps({"model": LLM, "messages": [{"role": "wizard", "content": "hi"}]}), "messages[0].role"),
        (orjson.dumps({"model": LLM, "messages": QUESTION, "max_tokens": 0}), "max_tokens"),
    ]
    for raw, param in cases:
        r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        openai_schema("ErrorResponse", r.json())
        assert r.json()["error"]["type"] == "invalid_request_error"
        if param:
            assert r.json()["error"]["param"] == param, r.json()


def test_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=LLM, messages=QUESTION, max_tokens=9000)
    assert e.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert e.value.body["param"] == "messages"  # type: ignore[index]


def test_models_and_health(http: httpx.Client, gateway: GatewayServer, openai_schema: Callable[..., None]) -> None:
    r = http.get("/v1/models")
    assert r.status_code == 200
    openai_schema("ListModelsResponse", r.json())
    ids = {m["id"]: m for m in r.json()["data"]}
    assert ids[LLM]["kind"] == "llm" and ids[LLM]["max_model_len"] == 8192
    one = http.get(f"/v1/models/{LLM}")
    assert one.status_code == 200
    openai_schema("Model", one.json())
    assert http.get("/v1/models/nope").status_code == 404
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    ready = httpx.get(f"{gateway.url}/health/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
