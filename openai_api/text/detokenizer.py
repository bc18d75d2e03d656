"""Incremental detokenization: O(1) work per token, correct across multi-byte UTF-8 splits."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back only the newly completed text.

    `tokenizers.decoders.DecodeStream` keeps a small sliding window of ids, so each step costs the
    same whatever the length of the sequence so far; a token that ends in the middle of a UTF-8
    character (byte-level BPE splits emoji and CJK) yields "" until the character completes.
    """

    __slots__ = ("_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True,
                 prefix_ids: list[int] | None = None) -> None:
        self._tokenizer = tokenizer
        # Priming with prompt ids gives the same leading-space handling as decoding the whole text.
        if prefix_ids:
            self._stream = DecodeStream(ids=prefix_ids[-8:], skip_special_tokens=skip_special_tokens)
        else:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        piece = self._stream.step(self._tokenizer, token_id)
        return piece or ""

    def steps(self, token_ids: list[int]) -> str:
        if len(token_ids) == 1:
            piece = self._stream.step(self._tokenizer, token_ids[0])
        elif token_ids:
            # One call for many ids (a non-streamed answer, a multi-token chunk): same text and the
            # same held-back partial character as stepping one by one, at a fraction of the calls.
            piece = self._stream.step(self._tokenizer, token_ids)
        else:
            return ""
        return piece or ""
