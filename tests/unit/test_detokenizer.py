"""IncrementalDetokenizer over SmolLM2's byte-level BPE: exact text, never a half character."""

from __future__ import annotations

import random

import pytest

from openai_api.text.detokenizer import IncrementalDetokenizer
from openai_api.text.tokenizer import TextTokenizer
from tests.helpers import MODELS, missing_models

SMOLLM2_DIR = MODELS / "smollm2-135m-instruct"

if reason := missing_models(SMOLLM2_DIR.name):
    pytest.skip(reason, allow_module_level=True)

REPLACEMENT = "\ufffd"

SAMPLES = [
    "Hello, world!",
    " leading space and trailing space ",
    "héllo café naïve Ærøskøbing",
    "😀",
    "Emoji 😀🎉🚀 in a row",
    "family: 👨\u200d👩\u200d👧 and flags 🇫🇷🇯🇵",
    "世界你好\uff0c这是一个测试。",
    "日本語のテキストと한국어",
    "mixed: abc 世界 😀 é ß ∑ → ✓",
    "tabs\tand\nnewlines\n\n  indented",
    "code: def f(x):\n    return x ** 2  # ok",
    "numbers 1234567890 3.14159",
    "Ünïcödé ÅÄÖ ñ ç Ω ж ע ع",
    "   ",
    "a",
]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer.from_folder(SMOLLM2_DIR)


def stream(tok: TextTokenizer, ids: list[int], prefix_ids: list[int] | None = None) -> list[str]:
    d = IncrementalDetokenizer(tok.tokenizer, prefix_ids=prefix_ids)
    return [d.step(i) for i in ids]


def _splits_multibyte_chars(tok: TextTokenizer, ids: list[int]) -> bool:
    """True when at least one token ends inside a UTF-8 character (the case this module is about)."""
    return any(tok.decode([i]).endswith(REPLACEMENT) for i in ids)


