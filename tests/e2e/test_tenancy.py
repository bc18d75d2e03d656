"""Tenants kept apart on the wire (issue #35 items 1, 2, 4), against the session's real Triton: one gateway with
a keys file (two teams, a key narrowed to the embedding model, a Prometheus key), a Responses store, and a model
whose Triton model does not exist (it never becomes ready), driven by the clients people use (`openai`,
`anthropic`).

Proven here, each failing on the gateway before this change: team B cannot read, continue, list or delete
team A's stored response (the `openai` client gets NotFoundError, as for an id never issued), nor can A's own
team's key narrowed to other models; two keys sending the same X-Request-Id get two responses, neither
replacing the other; a streamed response can be continued the moment its last event arrived; /metrics is
refused to a team's key and served to the Prometheus key; one model that cannot load leaves the gateway ready
(and `--ready-models all` does not); Anthropic's Messages answers an image to a model the key may not use with
the 404 of an unknown model."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from openai_api.config import BUNDLED_TEMPLATES, GatewayConfig, LLMModel
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import LLM, GatewayServer, gateway_config
from tests.helpers import openai_validator, requires_models
from tests.image_samples import solid

pytestmark = requires_models(LLM, "all-minilm-l6-v2")

BROKEN = "broken-llm"  # configured, but its Triton model does not exist: never ready
validate = openai_validator()


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


KEYS = [
    {"name": "team-a", "team": "a", "secret_sha256": sha("sk-team-a")},
    {"name": "team-b", "team": "b", "secret_sha256": sha("sk-team-b")},
    {"name": "a-embeddings", "team": "a", "secret_sha256": sha("sk-a-embed"), "models": ["all-minilm-l6-v2"]},
    {"name": "prometheus", "secret_sha256": sha("sk-prometheus"), "models": [], "metrics": True},
]


def config_with_a_broken_model(triton: EmbeddedTriton) -> GatewayConfig:
    config = gateway_config(triton)
    smollm2 = next(m for m in config.llm if m.name == LLM)
    config.llm.append(LLMModel(name=BROKEN, url=triton.grpc_url, path=smollm2.path, triton_model="no-such-model",
                               chat_template=BUNDLED_TEMPLATES / "smollm2.jinja"))
    return config


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    folder = tmp_path_factory.mktemp("tenancy")
    keys = folder / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS}), encoding="utf-8")
    settings = Settings(config_file=Path("."), keys_file=keys, responses_store=64,
                        responses_store_url=f"sqlite://{folder}/store")
    server = GatewayServer(config_with_a_broken_model(triton), [], settings).start()
    yield server
    server.stop()


def client(gateway: GatewayServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def team_a(gateway: GatewayServer) -> openai.OpenAI:
    return client(gateway, "sk-team-a")


@pytest.fixture(scope="module")
def team_b(gateway: GatewayServer) -> openai.OpenAI:
    return client(gateway, "sk-team-b")


def test_another_key_cannot_read_continue_list_or_delete_a_stored_response(
        gateway: GatewayServer, team_a: openai.OpenAI, team_b: openai.OpenAI) -> None:
    first = team_a.responses.create(model=LLM, input="The launch code is 4711. Repeat it.", store=True,
                                    max_output_tokens=12, temperature=0)
    narrowed = client(gateway, "sk-a-embed")  # team A's own key, allowed only the embedding model
    for other in (team_b, narrowed):
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.input_items.list(first.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        team_b.responses.create(model=LLM, input="What was the code?", previous_response_id=first.id,
                                max_output_tokens=12)
    assert e.value.body is not None and "4711" not in json.dumps(e.value.body)
    # Nothing of the above touched it: its owner reads, lists and continues it.
    assert team_a.responses.retrieve(first.id).output_text == first.output_text
    items = team_a.responses.input_items.list(first.id)
    validate("ResponseItemList", items.model_dump(mode="json", exclude_unset=True))
    assert [i.content[0].text for i in items.data] == ["The launch code is 4711. Repeat it."]  # type: ignore[union-attr]
    second = team_a.responses.create(model=LLM, input="What was the code?", previous_response_id=first.id,
                                     max_output_tokens=12, temperature=0)
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn was sent again


def test_the_same_request_id_from_two_keys_makes_two_responses(team_a: openai.OpenAI, team_b: openai.OpenAI) -> None:
    same = {"X-Request-Id": "shared-request-id"}
    a = team_a.responses.with_raw_response.create(model=LLM, input="Say apple.", store=True, max_output_tokens=8,
                                                  temperature=0, extra_headers=same)
    b = team_b.responses.create(model=LLM, input="Say banana.", store=True, max_output_tokens=8, temperature=0,
                                extra_headers=same)
    assert a.headers["x-request-id"] == "shared-request-id"  # echoed, and still the log's and Triton's id
    mine = a.parse()
    assert mine.id != b.id and "shared-request-id" not in mine.id
    assert team_a.responses.retrieve(mine.id).output_text == mine.output_text
    assert team_b.responses.retrieve(b.id).output_text == b.output_text
    with pytest.raises(openai.NotFoundError):
        team_b.responses.retrieve(mine.id)


def test_a_streamed_response_is_stored_before_its_last_event_and_deleted_by_its_owner(team_a: openai.OpenAI) -> None:
    with team_a.responses.stream(model=LLM, input="Say hello.", store=True, max_output_tokens=64,
                                 temperature=0) as stream:  # (the SDK wants response.completed: not cut)
        final = stream.get_final_response()
    follow = team_a.responses.create(model=LLM, input="Again.", previous_response_id=final.id, max_output_tokens=4)
    assert follow.previous_response_id == final.id
    deleted = team_a.responses.delete(final.id)  # the SDK returns None for the 200
    assert deleted is None
    with pytest.raises(openai.NotFoundError):
        team_a.responses.retrieve(final.id)


def test_metrics_are_refused_to_a_teams_key_and_served_to_prometheus(gateway: GatewayServer) -> None:
    r = httpx.get(f"{gateway.url}/metrics", headers={"Authorization": "Bearer sk-team-a"}, timeout=30)
    assert r.status_code == 403 and "team-b" not in r.text
    assert r.json()["error"]["code"] == "permission_denied"
    r = httpx.get(f"{gateway.url}/metrics", headers={"Authorization": "Bearer sk-prometheus"}, timeout=30)
    assert r.status_code == 200 and "openai_api_requests_total" in r.text


def test_one_model_that_cannot_load_leaves_the_gateway_ready(gateway: GatewayServer, triton: EmbeddedTriton,
                                                             tmp_path: Path) -> None:
    r = httpx.get(f"{gateway.url}/health/ready", headers={"Authorization": "Bearer sk-team-a"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["models"][BROKEN] == "not ready" and r.json()["models"][LLM] == "ready"
    narrowed = httpx.get(f"{gateway.url}/health/ready", headers={"Authorization": "Bearer sk-a-embed"}, timeout=60)
    assert narrowed.json()["models"] == {"all-minilm-l6-v2": "ready"}  # only what this key may use
    assert httpx.get(f"{gateway.url}/health/ready", timeout=60).json() == {"ready": True}  # no key: no names
    ping = httpx.get(f"{gateway.url}/ping", timeout=60)
    assert ping.status_code == 200 and ping.json() == {"status": "healthy"}
    strict = GatewayServer(config_with_a_broken_model(triton), [],
                           Settings(config_file=Path("."), ready_models="all")).start()
    try:
        assert httpx.get(f"{strict.url}/health/ready", timeout=60).status_code == 503
        assert httpx.get(f"{strict.url}/ping", timeout=60).status_code == 503
    finally:
        strict.stop()


def test_an_image_to_a_model_the_key_may_not_use_is_an_unknown_model(gateway: GatewayServer) -> None:
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="sk-a-embed", max_retries=0, timeout=60)
    png = base64.b64encode(solid(4, 4, "red")).decode()  # inline: nothing is ever fetched
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    for model in (LLM, "no-such-model"):
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.create(model=model, max_tokens=8,
                                   messages=[{"role": "user", "content": [image]}])  # type: ignore[list-item]
