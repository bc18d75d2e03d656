"""Agent frameworks on real model families: a function-tool round trip through the whole real path (issue #19).

The OpenAI Agents SDK (`Agent` + `Runner` on `OpenAIChatCompletionsModel` and `OpenAIResponsesModel`, plain
and streamed) and LangChain (`ChatOpenAI(...).bind_tools`, invoke and stream) drive two families that are
nothing like SmolLM2's Hermes: gpt-oss (harmony: analysis / commentary to=functions.NAME / final channels)
and Qwen3-Coder / Qwen3.5 (qwen3_xml: `<function=...><parameter=...>` calls, `<think>` reasoning). Each model
is served the way tests/e2e/test_families.py serves it: the family's real tokenizer and chat template in
front of the Triton model `replay-llm` (TensorRT-LLM ids) or `replay-llm-vllm` (the vLLM text interface),
which replays the golden corpus's recorded completion named by the LAST `replay:<family>/<case>` marker in
the prompt.

A round trip: turn 1's user message names `<family>/one_call` (one call to get_weather); the framework
parses it, runs OUR tool function, and sends its return value back as the tool result - which names
`<family>/final_after_tool`, so turn 2 replays the final answer. Asserted, with the corpus as the oracle:
the tool really ran, once, with the corpus's arguments; the framework's final output is the corpus's final
text; the reasoning (harmony's analysis channel, qwen's `<think>`) and no control text reached it.

One gateway for this module (two families x two interfaces) on the session's tritonserver.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterator
from functools import reduce
from pathlib import Path
from typing import Any

import openai
import pytest

from openai_api.config import GatewayConfig
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, GatewayServer
from tests.e2e.test_families import CORPORA, _folder, _model

FAMILIES = ("harmony", "qwen3_xml")
VARIANTS = ("ids", "vllm")
FIRST, SECOND = "one_call", "final_after_tool"


def _case(family: str, name: str) -> dict[str, Any]:
    return next(c for c in CORPORA[family]["cases"] if c["name"] == name)


def _expected_call(family: str) -> dict[str, Any]:
    calls = _case(family, FIRST)["expect"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    return dict(calls[0]["arguments"])


def _expected_final(family: str) -> dict[str, Any]:
    exp = _case(family, SECOND)["expect"]
    assert not exp["tool_calls"] and exp["content"] and exp["reasoning_content"]
    return dict(exp)


def _params() -> list[Any]:
    out = []
    for family in FAMILIES:
        built = (_folder(family) / "tokenizer.json").is_file()
        marks = [] if built else [pytest.mark.skip(reason=f"no tokenizer built for {family} in {_folder(family)}")]
        for variant in VARIANTS:
            out.append(pytest.param(family, variant, id=f"{family}-{variant}", marks=marks))
    return out


PARAMS = _params()


def _name(family: str, variant: str) -> str:
    return f"replay-{family}" + ("-vllm" if variant == "vllm" else "")


@pytest.fixture(scope="module")
def agents_gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    """The two families on both interfaces, served like test_families.py serves them."""
    models = [_model(f, v, triton.grpc_url) for f in FAMILIES for v in VARIANTS
              if (_folder(f) / "tokenizer.json").is_file()]
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], responses_store=16)
    server = GatewayServer(GatewayConfig(llm=models), [API_KEY], settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def aclient(agents_gateway: GatewayServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{agents_gateway.url}/v1", api_key=API_KEY, timeout=120, max_retries=0)


class Weather:
    """The tool both frameworks run: it records every call it gets, and its result names the next scenario."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.calls: list[dict[str, Any]] = []

    def __call__(self, city: str, unit: str | None = None) -> str:
        args: dict[str, Any] = {"city": city}
        if unit is not None:
            args["unit"] = unit
        self.calls.append(args)
        # The replay model answers the LAST marker in the prompt: this result steers turn 2 to the final answer.
        return json.dumps({"temperature": 18, "sky": "clear"}) + f" replay:{self.family}/{SECOND}"


def _check_final(family: str, text: str | None) -> None:
    """The framework's final text is the corpus's final answer: no reasoning, no control text in it."""
    exp = _expected_final(family)
    assert (text or "").strip() == exp["content"]
    assert exp["reasoning_content"] not in (text or "")
    assert not [m for m in CORPORA[family]["markers"] if m in (text or "")]


# ------------------------------------------------------------------ the OpenAI Agents SDK
def _agent(family: str, variant: str, aclient: openai.AsyncOpenAI, api: str, weather: Weather) -> Any:
    from agents import Agent, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    @function_tool
    def get_weather(city: str, unit: str | None = None) -> str:
        """Current weather for a city.

        Args:
            city: The city.
            unit: celsius or fahrenheit.
        """
        return weather(city, unit)

    name = _name(family, variant)
    model = (OpenAIResponsesModel(model=name, openai_client=aclient) if api == "responses"
             else OpenAIChatCompletionsModel(model=name, openai_client=aclient))
    return Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model)


