"""The Responses surfaces coding agents use, end to end through the `openai` SDK, the real gateway and the session
Triton (SmolLM2): `responses.input_tokens.count` equals the usage of the same request, `responses.compact` and a
following request that continues from its output, `background` with polling and `responses.cancel`, and a
two-turn session over `responses.connect()` (the Responses WebSocket mode) continued with `previous_response_id`
and no store; the OpenAI Agents SDK as a third client (a tool turn over HTTP and over the WebSocket mode)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, GatewayServer, gateway_config
from tests.helpers import openai_validator

validate = openai_validator()


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    """The session Triton behind a gateway that keeps responses (background ones need the store)."""
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], responses_store=32)
    server = GatewayServer(gateway_config(triton), [API_KEY], settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=60, max_retries=0)


CONVERSATION: list[Any] = [
    {"role": "user", "content": "My name is Ada and I like tea."},
    {"role": "assistant", "content": "Nice to meet you, Ada."},
    {"role": "user", "content": "What do I like?"},
]


def test_input_tokens_count_what_the_response_uses(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"model": LLM, "input": CONVERSATION, "instructions": "Be brief."}
    counted = client.responses.input_tokens.count(**body)
    validate("TokenCountsResource", counted.model_dump(mode="json"))
    used = client.responses.create(**body, max_output_tokens=4, temperature=0)
    assert used.usage is not None and counted.input_tokens == used.usage.input_tokens > 0


def test_compact_then_continue_from_its_output(client: openai.OpenAI) -> None:
    # (a short summary: SmolLM2 would otherwise write up to the 2048 tokens a compaction may take)
    raw = client.responses.with_raw_response.compact(model=LLM, input=CONVERSATION,
                                                     extra_body={"max_output_tokens": 48})
    compacted = raw.parse()  # the SDK's typed object; the wire JSON below (its user messages fit its output union
    body = raw.http_response.json()  # only loosely, so the SDK warns when dumping them back)
    validate("CompactResource", body)
    *users, item = body["output"]
    assert [u["content"][0]["text"] for u in users] == ["My name is Ada and I like tea.", "What do I like?"]
    assert item["type"] == "compaction" and item["encrypted_content"]
    assert compacted.usage.output_tokens > 0
    nxt = client.responses.create(model=LLM, input=[*body["output"], {"role": "user", "content": "And my name?"}],
                                  max_output_tokens=8, temperature=0)
    assert nxt.status in ("completed", "incomplete") and nxt.usage is not None
    # The summary stands in the prompt where the conversation stood: the count grew by more than the question.
    alone = client.responses.input_tokens.count(model=LLM, input="And my name?").input_tokens
    assert nxt.usage.input_tokens > alone + 10


def test_background_is_polled_to_its_end_and_cancelled(client: openai.OpenAI) -> None:
    queued = client.responses.create(model=LLM, input="Say hi.", background=True, max_output_tokens=8,
                                     temperature=0)
    validate("Response", queued.model_dump(mode="json", exclude_unset=True))
    assert queued.status == "queued" and queued.background is True
    deadline = time.monotonic() + 30
    done = client.responses.retrieve(queued.id)
    while done.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        done = client.responses.retrieve(queued.id)
    assert done.status in ("completed", "incomplete") and done.output_text.strip()
    long = client.responses.create(model=LLM, input="Write a long story about the sea.", background=True,
                                   max_output_tokens=1500, temperature=1.0)
    cancelled = client.responses.cancel(long.id)
    validate("Response", cancelled.model_dump(mode="json", exclude_unset=True))
    assert cancelled.status == "cancelled" and client.responses.retrieve(long.id).status == "cancelled"


def test_a_websocket_session_of_two_turns(client: openai.OpenAI) -> None:
    turns = []
    with client.responses.connect() as connection:
        previous = None
        for text in ("My name is Ada.", "What is my name?"):
            connection.response.create(model=LLM, input=text, max_output_tokens=8, temperature=0, store=False,
                                       **({"previous_response_id": previous} if previous else {}))
            kinds = []
            for event in connection:
                kinds.append(event.type)
                if event.type == "error":
                    raise AssertionError(event)
                if event.type in ("response.completed", "response.incomplete"):
                    turns.append(event.response)
                    previous = event.response.id
                    break
            assert kinds[:2] == ["response.created", "response.in_progress"]
    first, second = turns
    assert first.output_text.strip() and second.usage is not None and first.usage is not None
    # The second turn's prompt holds the first turn (kept by the connection, not a store).
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


# ------------------------------------------------------------------ the OpenAI Agents SDK as a third client
class Report(BaseModel):
    """The agent's final output (a guided, strict `text.format`): one enum, a few tokens and a small grammar, as a
    135M model cannot be trusted to write a schema's JSON by itself and every token costs test time."""

    sky: Literal["clear", "rain", "snow"]


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_an_agents_sdk_agent_runs_a_tool_turn_chained_by_previous_response_id(
        gateway: GatewayServer, client: openai.OpenAI, transport: str) -> None:
    """The Agents SDK (0.24) on its Responses model classes - `OpenAIResponsesModel` over HTTP and
    `OpenAIResponsesWSModel` over the Responses WebSocket mode - runs one agent turn of two model calls: a forced
    call of our function tool (it runs), then the structured `Report`, the second call continuing the first with
    `previous_response_id` (`auto_previous_response_id`) and only the tool's output as input. The SDK has no
    input-token counting nor `background` (neither is called anywhere in the package); what it does count is
    its `Usage`, the sum of the responses' `usage`, checked here against the stored responses (HTTP)."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel, OpenAIResponsesWSModel

    set_tracing_disabled(True)
    bodies: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> None:
        if request.content:
            bodies.append(json.loads(request.content))

    seen: list[str] = []

    def get_weather(city: Literal["Oslo", "Rome"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"snow in {city}"

    sdk_client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0,
                                    http_client=httpx.AsyncClient(timeout=60, event_hooks={"request": [record]}))
    model_class = OpenAIResponsesModel if transport == "http" else OpenAIResponsesWSModel
    before = _ws_requests(gateway)
    agent = Agent(name="weather", instructions="Use the tool, then report.", output_type=Report,
                  model=model_class(model=LLM, openai_client=sdk_client), tools=[function_tool(get_weather)],
                  model_settings=ModelSettings(tool_choice="get_weather", parallel_tool_calls=False, max_tokens=24,
                                               temperature=0.8, store=transport == "http"))
    try:
        result = await Runner.run(agent, "What is the weather in Oslo?", max_turns=3,
                                  auto_previous_response_id=True)
    finally:
        if isinstance(agent.model, OpenAIResponsesWSModel):
            await agent.model.close()
        await sdk_client.close()
    assert len(seen) == 1 and isinstance(result.final_output, Report)
    first, second = result.raw_responses
    assert second.response_id is not None and result.last_response_id == second.response_id
    usage = result.context_wrapper.usage
    assert usage.requests == 2
    if transport == "websocket":
        assert bodies == []  # nothing went over HTTP: both calls were response.create frames on one socket
        assert _ws_requests(gateway) - before == 2
        return
    sent_first, sent_second = bodies
    assert sent_first["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert sent_second["previous_response_id"] == first.response_id
    assert [i["type"] for i in sent_second["input"]] == ["function_call_output"]
    assert sent_second["input"][0]["output"] == f"snow in {seen[0]}"
    # What the agent produced is what the gateway stored as the chain's last response.
    stored = [client.responses.retrieve(r.response_id or "") for r in (first, second)]
    assert Report.model_validate_json(stored[1].output_text) == result.final_output
    assert [c.name for c in stored[0].output if c.type == "function_call"] == ["get_weather"]
    assert usage.input_tokens == sum(s.usage.input_tokens for s in stored if s.usage is not None)
    assert usage.output_tokens == sum(s.usage.output_tokens for s in stored if s.usage is not None)


def _ws_requests(gateway: GatewayServer) -> float:
    """`response.create`s answered 200 over the WebSocket so far (the gateway's request counter)."""
    text = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {API_KEY}"}, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("openai_api_requests_total{") and 'route="websocket:/v1/responses"' in line
               and 'status="200"' in line)


NODE_DIR = Path(__file__).with_name("node")


def _node_sdk() -> None:
    """The `openai` Node SDK as tests/e2e/node's lock has it (the test command installs it: scripts/setup_tests.sh,
    `npm ci`); without it this test skips, saying so."""
    import shutil

    if shutil.which("node") is None:
        pytest.skip("node is not installed: the test command installs it (bash scripts/setup_tests.sh)")
    lock = json.loads((NODE_DIR / "package-lock.json").read_text(encoding="utf-8"))
    pkg = NODE_DIR / "node_modules" / "openai" / "package.json"
    if not pkg.is_file() or json.loads(pkg.read_text(encoding="utf-8"))["version"] != \
            lock["packages"]["node_modules/openai"]["version"]:
        pytest.skip("tests/e2e/node's npm packages are not installed as locked (bash scripts/setup_tests.sh)")


def test_the_openai_node_sdk_drives_every_responses_surface(gateway: GatewayServer) -> None:
    """The official Node SDK (`openai`, tests/e2e/node/responses_sdk.mjs) through the real gateway: a stored response,
    `responses.inputTokens.count` equal to its usage, a stream, a follow-up by `previous_response_id`, a background
    response polled to its end and one cancelled, `responses.compact` and a request continuing from its output,
    and a delete after which the response is a 404 - each as the SDK itself parsed it."""
    import os
    import subprocess

    _node_sdk()
    env = {**os.environ, "OPENAI_BASE_URL": f"{gateway.url}/v1", "OPENAI_API_KEY": API_KEY}
    done = subprocess.run(["node", "responses_sdk.mjs", json.dumps({"model": LLM})], cwd=NODE_DIR, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    plain = out["plain"]
    assert plain["object"] == "response" and plain["status"] in ("completed", "incomplete") and plain["text"]
    assert out["input_tokens"] == plain["usage"]["input_tokens"] > 0
    assert out["stream"]["events"][:2] == ["response.created", "response.in_progress"]
    assert out["stream"]["events"][-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in out["stream"]["events"] and out["stream"]["text"]
    assert out["next"]["previous_response_id"] == plain["id"]
    assert out["next"]["usage"]["input_tokens"] > plain["usage"]["input_tokens"]  # the stored turn came with it
    assert out["background"]["first"] in ("queued", "in_progress") and out["background"]["background"] is True
    assert out["background"]["status"] in ("completed", "incomplete")
    assert out["cancel"] == "cancelled"  # a 2,000-token answer on the CPU: still running when cancelled
    assert out["compact"]["object"] == "response.compaction" and out["compact"]["types"][-1] == "compaction"
    assert out["after_compact"] in ("completed", "incomplete")
    assert out["deleted"] is True
