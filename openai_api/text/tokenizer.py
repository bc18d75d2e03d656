"""Local tokenization with the model's own `tokenizer.json` (the `tokenizers` library only, no transformers).

Also reads the small JSON files that sit beside it (tokenizer_config.json, generation_config.json,
config.json) for special tokens, EOS ids and the context length.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from openai_api.errors import InvalidRequestError

logger = logging.getLogger(__name__)

# Longer texts are counted window by window before anything tokenizes them whole (`TextTokenizer.bound`).
BOUND_WINDOW_CHARS = 16384
# Names each tokenizer object for the prompt cache (`text.prompt_cache`): never reused in a process.
_KEYS = itertools.count(1)


def _ids(tok: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids only. `encode_batch_fast` skips the offsets and alignments `encode` builds and that
    nothing here reads: a 41-token chat prompt costs ~33 us instead of ~74 us (tokenizers 0.23, the
    default parallelism), on every request. Raises TypeError for text no tokenizer can take."""
    fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.21; the same ids either way
    encs = (fast or tok.encode_batch)(texts, add_special_tokens=add_special_tokens)
    return [e.ids for e in encs]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str:
    # tokenizer_config stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def invalid_text() -> InvalidRequestError:
    """What a `str` the tokenizer refuses (TypeError) means: JSON may escape a lone UTF-16 surrogate
    ("\\ud800"), which Python keeps in a str but no tokenizer can encode."""
    return InvalidRequestError("The input is not valid Unicode text: it contains a lone surrogate "
                               "(such as \\ud800).", code="invalid_unicode")


