"""`/v1/completions` through the gateway and the real Triton SmolLM2, with the official client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import openai
import orjson
import pytest
import tritonclient.grpc.aio as grpc_aio

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.text.tokenizer import TextTokenizer
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.e2e.test_triton_llm import build_request, collect
from tests.helpers import MODELS

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def test_string_prompt(client: openai.OpenAI, http: httpx.Client, openai_schema: Callable[..., None]) -> None:
    r = client.completions.create(model=LLM, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    tok = TextTokenizer.from_folder(MODELS / LLM)
    assert r.usage is not None and r.usage.prompt_tokens == len(tok.encode(PROMPT))
    raw = http.post("/v1/completions", json={"model": LLM, "prompt": PROMPT, "max_tokens": 4})
    openai_schema("CreateCompletionResponse", raw.json())


def test_batch_prompts_and_n(client: openai.OpenAI) -> None:
    r = client.completions.create(model=LLM, prompt=[PROMPT, "Once upon a time"], max_tokens=5, n=2, seed=3,
                                  temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.text for c in r.choices)


def test_token_id_prompts_equal_text_prompts(client: openai.OpenAI) -> None:
    ids = TextTokenizer.from_folder(MODELS / LLM).encode(PROMPT)
    by_text = client.completions.create(model=LLM, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
    by_ids = client.completions.create(model=LLM, prompt=ids, max_tokens=6, temperature=0).choices[0].text
    by_lists = client.completions.create(model=LLM, prompt=[ids, ids], max_tokens=6, temperature=0)
    assert by_text == by_ids == by_lists.choices[0].text == by_lists.choices[1].text


@pytest.mark.parametrize("stream", [False, True])
def test_a_token_prompt_cut_mid_character_leaks_no_prompt_text(client: openai.OpenAI, triton: EmbeddedTriton,
                                                                 stream: bool) -> None:
    """Token ids that end inside a UTF-8 character (a client that splits at byte boundaries): the answer is the
    model's own tokens as the tokenizer decodes them after the prompt's whole characters (vLLM #48853 returned
    the primed prompt text in the first delta). The model's tokens come from Triton directly, greedy."""
    tok = TextTokenizer.from_folder(MODELS / LLM)
    ids = tok.encode("Answer with one emoji. A hot red pepper looks like 🌶")
    cut = next(k for k in range(len(ids) - 1, 0, -1) if tok.decode(ids[:k]).endswith("\ufffd"))
    prompt = ids[:cut]

    info = load_config(BUNDLED_CONFIG).model_info(LLM)  # the sampling defaults the gateway sends with it
    assert info.top_p is not None and info.repetition_penalty is not None
    sampling = {"runtime_top_p": (info.top_p, "FP32"), "repetition_penalty": (info.repetition_penalty, "FP32")}

    async def model_tokens() -> list[int]:
        c = grpc_aio.InferenceServerClient(triton.grpc_url)
        try:
            return (await collect(c, build_request(prompt, 8, **sampling))).tokens
        finally:
            await c.close()

    out = asyncio.run(model_tokens())
    expected = tok.decode(prompt + out)[len(tok.decode(prompt).rstrip("\ufffd")):]
    if stream:
        chunks = client.completions.create(model=LLM, prompt=prompt, max_tokens=8, temperature=0, stream=True)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        text = client.completions.create(model=LLM, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    assert text == expected and "pepper" not in text, (text, out)


def test_echo(client: openai.OpenAI) -> None:
    r = client.completions.create(model=LLM, prompt=PROMPT, max_tokens=5, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPT) and len(r.choices[0].text) > len(PROMPT)


def test_stream_shape_usage_and_done(http: httpx.Client, openai_schema: Callable[..., None]) -> None:
    body = {"model": LLM, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        blocks = [b[6:] for b in resp.read().split(b"\n\n") if b.strip()]
    assert blocks[-1] == b"[DONE]"
    chunks = [orjson.loads(b) for b in blocks[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    *texts, finish, usage = chunks
    # OpenAI's spec has no schema for completion stream chunks (intermediate ones carry
    # finish_reason null, as OpenAI sends them); the finishing chunk is a valid completion object.
    openai_schema("CreateCompletionResponse", finish)
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    plain = {k: v for k, v in body.items() if k != "stream_options"}  # stream_options needs stream: true
    whole = http.post("/v1/completions", json={**plain, "stream": False}).json()["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in texts) == whole


def test_logprobs_zero_gives_sampled_token_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=LLM, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and len(lp.tokens) == len(lp.token_logprobs or []) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs or [])


def test_unset_max_tokens_is_not_a_small_default(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=LLM, temperature=0, messages=[
        {"role": "user", "content": "List the numbers from 1 to 30, separated by commas."}])
    assert r.usage is not None and r.usage.completion_tokens > 16
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"suffix": "end"}, "suffix", "unsupported_parameter"),
    ({"logprobs": 2}, "logprobs", "unsupported_parameter"),
    ({"best_of": 3}, "best_of", "unsupported_parameter"),
    ({"prompt": ""}, "prompt", None),
    ({"prompt": []}, "prompt", None),
    ({"prompt": [[]]}, "prompt", None),
    ({"prompt": [10**7]}, "prompt", None),
    ({"max_tokens": 9000}, "prompt", "context_length_exceeded"),
    ({"model": "all-minilm-l6-v2"}, "model", "model_kind_mismatch"),
])
def test_refused_completion_requests(http: httpx.Client, extra: dict, param: str, code: str | None) -> None:
    r = http.post("/v1/completions", json={"model": LLM, "prompt": PROMPT, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    if code:
        assert err["code"] == code
