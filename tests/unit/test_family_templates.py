"""Every vendored model-family chat template renders through the gateway exactly as transformers renders it.

The templates are the models' own (tests/data/families/<family>/, each with its SOURCE.md); the tokenizers
are built offline from installable packages by `openai_api.embedded.families` (idempotent, seconds once
built). The gateway side is the chat service's own `template_messages` (the OpenAI request's messages as
the template reads them) through `ChatTemplate.render`, with bos/eos as the gateway's tokenizer reads them.
The oracle is transformers: `PreTrainedTokenizerFast.apply_chat_template` on the built tokenizer folder,
given the messages a transformers user writes (arguments as dicts, content parts as lists), or, for the two
families whose tokenizer no package ships (kimi_k2, glm45), transformers' own renderer
`render_jinja_template` with the config's bos/eos. Reference conventions, by template:

- arguments: a dict, except for a template that concatenates them with strings (DeepSeek-V3.1), which fails
  on a dict under transformers too: there the user passes the JSON string.
- content parts: the list as sent for a template that loops over parts; any other template cannot print a
  list, so its reference is the text joined (vLLM's "string" content format).
- an assistant turn with only tool calls: content "" (OpenAI clients send null; vLLM passes "", and
  transformers 5 drops a None field, which DeepSeek-V3.1's and Qwen3's templates then fail on).
- A conversation the template refuses under transformers (Llama 3.1 allows one call per turn) must be
  refused by the gateway too, and the pair is skipped with that reason.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from openai_api.embedded.families import DATA_DIR, has_tokenizer, prepare_families
from openai_api.schemas.openai import ChatMessage
from openai_api.services.chat import template_messages
from openai_api.text.templates import ChatTemplate, TemplateError
from openai_api.text.tokenizer import TextTokenizer

transformers = pytest.importorskip("transformers")

TEMPLATES = sorted(DATA_DIR.glob("*/*.jinja"))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    # As an OpenAI client sends an earlier call back: arguments as the JSON string the gateway returned. The
    # ids are 9 alphanumerics, which Mistral's template insists on (and every other template accepts).
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "system_user": ([{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "What is the capital of France?"}], None),
    "tools_offered": ([{"role": "system", "content": "You can call tools."},
                       {"role": "user", "content": "Weather in Paris?"}], [WEATHER, TIME]),
    "call_result_turn": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("wx7Kp2Qa9", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "wx7Kp2Qa9", "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"},
        {"role": "user", "content": "And should I take a coat?"}], [WEATHER]),
    "parallel_calls": ([
        {"role": "user", "content": "Weather in Paris and the time in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            _call("wx7Kp2Qa9", "get_weather", {"city": "Paris", "unit": "celsius"}),
            _call("tm3Rz8Lb1", "get_time", {"zone": "Asia/Tokyo"})]},
        {"role": "tool", "tool_call_id": "wx7Kp2Qa9", "content": "21 C, clear"},
        {"role": "tool", "tool_call_id": "tm3Rz8Lb1", "content": "18:04"}], [WEATHER, TIME]),
    "unicode": ([
        {"role": "user", "content": "Wetter in Zürich? 東京の天気は？ 🌤️"},  # noqa: RUF001
        {"role": "assistant", "content": None,
         "tool_calls": [_call("uc5Nq4Ze6", "get_weather", {"city": "Zürich — 東京", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "uc5Nq4Ze6", "content": "Sonnig ☀️, 21 °C"}], [WEATHER]),
    "reasoning_history": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "The user wants the weather; call the tool.",
         "tool_calls": [_call("wx7Kp2Qa9", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "wx7Kp2Qa9", "content": "21 C, clear"}], [WEATHER]),
    "content_parts": ([
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "Paris."}]}],
        None),
}


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return prepare_families()


@functools.cache
def _hf_tokenizer(folder: Path) -> Any:
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


@functools.cache
def _gateway_tokenizer(folder: Path) -> TextTokenizer:
    return TextTokenizer.from_folder(folder)


def _family(template: Path) -> str:
    return template.parent.name


def _reference_messages(messages: list[dict[str, Any]], tmpl: ChatTemplate, args_as_text: bool) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for tc in m.get("tool_calls") or []:
            if not args_as_text:
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""  # transformers drops a None field, which some templates cannot render (see above)
        if isinstance(m.get("content"), list) and not tmpl.content_as_parts:
            m["content"] = "".join(p["text"] for p in m["content"])
        out.append(m)
    return out


# The templates that need the arguments string (they concatenate it); every other reference gets a dict.
NEEDS_TEXT = {"deepseek_v31/chat_template.jinja"}


def _key(template: Path) -> str:
    return f"{template.parent.name}/{template.name}"


def _reference(template: Path, folder: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               **kwargs: Any) -> str:
    source = template.read_text(encoding="utf-8")
    if has_tokenizer(_family(template)):
        out = _hf_tokenizer(folder).apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                      add_generation_prompt=True, **kwargs)
        assert isinstance(out, str)
        return out
    from transformers.utils.chat_template_utils import render_jinja_template

    cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)}
    out = render_jinja_template(conversations=[messages], tools=list(tools or []) or None, chat_template=source,
                                add_generation_prompt=True, **special, **kwargs)
    rendered = out[0] if isinstance(out, tuple) else out  # (renders, generation indices) in transformers 5
    return str(rendered[0] if isinstance(rendered, list) else rendered)


def _gateway(template: Path, folder: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             **kwargs: Any) -> str:
    tmpl = ChatTemplate.from_file(template)
    if has_tokenizer(_family(template)):
        tok = _gateway_tokenizer(folder)
        bos, eos = tok.bos_token, tok.eos_token
    else:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        bos, eos = cfg.get("bos_token") or "", cfg.get("eos_token") or ""
    msgs = template_messages([ChatMessage.model_validate(m) for m in messages], tmpl)
    return tmpl.render(msgs, tools=tools if tmpl.uses_tools else None, bos_token=bos, eos_token=eos,
                       add_generation_prompt=True, **kwargs)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("template", TEMPLATES, ids=_key)
def test_gateway_render_equals_transformers(folders: dict[str, Path], template: Path, conversation: str) -> None:
    folder = folders[_family(template)]
    messages, tools = CONVERSATIONS[conversation]
    tmpl = ChatTemplate.from_file(template)
    reference_msgs = _reference_messages(messages, tmpl, _key(template) in NEEDS_TEXT)
    ref_tools = tools if tmpl.uses_tools else None
    try:
        expected = _reference(template, folder, reference_msgs, ref_tools)
    except Exception as exc:  # noqa: BLE001  (the template refuses the conversation: raise_exception, a type error)
        with pytest.raises(TemplateError):
            _gateway(template, folder, messages, tools)
        pytest.skip(f"{_key(template)} cannot render {conversation!r} under transformers either: {exc}")
    assert _gateway(template, folder, messages, tools) == expected


def test_arguments_reach_each_template_in_the_shape_it_reads() -> None:
    # By each template's source: Qwen3 tests `arguments is string` (kept: printed as the model wrote it);
    # DeepSeek-V3.1 concatenates it (a string is all it can take); the others apply tojson / items to it.
    shapes = {_key(t): ChatTemplate.from_file(t).arguments_as_text for t in TEMPLATES}
    assert shapes == {
        "deepseek_v31/chat_template.jinja": True, "glm45/chat_template.jinja": False,
        "harmony/chat_template.jinja": False, "hermes/chat_template.jinja": True,
        "kimi_k2/chat_template.jinja": False, "llama3_json/chat_template.jinja": False,
        "llama3_json/tool_chat_template_llama3.1_json.jinja": False, "llama4/chat_template.jinja": False,
        "mistral/chat_template.jinja": False,
        "qwen3_xml/chat_template.jinja": False}


def test_llama31_reads_an_earlier_call_once_encoded() -> None:
    # Issue 19's bug: with the string, `tojson` wrote `"parameters": "{\"city\": ...}"`.
    template = DATA_DIR / "llama3_json" / "tool_chat_template_llama3.1_json.jinja"
    tmpl = ChatTemplate.from_file(template)
    messages, tools = CONVERSATIONS["call_result_turn"]
    out = tmpl.render(template_messages([ChatMessage.model_validate(m) for m in messages], tmpl), tools=tools)
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in out
    assert '\\"city\\"' not in out


def test_harmony_gets_reasoning_effort_and_builtin_tools(folders: dict[str, Path]) -> None:
    template = DATA_DIR / "harmony" / "chat_template.jinja"
    messages, tools = CONVERSATIONS["tools_offered"]
    kwargs = {"reasoning_effort": "high", "builtin_tools": ["browser"]}
    out = _gateway(template, folders["harmony"], messages, tools, **kwargs)
    assert "Reasoning: high" in out
    assert out == _reference(template, folders["harmony"], messages, tools, **kwargs)


def test_not_json_arguments_are_a_clear_400() -> None:
    from openai_api.errors import InvalidRequestError

    tmpl = ChatTemplate.from_file(DATA_DIR / "llama3_json" / "chat_template.jinja")
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]
    with pytest.raises(InvalidRequestError) as err:
        template_messages([ChatMessage.model_validate(m) for m in bad], tmpl)
    assert err.value.param == "messages[1].tool_calls[0].function.arguments"
