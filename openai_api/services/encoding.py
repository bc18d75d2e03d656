"""What embeddings and rerank share: truncation modes, special-token wrapping, padding, and chunked Triton
calls."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from openai_api.errors import InvalidRequestError
from openai_api.services.registry import EncoderRuntime

# What to do with an input longer than the model's maximum: a 400, cut its start (keep the end), or cut
# its end (keep the start). NIM's `truncate` spells them NONE / START / END.
Truncation = Literal["none", "start", "end"]
_TRUNCATIONS: dict[str, Truncation] = {"none": "none", "start": "start", "end": "end"}


def nim_truncation(value: str | bool | None, param: str = "truncate") -> Truncation | None:
    """NIM's `truncate` (`NONE` / `START` / `END`, any case; a bool as `END` / `NONE`); None when unset."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "end" if value else "none"
    mode = _TRUNCATIONS.get(value.strip().lower())
    if mode is not None:
        return mode
    raise InvalidRequestError(f"'{param}' must be 'NONE', 'START' or 'END', not {value!r}.", param=param)


def tei_truncation(truncate: bool | None, direction: str | None, default: bool) -> Truncation:
    """TEI's `truncate` (unset: the model's default) and `truncation_direction` (`Right`, the default, cuts
    the end; `Left` cuts the start)."""
    side = (direction or "right").strip().lower()
    if side not in ("left", "right"):
        raise InvalidRequestError(f"'truncation_direction' must be 'Left' or 'Right', not {direction!r}.",
                                  param="truncation_direction")
    if not (default if truncate is None else truncate):
        return "none"
    return "start" if side == "left" else "end"


def special_wrap(rt: EncoderRuntime[Any]) -> tuple[list[int], list[int]]:
    """The ids a single sequence is wrapped in ([CLS] ... [SEP] for BERT), read off the tokenizer itself."""
    ids = rt.tokenizer.tokenizer.encode("", add_special_tokens=True).ids
    if len(ids) >= 2:
        return ids[:-1], ids[-1:]
    return [], ids


def pad_batch(seqs: list[list[int]], type_ids: list[list[int]] | None = None) -> dict[str, NDArray[Any]]:
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    types = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
        if type_ids is not None:
            types[i, : len(s)] = type_ids[i]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


async def infer_chunked(rt: EncoderRuntime[Any], seqs: list[list[int]],
                        type_ids: list[list[int]] | None = None) -> list[NDArray[Any]]:
    """Split into chunks of at most the model's batch size, run them concurrently (Triton's dynamic
    batcher merges them with other requests), and return per-chunk outputs in input order."""
    await rt.adapter.check()
    size = min(rt.config.max_batch_size, rt.adapter.max_batch_size or rt.config.max_batch_size)
    chunks = [(seqs[i:i + size], type_ids[i:i + size] if type_ids else None) for i in range(0, len(seqs), size)]
    return list(await asyncio.gather(*(rt.adapter.infer(pad_batch(s, t)) for s, t in chunks)))
