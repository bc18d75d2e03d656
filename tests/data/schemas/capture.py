"""Writes the schema corpus beside this file: what pydantic generates for nested, recursive, union and enum
models (`pydantic.json`), and the request bodies instructor, pydantic-ai, the OpenAI Agents SDK, LangChain and
the anthropic SDK send for them (`frameworks.json`), captured from their own HTTP clients.

    PYTHONPATH=$PWD .venv/bin/python tests/data/schemas/capture.py

Nothing leaves the machine: each client is given an HTTP transport that records the request body and answers
400, so each framework stops after its first request. Every model comes with one valid instance (checked by
pydantic here and by jsonschema in the test); `tests/unit/test_schema_corpus.py` reads both files.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import httpx
import openai
import pydantic
import pydantic.v1
from pydantic import BaseModel, Field, TypeAdapter

HERE = Path(__file__).resolve().parent
PACKAGES = ("pydantic", "instructor", "pydantic-ai-slim", "openai-agents", "langchain-openai", "langchain-core",
            "anthropic", "openai")


# ------------------------------------------------------------------------------------------- the models
class Geo(BaseModel):
    lat: float
    lon: float


class Address(BaseModel):
    street: str
    city: str
    geo: Geo


class Person(BaseModel):
    """Nested models two levels deep, a model used twice, a field with a description beside its `$ref`."""

    name: str
    home: Address = Field(description="Where the person lives.")
    work: Address | None = None


class Role(enum.StrEnum):
    lead = "lead"
    dev = "dev"


class Member(BaseModel):
    name: str
    role: Role


class Team(BaseModel):
    """A list of models with an enum inside."""

    name: str
    members: list[Member]


class Priority(enum.IntEnum):
    low = 1
    high = 2


class Ticket(BaseModel):
    """Enums: a str enum, an int enum, a Literal, an Optional enum."""

    title: str
    priority: Priority
    status: Literal["open", "closed"]
    assignee_role: Role | None = None


class Circle(BaseModel):
    radius: float


class Square(BaseModel):
    side: float


class Drawing(BaseModel):
    """A plain union of models (anyOf of `$ref`s) and a list of that union."""

    main: Circle | Square
    others: list[Circle | Square]


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Lizard(BaseModel):
    kind: Literal["lizard"]
    scales: int


class Household(BaseModel):
    """A discriminated union (oneOf of `$ref`s + discriminator mapping), alone and in a list."""

    pet: Annotated[Cat | Dog | Lizard, Field(discriminator="kind")]
    others: list[Annotated[Cat | Dog | Lizard, Field(discriminator="kind")]]


class TreeNode(BaseModel):
    """Recursive: the root is itself a definition (`$ref` at the root)."""

    value: int
    children: list[TreeNode]


class ListNode(BaseModel):
    """Recursive through Optional."""

    value: str
    next: ListNode | None = None


class Employee(BaseModel):
    name: str
    manager: Manager | None = None


class Manager(BaseModel):
    name: str
    reports: list[Employee]


class Org(BaseModel):
    """Mutually recursive models."""

    ceo: Manager


class Item(BaseModel):
    sku: str
    qty: int


class Inventory(BaseModel):
    """A dict of models (additionalProperties: `$ref`) and a tuple of models (prefixItems of `$ref`s)."""

    stock: dict[str, Item]
    pair: tuple[Item, Item]


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """A generic model (its definition's name is `Page_Item_`)."""

    items: list[T]
    next_cursor: str | None = None


class Annotated_(BaseModel):
    """Data that looks like schema: `$ref` and `$defs` inside `examples` and a default (never rewritten)."""

    model_config = pydantic.ConfigDict(json_schema_extra={"examples": [{"$ref": "#/$defs/Nothing"}]})
    where: Address = Field(default=Address(street="a", city="b", geo=Geo(lat=0, lon=0)))
    note: str = Field(default="", json_schema_extra={"examples": ["#/$defs/Address"]})


class Shadow:
    class Address(BaseModel):
        """A second, different model named `Address`."""

        zip: int
        country: str


class Parcel(BaseModel):
    """Its `$defs` name `Address` too, with other fields: the test offers it beside each other schema in one
    `required` guide, where the two `Address` definitions must not be confused."""

    to: Shadow.Address


class V1Address(pydantic.v1.BaseModel):
    street: str
    city: str


class V1Person(pydantic.v1.BaseModel):
    """pydantic v1 (still shipped as `pydantic.v1`): `definitions` + `#/definitions/...`."""

    name: str
    home: V1Address
    past: list[V1Address]


class V1Node(pydantic.v1.BaseModel):
    value: int
    children: list[V1Node]


V1Node.update_forward_refs()

GEO = {"lat": 48.85, "lon": 2.35}
ADDRESS = {"street": "1 Rue", "city": "Paris", "geo": GEO}
INSTANCES: dict[str, tuple[Any, Any]] = {  # name -> (model or type, a valid instance)
    "Person": (Person, {"name": "Ada", "home": ADDRESS, "work": None}),
    "Team": (Team, {"name": "core", "members": [{"name": "Ada", "role": "lead"}, {"name": "Bo", "role": "dev"}]}),
    "Ticket": (Ticket, {"title": "bug", "priority": 2, "status": "open", "assignee_role": "dev"}),
    "Drawing": (Drawing, {"main": {"radius": 1.5}, "others": [{"side": 2.0}, {"radius": 0.5}]}),
    "Household": (Household, {"pet": {"kind": "dog", "good": True},
                              "others": [{"kind": "cat", "lives": 9}, {"kind": "lizard", "scales": 100}]}),
    "TreeNode": (TreeNode, {"value": 1, "children": [{"value": 2, "children": []},
                                                      {"value": 3, "children": [{"value": 4, "children": []}]}]}),
    "ListNode": (ListNode, {"value": "a", "next": {"value": "b", "next": None}}),
    "Org": (Org, {"ceo": {"name": "Ann", "reports": [{"name": "Bob", "manager": {"name": "Cy", "reports": []}}]}}),
    "Inventory": (Inventory, {"stock": {"x": {"sku": "x", "qty": 1}}, "pair": [{"sku": "a", "qty": 1},
                                                                               {"sku": "b", "qty": 2}]}),
    "Page[Item]": (Page[Item], {"items": [{"sku": "a", "qty": 3}], "next_cursor": None}),
    "Annotated": (Annotated_, {"where": ADDRESS, "note": "n"}),
    "Cat|Dog|Lizard": (Cat | Dog | Lizard, {"kind": "cat", "lives": 3}),
    "list[Address]": (list[Address], [ADDRESS, ADDRESS]),
    "Parcel": (Parcel, {"to": {"zip": 75001, "country": "FR"}}),
    "V1Person": (V1Person, {"name": "Ada", "home": {"street": "s", "city": "c"}, "past": []}),
    "V1Node": (V1Node, {"value": 1, "children": [{"value": 2, "children": []}]}),
}
# The models each framework is asked for (their schemas hold `$defs`: nested, list of models, discriminated
# union, recursive, mutually recursive).
FRAMEWORK_MODELS = ("Person", "Team", "Household", "TreeNode", "Org")


def _instance(name: str) -> Any:
    """The instance, checked against its model (a typo here must not become a corpus "valid" case)."""
    model, value = INSTANCES[name]
    if isinstance(model, type) and issubclass(model, pydantic.v1.BaseModel):
        model.parse_obj(value)
    else:
        TypeAdapter(model).validate_python(value)
    return value


def pydantic_corpus() -> list[dict[str, Any]]:
    out = []
    for name, (model, _) in INSTANCES.items():
        if isinstance(model, type) and issubclass(model, pydantic.v1.BaseModel):
            schema = json.loads(model.schema_json())
        elif isinstance(model, type) and issubclass(model, BaseModel):
            schema = model.model_json_schema()
        else:
            schema = TypeAdapter(model).json_schema()
        out.append({"name": name, "schema": schema, "valid": _instance(name)})
    return out


# --------------------------------------------------------------------------------- capturing frameworks
class Recorder:
    """An httpx transport (sync and async) that records each JSON request body and answers 400."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append((request.url.path, json.loads(request.content)))
        return httpx.Response(400, json={"error": {"message": "captured", "type": "invalid_request_error"}})

    async def handle(self, request: httpx.Request) -> httpx.Response:
        return self(request)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0,
                             http_client=httpx.Client(transport=httpx.MockTransport(self)))

    def async_openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handle)))


def _one(run: Callable[[Recorder], Any]) -> tuple[str, dict[str, Any]] | str:
    """The first request body `run` makes, or why it made none."""
    rec = Recorder()
    try:
        result = run(rec)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except Exception as e:  # noqa: BLE001 - the 400 ends every framework's run; anything else is reported
        if not rec.bodies:
            return f"{type(e).__name__}: {str(e)[:200]}"
    if not rec.bodies:
        return "no request"
    path, body = rec.bodies[0]
    for key in ("messages", "input"):  # the conversation is not what this corpus is about
        body.pop(key, None)
    return path, body


def _instructor(mode_name: str) -> Callable[[Any], Callable[[Recorder], Any]]:
    import instructor

    def case(model: Any) -> Callable[[Recorder], Any]:
        def run(rec: Recorder) -> Any:
            client = instructor.from_openai(rec.openai(), mode=getattr(instructor.Mode, mode_name))
            return client.chat.completions.create(model="m", response_model=model, max_retries=0,
                                                  messages=[{"role": "user", "content": "hi"}])
        return run
    return case


def _instructor_anthropic(model: Any) -> Callable[[Recorder], Any]:
    import anthropic
    import instructor
    try:
        import httpx2 as ahttpx  # the anthropic SDK's own HTTP library in current releases
    except ImportError:
        ahttpx = httpx

    def run(rec: Recorder) -> Any:
        def handler(request: Any) -> Any:
            rec.bodies.append((request.url.path, json.loads(request.content)))
            return ahttpx.Response(400, json={"type": "error", "error": {"type": "invalid_request_error",
                                                                         "message": "captured"}})

        client = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="x", max_retries=0,
                                     http_client=ahttpx.Client(transport=ahttpx.MockTransport(handler)))
        return instructor.from_anthropic(client, mode=instructor.Mode.ANTHROPIC_TOOLS).messages.create(
            model="m", max_tokens=16, response_model=model, max_retries=0, messages=[{"role": "user", "content": "hi"}])
    return run


def _taking(model: Any) -> Callable[..., str]:
    """A function tool taking one `value` of `model` (annotations set by hand: this module's are strings)."""

    def store(value: Any) -> str:
        """Store the value."""
        return "ok"

    store.__annotations__ = {"value": model, "return": str}
    return store


def _anthropic_tool(model: Any) -> Callable[[Recorder], Any]:
    """The tool definition the anthropic SDK's `beta_tool` builds from a function taking the model (no request:
    recorded as the Messages body that offers it with `tool_choice: any`)."""
    import anthropic

    def run(rec: Recorder) -> None:
        tool = anthropic.beta_tool(_taking(model)).to_dict()
        rec.bodies.append(("/v1/messages", {"model": "m", "max_tokens": 16, "tools": [dict(tool)],
                                            "tool_choice": {"type": "any"}}))
    return run


def _langchain(method: str) -> Callable[[Any], Callable[[Recorder], Any]]:
    def case(model: Any) -> Callable[[Recorder], Any]:
        def run(rec: Recorder) -> Any:
            from langchain_openai import ChatOpenAI

            llm = ChatOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", model="m", max_retries=0,  # type: ignore[arg-type]
                             http_client=httpx.Client(transport=httpx.MockTransport(rec)))
            if method == "bind_tools_any":
                return llm.bind_tools([model], tool_choice="any").invoke("hi")
            return llm.with_structured_output(model, method=method).invoke("hi")  # type: ignore[arg-type]
        return run
    return case


def _pydantic_ai(kind: str) -> Callable[[Any], Callable[[Recorder], Any]]:
    def case(model: Any) -> Callable[[Recorder], Any]:
        async def run(rec: Recorder) -> Any:
            from pydantic_ai import Agent, NativeOutput
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider

            llm = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=rec.async_openai()))
            if kind == "tool_output":
                return await Agent(llm, output_type=model).run("hi")
            if kind == "native_output":
                return await Agent(llm, output_type=NativeOutput(model)).run("hi")
            return await Agent(llm, tools=[_taking(model)]).run("hi")
        return lambda rec: run(rec)
    return case


