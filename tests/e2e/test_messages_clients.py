"""Anthropic's npm clients against the gateway's Messages API (issue #25): the TypeScript SDK
(`@anthropic-ai/sdk`) and Claude Code (`@anthropic-ai/claude-code`, `claude -p`), pinned in
tests/e2e/node/package.json + package-lock.json and installed there by the test command
(scripts/setup_tests.sh: `npm ci`; skipped, with the reason, where they are not installed).

Claude Code's system prompt and tool definitions alone are ~20k tokens, beyond the 8,192-token context of
the only real model of the test set-up, so the agent talks to `replay-agent`: the Triton model `replay-llm`
(TensorRT-LLM ids interface) behind the hermes family's real tokenizer, template and parsers, with a large
`max_len`. It streams the recorded completion named by the last `replay:hermes/<case>` marker in the
prompt (tests/data/families/corpus/hermes.json), so the expected answers are the corpus's, not the
gateway's. `claude-sonnet-4-5` / `claude-haiku-4-5` are aliases of it, as a user would configure them.

* The TypeScript SDK streams a plain answer and a tool call; every raw event it parsed is validated
  against Anthropic's event schema and grammar (tests/anthropic_events.py) and its own accumulated
  message is checked against the corpus.
* Claude Code answers one prompt, and makes one tool round trip: the model calls Bash
  (`echo replay:hermes/plain_answer`), Claude Code really runs it and sends the output back as a
  `tool_result`, whose marker makes the next turn's answer.
* A request Claude Code 2.1.332 sent, recorded against a capture server on 127.0.0.1
  (tests/data/anthropic/claude_code_request.json: its system prompt, tools, `anthropic-beta` headers,
  `thinking`, `context_management`), replayed as is: needs no npm at all.

Claude Code runs with no network beyond the gateway: HOME is a temporary folder, telemetry, non-essential
traffic and the auto-updater are off, and the only base URL it knows is the gateway's loopback address.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openai_api.config import GatewayConfig, LLMModel, ModelInfo
from openai_api.embedded.launcher import EmbeddedTriton
from tests.anthropic_events import accumulate, check_stream, parse_sse
from tests.e2e.conftest import API_KEY, GatewayServer
from tests.helpers import PREPARED_MODELS, REPO

NODE_DIR = REPO / "tests" / "e2e" / "node"
CORPUS = json.loads((REPO / "tests" / "data" / "families" / "corpus" / "hermes.json").read_text(encoding="utf-8"))
RECORDED = json.loads((REPO / "tests" / "data" / "anthropic" / "claude_code_request.json").read_text(encoding="utf-8"))
HERMES = PREPARED_MODELS / "families" / "hermes"
MODEL, ALIASES = "replay-agent", ["claude-sonnet-4-5", "claude-haiku-4-5"]


def _case(name: str) -> dict[str, Any]:
    case: dict[str, Any] = next(c for c in CORPUS["cases"] if c["name"] == name)
    return case


def _anthropic_tools() -> list[dict[str, Any]]:
    """The corpus's tools in Anthropic's shape."""
    return [{"name": t["function"]["name"], "description": t["function"]["description"],
             "input_schema": t["function"]["parameters"]} for t in CORPUS["tools"]]


@pytest.fixture(scope="module")
def agent_gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    if not (HERMES / "tokenizer.json").is_file():
        pytest.skip(f"no hermes tokenizer built in {HERMES} (openai_api/embedded/families.py)")
    model = LLMModel(name=MODEL, url=triton.grpc_url, path=HERMES, chat_template=HERMES / "chat_template.jinja",
                     triton_model="replay-llm", tool_parser=CORPUS["tool_parser"],
                     reasoning_parser=CORPUS["reasoning_parser"], aliases=ALIASES)
    # The context Claude Code needs (its requests ask for max_tokens 32000 on a ~20k-token prompt).
    info = ModelInfo(name=MODEL, max_len=200_000)
    server = GatewayServer(GatewayConfig(model_infos=[info], llm=[model]), [API_KEY]).start()
    yield server
    server.stop()


def _installed() -> bool:
    lock = json.loads((NODE_DIR / "package-lock.json").read_text(encoding="utf-8"))
    for name, entry in lock["packages"].items():
        if name.startswith("node_modules/@anthropic-ai/") and "-linux-" not in name and "-darwin-" not in name \
                and "-win32-" not in name:
            pkg = NODE_DIR / name / "package.json"
            if not pkg.is_file() or json.loads(pkg.read_text(encoding="utf-8"))["version"] != entry["version"]:
                return False
    return True


@pytest.fixture(scope="session")
def node_clients() -> Path:
    """tests/e2e/node/node_modules with the locked packages, which the test command installs
    (scripts/setup_tests.sh: `npm ci`); without them these tests skip, saying so. Session-scoped and first
    in the tests' arguments, so a skip comes before the session's tritonserver starts."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the test command installs it (bash scripts/setup_tests.sh)")
    if not _installed():
        pytest.skip("tests/e2e/node's npm packages are not installed as locked: the test command installs them "
                    "(bash scripts/setup_tests.sh runs npm ci)")
    return NODE_DIR / "node_modules"


# ------------------------------------------------------------------ TypeScript SDK


