"""The priority scheduler (openai_api/http/scheduler.py): classes from the request, the key's cap, the queue's order
(class first, round-robin between keys), deadlines with a fake clock, shedding, and the batch class's slot share."""

from __future__ import annotations

import asyncio

import pytest

from openai_api.errors import OverloadedError
from openai_api.http.batch_share import MIN_BASELINE, AdaptiveShare
from openai_api.http.inflight import InFlightLimiter, Ticket
from openai_api.http.scheduler import Scheduler, capped_class, requested_class
from openai_api.quota.keys import KeysFileError, parse_keys


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(per_model: int = 2, queue: int = 8, batch_share: float = 0.5, timeout: float = 60.0,
         ) -> tuple[InFlightLimiter, Scheduler, Clock]:
    lim = InFlightLimiter(100, per_model, 1, {"m"})
    clock = Clock()
    lim.scheduler = Scheduler(lim, max_queue=queue, timeout_s=timeout, shares={"batch": batch_share}, clock=clock)
    return lim, lim.scheduler, clock


def test_class_from_request() -> None:
    assert requested_class("critical", None, None) == "interactive"
    assert requested_class("Sheddable", "priority", -5) == "batch"  # the header wins
    assert requested_class("some-objective", "flex", None) == "batch"  # unknown objective names are ignored
    assert requested_class(None, "priority", None) == "interactive"
    assert requested_class(None, "auto", 5) == "standard"
    assert requested_class(None, None, -1) == "interactive"
    assert requested_class(None, None, 0) == "standard"
    assert requested_class(None, None, 3) == "batch"
    assert requested_class(None, None, True) is None  # a bool is no vLLM priority
    assert requested_class(None, "scale", None) is None


def test_key_caps_the_class() -> None:
    assert capped_class("interactive", "standard", "standard") == "standard"
    assert capped_class(None, "batch", "interactive") == "batch"
    assert capped_class("batch", "standard", "standard") == "batch"  # less urgent is always allowed


def test_keys_file_classes() -> None:
    table = parse_keys({"keys": [{"name": "jobs", "secret_sha256": "a" * 64, "max_class": "standard",
                                  "default_class": "batch"}]}, "k.yaml")
    assert table.policies["jobs"].max_class == "standard"
    assert table.policies["jobs"].default_class == "batch"
    with pytest.raises(KeysFileError, match="default_class"):
        parse_keys({"keys": [{"name": "x", "secret_sha256": "a" * 64, "max_class": "batch",
                              "default_class": "interactive"}]}, "k.yaml")


async def _enter(lim: InFlightLimiter, cls: str, key: str, log: list[str], tag: str) -> Ticket:
    t = Ticket(lim)
    await t.acquire("m", 1, "n", 1.0, cls, key)  # type: ignore[arg-type]
    log.append(tag)
    return t


async def test_queue_orders_by_class_then_round_robin_between_keys() -> None:
    lim, sched, _ = make(per_model=2, batch_share=1.0)
    holders = [Ticket(lim), Ticket(lim)]
    for h in holders:
        await h.acquire("m", 1, "n", 1.0, "standard", "x")
    log: list[str] = []
    tasks = [asyncio.create_task(_enter(lim, cls, key, log, tag)) for cls, key, tag in [
        ("batch", "b", "b1"), ("standard", "a", "a1"), ("standard", "a", "a2"), ("standard", "a", "a3"),
        ("standard", "c", "c1"), ("interactive", "z", "z1")]]
    await asyncio.sleep(0)
    assert sched.waiting == 6
    seen: set[int] = set()
    for _ in range(6):  # one slot freed at a time: the next waiter in order takes it
        holders.pop(0).release()
        await asyncio.sleep(0)
        for t in tasks:
            if t.done() and id(t) not in seen:
                seen.add(id(t))
                holders.append(t.result())
    assert log == ["z1", "a1", "c1", "a2", "a3", "b1"]


async def test_deadline_refuses_with_retry_after() -> None:
    lim, sched, clock = make(per_model=1)
    holder = Ticket(lim)
    await holder.acquire("m", 1, "n", 1.0, "standard", "x")
    waiting = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "standard", "y"))
    await asyncio.sleep(0)
    clock.now += 59
    assert sched.expire() == 0
    clock.now += 2
    assert sched.expire() == 1
    with pytest.raises(OverloadedError) as e:
        await waiting
    assert e.value.status == 429 and e.value.headers == {"Retry-After": "1"}
    assert sched.waiting == 0
    holder.release()
    assert lim.per_model["m"] == 0


