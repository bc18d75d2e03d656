"""Priority classes and the per-model queue in front of the in-flight slots (`http.inflight`).

**Classes.** Every admitted request has one of `interactive`, `standard`, `batch` (most urgent first), read from
what it asks for, most specific first:

* the llm-d header `x-gateway-inference-objective` (`interactive`/`critical`, `standard`, `batch`/`sheddable`;
  other objective names are ignored);
* OpenAI's `service_tier`: `priority` -> interactive, `default`/`auto` -> standard, `flex` -> batch;
* vLLM's integer `priority` (lower is more urgent): below 0 -> interactive, 0 -> standard, above 0 -> batch;
* else the key's `default_class` (keys file; `standard` without one).

A key never gets a class more urgent than its `max_class` (keys file; `interactive` by default): asking for more is
served at its `max_class`, not refused. The Batch API's lines always run as `batch`.

**Slots.** A class may fill only its share of each in-flight limit (`--standard-slot-share`,
`--batch-slot-share`; interactive: all of it), so slots stay free for the classes above it even while lower-class
work keeps arriving: an interactive request never waits behind batch work that holds the slots.

**Queue.** With `--max-queue-per-model` N > 0, a request that finds no free slot waits in its model's queue
instead of an immediate 429: ordered by class, round-robin between keys within a class (a key with 1,000 queued
requests does not starve a key with one), each with a deadline (`--queue-timeout`; past it a 429 with
`Retry-After`). A full queue sheds its newest waiter of the lowest class below the arriving one (that waiter gets
the 429), else refuses the arrival. A request arriving while requests of its own class or above wait queues
behind them (no overtaking). With N = 0 (the default) nothing waits: an immediate 429, as before the queue.

**Adaptive batch share** (`--batch-share-adaptive`, off by default): the batch class's share of each model's limit
moves between `--batch-share-min` and `--batch-slot-share` with the interactive class's time to first token
(`http.batch_share`); the admission hands each interactive request's first token to `first_token`. And while an
interactive request of a model waits for its first token, no batch work of that model starts (it waits in the
queue, or gets its 429 without one): a batch line's start is its prompt's prefill in the engine and its template
and tokenizer in the gateway, work that would delay that first token. Deciding is apart from updating: `refusal`
only reads (asking twice gives the same answer), the share moves in `advance` (on each batch request's arrival,
before each batch waiter `dispatch` considers, and at the moment it is due to widen for want of interactive
requests while batch work waits - a loop timer, `_arm_idle`) and in `observe_ttft`.

**Batch starts** (`--batch-prefills-per-model` N > 0, off by default): at most N batch generations of a model may be
starting at once - admitted, no first token yet: their prompt's prefill in the engine (and their template and
tokenizer here) - the next waits in the queue until one of them yields its first token (or ends). An engine
prefills waiting prompts in arrival order within its step's token budget (vLLM's and TensorRT-LLM's chunked
prefill), so batch lines that start together (they end together, being alike) put several 1,000-token prompts
ahead of any chat that arrives next; one or two at a time leave it at most that much to wait for, and cost the job
little - its lines spend most of their time decoding (bench/priority_sim.py, docs/guides/batches.md). Counted for
the generating routes only (`Admission._admit(first_token=True)`): an embedding line has no first token to wait for.

Event-loop only (no locks), like the limiter. `clock` is injectable for the unit tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from openai_api.errors import OverloadedError
from openai_api.http.batch_share import AdaptiveShare
from openai_api.quota.caller import RANKS, PriorityClass

if TYPE_CHECKING:
    from openai_api.observability import Metrics


class InFlightLimiter(Protocol):
    """What the scheduler reads of `http.inflight.InFlightLimiter` (which holds the scheduler: named here as a
    protocol so the two modules do not import each other)."""

    max_total: int
    max_per_model: int
    total: int
    per_model: dict[str, int]
    metrics: Metrics | None

    def overloaded(self, message: str, reason: str) -> OverloadedError: ...


class Ticket(Protocol):
    """What the scheduler does with `http.inflight.Ticket`: hands it the slots it waited for."""

    awaiting: bool
    cls: PriorityClass
    sequences: int

    def take(self, model: str, sequences: int, cls: PriorityClass = "standard") -> None: ...

CLASSES: tuple[PriorityClass, ...] = ("interactive", "standard", "batch")
RANK = RANKS
OBJECTIVE_HEADER = "x-gateway-inference-objective"
_OBJECTIVES: dict[str, PriorityClass] = {
    "interactive": "interactive", "critical": "interactive", "standard": "standard", "batch": "batch",
    "sheddable": "batch"}
_TIERS: dict[str, PriorityClass] = {"priority": "interactive", "default": "standard", "auto": "standard",
                                    "flex": "batch"}
# Triton's request `priority` per class: `triton.wire.CLASS_PRIORITY`, sent by the adapters (the class read from
# `RequestStats.priority_class`, which admission sets) to models with priority levels (docs/guides/batches.md).


def requested_class(objective: str | None, service_tier: Any, priority: Any) -> PriorityClass | None:
    """The class a request asks for (module docstring), or None when it asks for none."""
    if objective:
        found = _OBJECTIVES.get(objective.strip().lower())
        if found is not None:
            return found
    if isinstance(service_tier, str) and service_tier in _TIERS:
        return _TIERS[service_tier]
    if isinstance(priority, int) and not isinstance(priority, bool):
        return "interactive" if priority < 0 else "standard" if priority == 0 else "batch"
    return None


def capped_class(asked: PriorityClass | None, default: PriorityClass, most: PriorityClass) -> PriorityClass:
    """`asked` (else `default`), never more urgent than `most`."""
    cls = asked if asked is not None else default
    return cls if RANK[cls] >= RANK[most] else most


@dataclass(eq=False)
class Waiter:
    """One queued request."""

    ticket: Ticket
    model: str
    sequences: int
    cls: PriorityClass
    key: str
    share: float
    deadline: float
    future: asyncio.Future[None] = field(repr=False)


class ModelQueue:
    """One model's waiters: per class, an ordered map key -> its waiters (FIFO), served round-robin."""

    def __init__(self) -> None:
        self.classes: dict[str, OrderedDict[str, deque[Waiter]]] = {c: OrderedDict() for c in CLASSES}
        self.size = 0

    def push(self, w: Waiter) -> None:
        self.classes[w.cls].setdefault(w.key, deque()).append(w)
        self.size += 1

    def remove(self, w: Waiter) -> bool:
        keys = self.classes[w.cls]
        q = keys.get(w.key)
        if q is None or w not in q:
            return False
        q.remove(w)
        if not q:
            del keys[w.key]
        self.size -= 1
        return True

    def waiting_at_or_above(self, cls: PriorityClass) -> bool:
        return any(self.classes[c] for c in CLASSES[:RANK[cls] + 1])

    def lowest_below(self, cls: PriorityClass) -> Waiter | None:
        """The newest waiter of the lowest class less urgent than `cls` (the one shed first)."""
        for c in reversed(CLASSES[RANK[cls] + 1:]):
            keys = self.classes[c]
            if keys:
                newest = max((q[-1] for q in keys.values()), key=lambda w: w.deadline)
                return newest
        return None

    def all(self) -> list[Waiter]:
        return [w for keys in self.classes.values() for q in keys.values() for w in q]