def _agents_sdk(api: str, kind: str) -> Callable[[Any], Callable[[Recorder], Any]]:
    def case(model: Any) -> Callable[[Recorder], Any]:
        async def run(rec: Recorder) -> Any:
            from agents import (
                Agent,
                ModelSettings,
                OpenAIChatCompletionsModel,
                OpenAIResponsesModel,
                Runner,
                function_tool,
                set_tracing_disabled,
            )

            set_tracing_disabled(True)
            cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
            llm = cls(model="m", openai_client=rec.async_openai())
            if kind == "output_type":
                return await Runner.run(Agent(name="a", model=llm, output_type=model), "hi")
            agent = Agent(name="a", model=llm, tools=[function_tool(_taking(model))],
                          model_settings=ModelSettings(tool_choice="required"))
            return await Runner.run(agent, "hi")
        return lambda rec: run(rec)
    return case


CAPTURES: dict[tuple[str, str], Callable[[Any], Callable[[Recorder], Any]]] = {
    ("instructor", "TOOLS"): _instructor("TOOLS"),
    ("instructor", "TOOLS_STRICT"): _instructor("TOOLS_STRICT"),
    ("instructor", "JSON_SCHEMA"): _instructor("JSON_SCHEMA"),
    ("instructor", "ANTHROPIC_TOOLS"): _instructor_anthropic,
    ("anthropic", "beta_tool"): _anthropic_tool,
    ("langchain", "function_calling"): _langchain("function_calling"),
    ("langchain", "json_schema"): _langchain("json_schema"),
    ("langchain", "bind_tools_any"): _langchain("bind_tools_any"),
    ("pydantic-ai", "tool_output"): _pydantic_ai("tool_output"),
    ("pydantic-ai", "native_output"): _pydantic_ai("native_output"),
    ("pydantic-ai", "function_tool"): _pydantic_ai("function_tool"),
    ("agents-sdk", "chat_output_type"): _agents_sdk("chat", "output_type"),
    ("agents-sdk", "chat_required_tool"): _agents_sdk("chat", "required_tool"),
    ("agents-sdk", "responses_output_type"): _agents_sdk("responses", "output_type"),
    ("agents-sdk", "responses_required_tool"): _agents_sdk("responses", "required_tool"),
}
# Frameworks whose function tool taking one `value` has that one argument (pydantic-ai makes a single model
# argument the whole arguments object).
WRAPPED = {("agents-sdk", "chat_required_tool"),
           ("agents-sdk", "responses_required_tool"), ("anthropic", "beta_tool")}


