"""Triton Python-backend sentence-embedding model: all-MiniLM-L6-v2 (BERT, hidden size 384).

Wire contract (``max_batch_size: 64``, so every tensor carries the batch dim B):

inputs
    ``input_ids``       INT64 [B, L]  WordPiece ids of the MiniLM ``tokenizer.json`` (``[CLS] ... [SEP]``).
    ``attention_mask``  INT64 [B, L]  1 for real tokens, 0 for padding (any non-zero counts as 1).
    ``token_type_ids``  INT64 [B, L]  optional; zeros when absent.

outputs (only those the request asks for are computed and returned; Triton asks for all when the
client names none)
    ``last_hidden_state``  FP32 [B, L, 384]  encoder output, what an ONNX export of the BertModel
                           gives; positions with ``attention_mask == 0`` are 0.0 so the tensor does not
                           depend on how requests were batched together.
    ``sentence_embedding`` FP32 [B, 384]     sentence-transformers pooling: mean over positions with
                           ``attention_mask == 1``, then L2-normalised (a row with no real token gives
                           the zero vector).

Requests with different L are batched together by Triton's dynamic batcher (``allow_ragged_batch``)
and padded here into shared forward passes; outputs are cut back to each request's own L.
Malformed requests (shape mismatch, ids out of range, L > 512) get an error response of their own;
the other requests in the same batch still succeed.

Weights come from ``$OPENAI_API_MODELS_DIR/all-minilm-l6-v2`` (or the ``model_dir`` config parameter,
or ``<repo>/models/all-minilm-l6-v2``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from minilm_encoder import (
    DEFAULT_FORWARD_OVERHEAD_TOKENS,
    DEFAULT_MAX_TOKENS_PER_FORWARD,
    MiniLMEncoder,
    config_string,
    error_response,
    read_request,
    resolve_model_dir,
)


class TritonPythonModel:
    """Triton entry point; see the module docstring for the wire contract."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        model_dir = resolve_model_dir(parameters)
        budget = int(config_string(parameters, "max_tokens_per_forward", str(DEFAULT_MAX_TOKENS_PER_FORWARD)))
        overhead = int(config_string(parameters, "forward_overhead_tokens", str(DEFAULT_FORWARD_OVERHEAD_TOKENS)))
        self.encoder = MiniLMEncoder(model_dir, budget, overhead)
        pb_utils.Logger.log_info(
            f"{config['name']}: loaded {model_dir} (max_tokens_per_forward={budget}, "
            f"forward_overhead_tokens={overhead})"
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        # Per accepted request: (index, first row, batch size, seq_len, mask, wants hidden, wants pooled).
        accepted: list[tuple[int, int, int, int, np.ndarray, bool, bool]] = []
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for index, request in enumerate(requests):
            try:
                ids, mask, types = read_request(request)
                problem = self.encoder.check_row_inputs(ids, mask, types)
                if problem is not None:
                    responses[index] = error_response(problem)
                    continue
                wanted = set(request.requested_output_names())
                if types is None:
                    types = np.zeros_like(ids)
                mask = (mask != 0).astype(np.int64)
                accepted.append(
                    (
                        index,
                        len(rows),
                        ids.shape[0],
                        ids.shape[1],
                        mask,
                        "last_hidden_state" in wanted,
                        "sentence_embedding" in wanted,
                    )
                )
                rows.extend(zip(ids, mask, types, strict=True))
            except Exception as exc:  # noqa: BLE001 - one bad request must not fail its batch mates
                responses[index] = error_response(f"invalid request: {exc}")
        if accepted:
            try:
                want_hidden = any(entry[5] for entry in accepted)
                hidden, pooled = self.encoder.encode(rows, want_hidden)
                for index, first, batch, seq_len, mask, wants_hidden, wants_pooled in accepted:
                    outputs = []
                    if wants_hidden:
                        full = np.zeros((batch, seq_len, self.encoder.hidden_size), dtype=np.float32)
                        for offset in range(batch):
                            states = hidden[first + offset]
                            if states is not None:
                                full[offset, : states.shape[0]] = states
                        # Holes inside the effective length (non-contiguous masks) are zeroed too.
                        full *= mask[:, :, None].astype(np.float32)
                        outputs.append(pb_utils.Tensor("last_hidden_state", full))
                    if wants_pooled:
                        outputs.append(pb_utils.Tensor("sentence_embedding", pooled[first : first + batch]))
                    responses[index] = pb_utils.InferenceResponse(output_tensors=outputs)
            except Exception as exc:  # noqa: BLE001 - report instead of taking the stub down
                pb_utils.Logger.log_error(f"encoder forward failed: {exc!r}")
                for entry in accepted:
                    responses[entry[0]] = error_response(f"encoder forward failed: {exc}")
        return responses

    def finalize(self) -> None:
        self.encoder = None  # type: ignore[assignment]
