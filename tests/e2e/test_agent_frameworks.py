"""Agent frameworks, each driven through its own library against the real gateway and tritonserver (issue #20).

pydantic-ai (tool output, `NativeOutput`, streamed output, a function-tool round trip), DSPy (`JSONAdapter`
typed fields through a declared OpenAI-compatible provider), smolagents (`ToolCallingAgent`) and the OpenAI
Agents SDK on both model classes (a forced tool, then structured output; tests/e2e/test_responses.py covers
its plain forced-tool call) talk to `smollm2-135m-instruct`, a 135M model served with real guided decoding
(xgrammar).

A 135M model cannot be trusted to pick the right tool or write a schema's JSON by itself. So every test
forces the step it needs (a named `tool_choice`, `required` with one tool, `response_format` / `text.format`)
and bounds every string the model writes (`maxLength`, `enum`): the guide the gateway sends to the backend,
not luck, makes each answer parse. The oracle is the framework's own parsing and validation (a pydantic model,
a DSPy typed field, smolagents' tool-call handling) plus our tool functions' record of their calls; the
request bodies the frameworks sent (recorded with an httpx hook) show which enforcement each step relied on.
Values the model chose (which enum member, what city) are never asserted: they are the model's, not ours.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

SKY = ("clear", "rain", "snow")
MAX_TOKENS = 60  # a bounded object or call is ~20-35 tokens on SmolLM2's tokenizer


class Report(BaseModel):
    """The structured output every framework asks for: one bounded string and one enum."""

    city: Annotated[str, Field(max_length=16)]
    sky: Literal["clear", "rain", "snow"]


class Trip(BaseModel):
    """A nested model: pydantic writes Report once under `$defs` and refers to it (`$ref`) from both fields, the
    schema shape a forced call's guide once broke (issue #34)."""

    start: Report
    end: Report


NESTED_TOKENS = 100  # a Trip, or a call holding one, is ~40-60 tokens


