"""OpenAI's `cl100k_base` vocabulary, loaded offline, to read token-id input to `/v1/embeddings`.

OpenAI's API defines token-array input in OpenAI's own tokenizer: LangChain's `OpenAIEmbeddings` (by
default) and LlamaIndex send `cl100k_base` ids instead of text. An embedding model whose config says
`token_ids: cl100k_base` (the default) decodes them back to the exact text with this vocabulary and
embeds that text, so the vector equals the text's (`services.embeddings`).

The vocabulary is tiktoken's `cl100k_base.tiktoken` file, never downloaded: it is looked up where tiktoken
keeps its cache (`$TIKTOKEN_CACHE_DIR`, `$DATA_GYM_CACHE_DIR`; tiktoken names the file by the sha1 of
its URL), then in the copy litellm ships in its package (`litellm/litellm_core_utils/tokenizers/`). A
file is used only when its sha256 is the one tiktoken expects (tiktoken itself would delete a file that
does not match and fetch it again). Not found: `VocabularyUnavailable`, which stops start-up with one line.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from pathlib import Path

import tiktoken

URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # as tiktoken_ext.openai_public
CACHE_NAME = hashlib.sha1(URL.encode()).hexdigest()  # tiktoken names its cache files so


class VocabularyUnavailable(RuntimeError):
    """OpenAI's cl100k_base file is not on this machine (or does not match its hash)."""


def _folders() -> list[Path]:
    """Where the file may be, in order: tiktoken's own cache, then litellm's shipped copy (found without
    importing litellm, which is slow and changes `TIKTOKEN_CACHE_DIR` for the whole process)."""
    out = [Path(os.environ[k]) for k in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR") if os.environ.get(k)]
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        out.append(Path(root) / "litellm_core_utils" / "tokenizers")
    return out


@functools.cache
def cl100k() -> tiktoken.Encoding:
    """The `cl100k_base` encoding (loaded once per process), or `VocabularyUnavailable`."""
    folders = _folders()
    for folder in folders:
        path = folder / CACHE_NAME
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() != SHA256:
            continue
        # tiktoken reads TIKTOKEN_CACHE_DIR on each load: pointed at the checked file for this call only,
        # it reads that file and never goes to the network.
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
        try:
            return tiktoken.get_encoding("cl100k_base")
        finally:
            if saved is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved
    looked = ", ".join(str(f) for f in folders) or "no folder (no TIKTOKEN_CACHE_DIR, litellm not installed)"
    raise VocabularyUnavailable(
        f"OpenAI's cl100k_base vocabulary (tiktoken file {CACHE_NAME}, sha256 {SHA256[:12]}...) is not on this "
        f"machine; looked in {looked}. Install litellm (it ships the file) or put the file in $TIKTOKEN_CACHE_DIR")


def decode(ids: list[int]) -> str | None:
    """The text `ids` (cl100k_base) encode, exactly as tiktoken decodes it; None when an id is not in the
    vocabulary (negative, past 100276, or one of the unused ids among the special tokens)."""
    try:
        return cl100k().decode(ids)
    except (KeyError, OverflowError, ValueError, TypeError):
        return None
