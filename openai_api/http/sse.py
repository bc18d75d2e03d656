"""Writing an SSE byte stream with as few socket writes as the flush interval allows.

On these machines one small loopback write costs tens of microseconds of CPU (the kernel does the
reader's TCP work and wakes it), more than all of the gateway's own per-token Python. An engine
streaming thousands of tokens per second would pay that once per token. `coalesced` keeps every
event as its own SSE event (clients see exactly the same bytes) but writes the events that arrive
within `interval_s` of the previous write together, once that interval has passed:

* the first event, and any event arriving after a quiet interval, is written at once, so time to
  first token and slow (human-speed) streams are untouched;
* only a stream producing faster than one event per interval waits, and then at most `interval_s`;
* the end of the stream flushes at once.

A `keepalive` (Anthropic's `ping` event) is written whenever nothing was written for `keepalive_s`: the
writer's own timer, so a stream that wants one costs no task or queue per event beyond the coalescing's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator


async def coalesced(first: bytes, source: AsyncGenerator[bytes, None], interval_s: float,
                    keepalive: bytes = b"", keepalive_s: float = 0.0) -> AsyncGenerator[bytes, None]:
    """Yield `first`, then `source`'s chunks, joined per write as described above, and `keepalive` after
    every `keepalive_s` without a write (`keepalive_s <= 0`: never).

    `source` runs in a task of its own so it keeps reading (from Triton) while a write is held back.
    Closing or cancelling this generator (client gone) cancels that task, which closes `source`, which
    cancels the Triton request; an exception `source` raises is raised here. `interval_s <= 0` (and no
    keepalive) passes chunks through one write each.
    """
    if interval_s <= 0 and keepalive_s <= 0:
        try:
            if first:
                yield first
            async for chunk in source:
                yield chunk
        finally:
            await source.aclose()
        return

    loop = asyncio.get_running_loop()
    buf: list[bytes] = [first] if first else []
    wake: asyncio.Future[None] | None = None
    done = False
    error: BaseException | None = None

    def _wake() -> None:
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def pump() -> None:
        nonlocal done, error
        try:
            async for chunk in source:
                buf.append(chunk)
                _wake()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised by the writer, in the request's own task
            error = e
        finally:
            done = True
            _wake()
            await source.aclose()

    task = loop.create_task(pump())
    # As if the last write were one interval ago: the first event goes at once, the first keepalive is due one
    # keepalive_s from now.
    last = loop.time() - interval_s if keepalive_s > 0 else -interval_s
    try:
        while True:
            if buf:
                wait = last + interval_s - loop.time()
                if wait > 0 and not done:
                    await asyncio.sleep(wait)  # events keep arriving meanwhile; all go in this write
                data = buf[0] if len(buf) == 1 else b"".join(buf)
                buf.clear()
                last = loop.time()
                yield data
            elif done:
                break
            else:
                wake = loop.create_future()
                timer = loop.call_later(last + keepalive_s - loop.time(), _wake) if keepalive_s > 0 else None
                await wake
                wake = None
                if timer is not None:
                    timer.cancel()
                    if not buf and not done and loop.time() - last >= keepalive_s:
                        buf.append(keepalive)
        if error is not None:
            raise error
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
