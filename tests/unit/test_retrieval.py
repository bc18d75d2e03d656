"""Retrieval dialects without a server: truncation spellings, the cut of an over-long sequence, and the
tokenizer bound that keeps a huge text's end exactly (what `truncate: START` relies on)."""

from __future__ import annotations

import random

import pytest

from openai_api.errors import InvalidRequestError
from openai_api.services.embeddings import _cut, input_type
from openai_api.services.encoding import nim_truncation, tei_truncation
from openai_api.text.tokenizer import BOUND_WINDOW_CHARS, TextTokenizer
from tests.helpers import MODELS, requires_models

EMB = "all-minilm-l6-v2"


@pytest.mark.parametrize(("value", "mode"), [(None, None), ("NONE", "none"), ("start", "start"), (" End ", "end"),
                                             (True, "end"), (False, "none")])
def test_nim_truncate_spellings(value: str | bool | None, mode: str | None) -> None:
    assert nim_truncation(value) == mode


def test_an_unknown_truncate_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequestError) as e:
        nim_truncation("MIDDLE")
    assert e.value.param == "truncate"


@pytest.mark.parametrize(("truncate", "direction", "default", "mode"), [
    (None, None, False, "none"), (None, None, True, "end"), (True, None, False, "end"), (True, "Left", False, "start"),
    (True, "right", False, "end"), (False, "left", True, "none"), (None, "LEFT", True, "start"),
])
def test_tei_truncation(truncate: bool | None, direction: str | None, default: bool, mode: str) -> None:
    assert tei_truncation(truncate, direction, default) == mode


def test_input_type_spellings() -> None:
    assert [input_type(v) for v in (None, "query", "PASSAGE", "document")] == [None, "query", "passage", "passage"]
    with pytest.raises(InvalidRequestError) as e:
        input_type("search_query")
    assert e.value.param == "input_type"


def test_cut_keeps_the_special_tokens_and_the_instruction() -> None:
    seq = [101, 7, 8, *range(20, 40), 102]  # [CLS], a two-token instruction, 20 tokens, [SEP]
    assert _cut(seq, 10, "end", 3, 1) == [101, 7, 8, 20, 21, 22, 23, 24, 25, 102]
    start = _cut(seq, 10, "start", 3, 1)
    assert start == [101, 7, 8, 34, 35, 36, 37, 38, 39, 102] and len(start) == 10


@requires_models(EMB)
@pytest.mark.parametrize("from_end", [False, True])
def test_bound_gives_exactly_the_first_or_last_tokens_of_a_huge_text(from_end: bool) -> None:
    tok = TextTokenizer.from_folder(MODELS / EMB)
    rng = random.Random(7)
    words = ["alpha", "beta,", "gamma\n", "délta", "ε.", "超长", "x" * 30, "(paren)"]
    text = " ".join(rng.choice(words) for _ in range(20000))
    assert len(text) > 8 * BOUND_WINDOW_CHARS
    part, over = tok.bound(text, 256, from_end=from_end)
    assert over and len(part) < len(text) // 4
    assert (text.endswith(part) if from_end else text.startswith(part))
    whole, ids = tok.encode(text), tok.encode(part)
    assert (ids[-256:] == whole[-256:]) if from_end else (ids[:256] == whole[:256])
    short = "a short text"
    assert tok.bound(short, 256, from_end=from_end) == (short, False)
