"""`/v1/embeddings`: text or token ids -> BERT-style inputs -> Triton -> pooled, normalised vectors."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from openai_api.config import EmbeddingModel
from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import EmbeddingRequest
from openai_api.services.encoding import infer_chunked, special_wrap
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import EncoderRuntime, ModelRegistry


def _inputs(req: EmbeddingRequest) -> tuple[list[str] | None, list[list[int]] | None]:
    """Normalise `input` to texts or token-id lists, refusing the empty cases OpenAI refuses."""
    inp: list[Any] = [req.input] if isinstance(req.input, str) else list(req.input)
    if not inp:
        raise InvalidRequestError("'input' must not be empty.", param="input")
    if all(isinstance(x, int) for x in inp):
        return None, [inp]
    if all(isinstance(x, str) for x in inp):
        for i, text in enumerate(inp):
            if not text:
                raise InvalidRequestError(f"input[{i}] is an empty string.", param="input")
        return inp, None
    if all(isinstance(x, list) for x in inp):
        for i, ids in enumerate(inp):
            if not ids:
                raise InvalidRequestError(f"input[{i}] is an empty list of tokens.", param="input")
        return None, inp
    raise InvalidRequestError("'input' must be a string, a list of strings, a list of token ids, or a list of "
                              "lists of token ids.", param="input")


def _pool(out: NDArray[Any], mask: NDArray[Any], pooling: str) -> NDArray[Any]:
    if out.ndim == 2:
        return out
    if pooling == "cls":
        return out[:, 0, :]
    m = mask[:, : out.shape[1], None].astype(out.dtype)
    pooled: NDArray[Any] = (out * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    return pooled


def _normalize(v: NDArray[Any]) -> NDArray[Any]:
    unit: NDArray[Any] = v / np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)
    return unit


class EmbeddingsService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess

    def _tokenize(self, rt: EncoderRuntime[EmbeddingModel], texts: list[str] | None,
                  ids: list[list[int]] | None) -> list[list[int]]:
        cfg = rt.config
        prefix, suffix = special_wrap(rt)
        if texts is not None:
            texts = list(texts)
            for i, text in enumerate(texts):
                head, over = rt.tokenizer.bound(text, cfg.max_tokens)
                if over and not cfg.truncate:
                    raise InvalidRequestError(
                        f"input[{i}] is more than {cfg.max_tokens} tokens long, the model's maximum. Shorten it, or "
                        "enable truncation for this model in the config.", param="input",
                        code="context_length_exceeded")
                texts[i] = head  # truncating: the head holds the first max_tokens tokens exactly
            seqs = rt.tokenizer.encode_batch(texts, add_special_tokens=True)
        else:
            vocab = rt.tokenizer.vocab_size
            seqs = []
            for i, s in enumerate(ids or []):
                if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in s):
                    raise InvalidRequestError(f"input[{i}] has token ids outside the vocabulary (0..{vocab - 1}).",
                                              param="input")
                has_wrap = s[: len(prefix)] == prefix and (not suffix or s[-len(suffix):] == suffix)
                seqs.append(list(s) if has_wrap else [*prefix, *s, *suffix])
        limit = cfg.max_tokens
        for i, s in enumerate(seqs):
            if len(s) > limit:
                if not cfg.truncate:
                    raise InvalidRequestError(
                        f"input[{i}] is {len(s)} tokens long, more than the model's maximum of {limit}. Shorten "
                        "it, or enable truncation for this model in the config.", param="input",
                        code="context_length_exceeded")
                seqs[i] = [*s[: limit - len(suffix)], *suffix]
        return seqs

    async def create(self, req: EmbeddingRequest) -> bytes:
        """The whole response body, already serialised (vectors go from numpy to JSON without lists)."""
        rt = self.registry.embedding(req.model)
        texts, ids = _inputs(req)
        if req.encoding_format not in ("float", "base64"):
            raise InvalidRequestError("encoding_format must be 'float' or 'base64'.", param="encoding_format")
        chars = sum(len(t) for t in texts) if texts else 0
        seqs = await self.preprocess.run(chars, self._tokenize, rt, texts, ids)
        outputs = await infer_chunked(rt, seqs)
        cfg = rt.config
        vectors = []
        start = 0
        for out in outputs:
            n = out.shape[0]
            lengths = [len(s) for s in seqs[start:start + n]]
            mask = np.zeros((n, max(lengths)), dtype=np.int64)
            for i, length in enumerate(lengths):
                mask[i, :length] = 1
            vectors.append(_pool(out.astype(np.float32, copy=False), mask, cfg.pooling))
            start += n
        emb = np.concatenate(vectors, axis=0)
        if cfg.normalize:
            emb = _normalize(emb)
        if req.dimensions is not None:
            if req.dimensions > emb.shape[1]:
                raise InvalidRequestError(f"dimensions={req.dimensions} is larger than the model's "
                                          f"{emb.shape[1]} dimensions.", param="dimensions")
            emb = _normalize(emb[:, : req.dimensions])
        emb = np.ascontiguousarray(emb, dtype="<f4")
        tokens = sum(len(s) for s in seqs)
        data: list[dict[str, Any]]
        if req.encoding_format == "base64":
            data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                    for i, row in enumerate(emb)]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(emb)]
        body = {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
