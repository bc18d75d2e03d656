"""`plan_chunks` of the MiniLM Triton models: how merged rows are cut into padded forward passes."""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from typing import Any

import pytest

from tests.helpers import REPO

MODEL_FILES = {
    "all-minilm-l6-v2": REPO / "triton_models" / "all-minilm-l6-v2" / "1" / "model.py",
    "minilm-rerank": REPO / "triton_models" / "minilm-rerank" / "1" / "model.py",
}


@pytest.fixture(scope="module", params=sorted(MODEL_FILES))
def model_module(request: pytest.FixtureRequest) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    name = f"planner_{request.param.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, MODEL_FILES[request.param])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # model.py imports the Python backend's utilities, which only exist inside Triton's stub.
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
        spec.loader.exec_module(module)
    return module


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


def test_both_models_plan_alike() -> None:
    sources = {name: path.read_text() for name, path in MODEL_FILES.items()}
    bodies = {
        name: src[src.index("def plan_chunks(") : src.index("class MiniLMEncoder")] for name, src in sources.items()
    }
    assert bodies["all-minilm-l6-v2"] == bodies["minilm-rerank"]
