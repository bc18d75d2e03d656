"""OpenAI's `cl100k_base` vocabulary, loaded offline, to read token-id input to `/v1/embeddings`.

OpenAI's API defines token-array input in OpenAI's own tokenizer: LangChain's `OpenAIEmbeddings` (by
default) and LlamaIndex send `cl100k_base` ids instead of text. An embedding model whose config says
`token_ids: cl100k_base` (the default) decodes them back to the exact text with this vocabulary and
embeds that text, so the vector equals the text's (`services.embeddings`).

The vocabulary is tiktoken's `cl100k_base.tiktoken` file, shipped in the package (`vocab/`, with its
source and license) so that any install reads it offline; it is never downloaded. It is used only when its
sha256 is the one tiktoken expects. The encoding is built as tiktoken's own `cl100k_base` definition
(`tiktoken_ext/openai_public.py`: the pre-tokenizer pattern and the special tokens below) over those ranks;
tests/unit/test_embedding_token_ids.py checks it against tiktoken's. A missing or altered file is
`VocabularyUnavailable`, which stops start-up with one line.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path

import tiktoken

VOCABULARY = Path(__file__).resolve().parent / "vocab" / "cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # as tiktoken_ext.openai_public
PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
           r"""\s*[\r\n]|\s+(?!\S)|\s""")
SPECIAL_TOKENS = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                  "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


class VocabularyUnavailable(RuntimeError):
    """OpenAI's cl100k_base file is not in the package (or does not match its hash)."""


def _ranks(path: Path) -> dict[bytes, int]:
    """The file's `base64(token) rank` lines (tiktoken's `load_tiktoken_bpe`, without its download cache)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise VocabularyUnavailable(f"OpenAI's cl100k_base vocabulary is missing from this install ({path}: "
                                    f"{e.strerror}); reinstall the package") from None
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise VocabularyUnavailable(f"OpenAI's cl100k_base vocabulary at {path} is not the published file (its "
                                    f"sha256 is not {SHA256[:12]}...); reinstall the package")
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


@functools.cache
def cl100k() -> tiktoken.Encoding:
    """The `cl100k_base` encoding (loaded once per process, ~0.1 s), or `VocabularyUnavailable`."""
    return tiktoken.Encoding("cl100k_base", pat_str=PATTERN, mergeable_ranks=_ranks(VOCABULARY),
                             special_tokens=SPECIAL_TOKENS)


def decode(ids: list[int]) -> str | None:
    """The text `ids` (cl100k_base) encode, exactly as tiktoken decodes it; None when an id is not in the
    vocabulary (negative, past 100276, or one of the unused ids among the special tokens)."""
    try:
        return cl100k().decode(ids)
    except (KeyError, OverflowError, ValueError, TypeError):
        return None
