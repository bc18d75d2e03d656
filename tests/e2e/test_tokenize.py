"""vLLM's `/tokenize` and `/detokenize` (its documented JSON: vLLM ships no client for them), on LLMs and
encoders: a chat's count is exactly the prompt `/v1/chat/completions` sends, a prompt's is what
`/v1/completions` and `/v1/embeddings` count."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from openai_api.text.tokenizer import TextTokenizer
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.helpers import MODELS

EMB = "all-minilm-l6-v2"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def tokenize(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def max_model_len(http: httpx.Client, model: str) -> int:
    return int(http.get(f"/v1/models/{model}").json()["max_model_len"])


def test_prompt_on_an_llm(http: httpx.Client, client: openai.OpenAI) -> None:
    tok = TextTokenizer.from_folder(MODELS / LLM)
    prompt = "The capital of France is"
    out = tokenize(http, model=LLM, prompt=prompt)
    assert out == {"count": len(tok.encode(prompt)), "max_model_len": max_model_len(http, LLM),
                   "tokens": tok.encode(prompt), "token_strs": None}
    usage = client.completions.create(model=LLM, prompt=prompt, max_tokens=1, temperature=0).usage
    assert usage is not None and usage.prompt_tokens == out["count"]
    strs = tokenize(http, model=LLM, prompt=prompt, return_token_strs=True)["token_strs"]
    assert strs == [tok.tokenizer.id_to_token(i) for i in out["tokens"]] and strs[1] == "Ġcapital"
    assert tokenize(http, prompt=prompt) == out  # no model: the first LLM, as vLLM serves one


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "required"}],
                         ids=["plain", "tools", "forced-tool"])
def test_messages_count_the_prompt_a_chat_sends(http: httpx.Client, client: openai.OpenAI,
                                                extra: dict[str, Any]) -> None:
    out = tokenize(http, model=LLM, messages=MESSAGES, **extra)
    usage = client.chat.completions.create(model=LLM, messages=MESSAGES, max_tokens=1, temperature=0, **extra).usage
    assert usage is not None and out["count"] == usage.prompt_tokens == len(out["tokens"])
    text = http.post("/detokenize", json={"model": LLM, "tokens": out["tokens"]}).json()["prompt"]
    assert "What is the capital of France?" in text and ("get_weather" in text) == bool(extra)
    if not extra:
        assert text.endswith("<|im_start|>assistant\n")
    bare = tokenize(http, model=LLM, messages=MESSAGES, add_generation_prompt=False, **extra)
    assert bare["count"] < out["count"]


def test_detokenize_inverts_tokenize(http: httpx.Client) -> None:
    # MiniLM's tokenizer is uncased and strips accents: its round trip is the normalized text.
    for model, text in ((LLM, "Détokenize ünïcode, emoji 🎉 and 中文 too."), (EMB, "detokenize this, too.")):
        ids = tokenize(http, model=model, prompt=text, add_special_tokens=False)["tokens"]
        r = http.post("/detokenize", json={"model": model, "tokens": ids})
        assert r.status_code == 200 and r.json() == {"prompt": text}


def test_prompt_on_an_encoder_counts_what_embeddings_count(http: httpx.Client) -> None:
    out = tokenize(http, model=EMB, prompt="hello world")
    assert out["tokens"][0] == 101 and out["tokens"][-1] == 102  # [CLS] ... [SEP], as /v1/embeddings sends
    assert out["max_model_len"] == max_model_len(http, EMB) == 256
    usage = http.post("/v1/embeddings", json={"model": EMB, "input": "hello world"}).json()["usage"]
    assert usage["prompt_tokens"] == out["count"]
    assert tokenize(http, model=EMB, prompt="hello world", add_special_tokens=False)["count"] == out["count"] - 2


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/tokenize", {"model": LLM}, 400, "prompt"),
    ("/tokenize", {"model": LLM, "prompt": "x", "messages": MESSAGES}, 400, "prompt"),
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/tokenize", {"model": EMB, "messages": MESSAGES}, 400, "messages"),
    ("/tokenize", {"model": LLM, "messages": []}, 400, "messages"),
    ("/tokenize", {"model": LLM, "messages": MESSAGES, "add_special_tokens": True}, 400, "add_special_tokens"),
    ("/tokenize", {"model": LLM, "messages": MESSAGES, "tool_choice": "required"}, 400, "tool_choice"),
    ("/tokenize", {"model": EMB, "prompt": "word " * 70000}, 400, "prompt"),
    ("/tokenize", {"model": LLM, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/detokenize", {"model": LLM, "tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"model": LLM, "tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"model": LLM, "tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "model"),
])
def test_errors_in_openai_shape(http: httpx.Client, path: str, body: dict[str, Any], status: int, param: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param


def test_a_prompt_past_max_model_len_is_counted_and_a_huge_one_refused(http: httpx.Client) -> None:
    out = tokenize(http, model=EMB, prompt="word " * 300)  # as vLLM: counted, so the client can see it is over
    assert out["count"] == 302 > out["max_model_len"] == 256
    r = http.post("/tokenize", json={"model": EMB, "prompt": "word " * 70000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_tokens"
    long_chat = [{"role": "user", "content": "word " * 9000}]  # what a chat would refuse, tokenize refuses
    r = http.post("/tokenize", json={"model": LLM, "messages": long_chat})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_api_keys_apply(gateway: GatewayServer) -> None:
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        r = httpx.post(f"{gateway.url}{path}", json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
