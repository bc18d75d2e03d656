"""SSE write coalescing: same bytes, fewer writes, nothing held back longer than the interval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from openai_api.http.sse import coalesced


class Source:
    """An event source: `gaps[i]` seconds before event i; records whether it was closed."""

    def __init__(self, gaps: list[float], fail_after: int | None = None, hang_after: int | None = None) -> None:
        self.gaps = gaps
        self.fail_after = fail_after
        self.hang_after = hang_after
        self.closed = False

    async def gen(self) -> AsyncIterator[bytes]:
        try:
            for i, gap in enumerate(self.gaps):
                if i == self.fail_after:
                    raise RuntimeError("triton went away")
                if i == self.hang_after:
                    await asyncio.Event().wait()
                if gap:
                    await asyncio.sleep(gap)
                yield f"data: {i}\n\n".encode()
        finally:
            self.closed = True


def events(writes: list[bytes]) -> list[bytes]:
    return [e + b"\n\n" for w in writes for e in w.split(b"\n\n") if e]


async def test_no_interval_writes_every_event_alone() -> None:
    src = Source([0, 0, 0])
    writes = [w async for w in coalesced(b"data: first\n\n", src.gen(), 0)]
    assert writes == [b"data: first\n\n", b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert src.closed


async def test_a_fast_burst_is_joined_and_nothing_is_lost_or_reordered() -> None:
    src = Source([0] * 50)
    writes = [w async for w in coalesced(b"data: first\n\n", src.gen(), 0.05)]
    assert writes[0] == b"data: first\n\n"  # the first event is never held back
    assert len(writes) <= 3
    assert events(writes) == [b"data: first\n\n"] + [f"data: {i}\n\n".encode() for i in range(50)]


async def test_a_slow_stream_is_written_event_by_event() -> None:
    src = Source([0.03] * 4)
    writes = [w async for w in coalesced(b"", src.gen(), 0.005)]
    assert writes == [f"data: {i}\n\n".encode() for i in range(4)]


async def test_an_error_in_the_source_is_raised_after_what_came_before() -> None:
    src = Source([0, 0, 0], fail_after=2)
    got: list[bytes] = []
    with pytest.raises(RuntimeError, match="triton went away"):
        async for w in coalesced(b"", src.gen(), 0.01):
            got.append(w)
    assert events(got) == [b"data: 0\n\n", b"data: 1\n\n"]
    assert src.closed


async def test_closing_early_closes_the_source() -> None:
    src = Source([0, 0, 0], hang_after=1)
    stream = coalesced(b"", src.gen(), 0.01)
    assert await anext(stream) == b"data: 0\n\n"
    await stream.aclose()  # the client went away while the source waits on Triton
    assert src.closed


async def test_cancelling_the_writer_closes_the_source() -> None:
    src = Source([0, 0, 0], hang_after=1)

    async def consume() -> None:
        async for _ in coalesced(b"", src.gen(), 0.01):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert src.closed
