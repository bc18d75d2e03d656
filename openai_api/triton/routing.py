"""Routing policies: which healthy replica of a model a request tries first (`RoutingConfig.policy`).

A policy only orders the healthy replicas; `replicas.ReplicaSet` puts the ones marked down last and fails
over down the list as before. Each policy is one small class behind `RoutingPolicy`:

- `LeastOutstanding` (the default): fewest requests in flight from this process; ties in turn.
- `RoundRobin`: in turn, whatever the load.
- `LeastLoad`: lowest `replica.load()`: Triton's own in-flight count and KV-cache fill, scraped from its
  metrics port (`loadscrape`), plus what this process started since that scrape (`replicas.Replica.load`).
- `PrefixAffinity`: a prompt is cut into `block_tokens`-token blocks, each block's hash chained with the
  previous one's (vLLM's prefix-cache scheme: block i's hash names the whole prefix up to block i). A bounded
  LRU map block hash -> replica urls (the last `HOLDERS`, most recent first) remembers where each prefix was
  sent; a request goes to the replica holding its longest remembered prefix (at least `min_match_blocks`),
  which most likely still has that prefix in its KV cache, so its prefill is short. A session key (a
  header's value; by default also OpenAI's `prompt_cache_key` and the session headers of Claude Code and Codex;
  or the request's `user`) names the session's last replica the same way and wins over the prefix match.
  Least load instead when nothing matches, when every holder is down (down ones are skipped: a shorter prefix
  held elsewhere may win), or when the holder is overloaded relative to the least loaded replica: holder -
  least > `imbalance_abs` and holder > `imbalance_rel` x least (SGLang's cache-aware router's rule, applied
  to the holder, so one hot conversation spills over instead of queueing).

`order` returns the ordering and the reason (a label of the routing-decision metric); `routed` is told the
replica a request was actually sent to (after failover too), which is what the prefix map remembers.
Python's hash of a tuple of ints is deterministic (no per-process salt), so every worker process hashes a
prompt the same way, and with `--workers` the workers share the prefix map (`sharedmap`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, TypeVar

from openai_api.config import RoutingConfig
from openai_api.triton.sharedmap import SharedTable, stable_id


class Routable(Protocol):
    """What a policy reads of a replica (`replicas.Replica`; the bench's fakes)."""

    url: str
    outstanding: int

    def load(self) -> float: ...


class RoutedRequest(Protocol):
    """What a policy reads of a request (`llm.GenerationRequest`)."""

    prompt_ids: Sequence[int]
    session: str | None


R = TypeVar("R", bound=Routable)


class RoutingPolicy(Protocol):
    name: str

    def order(self, healthy: Sequence[R], request: RoutedRequest | None) -> tuple[list[R], str]:
        """`healthy` (non-empty) best first, and why the first one (a metric label)."""
        ...

    def routed(self, replica: Routable, request: RoutedRequest | None) -> None:
        """`request` was sent to `replica`."""
        ...

    def forget(self, url: str) -> None:
        """Replica `url` is gone (retired by discovery): drop what points at it."""
        ...


def _rotated(items: Sequence[R], turn: int) -> list[R]:
    n = len(items)
    return [items[(turn + i) % n] for i in range(n)]


class _Stateless:
    def routed(self, replica: Routable, request: RoutedRequest | None) -> None:
        pass

    def forget(self, url: str) -> None:
        pass


class RoundRobin(_Stateless):
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, healthy: Sequence[R], request: RoutedRequest | None) -> tuple[list[R], str]:
        return _rotated(healthy, next(self._turn)), self.name


class LeastOutstanding(_Stateless):
    name = "least_outstanding"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, healthy: Sequence[R], request: RoutedRequest | None) -> tuple[list[R], str]:
        # Rotated first, then a stable sort: equals take turns.
        return sorted(_rotated(healthy, next(self._turn)), key=lambda r: r.outstanding), self.name


class LeastLoad(_Stateless):
    name = "least_load"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def order(self, healthy: Sequence[R], request: RoutedRequest | None) -> tuple[list[R], str]:
        return sorted(_rotated(healthy, next(self._turn)), key=lambda r: r.load()), self.name


def block_hashes(ids: Sequence[int], block_tokens: int) -> list[int]:
    """Chained hashes of the full `block_tokens`-token blocks of `ids` (a partial last block has none):
    equal hash i <=> (almost surely) equal first (i + 1) * block_tokens tokens."""
    out: list[int] = []
    h = 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hash((h, *ids[start:start + block_tokens]))
        out.append(h)
    return out


# Replicas remembered per block: one that is down still leaves others that hold the prefix.
HOLDERS = 8


