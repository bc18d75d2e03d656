"""Every model family's golden corpus through the gateway's whole real path (issue #19 item 6).

For each family whose real tokenizer is built (models/families/<family>/, openai_api/embedded/families.py)
the gateway serves `replay-<family>`: the family's tokenizer and chat template, its tool_parser and
reasoning_parser from the corpus file, and the Triton model `replay-llm` (TensorRT-LLM ids interface),
which streams the recorded completion's real token ids one by one. So each case runs: render with the
family's template, tokenize, Triton, detokenize, parse tool calls and reasoning, SSE. Hermes, Qwen3-XML,
Mistral and harmony also run over `replay-llm-vllm` (the vLLM backend's text interface) as
`replay-<family>-vllm`.

Per case, with the `openai` client, plain and streamed:
* the plain answer equals the corpus expectation (content, reasoning_content, each call's name and parsed
  arguments, the call id's format or exact value, finish_reason); content and reasoning compare with
  surrounding whitespace stripped (tests/unit/test_family_corpus.py states the rules);
* the streamed answer, assembled, equals the plain one: reasoning, content, each call's id format (exact
  id where the model writes it), name and arguments text, finish_reason;
* no control-token text of the family (the corpus's `markers`) appears in content or reasoning_content,
  plain or in any streamed delta (except the malformed cases whose raw text is the expected content).

The oracle is the corpus (written from vLLM's / SGLang's parser tests and the families' docs), never
the gateway's parsers. One extra gateway (this module's) shares the session's tritonserver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import ValidationError

from openai_api.config import BUNDLED_TEMPLATES, GatewayConfig, LLMModel
from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.conftest import API_KEY, GatewayServer
from tests.helpers import PREPARED_MODELS, REPO

CORPUS = REPO / "tests" / "data" / "families" / "corpus"
FAMILIES_DIR = PREPARED_MODELS / "families"
# Families also served over the vLLM text interface (special tokens kept with skip_special_tokens false).
VLLM_FAMILIES = ("hermes", "qwen3_xml", "mistral", "harmony")
FALLBACK_TEMPLATE = BUNDLED_TEMPLATES / "chatml.jinja"


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


CORPORA = {p.stem: _load(p) for p in sorted(CORPUS.glob("*.json"))}


def _folder(family: str) -> Path:
    data = CORPORA[family]
    return FAMILIES_DIR / str(data.get("tokenizer_family") or family)


def _params() -> list[Any]:
    out = []
    for family, data in CORPORA.items():
        variants = ["ids", "vllm"] if family in VLLM_FAMILIES else ["ids"]
        built = (_folder(family) / "tokenizer.json").is_file()
        for variant in variants:
            for case in data["cases"]:
                marks = [] if built else [pytest.mark.skip(
                    reason=f"no tokenizer built for {family} in {_folder(family)} (openai_api/embedded/families.py)")]
                out.append(pytest.param(family, variant, case["name"], id=f"{family}-{variant}-{case['name']}",
                                        marks=marks))
    return out


def _model(family: str, variant: str, url: str) -> LLMModel:
    data = CORPORA[family]
    folder = _folder(family)
    template = folder / "chat_template.jinja"
    if not template.is_file() and "chat_template" not in json.loads(
            (folder / "tokenizer_config.json").read_text(encoding="utf-8")):
        # No vendored template for this family yet: a neutral ChatML one renders the prompt, so the
        # output path (detokenize, parse, SSE) is still proven; the family's own template replaces it
        # as soon as tests/data/families/<family>/ vendors one.
        template = FALLBACK_TEMPLATE
    return LLMModel(name=f"replay-{family}" + ("-vllm" if variant == "vllm" else ""), url=url, path=folder,
                    chat_template=template if template.is_file() else None,
                    triton_model="replay-llm-vllm" if variant == "vllm" else "replay-llm",
                    tool_parser=data["tool_parser"], reasoning_parser=data["reasoning_parser"])


@pytest.fixture(scope="module")
def family_gateway(triton: EmbeddedTriton) -> Iterator[tuple[GatewayServer, dict[str, str]]]:
    """A gateway serving every built family (both variants where listed), and why the others are not
    served: the gateway refusing a family's parser names is an expected failure until it knows them."""
    models: list[LLMModel] = []
    refused: dict[str, str] = {}
    for family in CORPORA:
        if not (_folder(family) / "tokenizer.json").is_file():
            continue
        for variant in ("ids", "vllm") if family in VLLM_FAMILIES else ("ids",):
            try:
                models.append(_model(family, variant, triton.grpc_url))
            except ValidationError as exc:
                data = CORPORA[family]
                refused[family] = (f"the gateway does not know tool_parser {data['tool_parser']!r} / reasoning_parser "
                                   f"{data['reasoning_parser']!r} yet: {exc.errors()[0]['msg']}")
    server = GatewayServer(GatewayConfig(llm=models), [API_KEY]).start()
    yield server, refused
    server.stop()