class Wire:
    """Records the JSON body of every request a framework's HTTP client sends (an httpx event hook)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def record(self, request: httpx.Request) -> None:
        if request.content:
            self.bodies.append(json.loads(request.content))

    async def arecord(self, request: httpx.Request) -> None:
        self.record(request)

    def async_client(self, gateway: GatewayServer) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0,
                                  http_client=httpx.AsyncClient(timeout=120, event_hooks={"request": [self.arecord]}))


@pytest.fixture
def wire() -> Wire:
    return Wire()


def _weather_tool(seen: list[str]) -> Any:
    """The function tool the agents call: it records each call and returns a fixed observation."""

    def get_weather(city: Annotated[str, Field(max_length=16)]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"snow in {city}"

    return get_weather


# ------------------------------------------------------------------ pydantic-ai
def _pydantic_ai_model(gateway: GatewayServer, wire: Wire) -> Any:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(LLM, provider=OpenAIProvider(openai_client=wire.async_client(gateway)))


def _pydantic_ai_settings() -> Any:
    from pydantic_ai.settings import ModelSettings

    # One call per turn: with parallel calls allowed, `required` guides to a LIST of calls, which a
    # sampled 135M model can go on extending until max_tokens.
    return ModelSettings(max_tokens=MAX_TOKENS, temperature=0.8, parallel_tool_calls=False)


async def test_pydantic_ai_tool_output(gateway: GatewayServer, wire: Wire) -> None:
    """Tool output (pydantic-ai's default for a model type): the only tool is `final_result` and pydantic-ai
    sends `tool_choice: "required"`, so the gateway forces the call and guides its arguments to Report's
    schema; pydantic-ai validates them into a Report."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    agent = Agent(_pydantic_ai_model(gateway, wire), output_type=Report, model_settings=_pydantic_ai_settings())
    result = await agent.run("What is the weather in Oslo?")
    assert isinstance(result.output, Report)
    [body] = wire.bodies
    assert body["tool_choice"] == "required" and [t["function"]["name"] for t in body["tools"]] == ["final_result"]
    calls = [p for m in result.all_messages() if isinstance(m, ModelResponse) for p in m.parts
             if isinstance(p, ToolCallPart)]
    assert [c.tool_name for c in calls] == ["final_result"]
    assert Report.model_validate(calls[0].args_as_dict()) == result.output


async def test_pydantic_ai_tool_output_with_a_nested_model(gateway: GatewayServer, wire: Wire) -> None:
    """Tool output for a nested model: `final_result`'s parameters hold `$defs` + `$ref`, and with `tool_choice:
    "required"` the gateway's guide wraps them; the call still comes and validates into a Trip."""
    from pydantic_ai import Agent
    from pydantic_ai.settings import ModelSettings

    agent = Agent(_pydantic_ai_model(gateway, wire), output_type=Trip,
                  model_settings=ModelSettings(max_tokens=NESTED_TOKENS, temperature=0.8, parallel_tool_calls=False))
    result = await agent.run("Plan a trip from Oslo to Rome.")
    assert isinstance(result.output, Trip)
    [body] = wire.bodies
    assert body["tool_choice"] == "required" and "$defs" in body["tools"][0]["function"]["parameters"]


async def test_pydantic_ai_native_output(gateway: GatewayServer, wire: Wire) -> None:
    """`NativeOutput`: pydantic-ai sends `response_format: json_schema` (strict) and reads the message text;
    the gateway's guide makes that text Report's JSON (enum and maxLength enforced)."""
    from pydantic_ai import Agent, NativeOutput

    agent = Agent(_pydantic_ai_model(gateway, wire), output_type=NativeOutput(Report),
                  model_settings=_pydantic_ai_settings())
    result = await agent.run("What is the weather in Lima?")
    assert isinstance(result.output, Report)
    [body] = wire.bodies
    assert body["response_format"]["type"] == "json_schema" and "tools" not in body
    assert body["response_format"]["json_schema"]["schema"]["properties"]["sky"]["enum"] == list(SKY)


async def test_pydantic_ai_streamed_output(gateway: GatewayServer, wire: Wire) -> None:
    """`run_stream` with tool output: the forced call's arguments arrive as streamed tool-call deltas, which
    pydantic-ai parses partially as they come; the last partial and the final output are the same Report."""
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(gateway, wire), output_type=Report, model_settings=_pydantic_ai_settings())
    async with agent.run_stream("What is the weather in Rome?") as run:
        partials = [p async for p in run.stream_output(debounce_by=None)]
        final = await run.get_output()
    assert partials and all(isinstance(p, Report) for p in partials)
    assert partials[-1] == final
    [body] = wire.bodies
    assert body["stream"] is True and body["tool_choice"] == "required"