@dataclass
class TextTokenizer:
    """A model's tokenizer plus the facts about it the gateway needs."""

    folder: Path
    tokenizer: Tokenizer
    bos_token: str = ""
    eos_token: str = ""
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    context_length: int | None = None
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # The text of every special (control) token: `<|im_start|>`, `[CLS]`, ...
    special_tokens: list[str] = field(default_factory=list)
    # Every added token, special or not: a family's markers are often plain added tokens (DeepSeek's tool-call
    # and DSML tokens), which `tool_parser: auto` reads as well as the template.
    added_tokens: list[str] = field(default_factory=list)
    _plain: Tokenizer | None = field(default=None, repr=False)
    _plain_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _identity: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        specials = sorted({t for t in self.special_tokens if t}, key=len, reverse=True)
        self.special_pattern = re.compile("|".join(map(re.escape, specials))) if specials else None
        # This object's name in the prompt cache: a tokenizer whose files changed is a new object.
        self.cache_key = next(_KEYS)

    @classmethod
    def from_folder(cls, folder: Path) -> TextTokenizer:
        # Read once: the tokenizer is built from these very bytes, and their hash names it across processes.
        source = (folder / "tokenizer.json").read_bytes()
        tok = Tokenizer.from_str(source.decode("utf-8"))
        # Truncation/padding baked into tokenizer.json would silently change token counts.
        tok.no_truncation()
        tok.no_padding()
        tcfg = _read_json(folder / "tokenizer_config.json")
        gcfg = _read_json(folder / "generation_config.json")
        mcfg = _read_json(folder / "config.json")
        bos, eos = _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token"))
        eos_ids: list[int] = []
        raw = gcfg.get("eos_token_id", mcfg.get("eos_token_id"))
        if isinstance(raw, int):
            eos_ids = [raw]
        elif isinstance(raw, list):
            eos_ids = [int(x) for x in raw]
        eos_id = tok.token_to_id(eos) if eos else None
        if not eos_ids and eos_id is not None:
            eos_ids = [eos_id]
        pad = gcfg.get("pad_token_id", mcfg.get("pad_token_id"))
        ctx = None
        for key in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
            if isinstance(mcfg.get(key), int):
                ctx = mcfg[key]
                break
        defaults: dict[str, Any] = {k: gcfg[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")
                                    if k in gcfg}
        added = list(tok.get_added_tokens_decoder().values())
        specials = [t.content for t in added if t.special]
        return cls(folder=folder, tokenizer=tok, bos_token=bos, eos_token=eos, eos_token_ids=eos_ids,
                   pad_token_id=pad if isinstance(pad, int) else None, context_length=ctx,
                   generation_defaults=defaults, special_tokens=specials, added_tokens=[t.content for t in added],
                   _identity=hashlib.sha256(source).digest())

    def identity(self) -> bytes:
        """This tokenizer's name across the processes of one gateway (the prompt cache's shared folder,
        `text.shared_segments`): the SHA-256 of the tokenizer.json bytes `from_folder` built it from (hashed
        then, not later: the file may change on disk before a reload). Same bytes, same ids: every process
        builds it the same way. Not the hash of `to_str()`: that serialization's order differs between
        processes for some tokenizers (harmony's, seen here). A tokenizer built without `from_folder` (tests)
        gets a name of its own, unique to this process."""
        if self._identity is None:
            self._identity = f"{os.getpid()}:{id(self)}:{self.cache_key}".encode()
        return self._identity

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        try:
            return _ids(self.tokenizer, [text], add_special_tokens)[0]
        except TypeError:
            raise invalid_text() from None

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with special-token text in it read as plain text (`<|im_start|>` becomes
        `<`, `|`, `im`, ...), never as a control token. A private copy of the tokenizer does this, since
        the setting is tokenizer state and the shared one must keep reading markup."""
        if self._plain is None:
            with self._plain_lock:
                if self._plain is None:
                    plain = Tokenizer.from_str(self.tokenizer.to_str())
                    plain.encode_special_tokens = True
                    self._plain = plain
        try:
            return _ids(self._plain, [text], False)[0]
        except TypeError:
            raise invalid_text() from None

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        try:
            return _ids(self.tokenizer, texts, add_special_tokens)
        except TypeError:
            raise invalid_text() from None

    def bound(self, text: str, max_tokens: int, *, from_end: bool = False) -> tuple[str, bool]:
        """`(text, False)` when `text` is cheap to tokenize whole; else, when it certainly holds more than
        `max_tokens` tokens, `(prefix, True)`: a prefix of it that also does, so tokenizing the prefix and
        keeping `max_tokens` tokens gives exactly the text's first `max_tokens` tokens. With `from_end`,
        the same from the other side: a suffix that holds more than `max_tokens` tokens, whose last
        `max_tokens` tokens are the text's last ones (for truncation that keeps the end).

        Tokenizing a text allocates per token (ids, offsets, strings): a 12 MB input costs over a GB
        whole. A text longer than `BOUND_WINDOW_CHARS` is counted window by window instead, cut at
        whitespace, stopping as soon as the count certainly passes `max_tokens`, so the work is bounded by
        the limit, not by the input. A cut can add at most two tokens against tokenizing whole (a word or
        merge split in two), so the count is discounted by two per window: "certainly" holds. A long text
        that never passes (mostly whitespace, say) is returned whole: it is few tokens by then."""
        if len(text) <= BOUND_WINDOW_CHARS:
            return text, False
        count = windows = 0
        n = len(text)
        pos = n if from_end else 0
        try:
            while (pos > 0) if from_end else (pos < n):
                if from_end:
                    start, end = max(pos - BOUND_WINDOW_CHARS, 0), pos
                    if start > 0:
                        cuts = [c for c in (text.find(" ", start, end), text.find("\n", start, end)) if c > start]
                        if cuts:
                            start = min(cuts)
                    window, pos = text[start:end], start
                else:
                    start, end = pos, min(pos + BOUND_WINDOW_CHARS, n)
                    if end < n:
                        cut = max(text.rfind(" ", pos, end), text.rfind("\n", pos, end))
                        if cut > pos:
                            end = cut
                    window, pos = text[start:end], end
                count += len(_ids(self.tokenizer, [window], False)[0])
                windows += 1
                if count - 2 * windows > max_tokens:
                    return (text[pos:], True) if from_end else (text[:pos], True)
        except TypeError:
            raise invalid_text() from None
        return text, False

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)