class Scheduler:
    """The classes' slot shares and the per-model queues over one `InFlightLimiter` (module docstring)."""

    def __init__(self, limiter: InFlightLimiter, *, max_queue: int = 0, timeout_s: float = 30.0,
                 shares: dict[str, float] | None = None, clock: Callable[[], float] = time.monotonic,
                 adaptive: dict[str, float] | None = None, batch_prefills: int = 0) -> None:
        """`adaptive`: the adaptive batch share's settings (`floor`, and optionally `target`, `window_s`,
        `min_samples`, `idle_s`, `quantile` of `AdaptiveShare`), None = the static share. `batch_prefills`: batch
        generations per model starting at once at most (module docstring), 0 = no limit."""
        self.limiter = limiter
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.shares: dict[str, float] = {"interactive": 1.0, "standard": 1.0, "batch": 0.5, **(shares or {})}
        self.clock = clock
        self.queues: dict[str, ModelQueue] = {}
        self.waiting = 0
        self.adaptive = adaptive
        self.governors: dict[str, AdaptiveShare] = {}
        self.batch_held: dict[str, int] = {}  # the batch class's slots per model (the governors' "unloaded")
        self.awaiting: dict[str, int] = {}  # adaptive: interactive requests per model without a first token yet
        self.batch_prefills = batch_prefills
        self.batch_starting: dict[str, int] = {}  # batch_prefills: batch sequences per model without a first token
        self.idle_timers: dict[str, asyncio.TimerHandle] = {}  # adaptive: per model, the wake at `idle_due`

    # --- the adaptive batch share -----------------------------------------------------------------------------
    def governor(self, model: str) -> AdaptiveShare | None:
        """`model`'s adaptive batch share (made on first use), None when the share is static."""
        if self.adaptive is None:
            return None
        g = self.governors.get(model)
        if g is None:
            opts = dict(self.adaptive)
            floor = opts.pop("floor", 0.25)
            slot = 1 / max(min(self.limiter.max_per_model, self.limiter.max_total), 1)
            g = self.governors[model] = AdaptiveShare(
                floor, self.shares["batch"], slot, clock=self.clock, target=opts.get("target", 1.1),
                window_s=opts.get("window_s", 2.0), min_samples=int(opts.get("min_samples", 16)),
                idle_s=opts.get("idle_s", 10.0), quantile=opts.get("quantile", 0.5))
            self._shared(model, g.share)
        return g

    def first_token(self, ticket: Ticket, model: str, ttft_s: float) -> None:
        """A request's first token on `model`, `ttft_s` after it arrived. Interactive: the batch may start again
        once no other waits for one, and the adaptive share's signal. Batch: its prefill is done, the next batch
        line may start (`batch_prefills`)."""
        batch = ticket.cls == "batch"
        if ticket.awaiting:
            ticket.awaiting = False
            if not batch:
                self._arrived(model)
            else:
                self._started(model, ticket.sequences)
                if self.waiting:
                    self.dispatch()  # a queued batch line may take its turn
        if not batch:
            self.observe_ttft(model, ttft_s)

    def _arrived(self, model: str) -> None:
        left = self.awaiting[model] = self.awaiting.get(model, 1) - 1
        if not left and self.waiting:
            self.dispatch()  # batch work held back for it may start

    def _started(self, model: str, sequences: int) -> None:
        """Batch sequences of `model` no longer starting (a first token, or their end), counted off. A fan-out's
        first token counts off its whole request (only the first sequence's reaches `first_token`)."""
        self.batch_starting[model] = max(self.batch_starting.get(model, 0) - sequences, 0)

    def counts_start(self, cls: PriorityClass) -> bool:
        """Whether a request of `cls` is held as starting until its first token (`first_token`)."""
        return (cls == "interactive" and self.adaptive is not None) or (cls == "batch" and self.batch_prefills > 0)

    def observe_ttft(self, model: str, ttft_s: float) -> None:
        """An interactive time to first token on `model` (the adaptive share's signal)."""
        g = self.governor(model)
        if g is None:
            return
        before = g.share
        if g.observe(ttft_s, unloaded=not self.batch_held.get(model)):
            self.dispatch()  # the wider share may start queued batch work now
        if g.share != before:
            self._shared(model, g.share)

    def batch_share(self, model: str) -> float | None:
        """The adaptive batch share of `model` now (its floor before the model's first batch request), None when
        the share is static. Reads only: the governor is made and stepped by `advance`."""
        if self.adaptive is None:
            return None
        g = self.governors.get(model)
        return g.share if g is not None else min(self.adaptive.get("floor", 0.25), self.shares["batch"])

    def advance(self, model: str, dispatch: bool = True) -> bool:
        """The adaptive share's look at the clock for `model`, the one update the decision (`refusal`) leaves out:
        its window judged when due, or widened after `idle_s` without interactive requests (nobody releasing a
        slot says so). Made on each batch request's arrival and before a batch waiter is considered in
        `dispatch`. True when the share widened; with `dispatch`, queued work that now fits starts soon after."""
        g = self.governor(model)
        if g is None:
            return False
        before = g.share
        widened = g.step()
        if g.share != before:
            self._shared(model, g.share)
        if widened and dispatch and self.waiting:
            asyncio.get_running_loop().call_soon(self.dispatch)
        return widened

    def _arm_idle(self, model: str) -> None:
        """While batch work of `model` waits, wake the loop once when its adaptive share is due to widen for want of
        interactive requests (`AdaptiveShare.idle_due`): no request arrives and no slot is freed then (the batch's
        lines in flight may run for minutes), so without this wake the queued work would wait for the next line's
        end though the share allows it. One timer per model at most, re-armed only while batch work waits."""
        g = self.governors.get(model)
        if g is None or model in self.idle_timers:
            return
        due = g.idle_due()
        if due is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next arrival or release looks instead
            return
        self.idle_timers[model] = loop.call_later(max(0.0, due - self.clock()), self._idle_wake, model)

    def _idle_wake(self, model: str) -> None:
        del self.idle_timers[model]
        if self.advance(model, dispatch=False):  # widened: start what now fits
            self.dispatch()
        queue = self.queues.get(model)
        if queue is not None and queue.classes["batch"]:
            self._arm_idle(model)  # an interactive request came meanwhile, or more is due: the next moment

    def _shared(self, model: str, share: float) -> None:
        metrics = self.limiter.metrics
        if metrics is not None:
            metrics.batch_share.labels(model).set(share)

    def took(self, model: str, sequences: int, cls: PriorityClass) -> bool:
        """A ticket took its slots; True when it is counted as starting until its first token: an interactive
        request whose first token the batch awaits, or a batch request under `batch_prefills`."""
        if cls == "batch":
            self.batch_held[model] = self.batch_held.get(model, 0) + sequences
            if self.batch_prefills > 0:
                self.batch_starting[model] = self.batch_starting.get(model, 0) + sequences
                return True
        elif cls == "interactive" and self.adaptive is not None:
            self.awaiting[model] = self.awaiting.get(model, 0) + 1
            return True
        return False

    def released(self, model: str, sequences: int, cls: PriorityClass, awaiting: bool = False) -> None:
        """A ticket gave its slots back (`awaiting`: with no first token): counted, and handed to whoever waits
        for them."""
        if cls == "batch":
            self.batch_held[model] = self.batch_held.get(model, 0) - sequences
            if awaiting:
                self._started(model, sequences)
        elif awaiting:
            self.awaiting[model] = self.awaiting.get(model, 1) - 1
        self.dispatch()

    # --- capacity ---------------------------------------------------------------------------------------------
    @staticmethod
    def _cap(limit: int, share: float) -> int:
        return limit if share >= 1 else max(int(limit * share), 1)

    def refusal(self, model: str, sequences: int, cls: PriorityClass, share: float) -> tuple[str, str] | None:
        """Why `sequences` more of `model` cannot start now ((reason, message)), or None when they fit. A pure
        decision: asking twice gives the same answer and changes nothing (the adaptive share moves in `advance`)."""
        lim = self.limiter
        s = min(share, self.shares.get(cls, 1.0))
        adaptive = self.batch_share(model) if cls == "batch" else None
        if adaptive is not None:
            if self.awaiting.get(model):
                return "interactive_first", (f"The model {model!r} is starting interactive requests first; "
                                             "retry shortly.")
            s = min(s, adaptive)
        if cls == "batch" and self.batch_prefills > 0:
            starting = self.batch_starting.get(model, 0)
            if starting and starting + sequences > self.batch_prefills:  # alone, a bigger fan-out still starts
                return "batch_starting", (f"The model {model!r} is starting other batch work; retry shortly.")
        if lim.total + sequences > self._cap(lim.max_total, s):
            return "global_limit", f"The server is serving its maximum of {lim.max_total} requests; retry shortly."
        if lim.per_model.get(model, 0) + sequences > self._cap(lim.max_per_model, s):
            return "model_limit", (f"The model {model!r} is serving its maximum of {lim.max_per_model} "
                                   "generations; retry shortly.")
        return None

    def overloaded(self, reason: str, message: str) -> OverloadedError:
        return self.limiter.overloaded(message, reason)

    def _count(self, w: Waiter, delta: int) -> None:
        """The queued gauge (`openai_api_queued_requests`) and the waiting total, when `w` joins or leaves."""
        self.waiting += delta
        metrics = self.limiter.metrics
        if metrics is not None:
            metrics.queued.labels(w.model, w.cls).inc(delta)

    # --- admission --------------------------------------------------------------------------------------------
    async def acquire(self, ticket: Ticket, model: str, sequences: int, cls: PriorityClass, key: str,
                      share: float) -> None:
        """Take the slots now, or wait for them in `model`'s queue; raises the 429 when refused or shed."""
        queue = self.queues.get(model)
        if cls == "batch":
            self.advance(model)
        refused = self.refusal(model, sequences, cls, share)
        if refused is None and (queue is None or not queue.waiting_at_or_above(cls)):
            ticket.take(model, sequences, cls)
            return
        if self.max_queue <= 0:
            raise self.overloaded(*(refused or ("model_limit", f"The model {model!r} is busy; retry shortly.")))
        if queue is None:
            queue = self.queues[model] = ModelQueue()
        if queue.size >= self.max_queue:
            victim = queue.lowest_below(cls)
            if victim is None:
                raise self.overloaded("queue_full", f"The queue of model {model!r} is full; retry shortly.")
            self._fail(queue, victim, "shed", f"The model {model!r} is saturated by more urgent work; this "
                       f"{victim.cls} request was shed; retry later.")
        loop = asyncio.get_running_loop()
        w = Waiter(ticket, model, sequences, cls, key, share, self.clock() + self.timeout_s, loop.create_future())
        queue.push(w)
        self._count(w, 1)
        if cls == "batch":
            self._arm_idle(model)
        timer = loop.call_later(self.timeout_s, self._timed_out, queue, w)
        try:
            await w.future
        except asyncio.CancelledError:
            if queue.remove(w):
                self._count(w, -1)
            raise
        finally:
            timer.cancel()

    def _timed_out(self, queue: ModelQueue, w: Waiter) -> None:
        self._fail(queue, w, "queue_timeout", f"The request waited {self.timeout_s:g} s for model {w.model!r} "
                   "without a free slot; retry later.")

    def _fail(self, queue: ModelQueue, w: Waiter, reason: str, message: str) -> None:
        if queue.remove(w):
            self._count(w, -1)
            if not w.future.done():
                w.future.set_exception(self.overloaded(reason, message))

    def expire(self) -> int:
        """Refuse every waiter past its deadline (by `clock`); the timers do this too. Returns how many."""
        now = self.clock()
        n = 0
        for queue in self.queues.values():
            for w in queue.all():
                if w.deadline <= now:
                    self._timed_out(queue, w)
                    n += 1
        return n

    def dispatch(self) -> None:
        """Start what fits now, most urgent class first, round-robin between keys within a class; a class whose
        head cannot start holds back every class below it (slots freed go up first)."""
        if not self.waiting:
            return
        for queue in self.queues.values():
            for cls in CLASSES:
                keys = queue.classes[cls]
                blocked = False
                while keys:
                    key, q = next(iter(keys.items()))
                    w = q[0]
                    if w.cls == "batch":
                        self.advance(w.model, dispatch=False)  # this pass starts what a wider share lets in
                    if self.refusal(w.model, w.sequences, w.cls, w.share) is not None:
                        blocked = True
                        if w.cls == "batch":
                            self._arm_idle(w.model)
                        break
                    q.popleft()
                    keys.pop(key)
                    if q:
                        keys[key] = q  # to the end: the next key's turn
                    queue.size -= 1
                    self._count(w, -1)
                    if w.future.done():  # cancelled while queued: nothing to give
                        continue
                    w.ticket.take(w.model, w.sequences, w.cls)
                    w.future.set_result(None)
                if blocked:
                    break
