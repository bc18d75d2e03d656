"""The HTTP layer in-process: default-deny API keys, OpenAI error shapes, validation, request ids."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import BaseRoute

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.errors import BackendUnavailableError
from openai_api.settings import Settings
from openai_api.triton.llm import LLMBackend
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config

MODEL = "smollm2-135m-instruct"
KEYS = ["k1", "k2"]
AUTH = {"Authorization": "Bearer k1"}
CHAT = "/v1/chat/completions"

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> GatewayConfig:
    return llm_only_config(tmp_path_factory.mktemp("config"), url="127.0.0.1:1")


@pytest.fixture(scope="module")
async def shared_app(config: GatewayConfig) -> AsyncIterator[FastAPI]:
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, api_keys=list(KEYS)))
    yield app
    await app.state.gateway.services.registry.pool.close()


@pytest.fixture
def app(shared_app: FastAPI) -> FastAPI:
    """The app with a fresh fake backend for this test (the Triton adapter is never called)."""
    rt = shared_app.state.gateway.services.registry.llm(MODEL)
    fake: LLMBackend = FakeBackend([[i] for i in rt.tokenizer.encode("Hello from the fake!")])
    rt.backend = fake
    return shared_app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, **kw}


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """The response is `status` with OpenAI's error body; return its `error` object."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    payload = r.json()
    assert set(payload) == {"error"}
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err  # type: ignore[no-any-return]


def all_routes(routes: list[BaseRoute]) -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every route, looking inside included routers (FastAPI >= 0.16x nests them)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            for ctx in contexts():
                yield ctx.path, set(ctx.methods or ())
        elif hasattr(route, "routes"):
            yield from all_routes(route.routes)
        elif hasattr(route, "path"):
            yield route.path, set(getattr(route, "methods", None) or {"GET"})


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "anything", path)


# --- API keys: default-deny ---------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer k1k2"},
    {"Authorization": "Basic k1"},
    {"Authorization": "k1"},
    {"X-API-Key": "wrong"},
    {"Api-Key": "k1"},
], ids=["no-header", "wrong-key", "empty-key", "keys-concatenated", "basic-scheme", "no-scheme", "x-api-key-wrong",
        "other-header"])
