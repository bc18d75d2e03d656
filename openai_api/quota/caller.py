"""Who is calling: the request's key (its name, team and policy), reachable anywhere below the keys
middleware through `current_caller()` (a context variable, as `observability.current_stats`), and the
token meter that reserves and settles the request's tokens.

Base layer: imported by `http/` (routes, admission) and `services/backends.py` (the Triton call, where a
request's prompt tokens and `max_tokens` are first known), and it imports neither.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Literal

Priority = Literal["high", "normal", "low"]
# The scheduler's classes, most urgent first (`http.scheduler`).
PriorityClass = Literal["interactive", "standard", "batch"]
RANKS: dict[str, int] = {"interactive": 0, "standard": 1, "batch": 2}


@dataclass(frozen=True, slots=True)
class Policy:
    """One key's limits as the keys file gives them; None = no limit. Rates are per minute (scaled to
    the file's `window_seconds`)."""

    models: tuple[str, ...] = ("*",)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    priority: Priority = "normal"
    admin: bool = False
    metrics: bool = False  # may read /metrics (admin keys may too): a key for Prometheus
    max_class: PriorityClass = "interactive"  # the most urgent class its requests may ask for (http.scheduler)
    default_class: PriorityClass = "standard"  # the class of its requests that ask for none

    @property
    def reads_metrics(self) -> bool:
        return self.admin or self.metrics

    def allows(self, model: str) -> bool:
        """Whether the key may use `model` (exact names or shell-style globs: `smollm2-*`)."""
        return any(p == model or (("*" in p or "?" in p or "[" in p) and fnmatch.fnmatchcase(model, p))
                   for p in self.models)

    @property
    def counted(self) -> bool:
        """Whether anything of this key is counted (a key with only an allow-list is not)."""
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent,
                                            self.tokens_per_day, self.tokens_per_month))


UNLIMITED = Policy()


@dataclass(slots=True)
class Caller:
    """The key a request came with. `--api-key` keys (and a gateway without keys) are `UNLIMITED`, named
    `api-key` (`anonymous` without keys); keys from the keys file carry their file name and team."""

    name: str
    team: str = ""
    policy: Policy = UNLIMITED
    share: float = 1.0  # of --max-in-flight this key may fill (its priority's share)
    meter: TokenMeter | None = None
    key_digest: str = ""  # an `--api-key` key's: which of them (they all share one name)

    def allows(self, model: str) -> bool:
        return self.policy.allows(model)

    @property
    def owner(self) -> str:
        """Whose the objects this caller stores are (`openai_api.stored`): a keys file's key by its name (a new
        secret under the same name keeps them), an `--api-key` key by a digest of the key (two such keys never
        share), `key:anonymous` on a gateway without keys."""
        return f"key:{self.name}" + (f":{self.key_digest}" if self.key_digest else "")


Reserve = Callable[[int], Awaitable[object]]
Settle = Callable[["TokenMeter"], Awaitable[None]]


@dataclass(slots=True)
class TokenMeter:
    """One request's tokens: `reserve` before each Triton call (prompt + max_tokens, the prompt counted once
    per distinct prompt), `used` when it ends with the real counts. The keys middleware settles the
    difference when the response is over (streamed, plain or cancelled alike); work that outlives its request
    (a background response) counts on a `fork()` of it and calls `settle()` when it ends."""

    reserve_fn: Reserve
    settle_fn: Settle | None = None  # what `settle()` does (the quota service's; None: nothing to settle)
    reservations: list[tuple[object, int]] = field(default_factory=list)  # (grant, tokens reserved)
    prompts_seen: set[int] = field(default_factory=set)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    remaining_tokens: int | None = None  # after the latest reservation, for the response's headers
    reset_tokens_s: float | None = None

    async def reserve(self, prompt_ids: object, prompt_tokens: int, max_tokens: int) -> bool:
        """Reserve a sequence's tokens; the same prompt object (n > 1 choices) counts its tokens once.
        Returns whether its prompt was counted here (pass it back to `used`). Raises the 429 when refused."""
        first = id(prompt_ids) not in self.prompts_seen
        tokens = (prompt_tokens if first else 0) + max(max_tokens, 0)
        grant = await self.reserve_fn(tokens)
        self.prompts_seen.add(id(prompt_ids))
        self.reservations.append((grant, tokens))
        return first

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    @property
    def reserved(self) -> int:
        return sum(t for _, t in self.reservations)

    def fork(self) -> TokenMeter:
        """A new meter on the same key's counters, empty: for work that outlives the request (its tokens are
        then settled by that work's `settle()`, never by the request's end, which would settle them early)."""
        return TokenMeter(self.reserve_fn, self.settle_fn)

    async def settle(self) -> None:
        """Give back what was reserved and not used, and count what was used (work that outlived a request).
        Once: later calls do nothing."""
        settle, self.settle_fn = self.settle_fn, None
        if settle is not None:
            await settle(self)


_CALLER: ContextVar[Caller | None] = ContextVar("openai_api_caller", default=None)


def current_caller() -> Caller | None:
    return _CALLER.get()


def current_meter() -> TokenMeter | None:
    caller = _CALLER.get()
    return caller.meter if caller is not None else None


def first_usable(names: Iterable[str]) -> str | None:
    """The first of `names` the request's key may use (any, without a keys file): the model of a route whose
    client names none (TEI's, vLLM's tokenize), so it never picks, nor names in an error, one the key may not use."""
    caller = _CALLER.get()
    return next((n for n in names if caller is None or caller.allows(n)), None)


def bind_caller(caller: Caller) -> Token[Caller | None]:
    return _CALLER.set(caller)


def unbind_caller(token: Token[Caller | None]) -> None:
    _CALLER.reset(token)
