"""`CPUWorkers` (openai_api/text/workers.py): what a job leaves behind once its caller is done with it.

A refused request's input (a 2 MB message, its rendered prompt) must be freed by reference counting as soon as
the error answer is sent, not kept until a full garbage collection: a busy server runs those rarely, and the
soak run (scripts/soak.py) saw ~80 MiB of refused requests held that way. The oracle is CPython's own: with the
cyclic collector off, a weak reference to the job's argument dies only if nothing, cycles included, holds it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from openai_api.text.workers import CPUWorkers


class Payload:
    """Stands for a request's input; weakly referenceable, unlike str."""

    def __init__(self) -> None:
        self.text = "x" * 1_000_000


class Refused(Exception):
    pass


def refuse(payload: Payload) -> None:
    rendered = payload.text + payload.text  # a frame local of the failing job, as a rendered prompt is
    raise Refused(f"{len(rendered)} characters is too long")


def accept(payload: Payload) -> int:
    return len(payload.text)


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def handle(workers: CPUWorkers, fn: object, payload: Payload) -> str:
    """What the HTTP layer does: await the job, turn an exception into an answer, keep nothing."""
    try:
        return str(await workers.run(fn, payload))  # type: ignore[arg-type]
    except Refused as e:
        return f"400: {e}"


@pytest.mark.parametrize("fn", [refuse, accept], ids=["job_raises", "job_returns"])
async def test_the_input_is_freed_without_a_garbage_collection(no_cyclic_gc: None, fn: object) -> None:
    workers = CPUWorkers(1)
    try:
        payload = Payload()
        alive = weakref.ref(payload)
        answer = await handle(workers, fn, payload)
        assert answer in ("400: 2000000 characters is too long", "1000000")
        await workers.run(int)  # one thread: this runs once the worker has let go of the first job
        del payload
        assert alive() is None, [type(r).__name__ for r in gc.get_referrers(alive())]
    finally:
        workers.close()


def test_trims_paced_by_rss_growth() -> None:
    """A trim hands every free page back, and the next request faults them in again (~2 ms of system CPU at
    an agent turn of ~117k tokens): so a job trims only once RSS has grown `slack` past its last trimmed
    level, which still bounds what a stream of big requests can leave behind."""
    from openai_api.text.workers import TrimPacer

    rss = [100 << 20]
    calls: list[int] = []
    pacer = TrimPacer(slack=16 << 20, rss=lambda: rss[0], trim=lambda pad: calls.append(pad) or 0)
    pacer.after_job()  # no level known yet: trims, and remembers what RSS is after it
    assert calls == [0]
    for grown in (1, 8, 15):  # agent turns: growth under the slack, nothing handed back
        rss[0] = (100 + grown) << 20
        pacer.after_job()
    assert len(calls) == 1
    rss[0] = 117 << 20  # a big request's fragments: past the slack
    pacer.after_job()
    assert len(calls) == 2
    rss[0] = 120 << 20  # measured from the level after that trim, not from the first one
    pacer.after_job()
    assert len(calls) == 2


def test_trims_every_job_without_procfs() -> None:
    from openai_api.text.workers import TrimPacer

    calls: list[int] = []
    pacer = TrimPacer(rss=lambda: None, trim=lambda pad: calls.append(pad) or 0)
    for _ in range(3):
        pacer.after_job()
    assert len(calls) == 3
    TrimPacer(trim=None).after_job()  # not glibc: nothing to call
