"""Coding agents' first turns end to end (issue #38): the real gateway and a real tritonserver, through the
clients the agents use (the `openai` and `anthropic` Python SDKs) and, where their binaries are present,
the agents themselves.

The recorded first requests (tests/data/openai/codex_request.json, codex_catalog_model_request.json,
tests/data/anthropic/claude_code_served_name_request.json) are sent as the agents sent them: Codex's
`namespace` sub-agent tool, hosted `web_search`, developer messages and its `include`, `reasoning`,
`prompt_cache_key`, `client_metadata` fields and session headers; Claude Code's `system`-role message
inside `messages` under a served model's own name, adaptive thinking, `output_config.effort` and
`context_management`. Both agents' prompts are far beyond the 8,192-token context of the only real model
of the set-up, so they talk to `replay-agent` (as tests/e2e/test_messages_clients.py): the Triton model
`replay-llm` behind the hermes family's real tokenizer, template and parsers, which streams the recorded
completion named by the last `replay:hermes/<case>` marker in the prompt (tests/data/families/corpus/
hermes.json). So the expected answers and calls are the corpus's, never the gateway's.

The agents' binaries are not installed by the tests: Codex CLI (`codex`, npm `@openai/codex`) and Claude
Code (`claude`) run when they are on PATH or in tests/e2e/node/node_modules/.bin, with no network beyond
the gateway's loopback address; otherwise those tests skip saying so.

Anthropic's structured outputs (`output_config.format`, `strict` tools) run on SmolLM2, whose reference
Triton model enforces guides (tests/e2e/test_structured_outputs.py does the same for chat).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from openai_api.config import GatewayConfig, LLMModel, ModelInfo
from openai_api.embedded.launcher import EmbeddedTriton
from tests.anthropic_events import accumulate, check_stream, parse_sse
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.helpers import PREPARED_MODELS, REPO, openai_validator

DATA = REPO / "tests" / "data"
CORPUS = json.loads((DATA / "families" / "corpus" / "hermes.json").read_text(encoding="utf-8"))
CODEX = json.loads((DATA / "openai" / "codex_request.json").read_text(encoding="utf-8"))
CODEX_CATALOG = json.loads((DATA / "openai" / "codex_catalog_model_request.json").read_text(encoding="utf-8"))
CLAUDE = json.loads((DATA / "anthropic" / "claude_code_served_name_request.json").read_text(encoding="utf-8"))
HERMES = PREPARED_MODELS / "families" / "hermes"
MODEL = "replay-agent"
NODE_BIN = REPO / "tests" / "e2e" / "node" / "node_modules" / ".bin"
validate = openai_validator()

# Streamed events by the vendored OpenAPI schema that describes them.
_SCHEMAS = {"response.created": "ResponseCreatedEvent", "response.in_progress": "ResponseInProgressEvent",
            "response.output_item.added": "ResponseOutputItemAddedEvent",
            "response.output_item.done": "ResponseOutputItemDoneEvent",
            "response.content_part.added": "ResponseContentPartAddedEvent",
            "response.content_part.done": "ResponseContentPartDoneEvent",
            "response.output_text.delta": "ResponseTextDeltaEvent",
            "response.output_text.done": "ResponseTextDoneEvent",
            "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
            "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
            "response.custom_tool_call_input.delta": "ResponseCustomToolCallInputDeltaEvent",
            "response.custom_tool_call_input.done": "ResponseCustomToolCallInputDoneEvent",
            "response.completed": "ResponseCompletedEvent"}


def _schema(kind: str) -> str:
    return _SCHEMAS[kind]


def _wire(obj: Any) -> dict[str, Any]:
    """An SDK object as the JSON it was parsed from (the fields the gateway sent, nulls included)."""
    out: dict[str, Any] = obj.model_dump(mode="json", exclude_unset=True)
    return out


def _case(name: str) -> dict[str, Any]:
    case: dict[str, Any] = next(c for c in CORPUS["cases"] if c["name"] == name)
    return case


PLAIN = _case("plain_answer")["expect"]["content"]


class Traffic:
    """What reaches the gateway on `/v1/responses` (ASGI middleware in front of the app, `wrap`): each HTTP
    request's JSON body and answer status, and each WebSocket message the client sends, in order. Codex's own
    `x-codex-turn-metadata` (in every body's `client_metadata`) says what each request was for."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, dict[str, Any]]] = []  # (transport, HTTP status, body)

    def wrap(self, app: Any) -> Any:
        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] not in ("http", "websocket") or not scope["path"].startswith("/v1/responses"):
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            status: list[int] = []

            async def recv() -> dict[str, Any]:
                message: dict[str, Any] = await receive()
                if message.get("text"):
                    self.seen.append(("websocket", None, json.loads(message["text"])))
                chunks.append(message.get("body") or b"")
                return message

            async def reply(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status.append(message["status"])
                await send(message)

            await app(scope, recv, reply)
            if scope["type"] == "http":
                body = b"".join(chunks)
                self.seen.append((scope["path"], status[0] if status else None, json.loads(body) if body else {}))

        return asgi

    def codex_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Codex's requests as (request_kind, body): "turn", "compaction", "prewarm"."""
        out = []
        for _, _, body in self.seen:
            meta = json.loads((body.get("client_metadata") or {}).get("x-codex-turn-metadata") or "{}")
            out.append((meta.get("request_kind", ""), body))
        return out


@pytest.fixture(scope="module")
def traffic() -> Traffic:
    return Traffic()


@pytest.fixture(scope="module")
def agent_gateway(triton: EmbeddedTriton, traffic: Traffic) -> Iterator[GatewayServer]:
    if not (HERMES / "tokenizer.json").is_file():
        pytest.skip(f"no hermes tokenizer built in {HERMES} (openai_api/embedded/families.py)")
    model = LLMModel(name=MODEL, url=triton.grpc_url, path=HERMES, chat_template=HERMES / "chat_template.jinja",
                     triton_model="replay-llm", tool_parser=CORPUS["tool_parser"],
                     reasoning_parser=CORPUS["reasoning_parser"])
    # The context the agents' prompts need (Claude Code's requests ask for max_tokens 32000).
    server = GatewayServer(GatewayConfig(model_infos=[ModelInfo(name=MODEL, max_len=200_000)], llm=[model]),
                           [API_KEY])
    server.server.config.app = traffic.wrap(server.server.config.app)  # uvicorn loads it on start
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def client(agent_gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent_gateway.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def _codex_call(recorded: dict[str, Any], marker: str, **changes: Any) -> dict[str, Any]:
    """The recorded Codex request as `responses.create` keywords, its last user message asking for
    `marker`'s replay; the fields the SDK does not type (`client_metadata`) in `extra_body`, Codex's
    session headers in `extra_headers`."""
    body = copy.deepcopy(recorded["body"])
    body["input"][-1]["content"] = [{"type": "input_text", "text": f"replay:hermes/{marker}"}]
    headers = {k: v for k, v in recorded["headers"].items() if k not in ("accept", "content-type")}
    extra = {"client_metadata": body.pop("client_metadata")}
    return {**body, **changes, "extra_body": extra, "extra_headers": headers}


# ------------------------------------------------------------------ Codex through the openai client


def test_codexs_first_request_through_the_openai_client(client: openai.OpenAI) -> None:
    """Codex's recorded first request, streamed as Codex asks: every event valid, the corpus's answer,
    and the hosted web_search named in x-omitted-tools (not a 400)."""
    raw = client.responses.with_raw_response.create(**_codex_call(CODEX, "plain_answer"))
    assert raw.headers["x-omitted-tools"] == "web_search"
    events = list(raw.parse())
    final = events[-1]
    assert final.type == "response.completed"
    for e in events:
        validate(_schema(e.type), _wire(e))
    assert final.response.output_text.strip() == PLAIN
    assert final.response.prompt_cache_key == CODEX["body"]["prompt_cache_key"]
    assert final.response.usage is not None and final.response.usage.input_tokens > 8192


def test_a_namespaced_call_and_its_output_through_the_openai_client(client: openai.OpenAI) -> None:
    """The model calls the flat name `multi_agent_v1__spawn_agent`; the client gets spawn_agent in the
    multi_agent_v1 namespace, plain and streamed, and the next turn (the call and its output sent back, as
    Codex does) is answered."""
    (expected,) = _case("codex_spawn_agent")["expect"]["tool_calls"]
    plain = client.responses.create(**_codex_call(CODEX, "codex_spawn_agent", stream=False))
    validate("Response", _wire(plain))
    (call,) = plain.output
    assert call.type == "function_call"
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")
    assert json.loads(call.arguments) == expected["arguments"]
    with client.responses.stream(**{k: v for k, v in _codex_call(CODEX, "codex_spawn_agent").items()
                                    if k != "stream"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    for e in events:
        validate(_schema(e.type), _wire(e))
    (streamed,) = final.output
    assert streamed.type == "function_call" and streamed.namespace == "multi_agent_v1"
    assert json.loads(streamed.arguments) == expected["arguments"]
    # Codex's next request: the call (with its namespace) and its output; the output carries the next marker.
    turn = _codex_call(CODEX, "codex_spawn_agent", stream=False)
    turn["input"] = [*turn["input"], call.model_dump(exclude_none=True),
                     {"type": "function_call_output", "call_id": call.call_id,
                      "output": "agent started: replay:hermes/plain_answer"}]
    answer = client.responses.create(**turn)
    assert answer.output_text.strip() == PLAIN


def test_a_custom_tool_call_through_the_openai_client(client: openai.OpenAI) -> None:
    """Codex's apply_patch (a custom tool with a Lark grammar, sent to models Codex knows) comes back as a
    custom_tool_call whose input is the raw patch, plain and streamed."""
    (expected,) = _case("codex_apply_patch")["expect"]["tool_calls"]
    patch = expected["arguments"]["input"]
    raw = client.responses.with_raw_response.create(**_codex_call(CODEX_CATALOG, "codex_apply_patch", stream=False))
    assert raw.headers["x-omitted-tools"] == "web_search"
    (call,) = raw.parse().output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == patch
    events = list(client.responses.create(**_codex_call(CODEX_CATALOG, "codex_apply_patch")))
    for e in events:
        validate(_schema(e.type), _wire(e))
    assert [e.input for e in events if e.type == "response.custom_tool_call_input.done"] == [patch]


# ------------------------------------------------------------------ Claude Code through its request and the SDK


def test_claude_codes_first_request_under_the_served_name(agent_gateway: GatewayServer) -> None:
    """The exact request Claude Code sends with ANTHROPIC_MODEL set to the served model's own name (a
    `system` message inside `messages`): a valid stream with the corpus's answer and the applied edits, and
    count_tokens of the same prompt equal to the answer's input_tokens."""
    headers = {**CLAUDE["headers"], "x-api-key": API_KEY}
    body = CLAUDE["body"]
    assert body["model"] == MODEL and any(m["role"] == "system" for m in body["messages"])
    with httpx.Client(base_url=agent_gateway.url, headers=headers, timeout=60) as http:
        resp = http.post(CLAUDE["path"], json=body)
        assert resp.status_code == 200, resp.text[:2000]
        events = parse_sse(resp.text)
        check_stream(events)
        message = accumulate(events)
        assert "".join(b["text"] for b in message["content"] if b["type"] == "text").strip() == PLAIN
        assert events[-2]["context_management"]["applied_edits"][0]["type"] == "clear_thinking_20251015"
        counted = http.post("/v1/messages/count_tokens?beta=true",
                            json={k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")})
        assert counted.status_code == 200, counted.text[:2000]
        assert counted.json()["input_tokens"] == events[0]["message"]["usage"]["input_tokens"] > 8192


def test_a_system_message_inside_messages_through_the_anthropic_sdk(agent_gateway: GatewayServer) -> None:
    client = anthropic.Anthropic(base_url=agent_gateway.url, api_key=API_KEY, max_retries=0)
    messages: Any = [{"role": "user", "content": "Hello"},
                     {"role": "system", "content": [{"type": "text", "text": "replay:hermes/plain_answer"}]}]
    message = client.messages.create(model=MODEL, max_tokens=256, system="You are terse.", messages=messages,
                                      thinking={"type": "adaptive"}, output_config={"effort": "high"},
                                      metadata={"user_id": "u-1"})
    assert message.content[-1].type == "text" and message.content[-1].text.strip() == PLAIN
    with client.beta.messages.stream(model=MODEL, max_tokens=256, messages=messages,
                                     context_management={"edits": [{"type": "clear_thinking_20251015"}]},
                                     betas=["context-management-2025-06-27"]) as stream:
        final = stream.get_final_message()
    assert final.content[-1].type == "text" and final.content[-1].text.strip() == PLAIN
    assert final.context_management is not None
    assert final.context_management.applied_edits[0].type == "clear_thinking_20251015"


# ------------------------------------------------------------------ the agents themselves, when installed


def _binary(name: str) -> str:
    found = shutil.which(name) or (str(NODE_BIN / name) if (NODE_BIN / name).is_file() else None)
    if found is None:
        pytest.skip(f"{name} is not installed (on PATH or in {NODE_BIN}); the tests do not install it")
    return found


def _quiet_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "NO_PROXY": "127.0.0.1", **extra}


def _codex_workspace(tmp_path: Path, gateway: GatewayServer, provider: str = 'name = "gateway"\n',
                     ) -> tuple[Path, dict[str, str]]:
    """A CODEX_HOME whose config.toml has one [model_providers] entry for the gateway (Responses wire API, the served
    model's own name; `provider`: the entry's name and any other lines), an empty working folder, and the
    environment `codex exec` runs in: the folder and the environment."""
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "gateway"\n\n[model_providers.gateway]\n{provider}'
        f'base_url = "{gateway.url}/v1"\nwire_api = "responses"\nenv_key = "GATEWAY_API_KEY"\n', encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    return work, _quiet_env(tmp_path, CODEX_HOME=str(home), GATEWAY_API_KEY=API_KEY)


def test_codex_cli_runs_a_tool_turn_in_its_default_configuration(agent_gateway: GatewayServer,
                                                                    tmp_path: Path) -> None:
    """`codex exec` with one [model_providers] entry for the gateway (Responses wire API, the served model's
    own name, sub-agents and web search left on): the model calls exec_command, Codex runs it, sends the
    output back, and the next turn's answer ends the session."""
    codex = _binary("codex")
    work, env = _codex_workspace(tmp_path, agent_gateway)
    done = subprocess.run([codex, "exec", "--json", "--skip-git-repo-check", "replay:hermes/codex_exec_command"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                          check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert [c["command"] for c in commands][:1] and "echo replay:hermes/plain_answer" in commands[0]["command"]
    assert "replay:hermes/plain_answer" in commands[0]["aggregated_output"]  # Codex really ran it
    messages = [i["text"] for i in items if i.get("type") == "agent_message"]
    assert messages[-1].strip() == PLAIN
    assert "error" not in [e.get("type") for e in events], events


def test_claude_code_answers_under_the_served_models_own_name(agent_gateway: GatewayServer, tmp_path: Path) -> None:
    """`claude -p` with ANTHROPIC_MODEL set to the served model's name (no alias): the first request (a
    system message inside messages) is answered and the session succeeds."""
    claude = _binary("claude")
    work = tmp_path / "work"
    work.mkdir()
    env = _quiet_env(tmp_path, ANTHROPIC_BASE_URL=agent_gateway.url, ANTHROPIC_API_KEY=API_KEY,
                     ANTHROPIC_MODEL=MODEL, DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                     DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1")
    done = subprocess.run([claude, "-p", "replay:hermes/plain_answer", "--output-format", "stream-json", "--verbose",
                           "--max-turns", "3"], cwd=work, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (result,) = [m for m in lines if m.get("type") == "result"]
    assert result["subtype"] == "success" and not result["is_error"], result
    assert result["result"].strip() == PLAIN


# ------------------------------------------------------------------ Anthropic structured outputs on a guided model

FORECAST = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                             "rain": {"type": "boolean"}},
            "required": ["city", "rain"], "additionalProperties": False}


def test_an_anthropic_json_schema_output_is_enforced_plain_and_streamed(gateway: GatewayServer) -> None:
    """SmolLM2 answers "Write a haiku" in prose when left alone; with `output_config.format` the text block is
    an object of the schema, plain and streamed (the TensorRT-LLM reference model enforces the guide)."""
    client = anthropic.Anthropic(base_url=gateway.url, api_key=API_KEY, max_retries=0)
    kw: dict[str, Any] = {"model": LLM, "max_tokens": 64, "extra_body": {"temperature": 0.8},
                          "messages": [{"role": "user", "content": "Write a haiku about rain."}],
                          "output_config": {"format": {"type": "json_schema", "schema": FORECAST}}}
    plain = client.messages.create(**kw)
    assert plain.content[0].type == "text"
    jsonschema.validate(json.loads(plain.content[0].text), FORECAST)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text"
    jsonschema.validate(json.loads(final.content[0].text), FORECAST)


def test_a_forced_strict_tool_and_an_uncompilable_schema(gateway: GatewayServer) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=API_KEY, max_retries=0)
    tool: Any = {"name": "forecast", "description": "A forecast", "strict": True, "input_schema": FORECAST}
    message = client.messages.create(model=LLM, max_tokens=64, tools=[tool],
                                     tool_choice={"type": "tool", "name": "forecast"},
                                     messages=[{"role": "user", "content": "Tell me a joke about cats."}])
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "forecast"
    jsonschema.validate(block.input, FORECAST)
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=LLM, max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
                               output_config={"format": {"type": "json_schema", "schema": bad}})
    assert "output_config.format.schema" in str(refused.value)


def test_codex_cli_runs_its_tool_loop_over_the_websocket(agent_gateway: GatewayServer, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """`codex exec` with `supports_websockets = true` on its provider: Codex opens the Responses WebSocket, the
    tool call and the answer after its output are two `response.create`s on that one connection (the second
    continues the first with `previous_response_id`, no store), Codex really runs the command, and it never
    falls back to HTTP."""
    codex = _binary("codex")
    work, env = _codex_workspace(tmp_path, agent_gateway, 'name = "gateway"\nsupports_websockets = true\n')
    with caplog.at_level("INFO", logger="openai_api.http.routers.responses_ws"):
        done = subprocess.run([codex, "exec", "--json", "--skip-git-repo-check", "replay:hermes/codex_exec_command"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert commands and "replay:hermes/plain_answer" in commands[0]["aggregated_output"]  # Codex really ran it
    assert [i["text"] for i in items if i.get("type") == "agent_message"][-1].strip() == PLAIN
    assert "error" not in [e.get("type") for e in events], events
    assert "fall" not in done.stderr.lower() and "websocket" not in done.stderr.lower(), done.stderr[-3000:]
    served = [int(r.getMessage().split(" after ")[1].split()[0]) for r in caplog.records
              if r.getMessage().startswith("responses websocket closed")]
    assert served and max(served) >= 2, caplog.text[-3000:]


# ------------------------------------------------------------------ Codex compacting a long session

SUMMARY = _case("codex_compaction_summary")["expect"]["content"]


@pytest.mark.parametrize(("provider", "compaction"), [
    pytest.param('name = "gateway"\n', "responses", id="local-summary-over-http"),
    pytest.param('name = "OpenAI"\nsupports_websockets = true\n', "responses_compaction_v2",
                 id="compaction-trigger-over-the-websocket")])
def test_codex_cli_compacts_a_long_session_and_carries_on(agent_gateway: GatewayServer, traffic: Traffic,
                                                          tmp_path: Path, provider: str, compaction: str) -> None:
    """`codex exec` past its auto-compact limit in the middle of a turn, as Codex 0.169 compacts against a
    [model_providers] entry: by default locally (a plain /v1/responses asking the model for a handoff summary,
    which Codex then puts in the history as a user message), and, for a provider named "OpenAI" (Codex's
    test for a provider that compacts remotely; remote compaction v2 is on by default), with a final
    `compaction_trigger` item whose one `compaction` output item Codex sends back in place of the compacted turns
    (here over the Responses WebSocket). /v1/responses/compact is never called by this Codex.

    The limit (10,000 tokens) sits between the session before its compaction (Codex's ~8,600-token first
    prompt plus ~2,500 tokens that it estimates for the 10 kB it keeps of `seq 1 4000`) and after it (the first
    prompt plus the summary). The replay model answers each prompt's last marker: the summary is the case
    named by the listing's last line, and what follows the compaction is scripted by the summary alone, so Codex
    running the command that writes after.txt proves that the prompt after the compaction carried the summary."""
    codex = _binary("codex")
    work, env = _codex_workspace(tmp_path, agent_gateway, provider)
    traffic.seen.clear()
    done = subprocess.run([codex, "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
                           "-c", "model_auto_compact_token_limit=10000", "replay:hermes/codex_compaction_fill"],
                          # A session runs in seconds; a limit that it never got back under would compact for ever.
                          cwd=work, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "fall" not in done.stderr.lower() and "404" not in done.stderr, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i["command"] for i in items if i.get("type") == "command_execution"]
    assert len(commands) == 2 and "seq 1 4000" in commands[0], commands
    assert "> after.txt" in commands[1], commands  # the step that only the summary names
    assert (work / "after.txt").read_text(encoding="utf-8") == "compacted\n"
    assert [i["text"] for i in items if i.get("type") == "agent_message"][-1].strip() == PLAIN
    assert "error" not in [e.get("type") for e in events], events
    # Codex's one notice is about its own model catalog (no metadata for a model it does not know).
    assert all("Model metadata" in i["message"] for i in items if i.get("type") == "error"), items
    assert not [s for _, s, _ in traffic.seen if s is not None and s != 200], traffic.seen  # no 404, no refusal
    requests = traffic.codex_requests()
    kinds = [k for k, _ in requests if k != "prewarm"]
    assert kinds == ["turn", "compaction", "turn", "turn"], kinds
    (asked,) = [b for k, b in requests if k == "compaction"]
    meta = json.loads(asked["client_metadata"]["x-codex-turn-metadata"])
    assert meta["compaction"]["implementation"] == compaction
    after = next(b for k, b in requests[requests.index(("compaction", asked)) + 1:] if k == "turn")
    shown = json.dumps(after["input"])
    # The compacted turns are gone: neither the call nor its output, nor a previous_response_id that holds them.
    assert after.get("previous_response_id") is None and "\\n3999\\n" not in shown
    assert not [i for i in after["input"] if i.get("type") in ("function_call", "function_call_output")]
    if compaction == "responses":  # the summary as Codex's own user message
        assert [i for i in asked["input"] if i.get("type") == "function_call_output"]
        assert SUMMARY in shown
    else:  # this gateway's compaction item, which reads back as the summary
        assert asked["input"][-1] == {"type": "compaction_trigger"}
        (item,) = [i for i in after["input"] if i.get("type") == "compaction"]
        tag, _, encoded = item["encrypted_content"].partition(":")
        assert tag == "gw-compaction-v1" and base64.b64decode(encoded).decode() == SUMMARY
    assert ("websocket" in {t for t, _, _ in traffic.seen}) == ("websockets" in provider)
