"""Incremental detokenization: O(1) work per token, correct across multi-byte UTF-8 splits."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back only the newly completed text.

    `tokenizers.decoders.DecodeStream` keeps a small sliding window of ids, so each step costs the
    same whatever the length of the sequence so far; a token that ends in the middle of a UTF-8
    character (byte-level BPE splits emoji and CJK) yields "" until the character completes.

    With `drop_ids` (a model whose parser family reads marker tokens, `[TOOL_CALLS]`, `<|channel|>`), special
    tokens are decoded as text except the ids in `drop_ids` (EOS, padding: every special token that is not
    a marker), which are dropped before decoding: one set lookup per token.
    """

    __slots__ = ("_drop", "_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True,
                 prefix_ids: list[int] | None = None, drop_ids: frozenset[int] | None = None) -> None:
        self._tokenizer = tokenizer
        self._drop = drop_ids
        if drop_ids is not None:
            skip_special_tokens = False
        # Priming with prompt ids gives the same leading-space handling as decoding the whole text.
        if prefix_ids:
            self._stream = DecodeStream(ids=prefix_ids[-8:], skip_special_tokens=skip_special_tokens)
        else:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        if self._drop is not None and token_id in self._drop:
            return ""
        piece = self._stream.step(self._tokenizer, token_id)
        return piece or ""

    def steps(self, token_ids: list[int]) -> str:
        if self._drop is not None:
            drop = self._drop
            token_ids = [t for t in token_ids if t not in drop]
        if len(token_ids) == 1:
            piece = self._stream.step(self._tokenizer, token_ids[0])
        elif token_ids:
            # One call for many ids (a non-streamed answer, a multi-token chunk): same text and the
            # same held-back partial character as stepping one by one, at a fraction of the calls.
            piece = self._stream.step(self._tokenizer, token_ids)
        else:
            return ""
        return piece or ""
