"""Incremental detokenization: O(1) work per token, correct across multi-byte UTF-8 splits."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

_WINDOW = 8  # prompt ids the stream is primed with
_MAX_PENDING = 3  # a UTF-8 character is at most 4 bytes, so at most 3 of its bytes end an incomplete prompt


def _incomplete_tail(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool) -> tuple[int, str]:
    """`(pending, held)`: how many of `ids`' last tokens hold only the start of a UTF-8 character, and the whole
    characters those tokens hold before it (a space, a CJK character: the prompt's text, which the first output
    would repeat). (0, "") when the text ends whole; (-1, "") when it still ends with U+FFFD after 3, so the
    text itself ends with that character. An ordinary prompt costs one decode of its last token (~2 us): a
    token whose own bytes end inside no character ends the text whole; one cut mid-character costs up to 5
    decodes of <= 8 ids. Text alone cannot tell a U+FFFD the prompt really ends with from a cut character:
    such a prompt's U+FFFD is repeated at the output's start."""
    if not tokenizer.decode(ids[-1:], skip_special_tokens=skip_special_tokens).endswith("\ufffd"):
        return 0, ""

    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=skip_special_tokens)

    whole = decode(ids)
    if not whole.endswith("\ufffd"):
        return 0, ""
    for pending in range(1, min(_MAX_PENDING, len(ids)) + 1):
        before = decode(ids[:len(ids) - pending])
        if not before.endswith("\ufffd"):
            held = whole.rstrip("\ufffd")
            return pending, held[len(before):] if held.startswith(before) else ""
    return -1, ""


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back only the newly completed text.

    `tokenizers.decoders.DecodeStream` keeps a small sliding window of ids, so each step costs the
    same whatever the length of the sequence so far; a token that ends in the middle of a UTF-8
    character (byte-level BPE splits emoji and CJK) yields "" until the character completes.

    With `drop_ids` (a model whose parser family reads marker tokens, `[TOOL_CALLS]`, `<|channel|>`), special
    tokens are decoded as text except the ids in `drop_ids` (EOS, padding: every special token that is not
    a marker), which are dropped before decoding: one set lookup per token.
    """

    __slots__ = ("_drop", "_held", "_last", "_skip", "_skip_special", "_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True,
                 prefix_ids: Sequence[int] | None = None, drop_ids: frozenset[int] | None = None) -> None:
        self._tokenizer = tokenizer
        self._drop = drop_ids
        if drop_ids is not None:
            skip_special_tokens = False
        self._skip_special = skip_special_tokens
        # Priming with prompt ids gives the same leading-space handling as decoding the whole text.
        window = list(prefix_ids[-_WINDOW:]) if prefix_ids else []
        pending, self._skip = _incomplete_tail(tokenizer, window, skip_special_tokens) if window else (0, "")
        if pending < 0:
            # the prompt's text ends with U+FFFD itself: not primed, since a stream primed with it would emit
            # the window's text with the first output, as below
            window, pending = [], 0
        primed = window[:len(window) - pending]
        self._stream = DecodeStream(ids=primed or None, skip_special_tokens=skip_special_tokens)
        # Ids stepped since the last text came out (held: the text so far ends inside a character), and the
        # id that text ended with: what `finish` decodes if the sequence ends there.
        self._held: list[int] = window[len(primed):]
        self._last: int | None = primed[-1] if primed else None
        if pending:
            # The prompt ends inside a UTF-8 character (a token-array prompt cut mid-character): a stream
            # primed with those bytes would never see its prefix text settle and would emit the whole window's
            # text with the first output (vLLM #48853). Stepped here instead, they wait, like any half
            # character, for the output's bytes; whole characters those tokens also hold (`_skip`) are the
            # prompt's and are cut from the first output, which then starts with the completed character, or
            # U+FFFD where the output does not complete it.
            for token_id in window[len(primed):]:
                self._stream.step(tokenizer, token_id)

    def step(self, token_id: int) -> str:
        if self._drop is not None and token_id in self._drop:
            return ""
        piece = self._stream.step(self._tokenizer, token_id)
        if piece is None:
            self._held.append(token_id)
            return ""
        if self._held:
            self._held.clear()
        self._last = token_id
        if self._skip and piece:
            return self._cut(piece)
        return piece

    def _cut(self, piece: str) -> str:
        """The first output after a prompt cut mid-character, less the prompt's whole characters it repeats."""
        skip, self._skip = self._skip, ""
        return piece[len(skip):] if piece.startswith(skip) else piece

    def steps(self, token_ids: list[int]) -> str:
        if self._drop is not None:
            drop = self._drop
            token_ids = [t for t in token_ids if t not in drop]
        if len(token_ids) == 1:
            piece = self._stream.step(self._tokenizer, token_ids[0])
        elif token_ids:
            # One call for many ids (a non-streamed answer, a multi-token chunk): same text as stepping one
            # by one, at a fraction of the calls - except that when the ids end inside a character the
            # stream holds all of them back, not just that character: `finish` gives them out at the end.
            piece = self._stream.step(self._tokenizer, token_ids)
        else:
            return ""
        if piece is None:
            self._held += token_ids
            return ""
        if self._held:
            self._held.clear()
        self._last = token_ids[-1]
        if self._skip and piece:
            return self._cut(piece)
        return piece

    def finish(self) -> str:
        """The end of the sequence: the text still held back, "" when none. Ids that end inside a character
        (an answer cut by max_tokens mid-emoji) give U+FFFD for it, as a decode of the whole sequence does; a
        non-streamed answer, stepped as one batch, is held whole in that case and would otherwise be lost."""
        if not self._held:
            return ""
        held, self._held = self._held, []
        decode, skip = self._tokenizer.decode, self._skip_special
        text = decode(held, skip_special_tokens=skip)
        if self._last is not None:
            # with the last id that came out as context, for decoders whose text depends on what precedes
            context = decode([self._last], skip_special_tokens=skip)
            whole = decode([self._last, *held], skip_special_tokens=skip)
            if whole.startswith(context):
                text = whole[len(context):]
        return self._cut(text) if self._skip and text else text