async def test_full_queue_sheds_lowest_class_first() -> None:
    lim, _, _ = make(per_model=1, queue=2, batch_share=1.0)
    holder = Ticket(lim)
    await holder.acquire("m", 1, "n", 1.0, "standard", "x")
    b1 = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "b"))
    s1 = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "standard", "s"))
    await asyncio.sleep(0)
    i1 = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "interactive", "i"))  # sheds b1
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError, match="shed"):
        await b1
    with pytest.raises(OverloadedError, match="full"):  # nothing below batch to shed: the arrival is refused
        await Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "b")
    holder.release()
    await asyncio.sleep(0)
    assert i1.done() and not s1.done()


async def test_batch_share_keeps_slots_for_interactive() -> None:
    lim, _, _ = make(per_model=4, queue=0, batch_share=0.5)
    batch = [Ticket(lim) for _ in range(2)]
    for t in batch:
        await t.acquire("m", 1, "n", 1.0, "batch", "job")
    with pytest.raises(OverloadedError):  # batch may hold half the model's slots, no more
        await Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job")
    inter = [Ticket(lim) for _ in range(2)]
    for t in inter:  # the interactive class finds the other half free, at once
        await t.acquire("m", 1, "n", 1.0, "interactive", "chat")
    assert lim.per_model["m"] == 4


async def test_no_overtaking_and_cancelled_waiter_leaves_queue() -> None:
    lim, sched, _ = make(per_model=1)
    holder = Ticket(lim)
    await holder.acquire("m", 1, "n", 1.0, "standard", "x")
    waiting = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "standard", "y"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    assert sched.waiting == 0
    holder.release()
    assert lim.per_model["m"] == 0


async def test_without_queue_the_answer_is_an_immediate_429() -> None:
    lim, _, _ = make(per_model=1, queue=0)
    await Ticket(lim).acquire("m", 1, "n", 1.0, "interactive", "x")
    with pytest.raises(OverloadedError, match="maximum of 1"):
        await Ticket(lim).acquire("m", 1, "n", 1.0, "interactive", "x")


async def test_the_queue_is_a_gauge_per_model_and_class() -> None:
    from openai_api.observability import Metrics

    metrics = Metrics()
    lim = InFlightLimiter(100, 1, 1, {"m"}, metrics=metrics)
    lim.scheduler = Scheduler(lim, max_queue=4, timeout_s=60)

    def queued(cls: str) -> float | None:
        return metrics.registry.get_sample_value("openai_api_queued_requests", {"model": "m", "class": cls})

    holder = Ticket(lim)
    await holder.acquire("m", 1, "n", 1.0, "standard", "x")
    waiting = [asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "b")) for _ in range(2)]
    await asyncio.sleep(0)
    assert queued("batch") == 2
    waiting[0].cancel()
    holder.release()  # the other one gets the slot
    await asyncio.sleep(0)
    assert queued("batch") == 0 and waiting[1].done()


# --- the adaptive batch share (openai_api/http/batch_share.py) ----------------------------------------------------
def _share(clock: Clock, **kw: float) -> AdaptiveShare:
    opts: dict[str, float] = {"target": 1.1, "window_s": 2.0, "min_samples": 4, "idle_s": 10.0, "quantile": 0.5,
                              **kw}
    return AdaptiveShare(0.25, 1.0, 0.125, clock=clock, target=opts["target"], window_s=opts["window_s"],
                         min_samples=int(opts["min_samples"]), idle_s=opts["idle_s"], quantile=opts["quantile"])


def _window(g: AdaptiveShare, clock: Clock, ttft: float, n: int = 4) -> None:
    """`n` loaded first tokens spread over one window."""
    for _ in range(n):
        clock.now += g.window_s / n
        g.observe(ttft, unloaded=False)


def test_adaptive_share_holds_its_floor_without_a_baseline() -> None:
    clock = Clock()
    g = _share(clock)
    for _ in range(5):
        _window(g, clock, 0.010)
    assert g.share == 0.25 and g.decisions == 0  # no unloaded level known: nothing to compare with


def test_adaptive_share_widens_while_ttft_stays_near_baseline_and_cuts_when_it_rises() -> None:
    clock = Clock()
    g = _share(clock)
    for _ in range(MIN_BASELINE):
        g.observe(0.010, unloaded=True)
    _window(g, clock, 0.0105)  # within 1.1x: one slot more per window
    assert g.share == 0.375
    for _ in range(10):
        _window(g, clock, 0.0105)
    assert g.share == 1.0  # capped by the ceiling (--batch-slot-share)
    _window(g, clock, 0.012)  # 1.2x: a quarter off
    assert g.share == 0.75
    for _ in range(10):
        _window(g, clock, 0.050)
    assert g.share == 0.25  # never below the floor
    assert g.decisions == 22