@pytest.fixture(scope="module")
def client(family_gateway: tuple[GatewayServer, dict[str, str]]) -> openai.OpenAI:
    return openai.OpenAI(base_url=family_gateway[0].url + "/v1", api_key=API_KEY, timeout=120, max_retries=0)


def _text(value: str | None) -> str | None:
    """Content / reasoning as the corpus compares them: surrounding whitespace is layout."""
    return (value or "").strip() or None


def _request(family: str, variant: str, case: dict[str, Any]) -> dict[str, Any]:
    messages = [*case.get("history", []), {"role": "user", "content": f"replay:{family}/{case['name']}"}]
    req: dict[str, Any] = {"model": f"replay-{family}" + ("-vllm" if variant == "vllm" else ""),
                           "messages": messages, "tools": CORPORA[family]["tools"], "temperature": 0}
    if "max_tokens" in case:
        req["max_tokens"] = case["max_tokens"]
    return req


def _plain(resp: Any) -> dict[str, Any]:
    choice = resp.choices[0]
    msg = choice.message
    extra = msg.model_extra or {}
    return {"content": msg.content, "reasoning_content": extra.get("reasoning_content"),
            "tool_calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                           for c in msg.tool_calls or []],
            "finish_reason": choice.finish_reason}


def _streamed(chunks: Any, markers: list[str], markers_ok: bool) -> dict[str, Any]:
    content, reasoning = [], []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        piece_r = (delta.model_extra or {}).get("reasoning_content")
        for piece in (delta.content, piece_r):
            if piece and not markers_ok:
                assert not [m for m in markers if m in piece], f"control text in a streamed delta: {piece!r}"
        if delta.content:
            content.append(delta.content)
        if piece_r:
            reasoning.append(piece_r)
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert slot["id"] is None, "a call's id is sent once"
                slot["id"] = tc.id
            if tc.function and tc.function.name:
                assert slot["name"] is None, "a call's name is sent once"
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
        if choice.finish_reason:
            finish = choice.finish_reason
    return {"content": "".join(content) or None, "reasoning_content": "".join(reasoning) or None,
            "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


@pytest.mark.parametrize(("family", "variant", "name"), _params())
def test_corpus_case_plain_and_streamed(client: openai.OpenAI, family_gateway: tuple[GatewayServer, dict[str, str]],
                                        family: str, variant: str, name: str) -> None:
    data = CORPORA[family]
    if family in family_gateway[1]:
        pytest.xfail(family_gateway[1][family])
    case = next(c for c in data["cases"] if c["name"] == name)
    exp = case["expect"]
    markers, markers_ok = data["markers"], bool(case.get("markers_in_content"))
    pattern = re.compile(data["id_pattern"])
    req = _request(family, variant, case)

    plain = _plain(client.chat.completions.create(**req))
    assert _text(plain["content"]) == exp["content"]
    assert _text(plain["reasoning_content"]) == exp["reasoning_content"]
    assert [c["name"] for c in plain["tool_calls"]] == [c["name"] for c in exp["tool_calls"]]
    for got, want in zip(plain["tool_calls"], exp["tool_calls"], strict=True):
        assert json.loads(got["arguments"]) == want["arguments"], got["name"]
        assert pattern.fullmatch(got["id"] or ""), f"call id {got['id']!r} does not match {pattern.pattern}"
        if "id" in want:
            assert got["id"] == want["id"]
    assert plain["finish_reason"] == exp["finish_reason"]
    if not markers_ok:
        for key in ("content", "reasoning_content"):
            assert not [m for m in markers if m in (plain[key] or "")], f"control text in {key}: {plain[key]!r}"

    streamed = _streamed(client.chat.completions.create(**req, stream=True), markers, markers_ok)
    assert _text(streamed["content"]) == _text(plain["content"])
    assert _text(streamed["reasoning_content"]) == _text(plain["reasoning_content"])
    assert streamed["finish_reason"] == plain["finish_reason"]
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"]] == \
        [(c["name"], c["arguments"]) for c in plain["tool_calls"]]
    for got, want in zip(streamed["tool_calls"], exp["tool_calls"], strict=True):
        assert pattern.fullmatch(got["id"] or ""), f"streamed call id {got['id']!r} does not match {pattern.pattern}"
        if "id" in want:
            assert got["id"] == want["id"]


def test_models_show_each_familys_parsers(family_gateway: tuple[GatewayServer, dict[str, str]]) -> None:
    """/v1/models tells a client which families each model's output is read with, and that the family's
    marker tokens reach the parser on both interfaces (ids decoded here; vLLM told to keep them)."""
    import httpx

    server, _ = family_gateway
    cards = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"]
    seen = 0
    for card in cards:
        family = card["id"].removeprefix("replay-").removesuffix("-vllm")
        caps = card["capabilities"]
        assert caps["tool_parser"] == CORPORA[family]["tool_parser"], card["id"]
        assert caps["reasoning_parser"] == CORPORA[family]["reasoning_parser"], card["id"]
        assert caps["parser_markers"] is True, card["id"]
        seen += 1
    assert seen >= 10