def framework_corpus() -> tuple[list[dict[str, Any]], list[str]]:
    out, skipped = [], []
    for (framework, how), case in CAPTURES.items():
        for name in FRAMEWORK_MODELS:
            model = INSTANCES[name][0]
            captured = _one(case(model))
            if isinstance(captured, str):
                skipped.append(f"{framework} {how} {name}: {captured}")
                continue
            path, body = captured
            value = _instance(name)
            out.append({"framework": framework, "how": how, "model": name, "path": path, "body": body,
                        "valid": {"value": value} if (framework, how) in WRAPPED else value})
    return out, skipped


def main() -> None:
    warnings.simplefilter("ignore")
    versions = {p: version(p) for p in PACKAGES}
    pyd = pydantic_corpus()
    (HERE / "pydantic.json").write_text(json.dumps({"versions": {"pydantic": versions["pydantic"]}, "cases": pyd},
                                                   indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    frameworks, skipped = framework_corpus()
    (HERE / "frameworks.json").write_text(json.dumps({"versions": versions, "skipped": skipped, "cases": frameworks},
                                                     indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    sys.stdout.write(f"{len(pyd)} pydantic schemas, {len(frameworks)} framework bodies; skipped:\n")
    for line in skipped:
        sys.stdout.write(f"  {line}\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
