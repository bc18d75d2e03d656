"""Reasoning parsers on outputs recorded from DeepSeek-R1 (distill) and Qwen3, whole and streamed with the
text cut at every position: the tags never leak, and the streamed parts always add up to the whole."""

from __future__ import annotations

import pytest

from openai_api.text.families import REASONING, OutputParser, ReasoningParserName


class ReasoningSplitter:
    """The engine with no tool format: (reasoning, content) per push, as the old splitter returned them."""

    def __init__(self, name: ReasoningParserName) -> None:
        self.parser = OutputParser(None, REASONING[name])

    @staticmethod
    def _pair(pieces: list) -> tuple[str, str]:
        return ("".join(p.text for p in pieces if p.kind == "reasoning"),
                "".join(p.text for p in pieces if p.kind == "content"))

    def push(self, text: str) -> tuple[str, str]:
        return self._pair(self.parser.push(text))

    def finish(self) -> tuple[str, str]:
        return self._pair(self.parser.finish())

    def split(self, text: str) -> tuple[str, str]:
        r1, c1 = self.push(text)
        r2, c2 = self.finish()
        return r1 + r2, c1 + c2

    @property
    def reasoning_text(self) -> str:
        return self.parser.reasoning_text

    @property
    def thinking_chars(self) -> int:
        return self.parser.thinking_chars

# (parser, raw output, reasoning, content)
CASES: list[tuple[ReasoningParserName, str, str, str]] = [
    # DeepSeek-R1-Distill: the template's prompt ends with "<think>\n", so the output starts inside it.
    ("deepseek_r1", "Okay, so I need to add 2 and 2. That gives 4.\n</think>\n\nThe answer is **4**.",
     "Okay, so I need to add 2 and 2. That gives 4.\n", "The answer is **4**."),
    # ... and when the model writes the opening tag itself anyway.
    ("deepseek_r1", "<think>\nThe user says hello; I should greet back.\n</think>\n\nHello! How can I help?",
     "The user says hello; I should greet back.\n", "Hello! How can I help?"),
    # Cut by max_tokens before the section ended: all of it is reasoning.
    ("deepseek_r1", "Let me consider the problem carefully. First, the <b>tags</b> ",
     "Let me consider the problem carefully. First, the <b>tags</b> ", ""),
    # Qwen3 thinking mode.
    ("qwen3",
     "<think>\nThe capital of France... that is Paris, of course.\n</think>\n\nThe capital of France is Paris.",
     "The capital of France... that is Paris, of course.\n", "The capital of France is Paris."),
    # Qwen3 with thinking off: no section at all.
    ("qwen3", "The capital of France is Paris. A <think> tag in prose stays prose.",
     "", "The capital of France is Paris. A <think> tag in prose stays prose."),
    # Qwen3's empty section.
    ("qwen3", "<think>\n\n</think>\n\nParis.", "\n", "Paris."),
    # Unicode across the boundary.
    ("qwen3", "<think>\n思考中…\n</think>\n\n答案是 42 🎉", "思考中…\n", "答案是 42 🎉"),
]


@pytest.mark.parametrize(("name", "raw", "reasoning", "content"), CASES)
def test_whole_output(name: ReasoningParserName, raw: str, reasoning: str, content: str) -> None:
    assert ReasoningSplitter(name).split(raw) == (reasoning, content)


@pytest.mark.parametrize(("name", "raw", "reasoning", "content"), CASES)
def test_streamed_cut_at_every_position_adds_up_and_never_leaks_a_tag(name: ReasoningParserName, raw: str,
                                                                     reasoning: str, content: str) -> None:
    for cut in range(len(raw) + 1):
        for pieces in ([raw[:cut], raw[cut:]], [raw[:cut], raw[cut:cut + 3], raw[cut + 3:]]):
            s = ReasoningSplitter(name)
            r_parts, c_parts = [], []
            for p in pieces:
                r, c = s.push(p)
                r_parts.append(r)
                c_parts.append(c)
            r, c = s.finish()
            r_parts.append(r)
            c_parts.append(c)
            assert ("".join(r_parts), "".join(c_parts)) == (reasoning, content), (cut, pieces)
            assert "</think>" not in "".join(r_parts) + "".join(c_parts) or "</think>" in content
            assert s.reasoning_text == reasoning


def test_token_by_token_of_a_real_tokenizer() -> None:
    from tokenizers import Tokenizer

    from tests.helpers import MODELS
    tok = Tokenizer.from_file(str(MODELS / "smollm2-135m-instruct" / "tokenizer.json"))
    raw = CASES[3][1]
    s = ReasoningSplitter("qwen3")
    out = [s.push(tok.decode([i])) for i in tok.encode(raw).ids]
    out.append(s.finish())
    assert ("".join(r for r, _ in out), "".join(c for _, c in out)) == (CASES[3][2], CASES[3][3])


@pytest.mark.parametrize(("name", "raw", "reasoning", "content"), CASES)
def test_the_thinking_section_is_located_in_the_raw_output(name: ReasoningParserName, raw: str, reasoning: str,
                                                            content: str) -> None:
    """`thinking_chars` is where the section ends, tags included, however the output was cut."""
    end = raw.find("</think>")
    expected = end + len("</think>") if end != -1 else (len(raw) if reasoning or name == "deepseek_r1" else 0)
    if not reasoning and end == -1 and name == "deepseek_r1":
        expected = len(raw)
    for cut in range(len(raw) + 1):
        s = ReasoningSplitter(name)
        s.push(raw[:cut])
        s.push(raw[cut:])
        assert s.thinking_chars == expected, cut


def test_streamed_reasoning_tokens_are_the_tokens_of_the_section() -> None:
    """A stream counts each token where it falls: the thinking's tokens, its end tag's included."""
    from tokenizers import Tokenizer

    from openai_api.services.output import ChoiceOutput
    from openai_api.services.tools import ToolPlan
    from tests.helpers import MODELS
    tok = Tokenizer.from_file(str(MODELS / "smollm2-135m-instruct" / "tokenizer.json"))
    raw = "<think>\nLet me add: 2 + 2 is 4.\n</think>\n\nIt is 4."
    ids = tok.encode(raw).ids
    section = len(tok.encode(raw[: raw.index("</think>") + len("</think>")]).ids)
    out = ChoiceOutput(ToolPlan(), "qwen3")
    for n, i in enumerate(ids, 1):
        out.push(tok.decode([i]), last=n == len(ids), produced=n)
    assert out.reasoning_tokens == section
