"""`bench.priority_sim`: the modelled engine stepped in simulated time (the oracle is plan_step's arithmetic done by
hand, not the simulator)."""

from __future__ import annotations

import pytest

from bench.priority_sim import Engine, Load, simulate


def test_a_chat_alone_waits_for_its_own_prefill_step_only() -> None:
    # One 1,530-token prompt fits the 2,048-token budget: one step of 6 ms + 0.08 ms (it emits) + 1,530 x 0.015 ms.
    res = simulate(Engine(), Load(rate=0.2), 0, 60.0)
    assert res.ttft and min(res.ttft) == pytest.approx(0.006 + 0.00008 + 1530 * 0.000015)
    assert res.batch_tokens == 0


def test_the_job_alone_emits_every_line_s_tokens() -> None:
    # One line at a time: 1,030 prompt tokens in one step (its first token), then 127 decode steps of 6.08 ms; the
    # next line enters 1 ms after. So a line is 128 tokens per (6.08 + 15.45) + 127 x 6.08 + 1 ms.
    line_s = (0.006 + 0.00008 + 1030 * 0.000015) + 127 * (0.006 + 0.00008) + 0.001
    res = simulate(Engine(), Load(), 1, 100 * line_s, chats=False)
    assert res.batch_tokens == pytest.approx(100 * 128, abs=128)


def test_holding_batch_starts_while_a_chat_waits_lowers_the_chats_tail() -> None:
    free = simulate(Engine(), Load(), 16, 120.0, seed=3)
    held = simulate(Engine(), Load(), 16, 120.0, hold=True, seed=3)
    assert len(free.ttft) == len(held.ttft)
    assert held.q(0.99) < free.q(0.99) and held.q(0.9) < free.q(0.9)


def test_one_batch_start_at_a_time_lowers_the_tail_at_the_same_throughput() -> None:
    held = simulate(Engine(), Load(), 24, 120.0, hold=True, seed=3)
    staggered = simulate(Engine(), Load(), 24, 120.0, hold=True, seed=3, starts_limit=1)
    assert len(staggered.ttft) == len(held.ttft)
    assert staggered.q(0.99) < held.q(0.99)
    assert staggered.batch_tokens >= 0.97 * held.batch_tokens


def test_the_starts_limit_keeps_one_line_without_its_first_token() -> None:
    # No chats, 8 lines allowed in flight, one starting at a time: each line's prompt is prefilled in a step of its
    # own, so in the first steps the lines enter one per step (the next after the previous one's first token).
    res = simulate(Engine(), Load(), 8, 0.2, chats=False, starts_limit=1)
    free = simulate(Engine(), Load(), 8, 0.2, chats=False)
    assert 0 < res.batch_tokens < free.batch_tokens
