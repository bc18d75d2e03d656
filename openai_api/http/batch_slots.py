"""Fair shares of one gateway process's batch capacity: its line slots (`--batch-concurrency`) and its job slots
(`--batch-running-jobs`), so that one huge job, or one key's many jobs, cannot starve another key's small job.

**Lines.** `FairSlots` hands its slots out round-robin between the keys that wait for one, and between the jobs of
one key in turn: a key with a 50,000-line job and a key with a 10-line job each get every other free slot, whatever
the first job's size. Each job waits for at most one slot at a time (the runner starts a line, then asks for the
next slot), so a grant is O(1) and the waiters are bounded by the jobs running.

**Jobs.** `claim_order` ranks the jobs nobody runs: those of keys with the fewest jobs running here first, oldest
first among equals; `victim` names the job to give back when every job slot is taken, a waiting job's key runs
nothing here and another key runs two or more (its newest; it stops starting lines, lets its lines in flight end,
and gives its lease back unfinished: it resumes later at its first unanswered line, here or on another gateway).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping


class FairSlots:
    """`size` slots; `acquire(owner)` waits for one, round-robin between owners, FIFO within one owner."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.used = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    async def acquire(self, owner: str) -> None:
        if self.used < self.size and not self._waiting:
            self.used += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted as the waiter was cancelled: hand the slot on
            else:
                queue = self._waiting.get(owner)
                if queue is not None and fut in queue:
                    queue.remove(fut)
                    if not queue:
                        del self._waiting[owner]
            raise

    def release(self) -> None:
        self.used -= 1
        while self.used < self.size and self._waiting:
            owner, queue = self._waiting.popitem(last=False)
            fut = queue.popleft()
            if queue:
                self._waiting[owner] = queue  # the owner's next waiter goes round again, behind the others
            if not fut.done():
                self.used += 1
                fut.set_result(None)


def claim_order(candidates: Iterable[tuple[str, str]], running: Mapping[str, int]) -> list[str]:
    """Ids of `candidates` ((id, owner), oldest first) in the order to claim them: the owner with the fewest jobs
    running here (counting those ranked before) first, so that claiming N jobs spreads them over the owners."""
    by_owner: OrderedDict[str, deque[str]] = OrderedDict()
    for job_id, owner in candidates:
        by_owner.setdefault(owner, deque()).append(job_id)
    load = Counter(running)
    out: list[str] = []
    while by_owner:
        owner = min(by_owner, key=lambda o: load[o])  # ties: the owner of the oldest job (insertion order)
        out.append(by_owner[owner].popleft())
        load[owner] += 1
        if not by_owner[owner]:
            del by_owner[owner]
    return out


def victim(jobs: Mapping[str, str], candidates: Iterable[tuple[str, str]]) -> str | None:
    """The running job (`jobs`: id -> owner, oldest first) to give back so that a waiting key gets a job slot, or
    None: when no waiting job's key is without a job here, or no key runs two."""
    load = Counter(jobs.values())
    if not any(load[owner] == 0 for _, owner in candidates):
        return None
    owner, most = max(load.items(), key=lambda kv: kv[1], default=("", 0))
    if most < 2:
        return None
    return [job_id for job_id, o in jobs.items() if o == owner][-1]
