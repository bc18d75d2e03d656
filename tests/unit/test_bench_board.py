"""The board metrics' arithmetic (bench/board_metrics.py) on recorded samples: added latency, stall
detection and CPU accounting. The expected values are worked out by hand from the samples."""

from __future__ import annotations

import math

from bench.board_metrics import (
    StreamVerdict,
    added_ms,
    cpu_us_per_unit,
    gaps_ms,
    judge_stream,
    level_passes,
    percentile,
    stall_free,
    summary_ms,
)

# Recorded c=1 non-streamed latencies (ms), 2-token requests on the 20 ms-paced synthetic model.
BARE_MS = [20.61, 20.58, 20.73, 20.66, 20.59, 20.70, 20.64, 20.62, 20.68, 21.90]
GATEWAY_MS = [21.72, 21.65, 21.80, 21.70, 21.69, 21.77, 21.74, 21.66, 21.71, 24.10]


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    # rank (10 - 1) * 0.99 = 8.91: 0.91 of the way from the 9th to the 10th sorted value
    assert math.isclose(percentile(BARE_MS, 99), 20.73 + 0.91 * (21.90 - 20.73))
    assert math.isnan(percentile([], 50))


def test_added_latency_subtracts_each_sides_percentile() -> None:
    # sorted medians: bare (20.64 + 20.66) / 2 = 20.65, gateway (21.71 + 21.72) / 2 = 21.715
    got = added_ms(GATEWAY_MS, BARE_MS)
    assert math.isclose(got["p50_ms"], 1.065, abs_tol=1e-4)
    p99 = (21.80 + 0.91 * (24.10 - 21.80)) - (20.73 + 0.91 * (21.90 - 20.73))
    assert math.isclose(got["p99_ms"], p99, abs_tol=1e-4)
    assert added_ms(BARE_MS, BARE_MS) == {"p50_ms": 0.0, "p99_ms": 0.0}
    assert summary_ms(BARE_MS)["n"] == 10


# Arrival times (s) of a 6-token stream paced at 20 ms, as recorded: the 4th gap is a 47 ms stall.
STALLED = [10.000, 10.0201, 10.0399, 10.0602, 10.1072, 10.1270]
# ... and a clean one whose 3rd and 4th tokens came in one read (same time: a gap of 0)
CLEAN = [3.000, 3.0203, 3.0398, 3.0398, 3.0797, 3.0997]


def test_gaps_are_between_consecutive_tokens() -> None:
    got = gaps_ms(STALLED)
    want = [20.1, 19.8, 20.3, 47.0, 19.8]
    assert len(got) == 5 and all(math.isclose(g, w, abs_tol=1e-6) for g, w in zip(got, want, strict=True))
    assert gaps_ms([1.0]) == [] and gaps_ms([]) == []


def test_a_gap_over_twice_the_pacing_is_a_stall() -> None:
    v = judge_stream(STALLED, expected=6, pacing_ms=20.0)
    assert v == StreamVerdict(tokens=6, lost=0, max_gap_ms=47.0, stalled=True)
    clean = judge_stream(CLEAN, expected=6, pacing_ms=20.0)
    assert clean == StreamVerdict(tokens=6, lost=0, max_gap_ms=39.9, stalled=False)  # 39.9 ms <= 2 x 20 ms
    assert judge_stream(CLEAN, expected=6, pacing_ms=20.0, factor=1.5).stalled is True


def test_a_lost_token_is_a_stall_even_without_a_gap() -> None:
    v = judge_stream(CLEAN[:5], expected=6, pacing_ms=20.0)
    assert v.lost == 1 and v.stalled
    assert judge_stream([], expected=64, pacing_ms=20.0) == StreamVerdict(0, 64, 0.0, True)


def test_a_level_passes_only_with_every_stream_clean_and_no_error() -> None:
    ok = StreamVerdict(64, 0, 21.0, False)
    bad = StreamVerdict(64, 0, 45.0, True)
    assert level_passes([ok, ok], streams=2)
    assert not level_passes([ok, bad], streams=2)
    assert not level_passes([ok], streams=2)  # a stream that never reported is lost
    assert not level_passes([ok, ok], streams=2, errors=1)


def test_stall_free_is_the_last_level_of_an_unbroken_run_of_passes() -> None:
    assert stall_free({1: True, 2: True, 4: True, 8: False, 16: True}) == 4
    assert stall_free({1: True, 2: True, 4: True}) == 4
    assert stall_free({1: False, 2: True}) == 0
    assert stall_free({}) == 0


def test_cpu_per_unit_is_the_window_difference_over_units() -> None:
    before = {"gateway": 12.50, "triton": 3.0}
    after = {"gateway": 12.83, "triton": 3.1}
    assert cpu_us_per_unit(before, after, "gateway", 300) == 1100.0  # 0.33 s over 300 requests
    assert cpu_us_per_unit(before, after, "triton", 4000) == 25.0
    assert math.isnan(cpu_us_per_unit(before, after, "gateway", 0))