class PrefixAffinity:
    name = "prefix_affinity"

    def __init__(self, config: RoutingConfig, shared: SharedTable | None = None) -> None:
        self.config = config
        # With --workers: the map every worker writes and reads as well (`sharedmap`), else None.
        self.shared = shared
        self._ids: dict[str, int] = {}
        # block hash -> the replicas that were sent that prefix, most recent first (at most HOLDERS)
        self.blocks: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self._balance = LeastLoad()
        # The last prompt hashed (order and routed see the same list object): hashed once per request.
        self._memo: tuple[Sequence[int] | None, list[int]] = (None, [])

    def _hashes(self, ids: Sequence[int]) -> list[int]:
        if self._memo[0] is not ids:
            self._memo = (ids, block_hashes(ids, self.config.block_tokens))
        return self._memo[1]

    def holder(self, healthy: Sequence[R], request: RoutedRequest) -> tuple[R | None, str]:
        """The healthy replica the session or the longest remembered prefix points at, and which of the two."""
        by_url = {r.url: r for r in healthy}
        shared = self.shared
        by_id = {self._id(r.url): r for r in healthy} if shared is not None else {}
        if request.session is not None:
            url = self.sessions.get(request.session)
            if url is not None and url in by_url:
                return by_url[url], "session"
            if shared is not None:
                ids = shared.get(stable_id("session:" + request.session))
                if ids and ids[0] in by_id:
                    return by_id[ids[0]], "session"
        hashes = self._hashes(request.prompt_ids)
        blocks = self.blocks

        def known(i: int) -> bool:
            return hashes[i] in blocks or (shared is not None and bool(shared.get(hashes[i])))

        # `routed` records every block of a prompt, so the blocks remembered form a prefix of the prompt's
        # (up to evictions): binary search for the deepest one (log n lookups instead of n on a new prompt),
        # then walk down past blocks whose holders are all down.
        lo, hi = -1, len(hashes) - 1  # known(lo) holds (lo = -1: nothing), the answer is in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if known(mid):
                lo = mid
            else:
                hi = mid - 1
        for i in range(lo, self.config.min_match_blocks - 2, -1):
            # Several replicas may hold this prefix (a system prompt every conversation shares): the least
            # loaded of them, else each new conversation would follow the previous one onto one replica.
            held = [by_url[u] for u in blocks.get(hashes[i], ()) if u in by_url]
            if not held and shared is not None:
                held = [by_id[x] for x in shared.get(hashes[i]) if x in by_id]
            if held:
                return min(held, key=lambda r: r.load()), "prefix"
        return None, "no_match"

    def _id(self, url: str) -> int:
        i = self._ids.get(url)
        if i is None:
            i = self._ids[url] = stable_id(url)
        return i

    def order(self, healthy: Sequence[R], request: RoutedRequest | None) -> tuple[list[R], str]:
        by_load, _ = self._balance.order(healthy, request)
        if request is None:
            return by_load, "no_match"
        holder, reason = self.holder(healthy, request)
        if holder is None:
            return by_load, reason
        least, mine = by_load[0].load(), holder.load()
        if mine - least > self.config.imbalance_abs and mine > self.config.imbalance_rel * least:
            return by_load, "imbalance"
        return [holder, *(r for r in by_load if r is not holder)], reason

    def routed(self, replica: Routable, request: RoutedRequest | None) -> None:
        if request is None:
            return
        url = replica.url
        blocks = self.blocks
        shared = self.shared
        me = self._id(url) if shared is not None else 0
        for h in self._hashes(request.prompt_ids):
            held = blocks.get(h, ())
            blocks[h] = held if held[:1] == (url,) else (url, *(u for u in held if u != url))[:HOLDERS]
            blocks.move_to_end(h)
            if shared is not None:
                shared.put(h, me)
        while len(blocks) > self.config.max_blocks:
            blocks.popitem(last=False)
        if request.session is not None:
            self.sessions[request.session] = url
            self.sessions.move_to_end(request.session)
            if shared is not None:
                shared.put(stable_id("session:" + request.session), me)
            while len(self.sessions) > self.config.max_sessions:
                self.sessions.popitem(last=False)

    def forget(self, url: str) -> None:
        for h, held in list(self.blocks.items()):
            if url in held:
                rest = tuple(u for u in held if u != url)
                if rest:
                    self.blocks[h] = rest
                else:
                    del self.blocks[h]
        for s in [s for s, u in self.sessions.items() if u == url]:
            del self.sessions[s]


def make_policy(config: RoutingConfig, shared: SharedTable | None = None) -> RoutingPolicy:
    """The policy object of one model (it holds that model's routing state; `shared`: the workers' table)."""
    if config.policy == "round_robin":
        return RoundRobin()
    if config.policy == "least_load":
        return LeastLoad()
    if config.policy == "prefix_affinity":
        return PrefixAffinity(config, shared)
    return LeastOutstanding()


# Headers in which coding agents name their session: Claude Code, and Codex (older releases write
# `session_id`, with an underscore, which HTTP allows).
AGENT_SESSION_HEADERS = (b"x-claude-code-session-id", b"session_id", b"session-id")
# A session key longer than this is remembered by its hash (the map of sessions holds many of them).
_MAX_KEY_CHARS = 256


def _bounded(kind: str, value: str) -> str:
    return f"{kind}:{value}" if len(value) <= _MAX_KEY_CHARS else f"{kind}#{stable_id(value):x}"


def _header(headers: Sequence[tuple[bytes, bytes]], names: tuple[bytes, ...]) -> str | None:
    """The value of the first of `names` (lower-case) among `headers`, non-empty; None: none."""
    if not headers:
        return None
    found = {k: v for k, v in headers if k in names and v}
    return next((found[n].decode("latin-1") for n in names if n in found), None)


def session_key(config: RoutingConfig, user: str | None, cache_key: str | None = None,
                headers: Sequence[tuple[bytes, bytes]] = ()) -> str | None:
    """The request's session for affinity, the first of: its `session_header` value (among the request's
    `headers`, which the request context carries); with `agent_sessions`, OpenAI's `prompt_cache_key`
    (`cache_key`), then the session header of a coding agent (`AGENT_SESSION_HEADERS`); its `user` when
    `session_user` is set. None: none."""
    if config.session_header is not None:
        value = _header(headers, (config.session_header.lower().encode("latin-1"),))
        if value:
            return _bounded("h", value)
    if config.agent_sessions:
        if cache_key:
            return _bounded("k", cache_key)
        value = _header(headers, AGENT_SESSION_HEADERS)
        if value:
            return _bounded("h", value)
    if config.session_user and user:
        return _bounded("u", user)
    return None
