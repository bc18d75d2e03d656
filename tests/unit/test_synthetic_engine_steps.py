"""`plan_step` of the synthetic LLM's prefill cost model (triton_models/synthetic-llm/1/synthetic_engine.py): what one
engine step holds and costs (chunked prefill)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.helpers import REPO

MODEL_DIR = REPO / "triton_models" / "synthetic-llm" / "1"


@pytest.fixture(scope="module")
def engine() -> Any:
    # The model's folder is no package (Triton puts it on sys.path); the cost model imports nothing of Triton's.
    sys.path.insert(0, str(MODEL_DIR))
    try:
        import synthetic_engine
    finally:
        sys.path.remove(str(MODEL_DIR))
    return synthetic_engine


def test_decodes_first_then_prompts_in_arrival_order_within_the_budget(engine: Any) -> None:
    # Two decoding requests take 2 of the 100 tokens; the first prompt (60) fits, the second gets the last 38.
    seconds, chunks = engine.plan_step([0, 60, 0, 500], 100, 0.010, 0.001, 0.0001)
    assert chunks == [0, 60, 0, 38]
    # Emitting: the two decodes and the prompt that finished (3); 98 prompt tokens.
    assert seconds == pytest.approx(0.010 + 3 * 0.001 + 98 * 0.0001)


def test_a_long_prompt_spans_steps_and_emits_when_it_ends(engine: Any) -> None:
    left, steps = [2500], 0
    while True:
        _, (chunk,) = engine.plan_step(left, 1024, 0.0, 0.0, 0.0)
        steps += 1
        if chunk == left[0]:
            break
        left = [left[0] - chunk]
    assert steps == 3  # 1024 + 1024 + 452


def test_a_budget_full_of_decodes_leaves_prompts_waiting(engine: Any) -> None:
    seconds, chunks = engine.plan_step([0, 0, 0, 40], 3, 0.005, 0.001, 0.01)
    assert chunks == [0, 0, 0, 0]
    assert seconds == pytest.approx(0.005 + 3 * 0.001)


def test_no_budget_prefills_every_prompt_whole(engine: Any) -> None:
    seconds, chunks = engine.plan_step([1500, 0, 2000], 0, 0.006, 0.0001, 0.000015)
    assert chunks == [1500, 0, 2000]
    assert seconds == pytest.approx(0.006 + 3 * 0.0001 + 3500 * 0.000015)


def test_without_prompts_a_step_is_the_old_decode_step(engine: Any) -> None:
    assert engine.plan_step([0] * 32, 2048, 0.010, 0.0001, 0.5) == (pytest.approx(0.010 + 32 * 0.0001), [0] * 32)
