"""The Responses API and reasoning models end to end: the `openai` client's `responses` resource and the
OpenAI Agents SDK (both of its model classes) against the real gateway and a real Triton.

SmolLM2 (135M) answers the plain and tool cases; forced tool calls are guided, so their arguments
always parse. The reasoning cases use `synthetic-reasoning`, the synthetic LLM with its thinking
section on (every answer opens with ``<think>`` ... ``</think>``, as DeepSeek-R1's and Qwen3's do), served
with ``reasoning_parser: deepseek_r1``: the thinking must come back apart from the answer on every
path (chat, chat streamed, responses, responses streamed) and be counted in usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import openai
import pytest
from pydantic import Field

from openai_api.config import BUNDLED_TEMPLATES, LLMModel, ModelInfo
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, REASONING, GatewayServer, gateway_config
from tests.helpers import MODELS, openai_validator

TIME_TOOL = {"type": "function", "name": "get_time", "description": "Time in a timezone",
             "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}},
                            "required": ["tz"], "additionalProperties": False}}
validate = openai_validator()


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    """The session Triton behind a gateway that also serves the reasoning model and keeps responses."""
    config = gateway_config(triton)
    config.model_infos.append(ModelInfo(name=REASONING, end_id=-1, max_len=4096))
    config.llm.append(LLMModel(name=REASONING, url=triton.grpc_url, path=MODELS / LLM,
                               chat_template=BUNDLED_TEMPLATES / "smollm2.jinja",
                               reasoning_parser="deepseek_r1"))
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], responses_store=64)
    server = GatewayServer(config, [API_KEY], settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def aclient(gateway: GatewayServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


def test_a_plain_response(client: openai.OpenAI) -> None:
    r = client.responses.create(model=LLM, input="What is the capital of France?", instructions="Be brief.",
                                max_output_tokens=12, temperature=0)
    validate("Response", r.model_dump(mode="json", exclude_unset=True))
    assert r.status in ("completed", "incomplete") and r.output_text.strip()
    assert r.usage is not None and r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_a_streamed_response_sends_the_typed_events_in_order(client: openai.OpenAI) -> None:
    types: list[str] = []
    text = ""
    with client.responses.stream(model=LLM, input="Say hello.", max_output_tokens=64, temperature=0) as stream:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"  # (the SDK only accepts a completed stream)
    assert types.index("response.output_item.added") < types.index("response.output_text.delta")
    assert types.index("response.output_text.done") < types.index("response.output_item.done")
    assert text and final.output_text == text


def test_a_forced_function_call_and_its_result(client: openai.OpenAI) -> None:
    """The SDK's tool round trip: a forced (guided) call, then the call's output back as input."""
    first = client.responses.create(model=LLM, input="What time is it in Tokyo?", tools=[TIME_TOOL],  # type: ignore[list-item]
                                    tool_choice={"type": "function", "name": "get_time"},
                                    max_output_tokens=40, temperature=0.8)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_time"
    assert set(json.loads(calls[0].arguments)) == {"tz"}
    second = client.responses.create(
        model=LLM, tools=[TIME_TOOL], max_output_tokens=16, temperature=0,  # type: ignore[list-item]
        input=[{"role": "user", "content": "What time is it in Tokyo?"}, calls[0].model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "09:30"}])
    assert second.status in ("completed", "incomplete") and second.output


def test_previous_response_id_continues_a_stored_conversation(client: openai.OpenAI, gateway: GatewayServer) -> None:
    first = client.responses.create(model=LLM, input="My name is Ada.", store=True, max_output_tokens=8)
    assert client.responses.retrieve(first.id).id == first.id
    second = client.responses.create(model=LLM, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn was sent again
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")


def test_bad_input_gets_openais_error_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=LLM, input=[{"type": "no_such_item"}], max_output_tokens=4)  # type: ignore[list-item]
    assert e.value.body is not None and "input" in str(e.value.body)


# ------------------------------------------------------------------ the Agents SDK
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_an_agent_calls_its_tool(aclient: openai.AsyncOpenAI, api: str) -> None:
    """A one-tool agent on both model classes: the tool runs with the arguments the model produced."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_time(tz: Annotated[str, Field(max_length=12)]) -> str:
        """The time in a timezone."""
        seen.append(tz)
        return f"09:30 in {tz}"

    model = (OpenAIResponsesModel(model=LLM, openai_client=aclient) if api == "responses"
             else OpenAIChatCompletionsModel(model=LLM, openai_client=aclient))
    agent = Agent(name="clock", instructions="Answer with the tool.", tools=[get_time], model=model,
                  # One call: a sampled 135M model left a list of calls open can go on adding calls to it.
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                               temperature=0.8),
                  tool_use_behavior="stop_on_first_tool")
    result = await Runner.run(agent, "What time is it in Tokyo?", max_turns=2)
    assert len(seen) == 1 and result.final_output == f"09:30 in {seen[0]}"


# ------------------------------------------------------------------ reasoning models
THINKING = "The user wants an answer; let me think it through step by step.\n"


def test_chat_returns_the_thinking_as_reasoning_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REASONING, messages=[{"role": "user", "content": "Hi"}], max_tokens=40)
    message = r.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == THINKING
    assert message.content and "<think>" not in message.content and "</think>" not in message.content
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert 0 < (r.usage.completion_tokens_details.reasoning_tokens or 0) < r.usage.completion_tokens


def test_streamed_chat_sends_reasoning_deltas_before_the_answer(client: openai.OpenAI) -> None:
    reasoning, content, order = "", "", []
    stream = client.chat.completions.create(model=REASONING, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=40, stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        piece = (delta.model_extra or {}).get("reasoning_content")
        if piece:
            reasoning += piece
            order.append("r")
        if delta.content:
            content += delta.content
            order.append("c")
    assert reasoning == THINKING and content and "<think>" not in content
    # Counted token by token as they came; the same count as the plain answer's (re-tokenized) one.
    plain = client.chat.completions.create(model=REASONING, messages=[{"role": "user", "content": "Hi"}], max_tokens=40)
    assert usage is not None and usage.completion_tokens_details is not None and plain.usage is not None
    assert plain.usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == plain.usage.completion_tokens_details.reasoning_tokens
    assert order.index("c") > len(order) - order[::-1].index("r") - 1  # every reasoning delta came first


def test_a_guided_answer_follows_the_thinking(client: openai.OpenAI) -> None:
    """A reasoning model's backend applies the guide after the thinking: the answer alone is the object."""
    r = client.chat.completions.create(model=REASONING, messages=[{"role": "user", "content": "Hi"}], max_tokens=60,
                                       response_format={"type": "json_object"})
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content") == THINKING
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


def test_responses_return_a_reasoning_item(client: openai.OpenAI, gateway: GatewayServer) -> None:
    r = client.responses.create(model=REASONING, input="Hi", max_output_tokens=40)
    validate("Response", r.model_dump(mode="json", exclude_unset=True))
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content is not None and r.output[0].content[0].text == THINKING  # type: ignore[union-attr]
    assert "<think>" not in r.output_text and r.usage is not None
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    # Streamed: reasoning deltas, then the message, checked against OpenAI's event schemas.
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as h:
        body = h.post("/v1/responses", json={"model": REASONING, "input": "Hi", "max_output_tokens": 40,
                                             "stream": True}).text
    events: list[dict[str, Any]] = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    types = [e["type"] for e in events]
    assert types.index("response.reasoning_text.delta") < types.index("response.output_text.delta")
    thinking = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thinking == THINKING
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
