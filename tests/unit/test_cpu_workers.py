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
