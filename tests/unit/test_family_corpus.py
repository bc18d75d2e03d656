"""The golden corpus of model-family outputs (tests/data/families/corpus/<family>.json) is well formed.

Each file holds one family's recorded completions (raw model output, control tokens as text) and what
the gateway must answer for each: content, reasoning_content, tool calls (name, arguments as a JSON
object, optionally the exact id) and finish_reason. The expectations are written from the families'
documentation and vLLM's / SGLang's parser tests (each case's `source`), never from our parser's output.
The replay model (triton_models/replay-llm) streams these completions through a real tritonserver for
tests/e2e/test_families.py; this file checks the data itself, so a broken case fails here first.

Comparison rules the e2e test applies (stated once, here): content and reasoning_content compare with
surrounding whitespace stripped (layout newlines around `<think>` blocks and before a call are not
text); an expected `null` means absent or empty.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import PREPARED_MODELS, REPO

CORPUS = REPO / "tests" / "data" / "families" / "corpus"
FAMILIES_DIR = PREPARED_MODELS / "families"
FILES = sorted(CORPUS.glob("*.json"))
FINISH = {"stop", "tool_calls", "length"}
TOP_KEYS = {"family", "tool_parser", "reasoning_parser", "id_pattern", "markers", "notes", "tools", "cases"}
OPTIONAL_TOP = {"tokenizer_family"}
CASE_KEYS = {"name", "completion", "expect", "source"}
OPTIONAL_CASE = {"max_tokens", "history", "markers_in_content"}
EXPECT_KEYS = {"content", "reasoning_content", "tool_calls", "finish_reason"}


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def cases_of(path: Path) -> list[dict[str, Any]]:
    return list(load(path)["cases"])


def test_there_is_a_corpus_for_every_family_of_issue_19() -> None:
    families = {p.stem for p in FILES}
    assert families >= {"hermes", "qwen3_xml", "llama3_json", "llama4", "pythonic", "mistral", "deepseek_v3",
                        "deepseek_v31", "deepseek_dsml", "harmony", "kimi_k2", "glm45"}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_file_structure(path: Path) -> None:
    data = load(path)
    assert TOP_KEYS <= set(data) <= TOP_KEYS | OPTIONAL_TOP, set(data) ^ TOP_KEYS
    assert data["family"] == path.stem
    assert isinstance(data["tool_parser"], str) and data["tool_parser"]
    assert data["reasoning_parser"] is None or isinstance(data["reasoning_parser"], str)
    re.compile(data["id_pattern"])
    assert data["markers"] and all(isinstance(m, str) and m for m in data["markers"])
    names = set()
    for tool in data["tools"]:
        assert tool["type"] == "function"
        fn = tool["function"]
        assert isinstance(fn["name"], str) and fn["name"] not in names
        assert fn["parameters"]["type"] == "object"
        names.add(fn["name"])
    cases = data["cases"]
    assert len(cases) >= 10, f"{path.stem}: {len(cases)} cases, at least 10 wanted"
    assert len({c["name"] for c in cases}) == len(cases), "case names must be unique"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_case_is_well_formed(path: Path) -> None:
    data = load(path)
    tools = {t["function"]["name"] for t in data["tools"]}
    pattern = re.compile(data["id_pattern"])
    for c in data["cases"]:
        where = f"{path.stem}/{c.get('name')}"
        assert CASE_KEYS <= set(c) <= CASE_KEYS | OPTIONAL_CASE, where
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+", c["name"]), where
        assert isinstance(c["completion"], str) and c["completion"], where
        assert isinstance(c["source"], str) and c["source"], where
        exp = c["expect"]
        assert set(exp) == EXPECT_KEYS, where
        assert exp["finish_reason"] in FINISH, where
        for key in ("content", "reasoning_content"):
            assert exp[key] is None or (isinstance(exp[key], str) and exp[key] == exp[key].strip() and exp[key]), \
                f"{where}: {key} must be null or non-empty, stripped text"
        for call in exp["tool_calls"]:
            assert set(call) <= {"name", "arguments", "id"}, where
            assert call["name"] in tools, f"{where}: {call['name']} is not among the file's tools"
            assert isinstance(call["arguments"], dict), where
            if "id" in call:
                assert pattern.fullmatch(call["id"]), where
        if exp["tool_calls"] and exp["finish_reason"] != "length":
            assert exp["finish_reason"] == "tool_calls", where
        if not exp["tool_calls"]:
            assert exp["finish_reason"] != "tool_calls", where
        if "max_tokens" in c:
            assert isinstance(c["max_tokens"], int) and c["max_tokens"] > 0, where
            assert exp["finish_reason"] == "length", f"{where}: a max_tokens cut ends with length"
        if exp["finish_reason"] == "length":
            assert "max_tokens" in c, where
        if "history" in c:
            roles = [m["role"] for m in c["history"]]
            assert roles and roles[-1] in ("assistant", "tool", "user"), where
        if not c.get("markers_in_content"):
            for key in ("content", "reasoning_content"):
                for marker in data["markers"]:
                    assert marker not in (exp[key] or ""), f"{where}: {marker!r} in expected {key}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_kinds_of_case_issue_19_asks_for(path: Path) -> None:
    data = load(path)
    cases = data["cases"]
    exps = [c["expect"] for c in cases]
    assert any(not e["tool_calls"] and e["content"] and not c.get("markers_in_content")
               for c, e in zip(cases, exps, strict=True)), "a plain answer"
    assert any(len(e["tool_calls"]) == 1 and e["finish_reason"] == "tool_calls" for e in exps), "one call"
    if data["family"] != "harmony":  # gpt-oss ends its generation at the first <|call|>: one call per turn
        assert any(len(e["tool_calls"]) >= 2 for e in exps), "parallel calls"
    if data["reasoning_parser"] is not None:
        assert any(e["reasoning_content"] and e["tool_calls"] for e in exps), "reasoning then a call"
    assert any(any(ord(ch) > 0x7F for ch in json.dumps(call["arguments"], ensure_ascii=False))
               and any(isinstance(v, dict | list) for v in call["arguments"].values())
               for e in exps for call in e["tool_calls"]), "unicode and nested JSON in arguments"
    assert any(not e["tool_calls"] and e["content"] and ("malformed" in c["name"] or c.get("markers_in_content"))
               for c, e in zip(cases, exps, strict=True)), "a malformed call that falls back to content"
    assert any("max_tokens" in c for c in cases), "a generation cut by max_tokens"
    assert any(any(m["role"] == "tool" for m in c.get("history", [])) for c in cases), \
        "a multi-turn conversation with a tool result in history"


def _family_tokenizer(path: Path) -> Any:
    data = load(path)
    folder = FAMILIES_DIR / str(data.get("tokenizer_family") or data["family"])
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"no tokenizer built for {path.stem} in {folder} (openai_api/embedded/families.py)")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_cut_cases_really_cut_with_the_real_tokenizer(path: Path) -> None:
    """A max_tokens case must end inside its completion (else it would not be cut), and for tool-call cuts
    after the first call's end: the expectation names only the calls that complete before the cut."""
    tok = _family_tokenizer(path)
    for c in cases_of(path):
        if "max_tokens" not in c:
            continue
        ids = tok.encode(c["completion"], add_special_tokens=False).ids
        assert c["max_tokens"] < len(ids), f"{c['name']}: {len(ids)} tokens, max_tokens {c['max_tokens']} cuts nothing"
        kept = tok.decode(ids[: c["max_tokens"]], skip_special_tokens=False)
        exp = c["expect"]
        if exp["reasoning_content"] and not exp["tool_calls"]:
            assert exp["reasoning_content"] in kept, c["name"]
        for call in exp["tool_calls"]:
            assert call["name"] in kept, f"{c['name']}: the cut falls before the call to {call['name']}"
