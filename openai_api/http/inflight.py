"""How many generations run at once, globally and per model: the in-flight limits and each request's ticket.

`InFlightLimiter` counts the slots taken (one per Triton sequence: a completions request with several prompts, or
`n` > 1, takes one per sequence), on the event loop only, so no locks. The guard middleware (`http.guard`) gives
every HTTP request a `Ticket` in its scope before the route runs and releases it when the response is done; the
route takes its slots once, through `http.admission.Admission`, after the body was validated. Past a limit the
answer is 429 with `Retry-After`, or with `--max-queue-per-model` a wait in the model's priority queue
(`http.scheduler`); a request that could never fit is the client's 400.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Scope

from openai_api.errors import InvalidRequestError, OverloadedError
from openai_api.http.scheduler import Scheduler
from openai_api.observability import Metrics
from openai_api.quota.caller import PriorityClass

# scope["state"] key of the request's ticket (set by the guard middleware).
TICKET_KEY = "admission_ticket"


class InFlightLimiter:
    """Counts requests in flight, globally and per model. Event-loop only: no locks needed. `models`: the names
    counted per model (replaced when a config reload swaps the model set)."""

    def __init__(self, max_total: int, max_per_model: int, retry_after_s: int, models: set[str],
                 metrics: Metrics | None = None) -> None:
        self.max_total = max_total
        self.max_per_model = max_per_model
        self.retry_after_s = retry_after_s
        self.models = models
        self.metrics = metrics
        self.total = 0
        self.per_model: dict[str, int] = {}
        # Gauge children cached per model (`.labels()` validates and locks on every call); made on first
        # use, as `.labels()` would, so /metrics lists a model once it has served a request.
        self._model_gauges: dict[str, Any] = {}
        # The classes' shares and the queues (`http.scheduler`); replaced by the process with its settings.
        self.scheduler = Scheduler(self)

    def model_gauge(self, model: str) -> Any:
        """`model`'s in-flight gauge child, or None without metrics."""
        gauge = self._model_gauges.get(model)
        if gauge is None and self.metrics is not None:
            gauge = self._model_gauges[model] = self.metrics.model_in_flight.labels(model)
        return gauge

    def overloaded(self, message: str, reason: str) -> OverloadedError:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()
        return OverloadedError(message, headers={"Retry-After": str(self.retry_after_s)})


class Ticket:
    """One request's admission: the slots it holds, taken by `acquire` and given back by the guard
    middleware when the response is done. A slot is one Triton sequence: a request that fans out
    (completions with several prompts, `n` > 1) takes one per sequence, from its model's limit and from
    the global one, because each is a request Triton works on and a stream the gateway holds open."""

    __slots__ = ("awaiting", "cls", "limiter", "model", "sequences")

    def __init__(self, limiter: InFlightLimiter) -> None:
        self.limiter = limiter
        self.model: str | None = None
        self.sequences = 0
        self.cls: PriorityClass = "standard"
        self.awaiting = False  # an interactive request the batch waits for (`Scheduler.first_token`)

    def _check(self, model: str, sequences: int, param: str) -> bool:
        """Whether `model` is counted at all; the 400 for more sequences than a limit could ever grant."""
        lim = self.limiter
        if self.sequences or model not in lim.models:
            return False  # unknown models get their 404 from the service; they never become a metric label
        most = min(lim.max_per_model, lim.max_total)
        if sequences > most:
            raise InvalidRequestError(
                f"This request asks for {sequences} generations at once (prompts x n); this server runs at most "
                f"{most} per model. Send fewer prompts or a smaller n per request.", param=param,
                code="too_many_sequences")
        return True

    async def acquire(self, model: str, sequences: int = 1, param: str = "n", share: float = 1.0,
                      cls: PriorityClass = "standard", key: str = "") -> None:
        """Take `sequences` slots of `model` and of the gateway. More than a limit could ever grant is the
        client's error (400 naming `param`); more than is free now is a 429, or a wait in the model's queue
        (ordered by class, fair between keys) where one is configured (`http.scheduler`). `share` (a key's
        priority, from the keys file) is the part of each limit this request may fill, capped by its class's."""
        if self._check(model, sequences, param):
            await self.limiter.scheduler.acquire(self, model, sequences, cls, key, share)

    def take(self, model: str, sequences: int, cls: PriorityClass = "standard") -> None:
        """Hold `sequences` slots of `model` for a request of class `cls` (checked by the caller)."""
        lim = self.limiter
        lim.per_model[model] = lim.per_model.get(model, 0) + sequences
        lim.total += sequences
        self.model = model
        self.sequences = sequences
        self.cls = cls
        self.awaiting = lim.scheduler.took(model, sequences, cls)
        gauge = lim.model_gauge(model)
        if gauge is not None:
            gauge.inc(sequences)

    def release(self) -> None:
        if self.model is not None:
            lim = self.limiter
            lim.per_model[self.model] -= self.sequences
            lim.total -= self.sequences
            gauge = lim.model_gauge(self.model)
            if gauge is not None:
                gauge.dec(self.sequences)
            model, sequences, awaiting = self.model, self.sequences, self.awaiting
            self.model = None
            self.sequences = 0
            self.awaiting = False
            # the freed slots to whoever waits for them
            lim.scheduler.released(model, sequences, self.cls, awaiting)


def request_ticket(scope: Scope) -> Ticket | None:
    """The request's ticket, given by the guard middleware (None without it)."""
    state: dict[str, Any] = scope.get("state", {})
    return state.get(TICKET_KEY)
