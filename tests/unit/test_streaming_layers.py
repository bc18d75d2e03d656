"""How many async generator layers a streamed token passes through, counted from the live stack.

From Triton to the socket a token passes: `TritonRPC.stream` -> the protocol adapter's `generate` -> the
metrics wrapper -> the streaming envelope (`sse_stream`) -> the SSE writer (`http.sse.coalesced`) -> the
socket. Here a fake stands for the first two (one layer), and the SSE writer is not on the stack when a
token is produced (its pump task iterates the envelope), so the frames seen are the fake, the metrics
wrapper and the envelope: 3 seen means 5 in production, replicas add one (6, the architecture's ceiling).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from openai_api.app import create_app
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

SEEN_IN_TEST = 3  # the fake (for rpc + adapter), the metrics wrapper, the envelope
PRODUCTION = SEEN_IN_TEST + 1 + 1  # + the second Triton layer the fake stands for + the SSE writer


class LayerCounting(FakeBackend):
    def __init__(self, script: list[list[int]]) -> None:
        super().__init__(script)
        self.layers: list[int] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        for ids in self.script:
            frame = sys._getframe()
            depth = 0
            while frame is not None:
                depth += bool(frame.f_code.co_flags & inspect.CO_ASYNC_GENERATOR)
                frame = frame.f_back
            self.layers.append(depth)
            yield GenerationChunk(token_ids=list(ids))


async def test_a_streamed_token_passes_at_most_six_generator_layers(tmp_path: Path) -> None:
    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path))
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = LayerCounting([[i] for i in rt.tokenizer.encode("one two three four five six")])
    rt.backend.inner = fake  # behind the real metrics wrapper, as the adapter is
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "stream": True,
                                                        "messages": [{"role": "user", "content": "Count."}]})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    await app.state.gateway.services.registry.pool.close()
    assert fake.layers and max(fake.layers) == SEEN_IN_TEST, fake.layers
    assert PRODUCTION + 1 <= 6  # with replicas