def test_adaptive_share_window_needs_time_and_samples() -> None:
    clock = Clock()
    g = _share(clock, min_samples=4)
    for _ in range(MIN_BASELINE):
        g.observe(0.010, unloaded=True)
    for _ in range(8):  # many samples within one window's time: judged once, when the time is up
        g.observe(0.010, unloaded=False)
    assert g.share == 0.25
    clock.now += 2.5
    g.observe(0.010, unloaded=False)
    assert g.share == 0.375 and not g.window
    clock.now += 3.0
    g.observe(0.010, unloaded=False)  # time is up but only one sample: the window stays open
    assert g.share == 0.375 and len(g.window) == 1


def test_adaptive_share_widens_while_no_interactive_request_comes() -> None:
    clock = Clock()
    g = _share(clock)
    clock.now += 1
    assert not g.step() and g.share == 0.25  # within a window: nothing judged
    clock.now += 1.5
    assert g.step() and g.share == 0.375  # no interactive request ever: nobody to protect
    g.observe(0.01, unloaded=False)
    clock.now += 3
    assert not g.step()  # one came 3 s ago: not idle, and too few samples to judge
    clock.now += 8
    assert g.step() and g.share == 0.5  # 11 s without one: idle again


async def test_scheduler_adaptive_share_limits_batch_and_widens_into_the_queue() -> None:
    lim = InFlightLimiter(100, 8, 1, {"m"})
    clock = Clock()
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, clock=clock,
                                      adaptive={"floor": 0.25, "target": 1.1, "window_s": 1.0, "min_samples": 2})
    for _ in range(MIN_BASELINE):  # interactive alone first: its unloaded level
        sched.observe_ttft("m", 0.010)
    batch = [Ticket(lim) for _ in range(2)]
    for t in batch:  # the floor: 2 of 8 slots
        await t.acquire("m", 1, "n", 1.0, "batch", "job")
    assert sched.batch_held["m"] == 2
    queued = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.sleep(0)
    assert sched.waiting == 1
    for _ in range(2):  # a healthy window with the batch running: one slot more, and the waiter takes it
        clock.now += 0.5
        sched.observe_ttft("m", 0.0105)
    await asyncio.sleep(0)
    assert queued.done() and sched.batch_held["m"] == 3
    for t in batch:
        t.release()
    assert sched.batch_held["m"] == 1


async def test_scheduler_adaptive_share_widens_when_idle_without_a_release() -> None:
    lim = InFlightLimiter(100, 4, 1, {"m"})
    clock = Clock()
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, clock=clock,
                                      adaptive={"floor": 0.25, "idle_s": 10.0})
    first = Ticket(lim)
    await first.acquire("m", 1, "n", 1.0, "batch", "job")
    queued = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.sleep(0)
    assert not queued.done()
    clock.now += 11  # no interactive request for idle_s: the next look at the share widens it ...
    assert sched.refusal("m", 1, "batch", 1.0) is not None  # (asking is not looking)
    assert sched.advance("m") and sched.refusal("m", 1, "batch", 1.0) is None
    for _ in range(3):  # ... and starts the waiter, though no slot was given back
        await asyncio.sleep(0)
    assert queued.done() and sched.batch_held["m"] == 2


async def test_refusal_decides_and_advance_updates() -> None:
    """Asking (`refusal`) changes nothing, however often and whatever the clock says: the same answer twice, no
    governor made, no window judged, no share moved, no gauge set, nothing dispatched; `advance` makes the move
    (here the idle widening) and only then does the answer change."""
    from openai_api.observability import Metrics

    lim = InFlightLimiter(100, 4, 1, {"m"})
    lim.metrics = Metrics()
    clock = Clock()
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, clock=clock,
                                      adaptive={"floor": 0.25, "idle_s": 10.0})
    metrics = lim.metrics

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("openai_api_batch_slot_share", {"model": "m"})

    assert sched.refusal("m", 1, "batch", 1.0) is None  # the floor's one slot of four, before any governor
    assert not sched.governors and sched.batch_share("m") == 0.25
    await Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job")  # the arrival looks: the governor exists now
    g = sched.governor("m")
    assert g is not None
    queued = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.sleep(0)
    clock.now += 11  # the share is due to widen (idle), and a waiter would take the slot

    def state() -> tuple[object, ...]:
        return g.share, g.window_start, list(g.window), g.decisions, gauge(), sched.waiting, \
            lim.per_model.get("m"), sched.batch_held.get("m")

    before = state()
    answers = [sched.refusal("m", 1, "batch", 1.0) for _ in range(2)]
    assert answers[0] is not None and answers[0] == answers[1] and answers[0][0] == "model_limit"
    assert sched.refusal("m", 1, "interactive", 1.0) is None  # other classes: the share does not apply
    assert state() == before
    for _ in range(3):
        await asyncio.sleep(0)
    assert not queued.done() and state() == before  # nothing was scheduled by asking either
    assert sched.advance("m") and g.share == 0.5 and gauge() == 0.5
    assert [sched.refusal("m", 1, "batch", 1.0) for _ in range(2)] == [None, None]
    for _ in range(3):
        await asyncio.sleep(0)
    assert queued.done() and sched.batch_held["m"] == 2


