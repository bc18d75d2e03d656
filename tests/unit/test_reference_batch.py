"""The SmolLM2 reference engine's batched decode step (triton_models/smollm2-135m-instruct/1/smollm2_batch.py),
against Hugging Face's own forward pass of the same model (a small random Llama with grouped-query attention, as
SmolLM2's): a batch of one is bit-identical to it, step after step; in a batch, every job's logits and KV cache match
its own forward pass and each job's cache grows by its one token."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.helpers import reference_module

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

batch = reference_module("smollm2_batch")


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def prefilled(model: Any, tokens: list[int]) -> tuple[Any, int]:
    """A job after its prefill: its cache and its first sampled (greedy) token."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([tokens]), use_cache=True, logits_to_keep=1)
    return out.past_key_values, int(out.logits[0, -1].argmax())


def reference_step(model: Any, cache: Any, token: int) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                     logits_to_keep=1).logits[0, -1].float()


def test_a_batch_of_one_is_the_models_own_forward_pass_bit_for_bit(model: Any) -> None:
    cache, token = prefilled(model, [5, 17, 3, 88, 41, 9, 60])
    theirs, ours = copy.deepcopy(cache), copy.deepcopy(cache)
    a = b = token
    for _ in range(12):
        expected = reference_step(model, theirs, a)
        with torch.inference_mode():
            got = batch.decode_step(model, [b], [ours])
        assert got.shape == (1, 97) and torch.equal(got[0], expected)
        a, b = int(expected.argmax()), int(got[0].argmax())
    assert ours.get_seq_length() == theirs.get_seq_length() == 7 + 12
    for mine, ref in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(mine.keys, ref.keys) and torch.equal(mine.values, ref.values)


def test_jobs_of_different_lengths_in_one_batch_each_get_their_own_step(model: Any) -> None:
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7] * 30, [90, 3]]
    jobs = [prefilled(model, p) for p in prompts]
    expected = [reference_step(model, copy.deepcopy(c), t) for c, t in jobs]
    caches = [copy.deepcopy(c) for c, _ in jobs]
    with torch.inference_mode():
        got = batch.decode_step(model, [t for _, t in jobs], caches)
    assert got.shape == (4, 97)
    for i, (prompt, cache) in enumerate(zip(prompts, caches, strict=True)):
        # The same maths in another summation order (a batch's matrix products): equal to float precision.
        torch.testing.assert_close(got[i], expected[i], rtol=1e-4, atol=1e-4)
        assert int(got[i].argmax()) == int(expected[i].argmax())
        assert cache.get_seq_length() == len(prompt) + 1
        ref = copy.deepcopy(jobs[i][0])
        reference_step(model, ref, jobs[i][1])
        for mine, theirs in zip(cache.layers, ref.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-4)
