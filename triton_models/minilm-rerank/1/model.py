"""Triton Python-backend rerank model with the cross-encoder tensor interface, MiniLM bi-encoder inside.

No cross-encoder ships in an installable package here, so this slot speaks exactly what a
production cross-encoder export (e.g. ms-marco-MiniLM, bge-reranker) speaks on the wire, and scores
with all-MiniLM-L6-v2 embeddings instead of a trained relevance head.

Wire contract (``max_batch_size: 64``, so every tensor carries the batch dim B):

inputs, one query/document pair per row, as a cross-encoder tokenizer produces it for
``tokenizer(query, document)``:
    ``input_ids``       INT64 [B, L]  ``[CLS] query [SEP] document [SEP]`` + padding.
    ``attention_mask``  INT64 [B, L]  1 for real tokens, 0 for padding.
    ``token_type_ids``  INT64 [B, L]  optional; 0 over ``[CLS] query [SEP]``, 1 over ``document [SEP]``.

output
    ``logits``  FP32 [B, 1]  relevance logit; ``sigmoid(logit)`` is the 0..1 relevance score.

How a row is split back into query and document (real tokens only, i.e. ``attention_mask != 0``):
    * with ``token_type_ids`` whose real tokens hold both segment 0 and segment 1: query = segment
      0, document = segment 1;
    * otherwise (no ``token_type_ids``, as with XLM-R based rerankers, or all zeros): query = tokens
      before the first ``[SEP]`` (id 102), document = the tokens after it, skipping a doubled
      separator (``</s></s>`` style) if present. A row without a separator is an error.
  A leading ``[CLS]`` and trailing ``[SEP]`` are stripped from each part, and each part is re-wrapped
  as its own ``[CLS] part [SEP]`` sequence, which reproduces the ids the tokenizer gives the text on
  its own (WordPiece pre-tokenises each sequence of a pair separately).

Scoring: both parts are embedded like ``all-minilm-l6-v2``'s ``sentence_embedding`` (mean pooling over
the mask, L2 normalisation) and

    logit = logit_scale * (cosine - logit_center),   defaults logit_scale = 10, logit_center = 0.5

(config parameters). MiniLM cosines for unrelated text sit around 0..0.3 and for on-topic passages
around 0.5..0.8, so 0.5 is the neutral point (sigmoid 0.5) and a scale of 10 spreads that range
over most of the sigmoid: cosine 0.68 -> logit 1.8 -> 0.86, 0.59 -> 0.71, 0.42 -> 0.31,
0.37 -> 0.21, 0.1 -> 0.02. The scores are ordinal-quality only (not calibrated probabilities).

Malformed requests get an error response of their own; the others in the batch still succeed.
Weights come from ``$OPENAI_API_MODELS_DIR/all-minilm-l6-v2`` (or the ``model_dir`` config parameter,
or ``<repo>/models/all-minilm-l6-v2``). The encoder is ``all-minilm-l6-v2/1/minilm_encoder.py``, imported from
beside that model (as the SmolLM2 family's models import their engine): deploy both folders together.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# The encoder lives beside all-minilm-l6-v2's model.py (one copy for both models).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "all-minilm-l6-v2" / "1"))
from minilm_encoder import (
    DEFAULT_FORWARD_OVERHEAD_TOKENS,
    DEFAULT_MAX_TOKENS_PER_FORWARD,
    MiniLMEncoder,
    config_string,
    error_response,
    read_request,
    resolve_model_dir,
)

CLS_ID = 101
SEP_ID = 102


def strip_specials(part: np.ndarray) -> np.ndarray:
    start = 1 if part.size and part[0] == CLS_ID else 0
    end = part.size - 1 if part.size > start and part[-1] == SEP_ID else part.size
    return part[start:end]


def split_pair(ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Query and document ids (specials stripped) of one tokenized pair row; raises ValueError."""
    real = mask != 0
    tokens = ids[real]
    segments = None if types is None else types[real]
    if segments is not None and (segments == 0).any() and (segments == 1).any():
        return strip_specials(tokens[segments == 0]), strip_specials(tokens[segments == 1])
    separators = np.flatnonzero(tokens == SEP_ID)
    if separators.size == 0:
        raise ValueError("pair row has neither token_type_ids segments nor a [SEP] (102) separator")
    first = int(separators[0])
    rest = first + 1
    while rest < tokens.size and tokens[rest] == SEP_ID and rest < tokens.size - 1:
        rest += 1
    return strip_specials(tokens[: first + 1]), strip_specials(tokens[rest:])


class TritonPythonModel:
    """Triton entry point; see the module docstring for the wire contract and the logit mapping."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        model_dir = resolve_model_dir(parameters)
        budget = int(
            config_string(parameters, "max_tokens_per_forward", str(DEFAULT_MAX_TOKENS_PER_FORWARD))
        )
        self.logit_scale = float(config_string(parameters, "logit_scale", "10.0"))
        self.logit_center = float(config_string(parameters, "logit_center", "0.5"))
        overhead = int(
            config_string(parameters, "forward_overhead_tokens", str(DEFAULT_FORWARD_OVERHEAD_TOKENS))
        )
        self.encoder = MiniLMEncoder(model_dir, budget, overhead)
        mapping = f"logit = {self.logit_scale} * (cosine - {self.logit_center})"
        pb_utils.Logger.log_info(f"{config['name']}: loaded {model_dir}; {mapping}")

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        # Identical segments (the query repeated on every row of a rerank call) are embedded once.
        unique: dict[bytes, int] = {}
        sequences: list[np.ndarray] = []
        accepted: list[tuple[int, list[tuple[int, int]]]] = []

        def slot_of(part: np.ndarray) -> int:
            wrapped = np.concatenate(([CLS_ID], part, [SEP_ID])).astype(np.int64)
            key = wrapped.tobytes()
            if key not in unique:
                unique[key] = len(sequences)
                sequences.append(wrapped)
            return unique[key]

        for index, request in enumerate(requests):
            try:
                ids, mask, types = read_request(request)
                problem = self.encoder.check_row_inputs(ids, mask, types)
                if problem is not None:
                    responses[index] = error_response(problem)
                    continue
                parts = [
                    split_pair(ids[row], mask[row], None if types is None else types[row])
                    for row in range(ids.shape[0])
                ]
                accepted.append((index, [(slot_of(query), slot_of(document)) for query, document in parts]))
            except Exception as exc:  # noqa: BLE001 - one bad request must not fail its batch mates
                responses[index] = error_response(f"invalid request: {exc}")
        if accepted:
            try:
                embeddings = self.encoder.embed(sequences)
                for index, pairs in accepted:
                    query_rows = embeddings[[query for query, _ in pairs]]
                    document_rows = embeddings[[document for _, document in pairs]]
                    cosine = (query_rows * document_rows).sum(axis=1)
                    logits = (self.logit_scale * (cosine - self.logit_center)).astype(np.float32)
                    responses[index] = pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("logits", logits.reshape(-1, 1))]
                    )
            except Exception as exc:  # noqa: BLE001 - report instead of taking the stub down
                pb_utils.Logger.log_error(f"rerank forward failed: {exc!r}")
                for index, _ in accepted:
                    responses[index] = error_response(f"rerank forward failed: {exc}")
        return responses

    def finalize(self) -> None:
        self.encoder = None  # type: ignore[assignment]