def _plain(raw: Any) -> Any:
    """A run item's raw item as plain data (the SDK keeps some as pydantic models, tool outputs as dicts)."""
    return raw if isinstance(raw, dict) else raw.model_dump()


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
@pytest.mark.parametrize(("family", "variant"), PARAMS)
async def test_agents_sdk_tool_round_trip(aclient: openai.AsyncOpenAI, family: str, variant: str, api: str) -> None:
    from agents import Runner, set_tracing_disabled

    set_tracing_disabled(True)
    weather = Weather(family)
    agent = _agent(family, variant, aclient, api, weather)
    result = await Runner.run(agent, f"What is the weather in Tokyo? replay:{family}/{FIRST}", max_turns=3)
    assert weather.calls == [_expected_call(family)]
    _check_final(family, result.final_output)
    # Every item the run produced: the final turn's reasoning arrives as a reasoning item (separated, not
    # dropped), never inside a message.
    reasoning = _expected_final(family)["reasoning_content"]
    dumps = [(item.type, json.dumps(_plain(item.raw_item), ensure_ascii=False)) for item in result.new_items]
    assert any(kind == "reasoning_item" and reasoning in text for kind, text in dumps), [k for k, _ in dumps]
    assert not any(kind == "message_output_item" and reasoning in text for kind, text in dumps)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
@pytest.mark.parametrize(("family", "variant"), PARAMS)
async def test_agents_sdk_streamed_tool_round_trip(aclient: openai.AsyncOpenAI, family: str, variant: str,
                                                   api: str) -> None:
    from agents import Runner, set_tracing_disabled

    set_tracing_disabled(True)
    weather = Weather(family)
    agent = _agent(family, variant, aclient, api, weather)
    result = Runner.run_streamed(agent, f"What is the weather in Tokyo? replay:{family}/{FIRST}", max_turns=3)
    text_deltas: list[str] = []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text_deltas.append(event.data.delta)
    assert weather.calls == [_expected_call(family)]
    _check_final(family, result.final_output)
    _check_final(family, "".join(text_deltas))


# ------------------------------------------------------------------ LangChain
def _chat(agents_gateway: GatewayServer, family: str, variant: str) -> tuple[Any, Any, Weather]:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = Weather(family)

    @tool
    def get_weather(city: str, unit: str | None = None) -> str:
        """Current weather for a city (unit: celsius or fahrenheit)."""
        return weather(city, unit)

    llm = ChatOpenAI(base_url=f"{agents_gateway.url}/v1", api_key=API_KEY,  # type: ignore[arg-type]
                     model=_name(family, variant), temperature=0, max_retries=0, timeout=120)
    return llm.bind_tools([get_weather]), get_weather, weather


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["args"]) for c in message.tool_calls]


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize(("family", "variant"), PARAMS)
def test_langchain_bind_tools_round_trip(agents_gateway: GatewayServer, family: str, variant: str,
                                         stream: bool) -> None:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

    llm, get_weather, weather = _chat(agents_gateway, family, variant)

    def ask(messages: list[BaseMessage]) -> Any:
        if not stream:
            return llm.invoke(messages)
        chunks = list(llm.stream(messages))
        assert chunks
        merged: Any = reduce(operator.add, chunks)
        return merged

    messages: list[BaseMessage] = [HumanMessage(f"What is the weather in Tokyo? replay:{family}/{FIRST}")]
    first = ask(messages)
    assert _calls(first) == [("get_weather", _expected_call(family))]
    assert not first.invalid_tool_calls
    call = first.tool_calls[0]
    assert call["id"] and re.fullmatch(CORPORA[family]["id_pattern"], call["id"])
    assert not [m for m in CORPORA[family]["markers"] if m in str(first.content)]
    assert first.response_metadata.get("finish_reason") == "tool_calls"

    tool_message = get_weather.invoke(call)  # a ToolMessage carrying the call's id
    assert weather.calls == [_expected_call(family)]
    assert tool_message.tool_call_id == call["id"]

    messages += [AIMessage(content=first.content, tool_calls=first.tool_calls), tool_message]
    final = ask(messages)
    assert not final.tool_calls
    _check_final(family, str(final.content))
    assert final.response_metadata.get("finish_reason") == "stop"


@pytest.mark.parametrize(("family", "variant"), PARAMS)
def test_langchain_stream_gives_the_same_tool_calls_as_invoke(agents_gateway: GatewayServer, family: str,
                                                              variant: str) -> None:
    from langchain_core.messages import HumanMessage

    llm, _, _ = _chat(agents_gateway, family, variant)
    prompt = [HumanMessage(f"What is the weather in Tokyo? replay:{family}/{FIRST}")]
    plain = llm.invoke(prompt)
    merged: Any = reduce(operator.add, list(llm.stream(prompt)))
    assert _calls(merged) == _calls(plain) == [("get_weather", _expected_call(family))]
    # The streamed call's arguments, as sent in the chunks, parse to the same object.
    assert [json.loads(c["args"]) for c in merged.tool_call_chunks] == [_expected_call(family)]

