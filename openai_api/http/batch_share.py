"""The adaptive batch share (`--batch-share-adaptive`): how much of one model's in-flight limit the batch class may
fill now, widened while the interactive class's time to first token stays near its unloaded level and narrowed
as soon as it rises.

A static `--batch-slot-share` trades one against the other once and for all: a small share keeps the interactive
latency but leaves capacity idle, a large one uses it but slows every interactive request (each sequence in an
engine's batch lengthens its steps, and the batch's own requests take the gateway's and Triton's CPU). The right
share depends on the engine, the model, the prompts and the machine, so the gateway measures it:

* **Signal**: the interactive class's time to first token, from the request's arrival at the gateway to its first
  token (what the user waits for: the engine's step, Triton's and the gateway's queues and CPU all in it), as the
  `quantile` (`--batch-ttft-quantile`) of a window (at least `min_samples` requests and `window_s` seconds),
  against the same quantile of the baseline (`within`). 0.5 (the median) is robust to one long prompt but blind to
  the tail: on an engine whose prompts cost their prefill, a batch prompt's prefill in the step an interactive
  request lands in delays a few requests a lot and most not at all - at a static share of 0.5 the median rose
  1.1-1.2x and the p99 1.7-1.9x (bench/results/priority-batch-2026-12-08-realistic*). 0.99 guards the p99: a
  window (~20 requests) passes only if none of them took more than `target` x the baseline's p99, so any such miss
  narrows the share; by the arithmetic of the additive increase (one slot) and multiplicative decrease (a quarter),
  the share settles where about one window in 1 + S/4 misses (S the batch's slots): ~1% of requests at S = 16.
  Measured, it did not beat the median's control on that engine (runs differed more than the two did), so 0.5
  stays the default (docs/guides/batches.md).
* **Baseline**: the median of the last `BASELINE_SAMPLES` interactive first tokens that came while the batch class
  held no slot of the model (its unloaded level). Without one yet (a job started before any interactive traffic
  was seen alone), the share stays at its floor, which must be safe on its own.
* **Control** (additive increase, multiplicative decrease, as TCP's congestion window): each window whose median
  is at most `target` x the baseline widens the share by one slot, up to `--batch-slot-share`; one above it cuts the
  share by a quarter, down to `--batch-share-min`. A window without interactive requests for `idle_s` widens it too
  (nobody to protect; the scheduler wakes at that moment while batch work waits, `idle_due`); the first window of
  their return narrows it again.

Generations in flight cannot be taken back: a narrowed share holds back new batch lines only, so the batch's slots
shrink as its lines end (a line's length at most). Event-loop only; `clock` is injectable for the unit tests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

BASELINE_SAMPLES = 256
MIN_BASELINE = 16
DECREASE = 0.75


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile: the smallest value with at least `q` of `values` at or below it (0.99 of 20
    values is the largest; 0.5 of 4 is the second)."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def within(window: Sequence[float], baseline: Sequence[float], target: float, q: float) -> bool:
    """Whether a window of loaded first tokens meets the target: its `q` quantile at most `target` x the baseline's
    (the unloaded level's) `q` quantile."""
    return quantile(window, q) <= target * quantile(baseline, q)


class AdaptiveShare:
    """One model's adaptive batch share (module docstring). `slot`: one slot as a share of the model's limit."""

    def __init__(self, floor: float, ceiling: float, slot: float, *, target: float = 1.1, window_s: float = 2.0,
                 min_samples: int = 16, idle_s: float = 10.0, quantile: float = 0.5,
                 clock: Callable[[], float]) -> None:
        self.floor = min(floor, ceiling)
        self.quantile = quantile
        self.ceiling = ceiling
        self.slot = slot
        self.target = target
        self.window_s = window_s
        self.min_samples = min_samples
        self.idle_s = idle_s
        self.clock = clock
        self.share = self.floor
        self.baseline: deque[float] = deque(maxlen=BASELINE_SAMPLES)
        self.window: list[float] = []
        self.window_start = clock()
        self.last_sample = float("-inf")
        self.decisions = 0  # windows judged (for the tests and the debug log)

    def observe(self, ttft_s: float, unloaded: bool) -> bool:
        """One interactive first token; `unloaded`: the batch class held no slot of the model. True when the
        share widened (queued batch work may start)."""
        now = self.clock()
        self.last_sample = now
        if unloaded:
            self.baseline.append(ttft_s)
            return False
        self.window.append(ttft_s)
        return self.step(now)

    def idle_due(self) -> float | None:
        """When `step` will widen the share for want of interactive requests if none comes first (`idle_s` after
        the last one, at the end of a window); None at the ceiling. Nothing else happens then - no request
        arrives, no slot is freed - so the scheduler wakes itself at this moment (`Scheduler._arm_idle`)."""
        if self.share >= self.ceiling:
            return None
        return max(self.window_start + self.window_s, self.last_sample + self.idle_s)

    def step(self, now: float | None = None) -> bool:
        """Judge the window when it is due; True when the share widened."""
        now = self.clock() if now is None else now
        if now - self.window_start < self.window_s:
            return False
        before = self.share
        if len(self.window) >= self.min_samples:
            if len(self.baseline) >= MIN_BASELINE:
                if within(self.window, self.baseline, self.target, self.quantile):
                    self.share = min(self.ceiling, self.share + self.slot)
                else:
                    self.share = max(self.floor, self.share * DECREASE)
                self.decisions += 1
        elif now - self.last_sample >= self.idle_s:
            self.share = min(self.ceiling, self.share + self.slot)
        else:
            return False  # too few interactive requests yet to judge: the window stays open
        self.window = []
        self.window_start = now
        return self.share > before
