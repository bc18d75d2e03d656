"""The MiniLM Triton models' encoder (triton_models/all-minilm-l6-v2/1/minilm_encoder.py): `plan_chunks`, how merged
rows are cut into padded forward passes, and `Bert`, the forward pass in plain torch, against transformers' own
BertModel as the oracle."""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import MODELS, REPO

ENCODER_DIR = REPO / "triton_models" / "all-minilm-l6-v2" / "1"
WEIGHTS = MODELS / "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def model_module() -> Any:
    pytest.importorskip("torch")
    sys.path.insert(0, str(ENCODER_DIR))
    try:
        import minilm_encoder
    finally:
        sys.path.remove(str(ENCODER_DIR))
    return minilm_encoder


def padded(lengths: list[int], chunks: list[list[int]]) -> int:
    return sum(len(chunk) * lengths[chunk[0]] for chunk in chunks)


def test_every_row_once_longest_first_within_the_cap(model_module: Any) -> None:
    rng = random.Random(3)
    for _ in range(500):
        lengths = [rng.choice([0, rng.randint(1, 512)]) for _ in range(rng.randint(0, 70))]
        cap = rng.choice([64, 512, 2048, 8192])
        chunks = model_module.plan_chunks(lengths, cap, rng.choice([0, 24, 1000]))
        assert sorted(row for chunk in chunks for row in chunk) == [i for i, n in enumerate(lengths) if n > 0]
        for chunk in chunks:
            assert all(lengths[chunk[0]] >= lengths[row] for row in chunk)
            assert len(chunk) == 1 or len(chunk) * lengths[chunk[0]] <= cap


def test_mixed_short_texts_are_cut_where_padding_costs_more_than_a_forward(model_module: Any) -> None:
    # 32 texts of 11..33 tokens, as the embeddings benchmark sends them.
    rng = random.Random(7)
    lengths = [rng.randint(11, 33) for _ in range(32)]
    chunks = model_module.plan_chunks(lengths, 8192, 24)
    one_forward = len(lengths) * max(lengths)
    assert padded(lengths, chunks) + 24 * len(chunks) < one_forward + 24
    assert padded(lengths, chunks) < 1.15 * sum(lengths)
    assert len(chunks) <= 6


def test_equal_lengths_stay_one_forward_and_overhead_zero_means_no_padding(model_module: Any) -> None:
    assert model_module.plan_chunks([20] * 64, 8192, 24) == [list(range(64))]
    lengths = [5, 9, 9, 5, 7]
    chunks = model_module.plan_chunks(lengths, 8192, 0)
    assert padded(lengths, chunks) == sum(lengths)


def test_the_forward_pass_is_transformers_bert_model_to_the_bit(model_module: Any) -> None:
    """Rows padded or not, token types mixed, up to the 512 positions: the hidden states at real positions are
    what transformers' BertModel (SDPA attention, the default) computes from the same checkpoint."""
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch

    if not (WEIGHTS / "model.safetensors").exists():
        pytest.skip(f"no MiniLM weights in {WEIGHTS} (scripts/setup.sh)")
    torch.set_num_threads(1)
    ours = model_module.Bert(WEIGHTS)
    oracle = transformers.AutoModel.from_pretrained(str(WEIGHTS)).eval()
    rng = np.random.default_rng(0)
    for batch, length, padded_rows in [(1, 7, False), (3, 20, True), (5, 64, True), (2, 512, True), (4, 33, False)]:
        ids = torch.from_numpy(rng.integers(0, ours.vocab_size, (batch, length)))
        mask = torch.ones(batch, length, dtype=torch.long)
        if padded_rows:
            for row in range(batch):
                mask[row, int(rng.integers(1, length + 1)):] = 0
        types = torch.from_numpy(rng.integers(0, 2, (batch, length)))
        with torch.inference_mode():
            got = ours(ids, mask, types)
            want = oracle(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        real = mask.bool()
        assert torch.equal(got[real], want[real]), (batch, length, (got - want)[real].abs().max().item())


def test_the_encoder_does_not_import_transformers() -> None:
    """What the module is for: a MiniLM stub starts without transformers' ~2 CPU-s of imports."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import minilm_encoder; "
            "print('transformers' in sys.modules, 'torch.distributed.tensor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(ENCODER_DIR)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.split() == ["False", "False"]