async def test_pydantic_ai_function_tool_round_trip(gateway: GatewayServer, wire: Wire) -> None:
    """A function tool, then structured output. A capability steers `tool_choice` per step (pydantic-ai's
    documented way to force a tool on one step only): step 1 names `get_weather` (a forced, guided call), step
    2 allows only the output tool (`final_result`, forced). Our tool runs once, its return value goes back as
    the tool message, and the run ends with a validated Report."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.settings import ModelSettings, ToolOrOutput

    seen: list[str] = []

    @dataclass
    class ForceWeatherFirst(AbstractCapability[None]):
        def get_model_settings(self) -> Any:
            return lambda ctx: ModelSettings(
                tool_choice=ToolOrOutput(function_tools=[]) if seen else ["get_weather"])

    agent = Agent(_pydantic_ai_model(gateway, wire), output_type=Report, tools=[_weather_tool(seen)],
                  model_settings=_pydantic_ai_settings(), capabilities=[ForceWeatherFirst()])
    result = await agent.run("What is the weather in Lima?")
    assert len(seen) == 1 and isinstance(result.output, Report)
    first, second = wire.bodies
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert second["tool_choice"] == {"type": "function", "function": {"name": "final_result"}}
    [tool_message] = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_message["content"] == f"snow in {seen[0]}"


# ------------------------------------------------------------------ DSPy
def test_dspy_json_adapter_typed_fields(gateway: GatewayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """DSPy's `JSONAdapter` with typed output fields (an enum, a bool, a pydantic model), through the gateway
    declared as an OpenAI-compatible provider (`dspy.lm15.register_provider`, vLLM's chat dialect) that states
    `response_schema` support. JSONAdapter then sends the fields' JSON schema as `response_format`, and the
    gateway's guide makes the reply parse into the typed fields. (Without the declaration DSPy does not know
    the model and sends no `response_format`; the 135M model then answers in prose and DSPy fails to parse.)
    The bounded string sits in a nested model: DSPy drops `Field` constraints on a top-level field's schema."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # DSPy's model metadata: no download
    dspy = pytest.importorskip("dspy")
    from dspy.lm15 import (
        AccessPolicy,
        ModelSupport,
        OpenAIChatCompat,
        ProviderDefinition,
        register_provider,
        unregister_provider,
    )

    class Capital(dspy.Signature):  # type: ignore[misc, name-defined]
        """Say which country the city is the capital of."""

        city: str = dspy.InputField()
        country: Literal["France", "Japan", "Peru"] = dspy.OutputField()
        confident: bool = dspy.OutputField()
        weather: Report = dspy.OutputField()

    provider = "triton-gateway"
    register_provider(ProviderDefinition.chat(AccessPolicy(provider=provider, env_keys=("TRITON_GATEWAY_API_KEY",),
                                                           base_url=f"{gateway.url}/v1"),
                                              compat=OpenAIChatCompat.preset("vllm")),
                      supports=ModelSupport(response_schema=True), replace=True)
    try:
        lm = dspy.LM(f"{provider}/{LLM}", api_key=API_KEY, max_tokens=2 * MAX_TOKENS, temperature=0.8, cache=False)
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            prediction = dspy.Predict(Capital)(city="Lima")
    finally:
        unregister_provider(provider)
    assert prediction.country in ("France", "Japan", "Peru")
    assert isinstance(prediction.confident, bool)
    assert isinstance(prediction.weather, Report)  # validated: within maxLength and the enum
    sent = lm.history[-1]["kwargs"]["response_format"].model_json_schema()
    assert sent["properties"]["country"]["enum"] == ["France", "Japan", "Peru"]
    assert sent["$defs"]["Report"]["properties"]["city"]["maxLength"] == 16


# ------------------------------------------------------------------ smolagents
def test_smolagents_tool_calling_agent(gateway: GatewayServer) -> None:
    """smolagents' `ToolCallingAgent` (native tool calls, `tool_choice` on every step): our model subclass
    names the tool per step - `get_weather` first, then `final_answer`, smolagents' way to finish - so each
    call is a forced, guided call; `final_answer`'s argument is an enum. A short system prompt keeps the
    prefill small (smolagents' default one is ~1,500 tokens)."""
    smolagents = pytest.importorskip("smolagents")
    import yaml

    seen: list[str] = []

    class GetWeather(smolagents.Tool):  # type: ignore[misc, name-defined]
        name = "get_weather"
        description = "The weather in a city."
        inputs = {"city": {"type": "string", "description": "The city.", "maxLength": 16}}
        output_type = "string"

        def forward(self, city: str) -> str:
            seen.append(city)
            return f"snow in {city}"

    class FinalAnswer(smolagents.Tool):  # type: ignore[misc, name-defined]
        name = "final_answer"
        description = "The sky in the city."
        inputs = {"answer": {"type": "string", "description": "The sky.", "enum": list(SKY)}}
        output_type = "string"

        def forward(self, answer: str) -> str:
            return answer

    class ForcedModel(smolagents.OpenAIServerModel):  # type: ignore[misc, name-defined]
        def generate(self, messages: Any, stop_sequences: Any = None, response_format: Any = None,
                     tools_to_call_from: Any = None, **kwargs: Any) -> Any:
            kwargs["tool_choice"] = {"type": "function",
                                     "function": {"name": "final_answer" if seen else "get_weather"}}
            return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)

    wire = Wire()
    model = ForcedModel(model_id=LLM, api_base=f"{gateway.url}/v1", api_key=API_KEY, max_tokens=MAX_TOKENS,
                        client_kwargs={"http_client": httpx.Client(timeout=120,
                                                                   event_hooks={"request": [wire.record]})})
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts")
                               .joinpath("toolcalling_agent.yaml").read_text(encoding="utf-8"))
    templates["system_prompt"] = "Answer with the tools."
    agent = smolagents.ToolCallingAgent(tools=[GetWeather(), FinalAnswer()], model=model, max_steps=2,
                                        verbosity_level=0, prompt_templates=templates)
    answer = agent.run("What is the weather in Oslo?")
    assert answer in SKY and len(seen) == 1
    assert [b["tool_choice"]["function"]["name"] for b in wire.bodies] == ["get_weather", "final_answer"]
    assert f"snow in {seen[0]}" in json.dumps(wire.bodies[1]["messages"])  # the observation went back


