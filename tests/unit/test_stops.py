"""StopStringMatcher: stop strings never leak, not even partly, whatever the token boundaries."""

from __future__ import annotations

import itertools
import random

import pytest

from openai_api.text.stops import StopStringMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, StopStringMatcher]:
    """Push every piece, flush at the end, and return everything the matcher released."""
    m = StopStringMatcher(stops)
    out = "".join(m.push(p) for p in pieces) + m.flush()
    return out, m


def test_stop_string_split_across_two_pushes_never_leaks() -> None:
    m = StopStringMatcher(["<|im_end|>"])
    first = m.push("Hello<|im")
    assert first == "Hello"
    assert not m.stopped
    second = m.push("_end|> and more")
    assert second == ""
    assert m.stopped
    assert m.matched == "<|im_end|>"
    assert m.flush() == ""


def test_stop_string_pushed_one_char_at_a_time_never_leaks() -> None:
    stop = "<|im_end|>"
    m = StopStringMatcher([stop])
    released = [m.push(c) for c in "ab" + stop + "cd"]
    released.append(m.flush())
    text = "".join(released)
    assert text == "ab"
    for piece in released:
        assert "<" not in piece and "|" not in piece
    assert m.stopped


def test_text_before_the_stop_is_emitted() -> None:
    out, m = run(["STOP"], ["The answer is 4.", " STOP", " ignored"])
    assert out == "The answer is 4. "
    assert m.stopped and m.matched == "STOP"


def test_stop_in_the_middle_of_one_push_cuts_there() -> None:
    m = StopStringMatcher(["\n\n"])
    assert m.push("line one\n\nline two") == "line one"
    assert m.stopped


def test_earliest_of_several_stops_wins() -> None:
    out, m = run(["world", "lo"], ["hello world"])
    assert out == "hel"
    assert m.matched == "lo"


def test_the_stop_that_completes_first_wins_whatever_the_chunking() -> None:
    # "bc" is complete before "abcd" is, so generation stops there, however the text was chunked:
    # the cut must not depend on how many tokens Triton put in each response.
    for pieces in (["xabcd"], ["xab", "cd"], ["xab", "c", "d"], list("xabcd")):
        out, m = run(["abcd", "bc"], pieces)
        assert out == "xa", pieces
        assert m.matched == "bc"


def test_stops_completing_together_cut_at_the_one_that_starts_first() -> None:
    out, m = run(["cde", "abcde"], ["xabcde"])
    assert out == "x"
    assert m.matched == "abcde"


def test_partial_match_that_is_not_a_stop_is_released_by_a_later_push() -> None:
    m = StopStringMatcher(["<|im_end|>"])
    assert m.push("a <|i") == "a "
    assert m.push("s here") == "<|is here"
    assert not m.stopped


def test_partial_match_at_the_end_is_released_by_flush() -> None:
    m = StopStringMatcher(["<|im_end|>"])
    assert m.push("tail <|im_e") == "tail "
    assert m.flush() == "<|im_e"
    assert m.flush() == ""
    assert not m.stopped


def test_no_stops_passes_text_through_unchanged() -> None:
    m = StopStringMatcher([])
    for piece in ["<|im", "_end|>", "", "x"]:
        assert m.push(piece) == piece
    assert m.flush() == ""
    assert not m.stopped


def test_empty_stop_strings_are_ignored() -> None:
    out, m = run(["", ""], ["abc"])
    assert out == "abc"
    assert not m.stopped


def test_after_stopping_every_push_and_flush_returns_empty() -> None:
    m = StopStringMatcher(["END"])
    assert m.push("xEND") == "x"
    assert m.push("more text") == ""
    assert m.push("END") == ""
    assert m.flush() == ""
    assert m.stopped


def test_stop_that_is_a_prefix_of_another_stop() -> None:
    # The shorter stop matches as soon as it is complete; the longer one is not waited for.
    m = StopStringMatcher(["ab", "abc"])
    assert m.push("xa") == "x"
    assert m.push("b") == ""
    assert m.stopped
    # Held text that could still become the longer stop is kept back until decided.
    m = StopStringMatcher(["abc", "abd"])
    assert m.push("zab") == "z"
    assert m.push("e") == "abe"
    assert not m.stopped


def test_repeated_prefix_chars_before_the_stop_are_released() -> None:
    # "<<" then "<|im_end|>": only the tail that can still start the stop is held.
    out, _ = run(["<|im_end|>"], ["<", "<", "<|", "im_end|>"])
    assert out == "<<"


def _random_splits(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(0, len(text) - 1))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    # Empty pushes happen (a token that completes no character) and must change nothing.
    for _ in range(rng.randint(0, 2)):
        pieces.insert(rng.randint(0, len(pieces)), "")
    return pieces


@pytest.mark.parametrize("seed", range(20))
def test_emitted_text_is_the_text_before_the_first_stop_whatever_the_split(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab<|>_é世😀 "
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.5 and text:
            # A stop taken from the text itself, so matches are common.
            a = rng.randrange(len(text))
            stop = text[a:a + rng.randint(1, 5)]
        else:
            stop = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        expected = text[: text.find(stop)] if stop in text else text
        pieces = _random_splits(rng, text)
        out, m = run([stop], pieces)
        assert out == expected, (text, stop, pieces)
        assert m.stopped == (stop in text)


def _first_completed_stop_start(text: str, stops: list[str]) -> int | None:
    """Reference semantics: scan the text as it grows; the first prefix that contains a stop ends it."""
    for end in range(1, len(text) + 1):
        hits = [end - len(s) for s in stops if s and text[:end].endswith(s)]
        if hits:
            return min(hits)
    return None


@pytest.mark.parametrize("seed", range(5))
def test_several_stops_cut_where_the_first_stop_completes_whatever_the_split(seed: int) -> None:
    rng = random.Random(1000 + seed)
    alphabet = "abc<|>"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        cut = _first_completed_stop_start(text, stops)
        expected = text if cut is None else text[:cut]
        pieces = _random_splits(rng, text)
        out, m = run(stops, pieces)
        assert out == expected, (text, stops, pieces)
        assert m.stopped == (cut is not None)
