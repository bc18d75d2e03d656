"""The parser engine (`openai_api.text.families`) on every family's golden corpus, fed whole, one character at
a time, and one token at a time through the gateway's own detokenizer with the family's real tokenizer.

The oracle is the corpus (tests/data/families/corpus/<family>.json): expectations written from each
family's documentation and vLLM's / SGLang's parser tests, never from this parser. Comparison rules are
the corpus's own (tests/unit/test_family_corpus.py): content and reasoning compared stripped, null means
absent or empty. Every feeding must give the same pieces: the streamed answer is the plain answer.
"""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from openai_api.text.detokenizer import IncrementalDetokenizer
from openai_api.text.families import (
    FAMILIES,
    HARMONY_MARKERS,
    REASONING,
    REASONING_PARSER_NAMES,
    TOOL_PARSER_NAMES,
    Piece,
    ToolContext,
    detect_family,
    detect_reasoning,
    detect_tool_format,
    keep_markers,
    make_parser,
)
from tests.helpers import PREPARED_MODELS, REPO

CORPUS = REPO / "tests" / "data" / "families" / "corpus"
DATA = REPO / "tests" / "data" / "families"
FILES = sorted(CORPUS.glob("*.json"))
CASES = [(p, c["name"]) for p in FILES for c in json.loads(p.read_text(encoding="utf-8"))["cases"]]


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def tokenizer_of(data: dict[str, Any]) -> Tokenizer | None:
    return _tokenizer(str(data.get("tokenizer_family") or data["family"]))


@functools.cache
def _tokenizer(family: str) -> Tokenizer | None:
    path = PREPARED_MODELS / "families" / family / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.is_file() else None


