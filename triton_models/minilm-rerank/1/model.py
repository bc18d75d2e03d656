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
or ``<repo>/models/all-minilm-l6-v2``). The encoder code mirrors ``all-minilm-l6-v2/1/model.py`` so
each model folder deploys on its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel

MODEL_FOLDER = "all-minilm-l6-v2"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_MAX_TOKENS_PER_FORWARD = 8192
# Fixed cost of one forward pass in padded tokens: ~7 ms against ~0.3 ms per token for this model
# on one x86 core (OMP_NUM_THREADS=1), measured with batches of 1..64 rows of 20 tokens.
DEFAULT_FORWARD_OVERHEAD_TOKENS = 24
CLS_ID = 101
SEP_ID = 102


def resolve_model_dir(parameters: dict[str, Any]) -> Path:
    """Folder holding the HF BertModel: config parameter, then the env var, then the repo checkout."""
    configured = parameters.get("model_dir", {}).get("string_value", "")
    if configured:
        return Path(configured)
    env_dir = os.environ.get("OPENAI_API_MODELS_DIR")
    if env_dir:
        return Path(env_dir) / MODEL_FOLDER
    return Path(__file__).resolve().parents[3] / "models" / MODEL_FOLDER


def string_parameter(parameters: dict[str, Any], key: str, default: str) -> str:
    return parameters.get(key, {}).get("string_value", "") or default


def plan_chunks(lengths: list[int], max_tokens: int, overhead_tokens: int) -> list[list[int]]:
    """Group row indices (rows of length 0 left out) into forward passes, longest rows first.

    A chunk is a run of the rows sorted by length, padded to its first (longest) row. On CPU a
    forward pass costs about ``overhead_tokens + rows * longest`` padded tokens' worth of time, so
    the split minimising that sum is found exactly by dynamic programming over the sorted rows
    (O(rows^2), rows <= max_batch_size: well under a millisecond), with at most ``max_tokens``
    padded tokens per chunk. Padding a merged batch of 10-30 token texts to its longest row costs
    ~30% more forward time; many tiny forwards cost their fixed overhead instead.
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    # best[end]: cheapest cost of the first `end` sorted rows; start[end]: first row of its last chunk.
    best = [0] * (len(order) + 1)
    start = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        best[end] = -1
        for first in range(end - 1, -1, -1):
            padded = (end - first) * lengths[order[first]]
            if padded > max_tokens and first < end - 1:
                break  # padded only grows as the chunk reaches back to longer rows
            cost = best[first] + overhead_tokens + padded
            if best[end] < 0 or cost < best[end]:
                best[end], start[end] = cost, first
    chunks: list[list[int]] = []
    end = len(order)
    while end > 0:
        chunks.append(order[start[end] : end])
        end = start[end]
    chunks.reverse()
    return chunks


class MiniLMEncoder:
    """Runs the BertModel over many variable-length rows with as little padding as practical."""

    def __init__(
        self,
        model_dir: Path,
        max_tokens_per_forward: int,
        forward_overhead_tokens: int = DEFAULT_FORWARD_OVERHEAD_TOKENS,
    ) -> None:
        # One intra-op thread unless OPENAI_API_REF_TORCH_THREADS says otherwise (as the SmolLM2 engine): with
        # torch's default (a thread per core), OpenMP's threads spin at every op's barrier whenever another
        # process holds a core - on a loaded 2-core box the same 300 small forwards took 50 CPU-s instead of 13.
        torch.set_num_threads(max(1, int(os.environ.get("OPENAI_API_REF_TORCH_THREADS", "1"))))
        self.model = AutoModel.from_pretrained(str(model_dir)).eval()
        self.hidden_size = int(self.model.config.hidden_size)
        self.vocab_size = int(self.model.config.vocab_size)
        self.type_vocab_size = int(self.model.config.type_vocab_size)
        self.max_length = int(self.model.config.max_position_embeddings)
        self.max_tokens_per_forward = max_tokens_per_forward
        self.forward_overhead_tokens = forward_overhead_tokens

    def check_row_inputs(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> str | None:
        """Return why these [B, L] tensors cannot be encoded, or None when they can."""
        if ids.ndim != 2:
            return f"input_ids must be 2-D [batch, seq_len], got shape {list(ids.shape)}"
        if mask.shape != ids.shape:
            return f"attention_mask shape {list(mask.shape)} != input_ids shape {list(ids.shape)}"
        if types is not None and types.shape != ids.shape:
            return f"token_type_ids shape {list(types.shape)} != input_ids shape {list(ids.shape)}"
        if ids.shape[1] == 0:
            return "input_ids has seq_len 0"
        if ids.shape[1] > self.max_length:
            return f"seq_len {ids.shape[1]} exceeds the model's maximum of {self.max_length} tokens"
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            return f"input_ids must lie in [0, {self.vocab_size})"
        if types is not None and types.size and (types.min() < 0 or types.max() >= self.type_vocab_size):
            return f"token_type_ids must lie in [0, {self.type_vocab_size})"
        return None

    def embed(self, sequences: list[np.ndarray]) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings [N, H] of unpadded 1-D id sequences."""
        pooled = np.zeros((len(sequences), self.hidden_size), dtype=np.float32)
        lengths = [len(sequence) for sequence in sequences]
        for chunk in plan_chunks(lengths, self.max_tokens_per_forward, self.forward_overhead_tokens):
            longest = lengths[chunk[0]]
            ids = np.zeros((len(chunk), longest), dtype=np.int64)
            mask = np.zeros_like(ids)
            for slot, row in enumerate(chunk):
                ids[slot, : len(sequences[row])] = sequences[row]
                mask[slot, : len(sequences[row])] = 1
            mask_t = torch.from_numpy(mask)
            with torch.inference_mode():
                states = self.model(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=mask_t,
                    token_type_ids=torch.zeros_like(mask_t),
                ).last_hidden_state
                weights = mask_t.unsqueeze(-1).to(states.dtype)
                states = torch.where(weights > 0, states, torch.zeros((), dtype=states.dtype))
                summed = states.sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
                pooled[chunk] = torch.nn.functional.normalize(summed, p=2.0, dim=1).float().numpy()
        return pooled


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


def read_request(request: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    tensors = {}
    for name in INPUT_NAMES:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        tensors[name] = None if tensor is None else tensor.as_numpy()
    if tensors["input_ids"] is None or tensors["attention_mask"] is None:
        raise ValueError("input_ids and attention_mask are required")
    for name, array in tensors.items():
        if array is not None and array.dtype != np.int64:
            raise ValueError(f"{name} must be INT64, got {array.dtype}")
    return tensors["input_ids"], tensors["attention_mask"], tensors["token_type_ids"]


def error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


class TritonPythonModel:
    """Triton entry point; see the module docstring for the wire contract and the logit mapping."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        model_dir = resolve_model_dir(parameters)
        budget = int(
            string_parameter(parameters, "max_tokens_per_forward", str(DEFAULT_MAX_TOKENS_PER_FORWARD))
        )
        self.logit_scale = float(string_parameter(parameters, "logit_scale", "10.0"))
        self.logit_center = float(string_parameter(parameters, "logit_center", "0.5"))
        overhead = int(
            string_parameter(parameters, "forward_overhead_tokens", str(DEFAULT_FORWARD_OVERHEAD_TOKENS))
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
