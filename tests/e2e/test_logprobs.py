"""Log-prob alternatives (chat `top_logprobs`, completions `logprobs` > 0) through the gateway, the real
tritonserver and SmolLM2 behind the vLLM backend's interface, with the `openai` client; the protocols that
cannot return them answer a 400 naming their own protocol; and `stream_options` needs `stream: true`.

The oracle for the sampled tokens' log-probs is the same weights behind the TensorRT-LLM token-id protocol,
which returns them in its own `output_log_probs` tensor (another wire format, another gateway adapter)."""

from __future__ import annotations

from typing import Any, cast

import httpx
import openai
import pytest

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

VLLM = f"{LLM}-vllm"
FT = f"{LLM}-ft"
TEXT = f"{LLM}-text"
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
TOKENS = 8


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def chat_entries(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> tuple[str, list[Any]]:
    """(content, logprobs.content entries) of one chat answer, plain or gathered from a stream."""
    args: dict[str, Any] = {"model": model, "messages": QUESTION, "max_tokens": TOKENS, "logprobs": True, **kwargs}
    if not stream:
        r = client.chat.completions.create(**args)
        assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
        assert r.usage is not None and len(r.choices[0].logprobs.content) == r.usage.completion_tokens
        return r.choices[0].message.content or "", r.choices[0].logprobs.content
    text = ""
    entries: list[Any] = []
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                entries += chunk.choices[0].logprobs.content or []
    return text, entries


def completion_logprobs(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """(text, logprobs as one object: tokens, token_logprobs, top_logprobs) of one completion."""
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, **kwargs}
    if not stream:
        r = client.completions.create(**args)
        assert r.choices[0].logprobs is not None
        return r.choices[0].text, r.choices[0].logprobs.model_dump()
    text, merged = "", cast(dict[str, Any], {"tokens": [], "token_logprobs": [], "top_logprobs": []})
    for chunk in client.completions.create(stream=True, **args):
        if chunk.choices:
            text += chunk.choices[0].text
            lp = chunk.choices[0].logprobs
            if lp is not None:
                for key in merged:
                    merged[key] += getattr(lp, key) or []
    return text, merged


@pytest.fixture(scope="module")
def reference_logprobs(client: openai.OpenAI) -> tuple[str, list[float]]:
    """The greedy chat answer and its sampled tokens' log-probs over the TensorRT-LLM token-id protocol."""
    text, entries = chat_entries(client, LLM, False, temperature=0)
    return text, [e.logprob for e in entries]


def check_alternatives(entries: list[Any], k: int) -> None:
    """Each token's alternatives: k of them, each with its UTF-8 bytes, sorted by log-prob (descending);
    greedy decoding means the chosen token is the first, with the same log-prob."""
    for e in entries:
        alts = e.top_logprobs
        assert len(alts) == k, e
        assert all(a.bytes == list(a.token.encode()) and a.logprob <= 0 for a in alts)
        assert [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        if k:
            assert (alts[0].token, alts[0].logprob) == (e.token, e.logprob)
            if k > 1:
                assert alts[1].logprob <= e.logprob


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_chat_top_logprobs_on_the_vllm_interface(client: openai.OpenAI, reference_logprobs: tuple[str, list[float]],
                                                 k: int, stream: bool) -> None:
    text, entries = chat_entries(client, VLLM, stream, temperature=0, top_logprobs=k)
    ref_text, ref_lps = reference_logprobs
    assert text == ref_text and "Paris" in text
    assert "".join(e.token for e in entries) == text
    # The chosen tokens' log-probs are the model's own: the TensorRT-LLM interface reports the same ones, but for
    # float32 rounding: its model may read the prompt's first block from its prefix KV cache and compute the rest
    # in a smaller forward pass, whose sums round differently (~1e-5; smollm2_prefix_cache.py).
    assert [e.logprob for e in entries] == pytest.approx(ref_lps, rel=1e-6, abs=1e-4)
    check_alternatives(entries, k)


def test_chat_sampled_tokens_among_their_alternatives(client: openai.OpenAI) -> None:
    """Sampling (temperature 1): a chosen token as likely as the last of the 20 alternatives is one of them,
    with the same log-prob; every other one is less likely than all of them."""
    _, entries = chat_entries(client, VLLM, False, temperature=1.0, seed=7, top_logprobs=20, max_tokens=24)
    for e in entries:
        alts = {a.token: a.logprob for a in e.top_logprobs}
        assert len(e.top_logprobs) == 20
        if e.logprob >= e.top_logprobs[-1].logprob:
            assert alts.get(e.token) == e.logprob, e
        else:
            assert e.token not in alts


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("k", [1, 5])
def test_completions_logprobs_alternatives_on_the_vllm_interface(client: openai.OpenAI, k: int,
                                                                  stream: bool) -> None:
    text, lp = completion_logprobs(client, VLLM, stream, temperature=0, logprobs=k)
    _, ref = completion_logprobs(client, LLM, False, temperature=0, logprobs=0)
    assert "".join(lp["tokens"]) == text and text
    assert lp["token_logprobs"] == pytest.approx(ref["token_logprobs"], rel=1e-6, abs=1e-6)
    assert ref["top_logprobs"] is None
    assert len(lp["top_logprobs"]) == len(lp["tokens"])
    for token, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        values = list(top.values())
        assert 1 <= len(top) <= k + 1  # the k most likely and the sampled token (OpenAI: up to logprobs + 1)
        assert values == sorted(values, reverse=True)
        assert top[token] == chosen
        assert next(iter(top)) == token  # greedy: the chosen token is the most likely


@pytest.mark.parametrize(("model", "protocol"), [(LLM, "tensorrt_llm"), (FT, "fastertransformer")])
def test_protocols_without_alternatives_name_themselves(client: openai.OpenAI, model: str, protocol: str) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=2, logprobs=True, top_logprobs=2)
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2, logprobs=3)
    for err, param in ((chat.value, "top_logprobs"), (completion.value, "logprobs")):
        body = err.body
        assert isinstance(body, dict) and body["param"] == param and body["code"] == "unsupported_parameter"
        assert f"({protocol})" in body["message"]
        assert protocol == "tensorrt_llm" or "TensorRT-LLM" not in body["message"]


def test_top_logprobs_need_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=VLLM, messages=QUESTION, max_tokens=2, top_logprobs=2)
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "top_logprobs"


def test_models_say_which_protocols_return_alternatives(http: httpx.Client) -> None:
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    caps = {m: (cards[m]["capabilities"]["logprobs"], cards[m]["capabilities"]["top_logprobs"])
            for m in (LLM, VLLM, FT, TEXT)}
    assert caps == {LLM: (True, False), VLLM: (True, True), FT: (True, False), TEXT: (False, False)}


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_stream_options_without_stream_is_a_400(client: openai.OpenAI, route: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        if route == "chat":
            client.chat.completions.create(model=VLLM, messages=QUESTION, max_tokens=2, stream=False,
                                           stream_options={"include_usage": True})
        else:
            client.completions.create(model=VLLM, prompt=PROMPT, max_tokens=2, stream=False,
                                      stream_options={"include_usage": True})
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == "stream_options"
    assert "stream_options can only be used when stream is true" in body["message"]