def specials_of(data: dict[str, Any], tok: Tokenizer | None) -> set[str]:
    """The special tokens of the family's tokenizer (its tokenizer_config.json when it was not built)."""
    if tok is not None:
        return {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    cfg = DATA / str(data.get("tokenizer_family") or data["family"]) / "tokenizer_config.json"
    if not cfg.is_file():
        return set()
    dec = json.loads(cfg.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
    return {v["content"] for v in dec.values() if isinstance(v, dict) and v.get("special")}


def run(data: dict[str, Any], feed: list[str], control: set[str], cut: bool) -> list[Piece]:
    parser = make_parser(data["tool_parser"], data["reasoning_parser"], tools_active=True,
                         ctx=ToolContext.from_tools(data["tools"]), control=control)
    assert parser is not None
    pieces: list[Piece] = []
    for text in feed:
        pieces += parser.push(text)
    return pieces + parser.finish(cut)


def summary(pieces: list[Piece]) -> dict[str, Any]:
    def text(kind: str) -> str | None:
        return "".join(p.text for p in pieces if p.kind == kind).strip() or None

    return {"content": text("content"), "reasoning_content": text("reasoning"),
            "tool_calls": [{"name": p.call.name, "arguments": p.call.arguments, "id": p.call.id}
                           for p in pieces if p.call is not None]}


def token_texts(data: dict[str, Any], tok: Tokenizer, completion: str, max_tokens: int | None) -> list[str]:
    """The completion as the gateway reads it from a token-id backend: the real ids (special tokens parsed),
    cut at max_tokens, through the gateway's detokenizer with the family's markers kept."""
    ids = tok.encode(completion, add_special_tokens=False).ids[: max_tokens or None]
    specials = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    keep = set(keep_markers(data["tool_parser"], data["reasoning_parser"]))
    drop = frozenset(i for t, i in specials.items() if t not in keep) if keep & set(specials) else None
    detok = IncrementalDetokenizer(tok, drop_ids=drop)
    return [detok.step(i) for i in ids]


@pytest.mark.parametrize(("path", "name"), CASES, ids=[f"{p.stem}/{n}" for p, n in CASES])
def test_corpus_case_whole_char_by_char_and_token_by_token(path: Path, name: str) -> None:
    data = load(path)
    case = next(c for c in data["cases"] if c["name"] == name)
    tok = tokenizer_of(data)
    control = specials_of(data, tok) & set(keep_markers(data["tool_parser"], data["reasoning_parser"]))
    cut = "max_tokens" in case
    if cut:
        if tok is None:
            pytest.skip(f"the cut needs {data['family']}'s tokenizer (models/families: scripts/setup.sh)")
        text = "".join(token_texts(data, tok, case["completion"], case["max_tokens"]))
    else:
        text = case["completion"]
    whole = summary(run(data, [text], control, cut))
    feeds = [list(text)]
    if tok is not None:
        feeds.append(token_texts(data, tok, case["completion"], case.get("max_tokens")))
    for feed in feeds:  # one character at a time; one token at a time
        got = summary(run(data, feed, control, cut))
        assert (got["content"], got["reasoning_content"]) == (whole["content"], whole["reasoning_content"])
        assert [(c["name"], c["arguments"]) for c in got["tool_calls"]] == \
            [(c["name"], c["arguments"]) for c in whole["tool_calls"]]
    exp = case["expect"]
    assert whole["content"] == exp["content"]
    assert whole["reasoning_content"] == exp["reasoning_content"]
    assert [(c["name"], json.loads(c["arguments"])) for c in whole["tool_calls"]] == \
        [(c["name"], c["arguments"]) for c in exp["tool_calls"]]
    for got, want in zip(whole["tool_calls"], exp["tool_calls"], strict=True):
        assert re.fullmatch(data["id_pattern"], got["id"]), got["id"]
        if "id" in want:
            assert got["id"] == want["id"]
    finish = "length" if cut else ("tool_calls" if whole["tool_calls"] else "stop")
    assert finish == exp["finish_reason"]
    if not case.get("markers_in_content"):
        markers = [*data["markers"], *HARMONY_MARKERS] if data["family"] == "harmony" else data["markers"]
        for m in markers:
            assert m not in (whole["content"] or "") and m not in (whole["reasoning_content"] or "")
    for m in control:  # control tokens never reach content or reasoning, malformed calls included
        assert m not in (whole["content"] or "") and m not in (whole["reasoning_content"] or "")


# Region families (harmony, its own parser, ends a generation at each call: its corpus has no parallel case).
@pytest.mark.parametrize("family", sorted(name for name, fmt in FAMILIES.items() if fmt.parser is None))
def test_markers_split_at_every_boundary_never_leak(family: str) -> None:
    """Each family's parallel-calls case cut in two at every position: same answer as whole."""
    path = CORPUS / f"{family}.json"
    data = load(path)
    case = next(c for c in data["cases"] if len(c["expect"]["tool_calls"]) >= 2)
    text = case["completion"]
    whole = summary(run(data, [text], set(), False))
    for cut in range(len(text) + 1):
        got = summary(run(data, [text[:cut], text[cut:]], set(), False))
        assert (got["content"], got["reasoning_content"]) == (whole["content"], whole["reasoning_content"]), cut
        assert [(c["name"], c["arguments"]) for c in got["tool_calls"]] == \
            [(c["name"], c["arguments"]) for c in whole["tool_calls"]], cut


def _cost(tool_parser: str, reasoning: str | None, pieces: list[str]) -> float:
    parser = make_parser(tool_parser, reasoning, tools_active=True, ctx=ToolContext.from_tools(None))
    assert parser is not None
    # This thread's CPU time, not the wall clock: other processes on a shared box do not count in it.
    start = time.thread_time()
    n = 0
    for p in pieces:
        n += len(parser.push(p))
    n += len(parser.finish())
    return time.thread_time() - start


def _hermes(n: int) -> list[str]:
    # a long thinking, a long answer, then a call whose arguments are long (held in its region to its end)
    return ["<think>", *["x "] * n, "</think>", *["word "] * n, "<tool_call>", '{"name": "f", "arguments": {"a": "',
            *["y"] * n, '"}}', "</tool_call>"]


def _mistral(n: int) -> list[str]:
    return ["[THINK]", *["x "] * n, "[/THINK]", "[TOOL_CALLS]", "f", "[ARGS]", '{"a": "', *["y"] * n, '"}']


def _harmony(n: int) -> list[str]:
    return ["<|channel|>", "analysis", "<|message|>", *["x "] * n, "<|end|>", "<|start|>", "assistant",
            "<|channel|>", "final", "<|message|>", *["w "] * n]


def _kimi(n: int) -> list[str]:
    return [*["a "] * n, "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.f:0",
            "<|tool_call_argument_begin|>", '{"a": "', *["y"] * n, '"}', "<|tool_call_end|>",
            "<|tool_calls_section_end|>"]


@pytest.mark.parametrize(("family", "reasoning", "make"), [
    ("hermes", "qwen3", _hermes), ("mistral", "mistral", _mistral), ("harmony", "harmony", _harmony),
    ("kimi_k2", None, _kimi)])
def test_cost_is_linear_in_the_output(family: str, reasoning: str | None, make: Any) -> None:
    """100k tokens cost about 10x what 10k tokens cost (a re-parse per token would be ~100x), in CPU time of
    the test's thread. The bound is loose (30x) for caches and frequency on a shared machine; a quadratic
    engine misses it by far."""
    small = min(_cost(family, reasoning, make(10_000)) for _ in range(3))
    big = _cost(family, reasoning, make(100_000))
    assert big < 30 * small, (small, big)


def test_auto_picks_the_family_of_every_vendored_template() -> None:
    seen = 0
    for folder in sorted(p for p in DATA.iterdir() if (p / "chat_template.jinja").is_file()):
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        specials = specials_of({"family": folder.name}, None)
        assert detect_family(template, specials) == folder.name, folder.name
        seen += 1
    assert seen >= 6
    assert detect_family("{{ messages }}") == "hermes"  # nothing says otherwise: today's default


def _added_tokens(family: str) -> list[str]:
    """Every added token the family's own tokenizer_config.json lists (special or not), as the model ships it."""
    dec = json.loads((DATA / family / "tokenizer_config.json").read_text(encoding="utf-8"))["added_tokens_decoder"]
    return [v["content"] for v in dec.values()]


def test_auto_reads_the_tokenizer_when_the_model_ships_no_template() -> None:
    """DeepSeek V3.2 / V4 ship no chat template (and V3-family folders converted for serving often none): the
    tokenizer's own added tokens (not `special` in DeepSeek's config) name the family; markers several families
    share leave a guess, which says so."""
    dsml = detect_tool_format("", _added_tokens("deepseek_dsml"))
    assert (dsml.family, dsml.evidence, dsml.guess) == ("deepseek_dsml", "tokenizer", False)
    v3 = detect_tool_format("", _added_tokens("deepseek_v3"))
    assert (v3.family, v3.evidence, v3.guess) == ("deepseek_v3", "tokenizer", True) and "deepseek_v31" in v3.why
    qwen = detect_tool_format("", _added_tokens("hermes"))
    assert (qwen.family, qwen.guess) == ("hermes", True) and "qwen3_xml" in qwen.why
    assert detect_tool_format("", _added_tokens("mistral")).family == "mistral"
    nothing = detect_tool_format("{{ messages }}", ["<|im_start|>", "<|im_end|>"])
    assert (nothing.family, nothing.evidence, nothing.guess) == ("hermes", "none", True)
    # The template speaks first: DeepSeek V3.1's template with a tokenizer that also has the DSML token.
    template = (DATA / "deepseek_v31" / "chat_template.jinja").read_text(encoding="utf-8")
    assert detect_tool_format(template, [*_added_tokens("deepseek_v31"), "\uff5cDSML\uff5c"]).family == "deepseek_v31"


def _model_folder(tmp: Path, family: str, template: str | None) -> Path:
    """A model folder as a DeepSeek release lays it out: tokenizer.json, and the family's own tokenizer_config.json
    (whose added tokens are the release's), with `template` as its chat template (None: none)."""
    tok = _tokenizer(family)
    if tok is None:
        pytest.skip(f"the {family} tokenizer is not built (scripts/setup.sh)")
    folder = tmp / family
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((DATA / family / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("family", "template", "expect", "warns"), [
    ("deepseek_dsml", None, "deepseek_dsml", False),  # V3.2 / V4: no template, the DSML token says it
    ("hermes", "{{ messages[0].content }}", "hermes", False),  # no tools in the template: the gateway's own prompt
    ("hermes", "{{ tools | tojson }}{{ messages[0].content }}", "hermes", True),  # tools rendered, format unknown
])
def test_auto_warns_when_it_can_only_guess(tmp_path: Path, caplog: pytest.LogCaptureFixture, family: str,
                                           template: str | None, expect: str, warns: bool) -> None:
    from openai_api.config import LLMModel
    from openai_api.services.registry import resolve_parsers
    from openai_api.text.templates import ChatTemplate
    from openai_api.text.tokenizer import TextTokenizer

    folder = _model_folder(tmp_path, family, template)
    tok = TextTokenizer.from_folder(folder)
    if family == "hermes":  # Qwen's <tool_call> tokens would name hermes themselves: a tokenizer without them
        tok.added_tokens = [t for t in tok.added_tokens if "tool" not in t]
    model = LLMModel(name="m", url="127.0.0.1:1", path=folder)
    with caplog.at_level("INFO", logger="openai_api.services.registry"):
        tool, *_ = resolve_parsers(model, tok, ChatTemplate.from_tokenizer_dir(folder))
    assert tool == expect
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warns:
        [message] = warnings
        assert f"guess {expect!r}" in message and '"tool_parser"' in message and "deepseek_dsml" in message
    else:
        assert not warnings, warnings


def test_auto_picks_the_reasoning_of_templates_that_think() -> None:
    assert detect_reasoning("{{ '<think>\\n' }}", "hermes") == "qwen3"
    assert detect_reasoning("[THINK]", "mistral") == "mistral"
    assert detect_reasoning("anything", "harmony") == "harmony"
    assert detect_reasoning("{{ messages }}", "hermes") is None


def test_a_prompt_that_opens_the_thinking_section_starts_the_output_inside_it() -> None:
    r = REASONING["qwen3"]
    assert r.starts_inside("<|im_start|>assistant\n<think>\n")
    assert not r.starts_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking turned off
    assert not r.starts_inside("<|im_start|>assistant\n")
    parser = make_parser("hermes", "qwen3", tools_active=False, prompt="<|im_start|>assistant\n<think>\n")
    assert parser is not None
    pieces = parser.push("I should greet.\n</think>\n\nHello!") + parser.finish()
    assert summary(pieces)["reasoning_content"] == "I should greet." and summary(pieces)["content"] == "Hello!"


def test_a_call_to_a_function_not_offered_is_content() -> None:
    parser = make_parser("mistral", None, tools_active=True, ctx=ToolContext(frozenset({"get_weather"})),
                         control={"[TOOL_CALLS]", "[ARGS]"})
    assert parser is not None
    got = summary(parser.push('[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}') + parser.finish())
    assert got["tool_calls"] == [] and got["content"] == 'rm_rf{"path": "/"}'  # no control token in content


def test_pythonic_calls_are_parsed_never_evaluated() -> None:
    parser = make_parser("pythonic", None, tools_active=True)
    assert parser is not None
    got = summary(parser.push('[f(a=__import__("os").system("true"))]') + parser.finish())
    assert got["tool_calls"] == [] and got["content"] == '[f(a=__import__("os").system("true"))]'
    deep = "[f(a=" + "[" * 5000 + "]" * 5000 + ")]"
    parser = make_parser("pythonic", None, tools_active=True)
    assert parser is not None
    assert summary(parser.push(deep) + parser.finish())["tool_calls"] == []  # too deep: content, no crash


def test_the_registry_holds_exactly_the_names_the_config_takes() -> None:
    """A name the config validates and the registry lacks would pass start-up and fail per request."""
    assert sorted(FAMILIES) == sorted(TOOL_PARSER_NAMES)
    assert all(name == fmt.name for name, fmt in FAMILIES.items())
    assert set(REASONING) | {"harmony"} == set(REASONING_PARSER_NAMES)


def test_every_family_has_markers_the_detokenizer_keeps() -> None:
    for name, fmt in FAMILIES.items():
        if name != "pythonic":
            assert fmt.markers, name
    assert set(keep_markers("harmony", "harmony")) == set(HARMONY_MARKERS)
    assert "[THINK]" in keep_markers("mistral", "mistral")
