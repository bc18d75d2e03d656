"""The arithmetic of the board's metrics (issue #27), as small pure functions over recorded samples.

The public gateway board ("onthebench") compares gateways by what they *add* to a paced upstream:

* added latency: a figure (p50, p99) of the gateway's samples minus the same figure of the bare
  client's samples on the same upstream (percentiles are taken per side, then subtracted: the two
  sides' requests are not paired one to one);
* inter-token latency: the gaps between consecutive token arrivals of one stream (the first token's
  wait is TTFT, not a gap);
* stall-free streams: a level of N concurrent paced streams passes when every stream got all its
  tokens and no gap between two tokens exceeded ``factor`` x the pacing; the figure is the largest
  level of an increasing ladder that passed with every level below it passing too;
* CPU accounting: CPU seconds of the measured processes over a window, per unit (request, token),
  in microseconds.

No I/O and no clocks here: ``bench.board`` records the samples, these functions reduce them, and
``tests/unit/test_bench_board.py`` checks them on recorded samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks (numpy's default);
    NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50, p99, mean and count of samples already in milliseconds."""
    return {
        "p50_ms": round(percentile(samples_ms, 50), 4),
        "p99_ms": round(percentile(samples_ms, 99), 4),
        "mean_ms": round(sum(samples_ms) / len(samples_ms), 4) if samples_ms else math.nan,
        "n": len(samples_ms),
    }


def added_ms(side_ms: Sequence[float], bare_ms: Sequence[float]) -> dict[str, float]:
    """What a side adds to the bare client: its p50 and p99 minus the bare client's, in ms."""
    return {
        "p50_ms": round(percentile(side_ms, 50) - percentile(bare_ms, 50), 4),
        "p99_ms": round(percentile(side_ms, 99) - percentile(bare_ms, 99), 4),
    }


def gaps_ms(arrivals_s: Sequence[float]) -> list[float]:
    """Inter-token gaps of one stream, in ms, from the arrival times (seconds) of its tokens in order.
    Tokens that arrived in one read share a time and give a gap of 0."""
    return [(b - a) * 1000.0 for a, b in itertools.pairwise(arrivals_s)]


@dataclass(frozen=True)
class StreamVerdict:
    """One paced stream judged: tokens received, tokens lost, its largest gap, whether it stalled."""

    tokens: int
    lost: int
    max_gap_ms: float
    stalled: bool


def judge_stream(arrivals_s: Sequence[float], expected: int, pacing_ms: float, factor: float = 2.0) -> StreamVerdict:
    """A stream stalls when a gap between two of its tokens exceeds ``factor`` x ``pacing_ms``, or when
    fewer than ``expected`` tokens arrived (a lost token, a cut stream or an error all count)."""
    gaps = gaps_ms(arrivals_s)
    worst = max(gaps, default=0.0)
    lost = max(0, expected - len(arrivals_s))
    return StreamVerdict(len(arrivals_s), lost, round(worst, 3), worst > factor * pacing_ms or lost > 0)


def level_passes(verdicts: Sequence[StreamVerdict], streams: int, errors: int = 0) -> bool:
    """A level of ``streams`` concurrent streams passes when all of them ran (a verdict each), none
    stalled and no request failed."""
    return errors == 0 and len(verdicts) == streams and not any(v.stalled for v in verdicts)


def stall_free(levels: Mapping[int, bool]) -> int:
    """The largest stream count that passed with every smaller tried count passing too (0 if the first
    failed). ``levels``: stream count -> passed."""
    best = 0
    for n in sorted(levels):
        if not levels[n]:
            break
        best = n
    return best


def cpu_us_per_unit(before: Mapping[str, float], after: Mapping[str, float], key: str, units: int) -> float:
    """Microseconds of CPU the ``key`` processes spent per unit between two samples of CPU seconds by
    process name; NaN when no unit was counted."""
    if units <= 0:
        return math.nan
    return round((after[key] - before[key]) * 1e6 / units, 2)