def test_static_share_has_no_governor() -> None:
    _, sched, _ = make()
    sched.observe_ttft("m", 0.5)
    assert sched.governor("m") is None and not sched.governors


async def test_adaptive_batch_waits_for_interactive_first_tokens() -> None:
    lim = InFlightLimiter(100, 8, 1, {"m"})
    clock = Clock()
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, clock=clock,
                                      adaptive={"floor": 1.0})
    chat, other = Ticket(lim), Ticket(lim)
    await chat.acquire("m", 1, "n", 1.0, "interactive", "c")
    await other.acquire("m", 1, "n", 1.0, "interactive", "c")
    assert sched.awaiting["m"] == 2
    line = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.sleep(0)
    assert not line.done()  # slots are free, but two interactive requests wait for their first token
    sched.first_token(chat, "m", 0.01)
    sched.first_token(chat, "m", 0.01)  # counted once per request
    await asyncio.sleep(0)
    assert not line.done() and sched.awaiting["m"] == 1
    other.release()  # ended without a first token (an error, a client gone): no longer awaited
    await asyncio.sleep(0)
    assert line.done() and sched.awaiting["m"] == 0 and sched.batch_held["m"] == 1
    chat.release()
    assert sched.awaiting["m"] == 0


async def test_static_share_does_not_hold_batch_for_interactive() -> None:
    lim, sched, _ = make(per_model=4, queue=0, batch_share=1.0)
    await Ticket(lim).acquire("m", 1, "n", 1.0, "interactive", "c")
    await Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job")  # no adaptive share: no wait, no count
    assert not sched.awaiting


def test_adaptive_share_idle_due_is_when_step_widens_for_want_of_interactive_requests() -> None:
    clock = Clock()
    g = _share(clock)  # window 2 s, idle 10 s
    assert g.idle_due() == 1002.0  # never an interactive request: the first window's end
    g.observe(0.01, unloaded=False)  # one at 1000
    assert g.idle_due() == 1010.0  # idle_s after it
    clock.now = 1009.9
    assert not g.step()
    clock.now = 1010.0
    assert g.step() and g.share == 0.375
    assert g.idle_due() == 1012.0  # the next window after the widening
    g.share = g.ceiling
    assert g.idle_due() is None  # nothing left to widen


async def test_scheduler_wakes_when_the_idle_share_is_due_with_no_request_and_no_release() -> None:
    """A batch line holds the floor's slot and another waits; no interactive request, no batch arrival, no slot
    given back: the scheduler's own wake at `idle_due` widens the share and starts the waiter."""
    import time

    lim = InFlightLimiter(100, 4, 1, {"m"})
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, clock=time.monotonic,
                                      adaptive={"floor": 0.25, "window_s": 0.05, "idle_s": 0.05})
    holder = Ticket(lim)
    await holder.acquire("m", 1, "n", 1.0, "batch", "job")
    queued = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.wait_for(queued, timeout=5.0)
    assert sched.batch_held["m"] == 2 and sched.batch_share("m") == 0.5
    assert "m" not in sched.idle_timers  # nothing waits: no wake armed
    holder.release()


def test_quantile_is_nearest_rank() -> None:
    from openai_api.http.batch_share import quantile

    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert quantile(values, 0.99) == 5.0 and quantile(values, 1.0) == 5.0  # of 5 values: the largest
    assert quantile(values, 0.01) == 1.0
    assert quantile([float(i) for i in range(1, 257)], 0.99) == 254.0  # 256 baseline samples: the 3rd largest


