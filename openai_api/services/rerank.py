"""`/v1/rerank` (seed, Jina and Cohere v1 shapes in one body) and `/v2/rerank` (Cohere v2).

Each (query, document) pair is tokenized as a cross-encoder expects it (`[CLS] q [SEP] d [SEP]`,
`token_type_ids` 0/1), truncating the document side to the model's `max_tokens`, and scored by the
Triton model's one output; `output_config.process` turns raw scores into relevance.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from openai_api.config import RerankModel
from openai_api.errors import InvalidRequestError
from openai_api.schemas.openai import RerankRequest
from openai_api.services.encoding import infer_chunked
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


class RerankService:
    def __init__(self, registry: ModelRegistry, preprocess: Preprocessor) -> None:
        self.registry = registry
        self.preprocess = preprocess
        self._pair_tokenizers: dict[str, Tokenizer] = {}

    def _pair_tokenizer(self, rt: EncoderRuntime[RerankModel]) -> Tokenizer:
        # A private copy: truncation is tokenizer state, and the shared one must stay untruncated.
        tok = self._pair_tokenizers.get(rt.name)
        if tok is None:
            tok = Tokenizer.from_str(rt.tokenizer.tokenizer.to_str())
            tok.no_padding()
            tok.enable_truncation(rt.config.max_tokens, strategy="only_second")
            self._pair_tokenizers[rt.name] = tok
        return tok

    def _tokenize(self, rt: EncoderRuntime[RerankModel], query: str,
                  docs: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        limit = rt.config.max_tokens
        if rt.tokenizer.bound(query, limit)[1]:
            raise InvalidRequestError(f"The query is more than {limit} tokens long, the model's maximum.",
                                      param="query", code="context_length_exceeded")
        # A document is cut to max_tokens anyway: a huge one is cut to a head that holds them first.
        docs = [rt.tokenizer.bound(d, limit)[0] for d in docs]
        tok = self._pair_tokenizer(rt)
        try:
            encs = tok.encode_batch([(query, d) for d in docs], add_special_tokens=True)
        except TypeError:
            raise invalid_text() from None
        except Exception as e:  # noqa: BLE001 - the tokenizer refuses a query longer than max_tokens
            raise InvalidRequestError(f"The query is too long for this model: {e}", param="query") from None
        return [e.ids for e in encs], [e.type_ids for e in encs]

    async def rank(self, req: RerankRequest) -> tuple[list[tuple[int, float]], int, list[str]]:
        """(index, score) pairs sorted by score, cut to top_n; plus the token count and the texts."""
        rt = self.registry.reranker(req.model)
        if not req.query.strip():
            raise InvalidRequestError("'query' must not be empty.", param="query")
        docs = req.texts()
        if not docs:
            raise InvalidRequestError("'documents' must not be empty.", param="documents")
        if req.top_n is not None and req.top_n < 1:
            raise InvalidRequestError("'top_n' must be at least 1.", param="top_n")
        chars = len(req.query) * len(docs) + sum(len(d) for d in docs)
        ids, types = await self.preprocess.run(chars, self._tokenize, rt, req.query, docs)
        outputs = await infer_chunked(rt, ids, types)
        raw = np.concatenate([o.reshape(o.shape[0], -1) for o in outputs], axis=0)
        scores = _scores(raw, rt.config.output_config.process)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[: req.top_n or len(docs)]
        return [(i, float(scores[i])) for i in order], sum(len(s) for s in ids), docs

    async def create(self, req: RerankRequest) -> dict[str, Any]:
        ranked, tokens, docs = await self.rank(req)
        entries = []
        for i, score in ranked:
            entry: dict[str, Any] = {"object": "rerank", "index": i, "relevance_score": score}
            if req.return_documents:
                entry["document"] = {"text": docs[i]}
            entries.append(entry)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        # `data` is the seed system's shape; `results` is what Cohere- and Jina-style clients read.
        return {"id": uuid.uuid4().hex, "object": "list", "data": entries, "results": entries, "model": req.model,
                "usage": usage, "meta": {"billed_units": {"search_units": 1}}}

    async def create_v2(self, req: RerankRequest) -> dict[str, Any]:
        ranked, tokens, docs = await self.rank(req)
        results = []
        for i, score in ranked:
            entry: dict[str, Any] = {"index": i, "relevance_score": score}
            if req.return_documents:
                entry["document"] = {"text": docs[i]}
            results.append(entry)
        return {"id": uuid.uuid4().hex, "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                         "tokens": {"input_tokens": tokens, "output_tokens": 0}}}
