"""`/v1/embeddings` (OpenAI, plus NIM's retrieval fields) and TEI's `/embed`: text -> BERT-style inputs
-> Triton -> pooled, normalised vectors.

NIM's retrieval dialect: `input_type` `query` / `passage` (also as a `-query` / `-passage` suffix on the
model name) prepends the model config's `query_prefix` / `passage_prefix` (e5's "query: ", bge's
instruction) before tokenizing; `truncate` `NONE` (a 400 when over-long), `START` (keep the end) or `END`
(keep the start), unset: the model config's `truncate` (true: as `END`).

Token-id input follows the model config's `token_ids`. `cl100k_base` (the default): OpenAI's API defines
token arrays in OpenAI's tokenizer, and LangChain's OpenAIEmbeddings (by default) and LlamaIndex send
cl100k ids, so each list is decoded back to its exact text (`text/cl100k.py`) and embedded as that text:
the vector equals the text's. An id outside cl100k_base is a 400. `accept_token_ids` (or the older
`accept_token_ids: true`): the ids are the model's own vocabulary, embedded as given. `refuse`: a 400 with
the fix in the message (read as the model's own ids, cl100k ids would embed to a vector unrelated to the
text: a 400 rather than silently wrong retrieval).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import orjson
from numpy.typing import NDArray

from openai_api.config import EmbeddingModel
from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.quota.caller import first_usable
from openai_api.schemas.dialects import TEIEmbedRequest
from openai_api.schemas.openai import EmbeddingRequest
from openai_api.services.context import RequestContext
from openai_api.services.encoding import Truncation, infer_chunked, nim_truncation, special_wrap, tei_truncation
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import EncoderRuntime, ModelRegistry
from openai_api.text import cl100k

InputType = Literal["query", "passage"]
# NIM's `input_type` values; Voyage's `document` means a passage as well.
_INPUT_TYPES: dict[str, InputType] = {"query": "query", "passage": "passage", "document": "passage"}


def input_type(value: str | None) -> InputType | None:
    if value is None:
        return None
    kind = _INPUT_TYPES.get(value.strip().lower())
    if kind is None:
        raise InvalidRequestError(f"'input_type' must be 'query' or 'passage', not {value!r}.", param="input_type")
    return kind


def _inputs(req: EmbeddingRequest) -> tuple[list[str] | None, list[list[int]] | None]:
    """Normalise `input` to texts or token-id lists, refusing the empty cases OpenAI refuses."""
    inp: list[Any] = [req.input] if isinstance(req.input, str) else list(req.input)
    if not inp:
        raise InvalidRequestError("'input' must not be empty.", param="input")
    if all(isinstance(x, int) for x in inp):
        return None, [inp]
    if all(isinstance(x, str) for x in inp):
        return _texts(inp, "input"), None
    if all(isinstance(x, list) for x in inp):
        for i, ids in enumerate(inp):
            if not ids:
                raise InvalidRequestError(f"input[{i}] is an empty list of tokens.", param="input")
        return None, inp
    raise InvalidRequestError("'input' must be a string, a list of strings, a list of token ids, or a list of "
                              "lists of token ids.", param="input")


def _texts(texts: list[str], param: str) -> list[str]:
    if not texts:
        raise InvalidRequestError(f"'{param}' must not be empty.", param=param)
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"{param}[{i}] is an empty string.", param=param)
    return texts


def _token_ids(cfg: EmbeddingModel) -> str:
    """How the model reads token-id input (`accept_token_ids: true` is the older spelling)."""
    return "accept_token_ids" if cfg.accept_token_ids else cfg.token_ids


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


def _too_long(param: str, i: int, limit: int, length: int | None = None) -> InvalidRequestError:
    size = f"{length} tokens long, more than" if length is not None else "more than"
    return InvalidRequestError(
        f"{param}[{i}] is {size} {limit} tokens, the model's maximum. Shorten it, or ask for truncation "
        "('truncate': 'END' keeps its start, 'START' its end; or truncation in the model's config).", param=param,
        code="context_length_exceeded")


def _cut(seq: list[int], limit: int, mode: Truncation, head: int, tail: int) -> list[int]:
    """`seq` (its first `head` ids special and instruction tokens, its last `tail` special) cut to `limit`."""
    if mode == "end":
        return [*seq[: limit - tail], *seq[len(seq) - tail:]]
    room = max(limit - head - tail, 0)
    body = seq[head: len(seq) - tail]
    return [*seq[:head], *body[len(body) - room:], *seq[len(seq) - tail:]][:limit]


class EmbeddingsService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess

    def resolve(self, req: EmbeddingRequest) -> EmbeddingRequest:
        """NIM's model-name suffix: `<model>-query` / `<model>-passage` is `<model>` with that `input_type`."""
        if req.model in self.registry.embeddings:
            return req
        for kind in ("query", "passage"):
            base = req.model.removesuffix(f"-{kind}")
            # (a base the key may not use stays unresolved: the allow-list's 404 names the client's own string)
            if base != req.model and base in self.registry.embeddings and first_usable([base]) is not None:
                if input_type(req.input_type) not in (None, kind):
                    raise InvalidRequestError(f"The model name {req.model!r} says input_type {kind!r}, but the "
                                              f"request says {req.input_type!r}.", param="input_type")
                return req.model_copy(update={"model": base, "input_type": kind})
        return req

    def model_name(self, name: str | None) -> str:
        """A request's model, or (TEI serves one model and names none) the first embedding model."""
        if name:
            return name
        first = first_usable(self.registry.embeddings)
        if first is None:
            raise ModelNotFoundError("No embedding model is configured (that this key may use).", param="model")
        return first

    def _tokenize(self, rt: EncoderRuntime[EmbeddingModel], texts: list[str] | None, ids: list[list[int]] | None,
                  kind: InputType | None, mode: Truncation, param: str) -> list[list[int]]:
        cfg = rt.config
        limit = cfg.max_tokens
        prefix, suffix = special_wrap(rt)
        instruction = {"query": cfg.query_prefix, "passage": cfg.passage_prefix}.get(kind or "", "")
        n_instruction = len(rt.tokenizer.encode(instruction)) if instruction else 0
        if ids is not None and _token_ids(cfg) == "cl100k_base":
            texts = []
            for i, s in enumerate(ids):
                text = cl100k.decode(s)
                if text is None:
                    raise InvalidRequestError(
                        f"{param}[{i}] has token ids outside OpenAI's cl100k_base vocabulary, which this model "
                        "reads token ids in (0..100276, except the unused 100256 and 100261..100275).",
                        param=param, code="invalid_token_ids")
                texts.append(text)
            ids = None
        if texts is not None:
            texts = list(texts)
            for i, text in enumerate(texts):
                part, over = rt.tokenizer.bound(text, limit, from_end=mode == "start")
                if over and mode == "none":
                    raise _too_long(param, i, limit)
                # Truncating: the part holds the tokens to keep (the first or the last), exactly.
                texts[i] = instruction + part
            seqs = rt.tokenizer.encode_batch(texts, add_special_tokens=True)
        else:
            if _token_ids(cfg) == "refuse":
                raise InvalidRequestError(
                    f"'{param}' holds token ids, and the model {rt.name!r} takes text only (its config says "
                    "token_ids: refuse). LangChain's OpenAIEmbeddings sends OpenAI (tiktoken cl100k) token ids by "
                    "default; create it with check_embedding_ctx_length=False to send the text itself. (Its config "
                    "can read such ids with token_ids: cl100k_base, or take the model's own ids with token_ids: "
                    "accept_token_ids.)", param=param, code="token_ids_not_accepted")
            vocab = rt.tokenizer.vocab_size
            head = rt.tokenizer.encode(instruction) if instruction else []
            seqs = []
            for i, s in enumerate(ids or []):
                if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in s):
                    raise InvalidRequestError(f"{param}[{i}] has token ids outside the vocabulary (0..{vocab - 1}).",
                                              param=param)
                has_wrap = s[: len(prefix)] == prefix and (not suffix or s[-len(suffix):] == suffix)
                inner = s[len(prefix): len(s) - len(suffix)] if has_wrap else s
                seqs.append([*prefix, *head, *inner, *suffix])
        for i, s in enumerate(seqs):
            if len(s) > limit:
                if mode == "none":
                    raise _too_long(param, i, limit, len(s))
                seqs[i] = _cut(s, limit, mode, len(prefix) + n_instruction, len(suffix))
        return seqs

    async def vectors(self, rt: EncoderRuntime[EmbeddingModel], texts: list[str] | None,
                      ids: list[list[int]] | None, *, kind: InputType | None = None, mode: Truncation | None = None,
                      normalize: bool | None = None, dimensions: int | None = None,
                      param: str = "input") -> tuple[NDArray[Any], int]:
        """The embeddings (float32, one row per input, in order) and the tokens they took."""
        cfg = rt.config
        if mode is None:
            mode = "end" if cfg.truncate else "none"
        chars = sum(len(t) for t in texts) if texts else 0
        if ids and _token_ids(cfg) == "cl100k_base":
            chars = 4 * sum(len(s) for s in ids)  # decoded first: about 4 characters a token, off the loop
        seqs = await self.preprocess.run(chars, self._tokenize, rt, texts, ids, kind, mode, param)
        outputs = await infer_chunked(rt, seqs)
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
        unit = cfg.normalize if normalize is None else normalize
        if unit:
            emb = _normalize(emb)
        if dimensions is not None:
            if dimensions > emb.shape[1]:
                raise InvalidRequestError(f"dimensions={dimensions} is larger than the model's "
                                          f"{emb.shape[1]} dimensions.", param="dimensions")
            emb = emb[:, :dimensions]
            if unit:
                emb = _normalize(emb)
        return np.ascontiguousarray(emb, dtype="<f4"), sum(len(s) for s in seqs)

    async def create(self, req: EmbeddingRequest, ctx: RequestContext) -> bytes:
        """The whole response body, already serialised (vectors go from numpy to JSON without lists). `ctx`: the
        request's context, as every service takes it (OpenAI's embeddings answer carries no id)."""
        req = self.resolve(req)
        rt = self.registry.embedding(req.model)
        texts, ids = _inputs(req)
        if req.encoding_format not in ("float", "base64"):
            raise InvalidRequestError("encoding_format must be 'float' or 'base64'.", param="encoding_format")
        # OpenAI's `dimensions` re-normalises the shortened vector whatever the model's `normalize`.
        emb, tokens = await self.vectors(rt, texts, ids, kind=input_type(req.input_type),
                                         mode=nim_truncation(req.truncate), dimensions=req.dimensions,
                                         normalize=True if req.dimensions is not None else None)
        data: list[dict[str, Any]]
        if req.encoding_format == "base64":
            data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
                    for i, row in enumerate(emb)]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(emb)]
        body = {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

    async def create_tei(self, req: TEIEmbedRequest, ctx: RequestContext) -> bytes:
        """TEI's `/embed` answer: a bare JSON list of vectors, one per input."""
        rt = self.registry.embedding(self.model_name(req.model))
        texts = _texts([req.inputs] if isinstance(req.inputs, str) else list(req.inputs), "inputs")
        mode = tei_truncation(req.truncate, req.truncation_direction, rt.config.truncate)
        emb, _ = await self.vectors(rt, texts, None, mode=mode, normalize=req.normalize, dimensions=req.dimensions,
                                    param="inputs")
        return orjson.dumps(emb, option=orjson.OPT_SERIALIZE_NUMPY)