async def test_requests_without_a_valid_bearer_key_get_401_in_openai_shape(
        client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    r = await client.post(CHAT, json=body(), headers=headers)
    err = error_of(r, 401)
    assert err["code"] == "invalid_api_key"
    assert err["type"] == "invalid_request_error"
    assert r.headers["www-authenticate"] == "Bearer"
    assert "k1" not in err["message"]


async def test_an_x_api_key_header_is_a_key_too(client: httpx.AsyncClient) -> None:
    """Anthropic's SDKs and Claude Code send `x-api-key` (LiteLLM accepts it on every route as well)."""
    r = await client.post(CHAT, json=body(), headers={"X-API-Key": "k1"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("key", KEYS)
async def test_every_configured_key_is_accepted(client: httpx.AsyncClient, key: str) -> None:
    r = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    assert MODEL in [m["id"] for m in r.json()["data"]]
    r = await client.post(CHAT, json=body(), headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text


async def test_bearer_scheme_is_case_insensitive(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models", headers={"Authorization": "bearer k2"})
    assert r.status_code == 200


async def test_liveness_is_open_without_a_key(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_readiness_is_open_without_a_key_and_503_without_triton(client: httpx.AsyncClient) -> None:
    r = await client.get("/health/ready")
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"ready": False}  # no key: the status only, never the model names
    r = await client.get("/health/ready", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 503 and r.json() == {"ready": False}
    r = await client.get("/health/ready", headers=AUTH)
    assert r.status_code == 503 and r.json() == {"ready": False, "models": {MODEL: "not ready"}}


async def test_every_other_route_requires_the_key(app: FastAPI, client: httpx.AsyncClient) -> None:
    open_paths = {"/health", "/health/ready", "/ping"}
    checked: set[str] = set()
    for path, methods in all_routes(app.routes):
        if path in open_paths:
            continue
        for method in sorted(methods):
            r = await client.request(method, concrete(path))
            assert r.status_code == 401, (method, path, r.status_code)
            if method != "HEAD" and path.startswith("/v1/messages"):  # Anthropic's shape on its routes
                assert r.json()["error"]["type"] == "authentication_error"
            elif method != "HEAD":
                assert r.json()["error"]["code"] == "invalid_api_key"
            checked.add(path)
    # The enumeration really saw the routes (including the ones FastAPI adds), so the check means something.
    assert {CHAT, "/v1/models", "/v1/models/{model_id:path}", "/openapi.json", "/docs"} <= checked


async def test_the_key_opens_the_generated_docs(client: httpx.AsyncClient) -> None:
    r = await client.get("/openapi.json", headers=AUTH)
    assert r.status_code == 200
    assert CHAT in r.json()["paths"]


# --- routing errors in OpenAI's shape ------------------------------------------------------------------------------


async def test_unknown_model_is_404_model_not_found(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(model="no-such-model"), headers=AUTH)
    err = error_of(r, 404)
    assert (err["code"], err["param"]) == ("model_not_found", "model")
    assert "no-such-model" in err["message"]


async def test_unknown_model_card_is_404_model_not_found(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models/no-such-model", headers=AUTH)
    err = error_of(r, 404)
    assert (err["code"], err["param"]) == ("model_not_found", "model")


async def test_unknown_route_is_404_in_openai_shape(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing-here", headers=AUTH)
    err = error_of(r, 404)
    assert err["code"] == "not_found"


async def test_wrong_method_is_405_in_openai_shape_with_allow(client: httpx.AsyncClient) -> None:
    r = await client.get(CHAT, headers=AUTH)
    err = error_of(r, 405)
    assert err["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]


# --- request validation ----------------------------------------------------------------------------------------


async def test_malformed_json_is_400_invalid_json(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, content=b'{"model": "x", "messages": [', headers={**AUTH,
                                                                            "Content-Type": "application/json"})
    err = error_of(r, 400)
    assert err["code"] == "invalid_json"
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, None])
async def test_body_that_is_not_an_object_is_400(client: httpx.AsyncClient, payload: Any) -> None:
    r = await client.post(CHAT, content=json.dumps(payload).encode(), headers={**AUTH,
                                                                             "Content-Type": "application/json"})
    err = error_of(r, 400)
    assert err["type"] == "invalid_request_error"


async def test_missing_messages_is_400_naming_messages(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json={"model": MODEL}, headers=AUTH)
    err = error_of(r, 400)
    assert err["param"] == "messages"
    assert "messages" in err["message"]


async def test_empty_messages_is_400_naming_messages(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(messages=[]), headers=AUTH)
    err = error_of(r, 400)
    assert err["param"] == "messages"


async def test_temperature_out_of_range_is_400_naming_temperature(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(temperature=5), headers=AUTH)
    err = error_of(r, 400)
    assert err["param"] == "temperature"


async def test_bad_message_field_names_its_path(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(messages=[{"role": "user", "content": "a"}, {"role": "wizard"}]),
                          headers=AUTH)
    err = error_of(r, 400)
    assert err["param"] == "messages[1].role"


async def test_unknown_extra_fields_are_ignored(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(some_future_field={"x": 1}, metadata={"k": "v"}, store=False),
                          headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello from the fake!"


@pytest.mark.parametrize(("method", "path", "kwargs", "status"), [
    ("POST", CHAT, {"json": body()}, 401),
    ("POST", CHAT, {"json": body(), "headers": {"Authorization": "Bearer nope"}}, 401),
    ("POST", CHAT, {"json": body(model="no-such-model"), "headers": AUTH}, 404),
    ("GET", "/v1/nothing-here", {"headers": AUTH}, 404),
    ("GET", CHAT, {"headers": AUTH}, 405),
    ("POST", CHAT, {"content": b"{", "headers": {**AUTH, "Content-Type": "application/json"}}, 400),
    ("POST", CHAT, {"json": [1], "headers": AUTH}, 400),
    ("POST", CHAT, {"json": {"model": MODEL}, "headers": AUTH}, 400),
    ("POST", CHAT, {"json": body(temperature=5), "headers": AUTH}, 400),
], ids=["no-key", "wrong-key", "unknown-model", "unknown-route", "wrong-method", "bad-json", "not-object",
        "missing-messages", "bad-temperature"])
async def test_every_error_body_validates_against_openai_error_response(
        client: httpx.AsyncClient, validate: Callable[[str, Any], None], method: str, path: str,
        kwargs: dict[str, Any], status: int) -> None:
    r = await client.request(method, path, **kwargs)
    assert r.status_code == status
    validate("ErrorResponse", r.json())


# --- request ids ---------------------------------------------------------------------------------------------------


async def test_request_id_is_echoed_and_used_for_the_completion(app: FastAPI, client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(), headers={**AUTH, "X-Request-Id": "trace-123"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "trace-123"
    assert r.json()["id"] == "chatcmpl-trace-123"
    fake = app.state.gateway.services.registry.llm(MODEL).backend
    assert fake.requests[-1].request_id == "trace-123"  # Triton sees the same id


async def test_request_id_is_generated_when_absent(client: httpx.AsyncClient) -> None:
    r1 = await client.post(CHAT, json=body(), headers=AUTH)
    r2 = await client.get("/health")
    ids = [r.headers.get("x-request-id") for r in (r1, r2)]
    assert all(i and re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids
    assert ids[0] != ids[1]
    assert r1.json()["id"] == f"chatcmpl-{ids[0]}"


async def test_even_a_401_carries_a_request_id(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models", headers={"X-Request-Id": "abc"})
    assert r.status_code == 401
    assert r.headers["x-request-id"] == "abc"


# --- responses --------------------------------------------------------------------------------------------------


async def test_chat_completion_over_http_validates(client: httpx.AsyncClient,
                                                   validate: Callable[[str, Any], None]) -> None:
    r = await client.post(CHAT, json=body(), headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    validate("CreateChatCompletionResponse", r.json())


async def test_streaming_over_http_is_sse_ending_in_done(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=body(stream=True), headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello from the fake!"


@pytest.mark.parametrize("stream", [False, True])
async def test_backend_failure_before_any_token_gets_its_status_code(app: FastAPI, client: httpx.AsyncClient,
                                                                     stream: bool) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([], fail_at=0, error=BackendUnavailableError("The Triton server is unreachable."))
    r = await client.post(CHAT, json=body(stream=stream), headers=AUTH)
    err = error_of(r, 503)
    assert err["code"] == "backend_unavailable"


# --- text the tokenizer cannot take ---------------------------------------------------------------------------


async def test_a_lone_surrogate_in_a_message_is_a_400_not_a_crash(client: httpx.AsyncClient) -> None:
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 5}' % MODEL.encode()
    r = await client.post(CHAT, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    err = error_of(r, 400)
    assert err["code"] == "invalid_unicode"
    assert "surrogate" in err["message"]


@pytest.mark.parametrize(("field", "value"), [("repetition_penalty", 1e-300), ("repetition_penalty", 1e300),
                                              ("top_k", 2**63), ("min_tokens", 10**30), ("max_tokens", 2**40),
                                              ("min_tokens", 25)])
async def test_out_of_range_sampling_values_are_a_400_before_triton(app: FastAPI, client: httpx.AsyncClient,
                                                                    field: str, value: Any) -> None:
    r = await client.post(CHAT, json=body(**{field: value}), headers=AUTH)  # min_tokens 25 > max_tokens 20
    err = error_of(r, 400)
    assert err["param"] == field and err["type"] == "invalid_request_error"
    assert app.state.gateway.services.registry.llm(MODEL).backend.requests == []


async def test_a_backend_failure_never_sends_triton_text_to_the_client(app: FastAPI, client: httpx.AsyncClient) -> None:
    from openai_api.triton.errors import map_triton_error

    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([[1]], fail_at=0, error=map_triton_error(
        RuntimeError("generation failed: RuntimeError: probability tensor contains inf at /opt/model.py:12"), MODEL))
    err = error_of(await client.post(CHAT, json=body(), headers=AUTH), 502)
    assert "probability" not in err["message"] and "/opt" not in err["message"] and MODEL in err["message"]
