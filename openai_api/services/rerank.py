"""Rerank in every dialect clients speak, over one scoring path:

- `/v1/rerank` (seed, Jina and Cohere v1 shapes in one body) and `/v2/rerank` (Cohere v2);
- `/v1/ranking`, NVIDIA NIM's (`{query: {text}, passages: [{text}], truncate}` -> `{rankings: [{index,
  logit}]}`, the raw scores before normalization);
- `/rerank`, where Hugging Face TEI (`texts`, answered as a bare list `[{index, score, text?}]`) and
  Infinity (`documents` as strings, answered in its Cohere-like shape with `document` a plain string) post.

Each (query, document) pair is tokenized as a cross-encoder expects it (`[CLS] q [SEP] d [SEP]`,
`token_type_ids` 0/1), the document side truncated to the model's `max_tokens` (its end by default, its
start when asked, or a 400 when truncation is off), and scored by the Triton model's one output;
`output_config.process` turns raw scores (logits) into relevance. Every response with an `id` carries the
request's id (X-Request-Id).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from openai_api.config import RerankModel
from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.quota.caller import first_usable
from openai_api.schemas.dialects import RankingRequest, RootRerankRequest
from openai_api.schemas.openai import RerankRequest
from openai_api.services.context import RequestContext
from openai_api.services.encoding import Truncation, infer_chunked, nim_truncation, tei_truncation
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import EncoderRuntime, ModelRegistry
from openai_api.text.tokenizer import invalid_text


def _scores(raw: NDArray[Any], process: str) -> NDArray[Any]:
    """`normalize`: sigmoid of a [B, 1] logit (the usual cross-encoder head); `softmax`: probability of
    the last class for [B, C>1] heads, or a softmax across the documents for [B, 1]; `none`: as is."""
    raw = raw.astype(np.float64).reshape(raw.shape[0], -1)
    scores: NDArray[np.float64]
    if process == "normalize":
        scores = 1.0 / (1.0 + np.exp(-raw[:, -1]))
    elif process == "softmax" and raw.shape[1] > 1:
        e = np.exp(raw - raw.max(axis=1, keepdims=True))
        scores = (e / e.sum(axis=1, keepdims=True))[:, -1]
    elif process == "softmax":
        e = np.exp(raw[:, 0] - raw[:, 0].max())
        scores = e / e.sum()
    else:
        scores = raw[:, -1]
    return scores


class Ranked(NamedTuple):
    """One query scored against its documents."""

    scores: list[float]  # relevance, after the model's `output_config.process`
    logits: list[float]  # the raw scores before it
    tokens: int
    docs: list[str]

    def order(self, raw: bool = False, top_n: int | None = None) -> list[int]:
        """Document indexes, best first (by relevance, or by logit), cut to `top_n`."""
        by = self.logits if raw else self.scores
        return sorted(range(len(by)), key=lambda i: -by[i])[: top_n or len(by)]


class RerankService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess
        self._pair_tokenizers: dict[tuple[str, Truncation], Tokenizer] = {}

    def model_name(self, name: str | None) -> str:
        """A request's model, or (TEI serves one model and names none) the first rerank model."""
        if name:
            return name
        first = first_usable(self.registry.rerankers)
        if first is None:
            raise ModelNotFoundError("No rerank model is configured (that this key may use).", param="model")
        return first

    def _pair_tokenizer(self, rt: EncoderRuntime[RerankModel], mode: Truncation) -> Tokenizer:
        if mode == "none":
            return rt.tokenizer.tokenizer  # untruncated, unpadded
        # A private copy: truncation is tokenizer state, and the shared one must stay untruncated.
        tok = self._pair_tokenizers.get((rt.name, mode))
        if tok is None:
            tok = Tokenizer.from_str(rt.tokenizer.tokenizer.to_str())
            tok.no_padding()
            tok.enable_truncation(rt.config.max_tokens, strategy="only_second",
                                  direction="left" if mode == "start" else "right")
            self._pair_tokenizers[(rt.name, mode)] = tok
        return tok

    def _tokenize(self, rt: EncoderRuntime[RerankModel], query: str, docs: list[str], mode: Truncation,
                  param: str) -> tuple[list[list[int]], list[list[int]]]:
        limit = rt.config.max_tokens
        if rt.tokenizer.bound(query, limit)[1]:
            raise InvalidRequestError(f"The query is more than {limit} tokens long, the model's maximum.",
                                      param="query", code="context_length_exceeded")
        bounded = []
        for i, d in enumerate(docs):
            # A document is cut to max_tokens anyway: a huge one is cut to the part that holds them first.
            part, over = rt.tokenizer.bound(d, limit, from_end=mode == "start")
            if over and mode == "none":
                raise _too_long(param, i, limit)
            bounded.append(part)
        tok = self._pair_tokenizer(rt, mode)
        try:
            encs = tok.encode_batch([(query, d) for d in bounded], add_special_tokens=True)
        except TypeError:
            raise invalid_text() from None
        except Exception as e:  # noqa: BLE001 - the tokenizer refuses a query longer than max_tokens
            raise InvalidRequestError(f"The query is too long for this model: {e}", param="query") from None
        if mode == "none":
            for i, enc in enumerate(encs):
                if len(enc.ids) > limit:
                    raise _too_long(param, i, limit)
        return [e.ids for e in encs], [e.type_ids for e in encs]

    async def score(self, rt: EncoderRuntime[RerankModel], query: str, docs: list[str], *, mode: Truncation = "end",
                    query_param: str = "query", param: str = "documents") -> Ranked:
        if not query.strip():
            raise InvalidRequestError(f"'{query_param}' must not be empty.", param=query_param)
        if not docs:
            raise InvalidRequestError(f"'{param}' must not be empty.", param=param)
        chars = len(query) * len(docs) + sum(len(d) for d in docs)
        ids, types = await self.preprocess.run(chars, self._tokenize, rt, query, docs, mode, param)
        outputs = await infer_chunked(rt, ids, types)
        raw = np.concatenate([o.reshape(o.shape[0], -1) for o in outputs], axis=0)
        scores = _scores(raw, rt.config.output_config.process)
        logits = raw.astype(np.float64)[:, -1]
        return Ranked([float(s) for s in scores], [float(x) for x in logits], sum(len(s) for s in ids), docs)

    async def rank(self, req: RerankRequest) -> tuple[list[tuple[int, float]], int, list[str]]:
        """(index, score) pairs sorted by score, cut to top_n; plus the token count and the texts."""
        rt = self.registry.reranker(req.model)
        if req.top_n is not None and req.top_n < 1:
            raise InvalidRequestError("'top_n' must be at least 1.", param="top_n")
        ranked = await self.score(rt, req.query, req.texts())
        return [(i, ranked.scores[i]) for i in ranked.order(top_n=req.top_n)], ranked.tokens, ranked.docs

    async def create(self, req: RerankRequest, ctx: RequestContext) -> dict[str, Any]:
        """`/v1/rerank`: the seed system's `data` and Cohere v1 / Jina's `results`, named by the request's id."""
        ranked, tokens, docs = await self.rank(req)
        entries = []
        for i, score in ranked:
            entry: dict[str, Any] = {"object": "rerank", "index": i, "relevance_score": score}
            if req.return_documents:
                entry["document"] = {"text": docs[i]}
            entries.append(entry)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        # `data` is the seed system's shape; `results` is what Cohere- and Jina-style clients read.
        return {"id": ctx.request_id, "object": "list", "data": entries, "results": entries, "model": req.model,
                "usage": usage, "meta": {"billed_units": {"search_units": 1}}}

    async def create_v2(self, req: RerankRequest, ctx: RequestContext) -> dict[str, Any]:
        """`/v2/rerank`: Cohere v2's answer, named by the request's id."""
        ranked, tokens, docs = await self.rank(req)
        results = []
        for i, score in ranked:
            entry: dict[str, Any] = {"index": i, "relevance_score": score}
            if req.return_documents:
                entry["document"] = {"text": docs[i]}
            results.append(entry)
        return {"id": ctx.request_id, "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                         "tokens": {"input_tokens": tokens, "output_tokens": 0}}}

    async def ranking(self, req: RankingRequest, ctx: RequestContext) -> dict[str, Any]:
        """NIM's `/v1/ranking`: every passage's raw score (`logit`), best first."""
        rt = self.registry.reranker(req.model)
        ranked = await self.score(rt, req.query.text, [p.text for p in req.passages],
                                  mode=nim_truncation(req.truncate) or "end", query_param="query.text",
                                  param="passages")
        return {"rankings": [{"index": i, "logit": ranked.logits[i]} for i in ranked.order(raw=True)]}

    async def rerank_root(self, req: RootRerankRequest, ctx: RequestContext) -> list[dict[str, Any]] | dict[str, Any]:
        """`/rerank`: TEI's answer for a body with `texts`, Infinity's for one with `documents`."""
        if (req.texts is None) == (req.documents is None):
            raise InvalidRequestError("Send either 'texts' (Hugging Face TEI) or 'documents' (Infinity), not "
                                      f"{'both' if req.texts is not None else 'neither'}.", param="texts")
        rt = self.registry.reranker(self.model_name(req.model))
        if req.texts is not None:
            mode = tei_truncation(req.truncate, req.truncation_direction, True)
            ranked = await self.score(rt, req.query, list(req.texts), mode=mode, param="texts")
            by = ranked.logits if req.raw_scores else ranked.scores
            out = []
            for i in ranked.order(raw=req.raw_scores):
                entry: dict[str, Any] = {"index": i, "score": by[i]}
                if req.return_text:
                    entry["text"] = ranked.docs[i]
                out.append(entry)
            return out
        if req.top_n is not None and req.top_n < 1:
            raise InvalidRequestError("'top_n' must be at least 1.", param="top_n")
        docs = [d if isinstance(d, str) else d.text for d in req.documents or []]
        ranked = await self.score(rt, req.query, docs)
        by = ranked.logits if req.raw_scores else ranked.scores
        results = []
        for i in ranked.order(raw=req.raw_scores, top_n=req.top_n):
            entry = {"relevance_score": by[i], "index": i}
            if req.return_documents:
                entry["document"] = docs[i]
            results.append(entry)
        return {"object": "rerank", "results": results, "model": rt.name,
                "usage": {"prompt_tokens": ranked.tokens, "total_tokens": ranked.tokens}, "id": ctx.request_id,
                "created": int(time.time())}


def _too_long(param: str, i: int, limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"{param}[{i}] with the query is more than {limit} tokens, the model's maximum, and truncation is off. "
        "Shorten it, or allow truncation.", param=param, code="context_length_exceeded")