@pytest.mark.parametrize("text", ["😀", "世界", "é" * 3 + "😀🎉", "👨\u200d👩\u200d👧"])
def test_multibyte_char_split_across_tokens_is_reassembled_exactly(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert _splits_multibyte_chars(tok, ids) or len(ids) == 1
    pieces = stream(tok, ids)
    assert "".join(pieces) == text
    assert all(REPLACEMENT not in p for p in pieces)


def test_emoji_split_over_several_tokens_yields_nothing_until_complete(tok: TextTokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1, "the emoji should span several byte-level tokens"
    pieces = stream(tok, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "😀"


@pytest.mark.parametrize("text", SAMPLES)
def test_concatenated_steps_equal_decoding_all_ids(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert "".join(pieces) == text
    assert all(REPLACEMENT not in p for p in pieces)


@pytest.mark.parametrize("seed", range(10))
def test_random_mixed_text_streams_exactly(tok: TextTokenizer, seed: int) -> None:
    rng = random.Random(seed)
    alphabet = list("abcxyz ABC,.!?\n\t0123") + list("éüßøñç") + list("世界你好日本語") + ["😀", "🎉", "🚀", "👍🏽"]
    for _ in range(20):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        ids = tok.encode(text)
        pieces = stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == text, text
        assert all(REPLACEMENT not in p for p in pieces), text


def test_steps_batch_equals_single_steps(tok: TextTokenizer) -> None:
    ids = tok.encode("mixed: abc 世界 😀 é")
    d = IncrementalDetokenizer(tok.tokenizer)
    batched = d.steps(ids[:3]) + d.steps(ids[3:7]) + d.steps([]) + d.steps(ids[7:])
    assert batched == "".join(stream(tok, ids))


@pytest.mark.parametrize("text", ["and then 🦊🦊 runs 東京 quickly", "family: 👨\u200d👩\u200d👧 ok"])
def test_multi_token_steps_hold_back_a_split_character_like_single_steps(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    want = "".join(stream(tok, ids))
    for cut1 in range(len(ids) + 1):
        for cut2 in range(cut1, len(ids) + 1):
            d = IncrementalDetokenizer(tok.tokenizer)
            parts = [d.steps(ids[:cut1]), d.steps(ids[cut1:cut2]), d.steps(ids[cut2:])]
            assert "".join(parts) == want, (cut1, cut2)
            assert all(REPLACEMENT not in p for p in parts)


def test_special_tokens_are_skipped(tok: TextTokenizer) -> None:
    im_end = tok.tokenizer.token_to_id("<|im_end|>")
    im_start = tok.tokenizer.token_to_id("<|im_start|>")
    assert im_end is not None and im_start is not None
    ids = [*tok.encode("Hi there"), im_end, im_start, *tok.encode(" 😀")]
    text = "".join(stream(tok, ids))
    assert text == "Hi there 😀"
    assert "<|im" not in text


def test_special_tokens_are_kept_when_asked(tok: TextTokenizer) -> None:
    im_end = tok.tokenizer.token_to_id("<|im_end|>")
    d = IncrementalDetokenizer(tok.tokenizer, skip_special_tokens=False)
    assert d.steps([*tok.encode("Hi"), im_end]) == "Hi<|im_end|>"


@pytest.mark.parametrize("prompt", [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "A prompt that ends in a word",
    "Ends with emoji 😀",
    "世界世界世界世界世界",
    "😀😀😀😀😀😀",  # the 8-id priming window starts in the middle of a character
])
@pytest.mark.parametrize("completion", [" world", "world 😀 ok", "界 and more", "\n\n- item", "é"])
def test_prefix_priming_does_not_change_output_for_byte_level_bpe(tok: TextTokenizer, prompt: str,
                                                                  completion: str) -> None:
    prompt_ids = tok.encode(prompt)
    ids = tok.encode(completion)
    primed = "".join(stream(tok, ids, prefix_ids=prompt_ids))
    unprimed = "".join(stream(tok, ids))
    assert primed == unprimed == completion


def test_text_with_a_lone_surrogate_is_refused_as_a_client_error(tok: TextTokenizer) -> None:
    from openai_api.errors import InvalidRequestError

    for call in (lambda: tok.encode("a\ud800b"), lambda: tok.encode_batch(["ok", "a\udfffb"])):
        with pytest.raises(InvalidRequestError) as e:
            call()
        assert e.value.status == 400 and e.value.code == "invalid_unicode"


@pytest.mark.parametrize("text", ["Hello world 🌶 and more", "你好世界 and more", "Hello 世界, 😀😀 ok",
                                  "日本語のテキストと한국어 ok"])
@pytest.mark.parametrize("batched", [False, True])
def test_a_prompt_cut_mid_character_never_leaks_into_the_output(tok: TextTokenizer, text: str,
                                                                 batched: bool) -> None:
    """A token-array prompt may end inside a UTF-8 character (vLLM #48853: a stream primed with it emitted the
    whole primed window's text with the first output). At every such cut the output is the whole text less
    the prompt's whole characters, as the tokenizer decodes both: the character the output completes is
    the output's; and where the output does not complete it, a U+FFFD stands for the broken bytes."""
    ids = tok.encode(text)
    cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith(REPLACEMENT)]
    assert cuts, "the sample must split a character across tokens"
    for k in cuts:
        prompt_text = tok.decode(ids[:k]).rstrip(REPLACEMENT)
        for output in (ids[k:], tok.encode(" next"), ids[k:k + 1]):  # completes it, does not, half of it
            d = IncrementalDetokenizer(tok.tokenizer, prefix_ids=ids[:k])
            out = (d.steps(output) if batched else "".join(d.step(i) for i in output)) + d.finish()
            assert out == tok.decode(ids[:k] + output)[len(prompt_text):], (k, output, out)



@pytest.mark.parametrize("text", ["Plants 🌱🌱🌱 grow", "日本語のテキストと한국어", "family: 👨\u200d👩\u200d👧 ok",
                                  "plain ascii"])
def test_an_answer_cut_anywhere_is_never_lost_and_ends_as_a_whole_decode(tok: TextTokenizer, text: str) -> None:
    """max_tokens may cut the ids inside a character. Stepped one by one or as one batch (a non-streamed
    answer: the stream then holds back every id, not just the cut character), the text plus `finish()` is
    what the tokenizer decodes from the same ids: U+FFFD for the cut character, nothing lost."""
    ids = tok.encode(text)
    for k in range(1, len(ids) + 1):
        d = IncrementalDetokenizer(tok.tokenizer)
        assert d.steps(ids[:k]) + d.finish() == tok.decode(ids[:k]), k
        d = IncrementalDetokenizer(tok.tokenizer)
        assert "".join(d.step(i) for i in ids[:k]) + d.finish() == tok.decode(ids[:k]), k
        assert d.finish() == "", k  # given out once