# ------------------------------------------------------------------ the OpenAI Agents SDK
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_agents_sdk_forced_tool_then_structured_output(gateway: GatewayServer, wire: Wire, api: str) -> None:
    """An Agents SDK agent with a function tool and `output_type=Report`, on both model classes. Turn 1:
    `tool_choice` names the tool (a forced, guided call; our function runs). The SDK then resets
    `tool_choice` (its `reset_tool_choice` default), so turn 2 carries only the structured-output format
    (`response_format` / `text.format`, strict), and the gateway's guide makes that turn's answer Report's
    JSON, which the SDK validates as the final output."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    seen: list[str] = []
    client = wire.async_client(gateway)
    model = (OpenAIResponsesModel(model=LLM, openai_client=client) if api == "responses"
             else OpenAIChatCompletionsModel(model=LLM, openai_client=client))
    agent = Agent(name="weather", instructions="Use the tool, then report.", model=model, output_type=Report,
                  tools=[function_tool(_weather_tool(seen))],
                  model_settings=ModelSettings(tool_choice="get_weather", parallel_tool_calls=False,
                                               max_tokens=MAX_TOKENS, temperature=0.8))
    result = await Runner.run(agent, "What is the weather in Oslo?", max_turns=3)
    assert len(seen) == 1 and isinstance(result.final_output, Report)
    first, second = wire.bodies
    if api == "responses":
        assert first["tool_choice"] == {"type": "function", "name": "get_weather"}
        assert second["text"]["format"]["type"] == "json_schema"
        outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
        assert [o["output"] for o in outputs] == [f"snow in {seen[0]}"]
    else:
        assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert second["response_format"]["type"] == "json_schema"
        assert [m["content"] for m in second["messages"] if m["role"] == "tool"] == [f"snow in {seen[0]}"]
    assert "tool_choice" not in second



async def test_agents_sdk_nested_output_type(gateway: GatewayServer, wire: Wire) -> None:
    """`output_type` a nested model on the Responses model class: `text.format` holds `$defs` + `$ref` (strict)."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    agent = Agent(name="trips", model=OpenAIResponsesModel(model=LLM, openai_client=wire.async_client(gateway)),
                  output_type=Trip, model_settings=ModelSettings(max_tokens=NESTED_TOKENS, temperature=0.8))
    result = await Runner.run(agent, "Plan a trip from Oslo to Rome.", max_turns=1)
    assert isinstance(result.final_output, Trip)
    [body] = wire.bodies
    assert "$defs" in body["text"]["format"]["schema"]


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_agents_sdk_required_tool_taking_a_nested_model(gateway: GatewayServer, wire: Wire, api: str) -> None:
    """`tool_choice="required"` with one function tool taking a nested model (the SDK's strict schema: `$defs`
    for Trip and Report): the call comes on both model classes, our function gets a validated Trip, and the
    SDK stops on that first tool call (`stop_on_first_tool`)."""
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    planned: list[Trip] = []

    def plan_trip(trip: Trip) -> str:
        """Book a trip."""
        planned.append(trip)
        return "booked"

    client = wire.async_client(gateway)
    model = (OpenAIResponsesModel(model=LLM, openai_client=client) if api == "responses"
             else OpenAIChatCompletionsModel(model=LLM, openai_client=client))
    agent = Agent(name="trips", model=model, tools=[function_tool(plan_trip)], tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               max_tokens=NESTED_TOKENS, temperature=0.8))
    result = await Runner.run(agent, "Plan a trip from Oslo to Rome.", max_turns=1)
    assert result.final_output == "booked" and len(planned) == 1 and isinstance(planned[0], Trip)
    [body] = wire.bodies
    assert body["tool_choice"] == "required"
    tool = body["tools"][0]
    assert "$defs" in (tool["parameters"] if api == "responses" else tool["function"]["parameters"])