def test_within_the_median_misses_the_tail_that_the_p99_sees() -> None:
    from openai_api.http.batch_share import within

    baseline = [0.040] * 90 + [0.060] * 10  # alone: p50 40 ms, p99 60 ms
    loaded = [0.041] * 19 + [0.150]  # one request of 20 landed behind a batch prompt's prefill
    assert within(loaded, baseline, 1.1, 0.5)  # the median: fine
    assert not within(loaded, baseline, 1.1, 0.99)  # the tail: 150 ms > 1.1 x 60 ms
    assert within([0.041] * 19 + [0.065], baseline, 1.1, 0.99)  # 65 ms <= 66 ms


def test_adaptive_share_on_the_tail_narrows_on_one_miss_and_widens_on_clean_windows() -> None:
    clock = Clock()
    g = _share(clock, quantile=0.99)
    for _ in range(MIN_BASELINE):
        g.observe(0.040, unloaded=True)
    g.observe(0.060, unloaded=True)  # the baseline's p99: 60 ms
    _window(g, clock, 0.050)  # all within 1.1 x 60 ms
    assert g.share == 0.375
    for _ in range(3):  # one request of four at 80 ms: its median is fine, the window misses
        clock.now += g.window_s / 4
        g.observe(0.041, unloaded=False)
    clock.now += g.window_s / 4
    g.observe(0.080, unloaded=False)
    assert g.share == pytest.approx(0.375 * 0.75)
    median = _share(clock)  # the same windows judged on the median only widen
    for _ in range(MIN_BASELINE):
        median.observe(0.040, unloaded=True)
    for ttft in (0.041, 0.041, 0.041, 0.080):
        clock.now += median.window_s / 4
        median.observe(ttft, unloaded=False)
    assert median.share == 0.375


async def test_batch_starts_wait_for_a_starting_lines_first_token() -> None:
    """--batch-prefills-per-model 1: slots are free, but a second batch line waits in the queue until the first
    one's first token (its prefill done) or its end; interactive requests are never held by it."""
    lim = InFlightLimiter(100, 8, 1, {"m"})
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, batch_prefills=1)
    first, second, third = Ticket(lim), Ticket(lim), Ticket(lim)
    await first.acquire("m", 1, "n", 1.0, "batch", "job")
    assert first.awaiting and sched.batch_starting["m"] == 1
    queued = asyncio.create_task(second.acquire("m", 1, "n", 1.0, "batch", "job"))
    later = asyncio.create_task(third.acquire("m", 1, "n", 1.0, "batch", "other"))
    await asyncio.sleep(0)
    assert not queued.done() and not later.done()
    assert sched.refusal("m", 1, "batch", 1.0) == (
        "batch_starting", "The model 'm' is starting other batch work; retry shortly.")
    await Ticket(lim).acquire("m", 1, "n", 1.0, "interactive", "c")  # not held by batch starts
    sched.first_token(first, "m", 0.5)
    sched.first_token(first, "m", 0.5)  # counted once per request
    await asyncio.sleep(0)
    assert queued.done() and not later.done() and sched.batch_starting["m"] == 1
    assert not sched.governors  # a batch line's first token is no signal of the adaptive share
    second.release()  # ended without a first token (an error): no longer starting
    await asyncio.sleep(0)
    assert later.done() and sched.batch_starting["m"] == 1
    first.release()  # ended after its first token: nothing more to count off
    assert sched.batch_starting["m"] == 1 and sched.batch_held["m"] == 1
    sched.first_token(third, "m", 0.5)
    third.release()
    assert sched.batch_starting["m"] == 0 and sched.batch_held["m"] == 0


async def test_a_batch_fan_out_counts_its_sequences_and_starts_alone_when_bigger_than_the_limit() -> None:
    lim = InFlightLimiter(100, 16, 1, {"m"})
    sched = lim.scheduler = Scheduler(lim, max_queue=16, timeout_s=600, shares={"batch": 1.0}, batch_prefills=2)
    wide = Ticket(lim)
    await wide.acquire("m", 4, "n", 1.0, "batch", "job")  # more than the limit, but nothing else starting
    assert sched.batch_starting["m"] == 4
    queued = asyncio.create_task(Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job"))
    await asyncio.sleep(0)
    assert not queued.done()
    sched.first_token(wide, "m", 0.2)  # one first token per request counts off all its sequences
    await asyncio.sleep(0)
    assert queued.done() and sched.batch_starting["m"] == 1


async def test_without_the_limit_batch_lines_are_not_counted_as_starting() -> None:
    lim, sched, _ = make(per_model=4, queue=0, batch_share=1.0)
    t = Ticket(lim)
    await t.acquire("m", 1, "n", 1.0, "batch", "job")
    await Ticket(lim).acquire("m", 1, "n", 1.0, "batch", "job")
    assert not t.awaiting and not sched.batch_starting and not sched.counts_start("batch")
