"""A paced OpenAI-compatible stand-in: the upstream LiteLLM is measured against (issue #27).

``python -m bench.paced_upstream --port P --delay-ms 20`` serves ``POST /v1/chat/completions``
(``model`` any name, ``max_tokens`` or ``max_completion_tokens`` tokens, default 16) and
``GET /v1/models`` / ``GET /health`` on aiohttp. It does no model work: a streamed request gets its
first content chunk at once and each next one ``delay_ms`` after the previous one was due (due times
are absolute, so the pacing does not drift), then a chunk with ``finish_reason: "length"`` and usage,
then ``data: [DONE]``; a non-streamed request waits ``(max_tokens - 1) x delay_ms`` and answers one
``chat.completion``. Each token is the word " fox", so every chunk carries
``"delta":{"content":" fox"}``. It is the same pacing the synthetic Triton model gives our gateway,
and the bare client's target on the LiteLLM side (the board measures a gateway against the same
upstream called directly).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

WORD = " fox"


def _chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


def make_app(delay_ms: float) -> web.Application:
    delay = delay_ms / 1000.0
    counter = iter(range(1 << 62))

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            req = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response(
                {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}, status=400
            )
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        model = str(req.get("model", "paced"))
        cid, created = f"chatcmpl-{next(counter)}", int(time.time())
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        loop = asyncio.get_running_loop()
        if not req.get("stream"):
            await asyncio.sleep(max(0, n - 1) * delay)
            body = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": WORD * n}, "finish_reason": "length"}
                ],
                "usage": usage,
            }
            return web.Response(body=orjson.dumps(body), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        start = loop.time()
        for i in range(n):
            due = start + i * delay
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            delta: dict[str, Any] = {"content": WORD} if i else {"content": WORD, "role": "assistant"}
            await resp.write(_chunk(cid, model, created, delta, None))
        with_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        await resp.write(_chunk(cid, model, created, {}, "length", usage if with_usage else None))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "paced", "object": "model", "owned_by": "bench"}]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.paced_upstream", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=20.0)
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(a.delay_ms), host=a.host, port=a.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
