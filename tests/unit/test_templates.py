"""Chat templates: exact renderings, HF parity, tools, continue_final_message and the sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openai_api.config import BUNDLED_TEMPLATES
from openai_api.text.sandbox import plain
from openai_api.text.templates import ChatTemplate, RenderLimits, TemplateBudgetError, TemplateError
from tests.helpers import MODELS, requires_models

TEMPLATES = BUNDLED_TEMPLATES
SMOLLM2_DIR = MODELS / "smollm2-135m-instruct"

# Verbatim copy of HuggingFaceTB/SmolLM2-135M-Instruct's chat_template.jinja, so the parity test runs
# even where the (git-ignored) model folder is absent; test_smollm2_reference_copy_is_verbatim keeps it
# honest.
SMOLLM2_REFERENCE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]

TOOLS: list[dict[str, Any]] = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]

TOOL_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


def load(name: str) -> ChatTemplate:
    return ChatTemplate.from_file(TEMPLATES / f"{name}.jinja")


# --- one exact rendering per template -------------------------------------------------------------

def test_chatml_render() -> None:
    assert load("chatml").render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_without_generation_prompt_or_system() -> None:
    assert load("chatml").render([{"role": "user", "content": "Hi"}], add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_smollm2_render() -> None:
    assert load("smollm2").render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_injects_default_system_prompt() -> None:
    assert load("smollm2").render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_render() -> None:
    out = load("llama3").render(CONVERSATION, bos_token="<|begin_of_text|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_mistral_render() -> None:
    out = load("mistral").render(CONVERSATION, bos_token="<s>", eos_token="</s>")
    assert out == "<s> [INST] You are terse.\n\nHi [/INST] Hello!</s> [INST] 2+2? [/INST]"


# ChatGLM2 labels turns "question"/"answer" in Chinese, each followed by a full-width colon.
ASK = "\u95ee\uff1a"
ANSWER = "\u7b54\uff1a"


def test_chatglm2_render() -> None:
    assert load("chatglm2").render(CONVERSATION) == (
        f"[Round 1]\n\n{ASK}You are terse.\n\nHi\n\n{ANSWER}Hello!\n\n"
        f"[Round 2]\n\n{ASK}2+2?\n\n{ANSWER}"
    )


def test_chatglm2_rounds_without_system() -> None:
    out = load("chatglm2").render(CONVERSATION[1:])
    assert out == f"[Round 1]\n\n{ASK}Hi\n\n{ANSWER}Hello!\n\n[Round 2]\n\n{ASK}2+2?\n\n{ANSWER}"


def test_chatglm3_render() -> None:
    assert load("chatglm3").render(CONVERSATION) == (
        "[gMASK]sop<|system|>\n You are terse.<|user|>\n Hi<|assistant|>\n Hello!<|user|>\n 2+2?<|assistant|>"
    )


# --- SmolLM2 parity with the model's own template -----------------------------------------------

PARITY_CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    CONVERSATION,
    CONVERSATION[1:],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaced \n\n text  "}],
    [{"role": "user", "content": "héllo 👋 <b>&amp;</b> {{ not jinja }}"},
     {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "tool", "content": "c"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "Go on\n"}],
]


@pytest.mark.parametrize("conversation", PARITY_CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_matches_model_template(conversation: list[dict[str, Any]],
                                        add_generation_prompt: bool) -> None:
    ours = load("smollm2").render(conversation, add_generation_prompt=add_generation_prompt)
    reference = ChatTemplate.from_string(SMOLLM2_REFERENCE).render(
        conversation, add_generation_prompt=add_generation_prompt)
    assert ours == reference


@pytest.mark.parametrize("conversation", PARITY_CONVERSATIONS)
def test_smollm2_matches_transformers(conversation: list[dict[str, Any]]) -> None:
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[conversation], chat_template=SMOLLM2_REFERENCE, add_generation_prompt=True)
    assert load("smollm2").render(conversation) == rendered[0]


@requires_models(SMOLLM2_DIR.name, files=["chat_template.jinja"])
def test_smollm2_reference_copy_is_verbatim() -> None:
    model_template = SMOLLM2_DIR / "chat_template.jinja"
    assert model_template.read_text(encoding="utf-8") == SMOLLM2_REFERENCE
    from_dir = ChatTemplate.from_tokenizer_dir(SMOLLM2_DIR)
    assert from_dir is not None
    for conversation in PARITY_CONVERSATIONS:
        assert from_dir.render(conversation) == load("smollm2").render(conversation)


def test_smollm2_tolerates_null_content_and_ignores_tools() -> None:
    template = load("smollm2")
    assert not template.uses_tools
    out = template.render(TOOL_CONVERSATION, tools=TOOLS)
    assert "<|im_start|>assistant\n<|im_end|>\n" in out
    assert "get_weather" not in out


# --- tools ------------------------------------------------------------------------------------------

def test_uses_tools() -> None:
    assert load("chatml").uses_tools
    assert load("llama3").uses_tools
    assert load("chatglm3").uses_tools
    assert not load("mistral").uses_tools
    assert not load("chatglm2").uses_tools
    assert not ChatTemplate.from_string("{# tools #}{{ messages | length }}").uses_tools


def test_chatml_tools() -> None:
    out = load("chatml").render(TOOL_CONVERSATION, tools=TOOLS)
    assert out == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOLS[0], ensure_ascii=False)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_chatml_tool_call_with_mapping_arguments_and_consecutive_tool_results() -> None:
    conversation = [
        {"role": "user", "content": "Two cities"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ]},
        {"role": "tool", "content": "cold"},
        {"role": "tool", "content": "warm"},
    ]
    out = load("chatml").render(conversation, tools=TOOLS)
    assert (
        "<|im_start|>assistant\nChecking."
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    ) in out
    # No system message given: the tools block is the whole system prompt.
    assert out.startswith("<|im_start|>system\n# Tools\n\n")


def test_llama3_tools() -> None:
    out = load("llama3").render(TOOL_CONVERSATION, tools=TOOLS, bos_token="<|begin_of_text|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper "
        "arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and '
        'its value}.Do not use variables.\n\n'
        + json.dumps(TOOLS[0], indent=4)
        + "\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 21}<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_tools_in_system_prompt() -> None:
    out = load("llama3").render(TOOL_CONVERSATION[:2], tools=TOOLS, tools_in_user_message=False,
                                date_string="01 Jan 2025")
    assert out.startswith(
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n"
        "You have access to the following functions. To call a function, please respond with JSON for a "
        "function call."
    )
    assert out.endswith(
        json.dumps(TOOLS[0], indent=4) + "\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_chatglm3_tools_and_observation() -> None:
    out = load("chatglm3").render(TOOL_CONVERSATION, tools=TOOLS)
    assert out == (
        "[gMASK]sop<|system|>\n Be brief.\n"
        + json.dumps([TOOLS[0]["function"]], indent=4, ensure_ascii=False)
        + "<|user|>\n Weather in Paris?"
        '<|assistant|>get_weather\n ```python\ntool_call(**{"city": "Paris"})\n```'
        '<|observation|>\n {"temp": 21}<|assistant|>'
    )


# --- continue_final_message ---------------------------------------------------------------------

def test_continue_final_message_chatml() -> None:
    conversation = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    out = load("chatml").render(conversation, continue_final_message=True)
    assert out == "<|im_start|>user\nCount<|im_end|>\n<|im_start|>assistant\n1, 2,"


def test_continue_final_message_keeps_trailing_space_when_template_does() -> None:
    conversation = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2, "}]
    assert load("smollm2").render(conversation, continue_final_message=True).endswith("assistant\n1, 2, ")


def test_continue_final_message_with_trimming_template() -> None:
    # Llama 3 trims content, so the prefill is trimmed too, exactly as transformers does.
    conversation = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2, "}]
    out = load("llama3").render(conversation, continue_final_message=True)
    assert out.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n1, 2,")


def test_continue_final_message_content_repeated_earlier() -> None:
    conversation = [
        {"role": "user", "content": "Say yes"}, {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "Again"}, {"role": "assistant", "content": "yes"},
    ]
    out = load("chatml").render(conversation, continue_final_message=True)
    assert out.endswith("<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\nyes")


def test_continue_final_message_does_not_mutate_input() -> None:
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    load("chatml").render(conversation, continue_final_message=True)
    assert conversation[-1]["content"] == "Hel"


def test_continue_final_message_requires_assistant() -> None:
    with pytest.raises(TemplateError, match="assistant"):
        load("chatml").render([{"role": "user", "content": "Hi"}], continue_final_message=True)
    with pytest.raises(TemplateError):
        load("chatml").render([], continue_final_message=True)


def test_continue_final_message_content_not_rendered() -> None:
    template = ChatTemplate.from_string("{% for m in messages %}{{ m.role }}{% endfor %}")
    with pytest.raises(TemplateError, match="final message"):
        template.render([{"role": "assistant", "content": "abc"}], continue_final_message=True)


# --- errors -----------------------------------------------------------------------------------------

def test_raise_exception_surfaces_as_template_error() -> None:
    template = ChatTemplate.from_string("{{ raise_exception('bad conversation: ' ~ (messages | length)) }}")
    with pytest.raises(TemplateError, match=r"^bad conversation: 1$"):
        template.render([{"role": "user", "content": "Hi"}])


def test_mistral_rejects_non_alternating_roles() -> None:
    with pytest.raises(TemplateError, match="must alternate"):
        load("mistral").render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(TemplateError, match="Only user and assistant roles"):
        load("mistral").render([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])


def test_chatglm2_rejects_non_alternating_roles() -> None:
    with pytest.raises(TemplateError, match="alternate"):
        load("chatglm2").render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}\n", encoding="utf-8")
    with pytest.raises(TemplateError) as info:
        ChatTemplate.from_file(bad)
    assert str(bad) in str(info.value)
    assert "line 2" in str(info.value)


def test_syntax_error_in_string() -> None:
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate.from_string("{% if %}")


def test_missing_file() -> None:
    with pytest.raises(TemplateError, match="cannot read"):
        ChatTemplate.from_file(Path("/nonexistent/template.jinja"))


def test_render_time_type_error_is_template_error() -> None:
    with pytest.raises(TemplateError, match="failed to render"):
        ChatTemplate.from_string("{{ 'a' + messages[0].content }}").render(
            [{"role": "user", "content": None}])


def test_tojson_does_not_html_escape() -> None:
    template = ChatTemplate.from_string("{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}")
    message = {"role": "user", "content": "<b>&'é"}
    assert template.render([message]) == (
        json.dumps(message, ensure_ascii=False) + "|" + json.dumps(message, ensure_ascii=False, indent=2))


def test_loop_controls_and_strftime_now() -> None:
    template = ChatTemplate.from_string(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
        "{{ strftime_now('%Y') | length }}")
    assert template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a4"


# --- tokenizer folders --------------------------------------------------------------------------

def test_from_tokenizer_dir_prefers_jinja_file(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("file", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}), encoding="utf-8")
    template = ChatTemplate.from_tokenizer_dir(tmp_path)
    assert template is not None
    assert template.render([]) == "file"


def test_from_tokenizer_dir_config_string_and_list(tmp_path: Path) -> None:
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "plain"}), encoding="utf-8")
    template = ChatTemplate.from_tokenizer_dir(tmp_path)
    assert template is not None
    assert template.render([]) == "plain"
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default"}]
    config.write_text(json.dumps({"chat_template": named}), encoding="utf-8")
    template = ChatTemplate.from_tokenizer_dir(tmp_path)
    assert template is not None
    assert template.render([]) == "default"


def test_from_tokenizer_dir_absent(tmp_path: Path) -> None:
    assert ChatTemplate.from_tokenizer_dir(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}), encoding="utf-8")
    assert ChatTemplate.from_tokenizer_dir(tmp_path) is None


# --- sandbox ----------------------------------------------------------------------------------------

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ raise_exception.__globals__['os'].getcwd() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.getcwd() }}",
    "{{ namespace.__init__.__globals__['os'].getcwd() }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ messages.append(1) }}",
    "{% set ns = namespace(_private=1) %}",
    "{{ obj.run() }}",
]

ATTRIBUTE_WALKS = [
    "{{ cycler.__init__.__globals__.os }}",
    "{{ self._TemplateReference__context }}",
    "{{ x.__class__ }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ messages.__class__.__init__.__globals__ }}",
]


class Evil:
    """Stands in for a rich object a caller might pass by mistake; the template must not reach it."""

    def run(self) -> str:
        raise AssertionError("template reached a caller object's method")


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_escapes_raise(source: str) -> None:
    template = ChatTemplate.from_string(source)
    with pytest.raises(TemplateError):
        template.render([{"role": "user", "content": "Hi"}], obj=Evil())


@pytest.mark.parametrize("source", ATTRIBUTE_WALKS)
def test_sandbox_attribute_walks_reach_nothing(source: str) -> None:
    try:
        out = ChatTemplate.from_string(source).render([{"role": "user", "content": "Hi"}], x="s")
    except TemplateError:
        return
    assert out == ""


LOOP_SOURCE = ("{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
               "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.depth }}/{{ loop.depth0 }}/"
               "{{ loop.previtem is defined }}/{{ loop.nextitem['role'] if not loop.last else '-' }};{% endfor %}")


def test_loop_variable_reads_as_jinja_defines_it() -> None:
    out = ChatTemplate.from_string(LOOP_SOURCE).render(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert out == ("1/0/3/2/True/False/3/1/0/False/assistant;2/1/2/1/False/False/3/1/0/True/user;"
                   "3/2/1/0/False/True/3/1/0/True/-;")


@pytest.mark.parametrize("source", ["{% for m in messages %}{{ loop._iterator }}{% endfor %}",
                                    "{% for m in messages %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
                                    "{% for m in messages %}{{ loop.cycle.__func__.__globals__ }}{% endfor %}"])
def test_loop_variable_internals_stay_out_of_reach(source: str) -> None:
    try:
        out = ChatTemplate.from_string(source).render([{"role": "user", "content": "Hi"}])
    except TemplateError:
        return
    assert out == ""


class Text(str):
    pass


def test_plain_copies_json_and_reduces_everything_else() -> None:
    inner = {"k": [1, 2.5, True, None, Text("sub")], Text("key"): {"deep": ["x"]}, "t": (1, "y")}
    value = [inner, {"role": "user", "content": "plain"}, Evil()]
    out = plain(value)
    assert out == [{"k": [1, 2.5, True, None, "sub"], "key": {"deep": ["x"]}, "t": [1, "y"]},
                   {"role": "user", "content": "plain"}, "<Evil>"]
    assert type(out[0]["k"][4]) is str and all(type(k) is str for k in out[0])
    assert out[0] is not inner and out[0]["k"] is not inner["k"] and out[1] is not value[1]


def test_sandbox_error_message_is_generic() -> None:
    with pytest.raises(TemplateError) as info:
        ChatTemplate.from_string("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    assert "forbidden" in str(info.value)
    assert "subclasses" not in str(info.value)


# --- render budget: a template (or what a client sends through it) cannot hang or bloat the gateway ------------

SMALL = RenderLimits(max_seconds=0.5, max_chars=100_000)
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source", [
    "{{ 'a' * 100000000 }}",
    "{{ messages[0]['content'] * 10000000 }}",
    "{{ [1, 2] * 100000000 }}",
    "{{ messages | tojson(indent=50000000) }}",
    "{{ 'x' | center(1000000000) }}",
    "{{ 'x'.ljust(1000000000) }}",
    "{{ '%099999999d' % 1 }}",
    "{{ '{:>99999999}'.format(1) }}",
    "{{ ('a\\n' * 1000) | indent(1000000) }}",
    "{{ 10 ** 100000000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% macro grow(s, n) %}{{ grow(s ~ s, n - 1) if n else s|length }}{% endmacro %}{{ grow('ab', 64) }}",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
])
def test_render_budget_refuses_oversized_values_before_allocating_them(source: str) -> None:
    with pytest.raises(TemplateBudgetError, match="render budget"):
        ChatTemplate(source).render(USER, limits=SMALL)


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(100000) %}{{ f(n) if n else '' }}{% endfor %}{% endmacro %}{{ f(1) }}",
])
def test_render_budget_ends_a_runaway_loop(source: str) -> None:
    import time

    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(USER, limits=SMALL)
    assert time.monotonic() - t0 < 30  # ended by the budget, not run out (10^10 steps): a hang bound, not speed


def test_render_budget_leaves_ordinary_templates_alone() -> None:
    big = [{"role": "user", "content": "x" * 50_000}, {"role": "assistant", "content": "ok"}]
    for name in ("chatml", "smollm2", "llama3", "mistral", "chatglm3"):
        out = ChatTemplate.from_file(TEMPLATES / f"{name}.jinja").render(big, limits=SMALL)
        assert "x" * 50_000 in out
    assert ChatTemplate("{{ messages | tojson(indent=4) }}").render(USER, limits=SMALL).startswith("[\n    {")


def test_bounded_templates_are_the_ones_whose_work_follows_their_input() -> None:
    assert ChatTemplate.from_file(TEMPLATES / "smollm2.jinja").bounded
    assert ChatTemplate.from_file(TEMPLATES / "chatml.jinja").bounded
    assert not ChatTemplate("{% for i in range(3) %}{% endfor %}").bounded
    assert not ChatTemplate("{{ 'a' * 3 }}").bounded
    assert not ChatTemplate("{% macro f() %}{% endmacro %}").bounded
    assert not ChatTemplate("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
                            "{% endfor %}{% endfor %}{% endfor %}").bounded


async def test_cpu_workers_interrupt_a_loop_no_hook_can_see() -> None:
    """An empty loop over data calls no sandbox hook; the worker's time budget stops it."""
    import time

    from openai_api.text.workers import CPUWorkers, JobTimeoutError

    tpl = ChatTemplate("{% for a in messages %}{% for b in messages %}{% for c in messages %}"
                       "{% endfor %}{% endfor %}{% endfor %}")
    many = [{"role": "user", "content": ""}] * 2000
    workers = CPUWorkers(1)
    try:
        t0 = time.monotonic()
        with pytest.raises(JobTimeoutError):
            await workers.run(tpl.render, many, budget_s=0.3)
        assert time.monotonic() - t0 < 30  # a hang bound (8e9 steps unbounded), not a speed target
        assert await workers.run(ChatTemplate("{{ messages[0].role }}").render, USER, budget_s=1) == "user"
    finally:
        workers.close()
