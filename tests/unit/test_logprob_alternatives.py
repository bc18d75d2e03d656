"""Log-prob alternatives from the backend to OpenAI's shapes, over HTTP with a scripted backend: chat
`logprobs.content[].top_logprobs[]` ({token, logprob, bytes}) and completions `logprobs.top_logprobs[]`
({token: logprob}), plain and streamed, validated against OpenAI's schema; and the refusals."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config

MODEL = "smollm2-135m-instruct"
AUTH = {"Authorization": "Bearer k1"}

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


class AlternativesBackend(FakeBackend):
    """Plays `script` (token ids), giving token i the log-prob -(i + 1) / 8 and as alternatives itself
    first, then ids 1000 + j, each 1/4 less likely, as many as the request asks for; `protocol` and
    whether it returns alternatives are set per test."""

    def __init__(self, script: list[list[int]], protocol: str = "vllm", alternatives: bool = True) -> None:
        super().__init__(script)
        self.protocol = protocol
        self.alternatives = alternatives

    def supports(self, param: str) -> bool:
        return self.alternatives or param != "top_logprobs"

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        n = 0
        for ids in self.script:
            lps = [-(n + i + 1) / 8 for i in range(len(ids))]
            top = [[(t, lp), *((1000 + j, lp - (j + 1) / 4) for j in range(request.top_logprobs - 1))]
                   for t, lp in zip(ids, lps, strict=True)] if request.top_logprobs else None
            n += len(ids)
            yield GenerationChunk(token_ids=list(ids), logprobs=lps if request.return_logprobs else None,
                                  top_logprobs=top)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> GatewayConfig:
    return llm_only_config(tmp_path_factory.mktemp("config"), url="127.0.0.1:1")


@pytest.fixture(scope="module")
async def app(config: GatewayConfig) -> AsyncIterator[FastAPI]:
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, api_keys=["k1"]))
    yield app
    await app.state.gateway.services.registry.pool.close()


@pytest.fixture
def backend(app: FastAPI) -> AlternativesBackend:
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = AlternativesBackend([[i] for i in rt.tokenizer.encode("Paris is nice")])
    rt.backend = fake
    return fake


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


def events(r: httpx.Response) -> list[dict[str, Any]]:
    data = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e.strip()]
    assert data[-1] == "[DONE]"
    return [json.loads(e) for e in data[:-1]]


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, **kw}


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_alternatives_in_openai_shape(client: httpx.AsyncClient, backend: AlternativesBackend,
                                                 validate: Callable[[str, Any], None], stream: bool) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=3, stream=stream),
                          headers=AUTH)
    assert r.status_code == 200, r.text
    if stream:
        chunks = events(r)
        for c in chunks:
            validate("CreateChatCompletionStreamResponse", c)
        entries = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                   for e in c["choices"][0]["logprobs"]["content"]]
    else:
        validate("CreateChatCompletionResponse", r.json())
        entries = r.json()["choices"][0]["logprobs"]["content"]
    assert backend.requests[0].return_logprobs and backend.requests[0].top_logprobs == 3
    assert [e["logprob"] for e in entries] == [-(i + 1) / 8 for i in range(len(entries))] and entries
    for e in entries:
        alts = e["top_logprobs"]
        assert [set(a) for a in alts] == [{"token", "logprob", "bytes"}] * 3
        assert (alts[0]["token"], alts[0]["logprob"], alts[0]["bytes"]) == (e["token"], e["logprob"], e["bytes"])
        assert [a["logprob"] for a in alts] == [e["logprob"], e["logprob"] - 0.25, e["logprob"] - 0.5]
        assert all(a["bytes"] == list(a["token"].encode()) for a in alts)


async def test_chat_logprobs_without_alternatives_have_empty_lists(client: httpx.AsyncClient,
                                                                   backend: AlternativesBackend) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=0), headers=AUTH)
    assert r.status_code == 200 and backend.requests[0].top_logprobs == 0
    assert all(e["top_logprobs"] == [] for e in r.json()["choices"][0]["logprobs"]["content"])


@pytest.mark.parametrize("stream", [False, True])
async def test_completion_alternatives_in_openai_shape(client: httpx.AsyncClient, backend: AlternativesBackend,
                                                       validate: Callable[[str, Any], None], stream: bool) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 20, "logprobs": 2, "stream": stream}
    r = await client.post("/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    if stream:
        parts = [c["choices"][0]["logprobs"] for c in events(r) if c["choices"] and c["choices"][0]["logprobs"]]
        lp = {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs")}
    else:
        validate("CreateCompletionResponse", r.json())
        lp = r.json()["choices"][0]["logprobs"]
    assert backend.requests[0].top_logprobs == 2
    assert len(lp["top_logprobs"]) == len(lp["tokens"]) > 0
    for token, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # The sampled token is the first alternative here, so the two most likely are all there is.
        assert next(iter(top.items())) == (token, chosen) and len(top) == 2
        assert list(top.values()) == [chosen, chosen - 0.25]


async def test_completion_sampled_token_outside_the_alternatives_is_added(client: httpx.AsyncClient,
                                                                          app: FastAPI) -> None:
    """OpenAI: "up to logprobs + 1 elements": the sampled token is there even when it is not among the
    most likely, in its place by log-prob."""
    rt = app.state.gateway.services.registry.llm(MODEL)

    class Unlikely(AlternativesBackend):
        async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
            yield GenerationChunk(token_ids=[rt.tokenizer.encode("Paris")[0]], logprobs=[-3.0],
                                  top_logprobs=[[(1000, -0.5), (1001, -1.0)]])

    rt.backend = Unlikely([])
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 5, "logprobs": 2},
                          headers=AUTH)
    lp = r.json()["choices"][0]["logprobs"]
    [top] = lp["top_logprobs"]
    assert list(top.values()) == [-0.5, -1.0, -3.0] and top[lp["tokens"][0]] == -3.0


@pytest.mark.parametrize(("protocol", "path", "extra", "param"), [
    ("tensorrt_llm", "/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ("fastertransformer", "/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ("tensorrt_llm", "/v1/completions", {"logprobs": 3}, "logprobs"),
    ("fastertransformer", "/v1/completions", {"logprobs": 1}, "logprobs"),
])
async def test_alternatives_refused_naming_the_models_protocol(client: httpx.AsyncClient, app: FastAPI,
                                                               protocol: str, path: str, extra: dict[str, Any],
                                                               param: str) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = AlternativesBackend([[1]], protocol=protocol, alternatives=False)
    body = chat_body(**extra) if "chat" in path else {"model": MODEL, "prompt": "Hi", **extra}
    r = await client.post(path, json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unsupported_parameter")
    assert f"({protocol})" in err["message"]
    assert protocol == "tensorrt_llm" or "TensorRT-LLM" not in err["message"]


async def test_top_logprobs_without_logprobs_is_a_400(client: httpx.AsyncClient, backend: AlternativesBackend) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body(top_logprobs=2), headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
    assert not backend.requests


async def test_models_show_whether_alternatives_come_back(client: httpx.AsyncClient, app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    for alternatives in (True, False):
        rt.backend = AlternativesBackend([[1]], alternatives=alternatives)
        caps = (await client.get(f"/v1/models/{MODEL}", headers=AUTH)).json()["capabilities"]
        assert (caps["logprobs"], caps["top_logprobs"]) == (True, alternatives)