def _ts_stream(gateway: GatewayServer, body: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": API_KEY}
    done = subprocess.run(["node", "messages_stream.mjs", json.dumps(body)], cwd=NODE_DIR, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    check_stream(out["events"])
    # The SDK's own accumulation and ours (from the same raw events) agree.
    mine = accumulate(out["events"])
    assert [(b["type"], b.get("text"), b.get("input")) for b in mine["content"]] == \
        [(b["type"], b.get("text"), b.get("input")) for b in out["final"]["content"]]
    return out


def test_typescript_sdk_streams_a_message(node_clients: Path, agent_gateway: GatewayServer) -> None:
    case = _case("plain_answer")
    out = _ts_stream(agent_gateway, {"model": "claude-sonnet-4-5", "max_tokens": 256,
                                     "messages": [{"role": "user", "content": "replay:hermes/plain_answer"}]})
    final = out["final"]
    assert final["id"].startswith("msg_") and final["model"] == "claude-sonnet-4-5"
    assert [b["type"] for b in final["content"]] == ["text"]
    assert final["content"][0]["text"].strip() == case["expect"]["content"]
    assert final["stop_reason"] == "end_turn"
    assert final["usage"]["output_tokens"] > 0 and final["usage"]["input_tokens"] > 0
    assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta" for e in out["events"])


def test_typescript_sdk_streams_a_tool_call(node_clients: Path, agent_gateway: GatewayServer) -> None:
    (call,) = _case("one_call")["expect"]["tool_calls"]
    out = _ts_stream(agent_gateway, {"model": MODEL, "max_tokens": 256, "tools": _anthropic_tools(),
                                     "messages": [{"role": "user", "content": "replay:hermes/one_call"}]})
    final = out["final"]
    (block,) = final["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert block["name"] == call["name"] and block["input"] == call["arguments"]
    assert final["stop_reason"] == "tool_use"
    deltas = [e["delta"]["partial_json"] for e in out["events"]
              if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"]
    assert json.loads("".join(deltas)) == call["arguments"]


# ------------------------------------------------------------------ Claude Code


def _claude(node_modules: Path, gateway: GatewayServer, home: Path, prompt: str, *args: str) -> list[dict[str, Any]]:
    """`claude -p PROMPT --output-format stream-json --verbose ARGS` -> its JSON lines."""
    home.mkdir(exist_ok=True)
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ANTHROPIC_BASE_URL": gateway.url,
           "ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_MODEL": ALIASES[0], "ANTHROPIC_SMALL_FAST_MODEL": ALIASES[1],
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_ERROR_REPORTING": "1", "NO_PROXY": "127.0.0.1"}
    done = subprocess.run([str(node_modules / ".bin" / "claude"), "-p", prompt, "--output-format", "stream-json",
                           "--verbose", "--max-turns", "3", *args],
                          cwd=work, env=env, capture_output=True, text=True, timeout=90, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    return lines


def _result(lines: list[dict[str, Any]]) -> dict[str, Any]:
    (result,) = [m for m in lines if m.get("type") == "result"]
    return result


def test_claude_code_answers_a_prompt(node_clients: Path, agent_gateway: GatewayServer, tmp_path: Path) -> None:
    lines = _claude(node_clients, agent_gateway, tmp_path / "home", "replay:hermes/plain_answer")
    result = _result(lines)
    assert result["subtype"] == "success" and not result["is_error"], result
    assert result["result"].strip() == _case("plain_answer")["expect"]["content"]
    assert result["num_turns"] == 1


def test_claude_code_tool_round_trip(node_clients: Path, agent_gateway: GatewayServer, tmp_path: Path) -> None:
    (call,) = _case("claude_code_bash_call")["expect"]["tool_calls"]
    lines = _claude(node_clients, agent_gateway, tmp_path / "home", "replay:hermes/claude_code_bash_call",
                    "--allowedTools", "Bash(echo:*)")
    blocks = [(m["type"], b) for m in lines if m.get("type") in ("assistant", "user")
              for b in m["message"]["content"] if isinstance(b, dict)]
    uses = [b for kind, b in blocks if kind == "assistant" and b["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [(call["name"], call["arguments"])]
    results = [b for kind, b in blocks if kind == "user" and b["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["tool_use_id"] == uses[0]["id"] and not results[0].get("is_error")
    output = results[0]["content"]
    text = output if isinstance(output, str) else "".join(p.get("text", "") for p in output)
    assert text.strip() == "replay:hermes/plain_answer"  # Claude Code really ran the command
    result = _result(lines)
    assert result["subtype"] == "success" and not result["is_error"], result
    assert result["result"].strip() == _case("plain_answer")["expect"]["content"]
    assert result["num_turns"] == 2


# ------------------------------------------------------------------ the recorded request


def test_a_recorded_claude_code_request_is_answered(agent_gateway: GatewayServer) -> None:
    """The exact request Claude Code sent (tests/data/anthropic/claude_code_request.json), its headers
    (`anthropic-beta`, `x-api-key`) and `?beta=true` included: a valid stream with the corpus's answer, and
    count_tokens of the same prompt equal to the answer's input_tokens."""
    headers = {**RECORDED["headers"], "x-api-key": API_KEY}
    body = RECORDED["body"]
    assert body["stream"] is True and body["model"] == ALIASES[0]
    with httpx.Client(base_url=agent_gateway.url, headers=headers, timeout=60) as http:
        resp = http.post(RECORDED["path"], json=body)
        assert resp.status_code == 200, resp.text[:2000]
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(resp.text)
        check_stream(events)
        message = accumulate(events)
        texts = [b["text"] for b in message["content"] if b["type"] == "text"]
        assert "".join(texts).strip() == _case("plain_answer")["expect"]["content"]
        assert message["stop_reason"] == "end_turn"
        counted = http.post("/v1/messages/count_tokens?beta=true",
                            json={k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")})
        assert counted.status_code == 200, counted.text[:2000]
        assert counted.json()["input_tokens"] == events[0]["message"]["usage"]["input_tokens"] > 8192
