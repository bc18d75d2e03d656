"""The gateway's own request path in this process, for ``bench.agent_sessions``: the token ids a turn sends to
Triton, and where a turn's CPU goes.

``InProcessGateway`` builds the services exactly as the gateway does (``services.container.build_services``
from the bench's model config and the default settings, so the prompt cache is on at its default size unless
``prompt_cache_mb`` says otherwise) and runs a request as its route does, through the JSON fast path
(``http.fastpath``: ``model_validate_json`` of the bytes): ``/v1/messages`` then ``parse`` and ``create``,
``/v1/responses`` then ``create``; the answer dumped with
orjson. Only the backend differs: the model's runtime is given one that records the ``GenerationRequest``
(its ``prompt_ids`` are what the TensorRT-LLM adapter would put in ``input_ids``) and answers one token. CPU
work the gateway sends to its worker threads runs inline here (``InlineWorkers``), so one thread does it all
and cProfile sees it. Not measured here: uvicorn/httptools, the middleware, the gRPC exchange; the HTTP runs
measure those (the whole gateway process).
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import orjson

from openai_api.config import load_config
from openai_api.http.dialects.anthropic_messages import parse
from openai_api.observability import Metrics
from openai_api.schemas.anthropic import MessagesRequest
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.container import build_services
from openai_api.services.context import RequestContext
from openai_api.settings import Settings
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest
from openai_api.triton.wire import encode_tensor


class InlineWorkers:
    """The CPU workers' interface, running each job in the caller's thread (profiling only)."""

    async def run(self, fn: Callable[..., Any], *args: Any, budget_s: float | None = None) -> Any:
        return fn(*args)

    def close(self) -> None:
        return None


class RecordingBackend:
    """A TensorRT-LLM-shaped backend that keeps the last request and answers with one token."""

    protocol = "tensorrt_llm"
    guide_kinds = GUIDE_KINDS

    def __init__(self, model: str, token: int) -> None:
        self.model = model
        self.token = token
        self.last: GenerationRequest | None = None

    def supports(self, param: str) -> bool:
        return param not in ("images", "kv_retention")  # as the synthetic model: no retention inputs

    async def check(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        self.last = request
        for _ in range(request.max_tokens):
            yield GenerationChunk(token_ids=[self.token])


# The stages a turn is split into (`InProcessGateway.turn_stages`), in order.
STAGES = ("parse_validate", "translate", "mark", "render", "tokenize", "other_prepare", "tensor")


class InProcessGateway:
    def __init__(self, config_path: Path, model: str, prompt_cache_mb: float = 128.0) -> None:
        config = load_config(config_path)
        settings = Settings(config_file=config_path, prompt_cache_mb=prompt_cache_mb)
        self.services = build_services(config, settings, Metrics())
        self.services.preprocess.workers.close()
        self.services.preprocess.workers = InlineWorkers()  # type: ignore[assignment]
        rt = self.services.registry.llm(model)
        self.backend = RecordingBackend(model, rt.tokenizer.eos_token_ids[0] + 1)
        self.services.registry.llms[model] = dataclasses.replace(rt, backend=self.backend)
        self.rt = self.services.registry.llms[model]
        self._timers: dict[str, float] = {}

    async def send(self, path: str, raw: bytes) -> dict[str, Any]:
        """One non-streamed request (``path``, body ``raw``) as the gateway's route runs it; the answer."""
        if path == "/v1/messages":
            m = MessagesRequest.model_validate_json(raw)
            svc = self.services.messages
            out = await svc.create(parse(m, svc), RequestContext("bench"))
        elif path == "/v1/responses":
            out = await self.services.responses.create(ResponsesRequest.model_validate_json(raw),
                                                       RequestContext("bench"))
        else:
            raise ValueError(f"no in-process route for {path}")
        assert isinstance(out, dict), "non-streamed requests only"
        orjson.dumps(out)
        return out

    async def prompt_ids(self, path: str, raw: bytes) -> list[int]:
        """The token ids the gateway sends to Triton for this request (``input_ids``)."""
        await self.send(path, raw)
        assert self.backend.last is not None
        return list(self.backend.last.prompt_ids)

    async def turn_stages(self, path: str, body: bytes) -> dict[str, float]:
        """CPU milliseconds of this process (``time.process_time``: the tokenizer's own threads included; one
        request at a time) of each of ``STAGES`` for one request: the body's parse and validation; the dialect's
        translation to a chat request; the scan that marks special-token text in client content (``_mark``); the
        template render; the prompt's tokenization (through the prompt cache when on); the rest of
        ``ChatService.prepare``; the ids as the ``input_ids`` tensor's bytes (``wire.encode_tensor``, as the
        adapter encodes them); and their ``total``. Not included: generating the answer and writing it."""
        from openai_api.services import preprocess as pp

        clock = time.process_time
        spent: dict[str, float] = {"mark": 0.0, "render": 0.0, "tokenize": 0.0}

        depth = dict.fromkeys(spent, 0)

        def timed(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
            def run(*a: Any, **k: Any) -> Any:  # the outermost call only (`_mark` recurses through the global)
                depth[stage] += 1
                c0 = clock()
                try:
                    return fn(*a, **k)
                finally:
                    depth[stage] -= 1
                    if not depth[stage]:
                        spent[stage] += (clock() - c0) * 1e3
            return run

        encoder_of = pp.PromptEncoder.__dict__["of"]
        real_of = pp.PromptEncoder.of

        def timed_of(rt: Any, cache: Any, chars: int) -> Any:
            enc = real_of(rt, cache, chars)
            return _EncoderProxy(enc, timed(enc.encode, "tokenize"))

        template = self.rt.template
        assert template is not None
        real_mark = pp._mark
        template.render = timed(template.render, "render")  # type: ignore[method-assign]
        pp._mark = timed(real_mark, "mark")
        pp.PromptEncoder.of = timed_of  # type: ignore[assignment,method-assign]
        try:
            c0 = clock()
            if path == "/v1/messages":
                m = MessagesRequest.model_validate_json(body)
                c1 = clock()
                chat_req = parse(m, self.services.messages).chat
            else:
                r = ResponsesRequest.model_validate_json(body)
                c1 = clock()
                chat_req = (await self.services.responses.chat_request(r, RequestContext("bench"))).chat
            c2 = clock()
            prepared = await self.services.chat.prepare(chat_req, RequestContext("bench"))
            c3 = clock()
            encode_tensor("INT32", prepared.greqs[0].prompt_ids)
            c4 = clock()
        finally:
            del template.render
            pp._mark = real_mark
            pp.PromptEncoder.of = encoder_of  # type: ignore[method-assign]
        t = {"parse_validate": (c1 - c0) * 1e3, "translate": (c2 - c1) * 1e3, **spent}
        t["other_prepare"] = (c3 - c2) * 1e3 - sum(spent.values())
        t["tensor"] = (c4 - c3) * 1e3
        t["total"] = (c4 - c0) * 1e3
        return {k: round(v, 3) for k, v in t.items()}


class InProcessApp:
    """The gateway's whole ASGI app (``app.create_app``: every middleware, the FastAPI routes and the JSON fast
    path) in this process, with ``InProcessGateway``'s recording backend and inline workers; ``call`` delivers
    a request body in 64 KiB pieces as uvicorn's httptools protocol does. Left out: uvicorn and httptools
    themselves (the socket, HTTP parsing) and the gRPC exchange."""

    def __init__(self, config_path: Path, model: str, prompt_cache_mb: float = 128.0) -> None:
        from openai_api.app import create_app

        settings = Settings(config_file=config_path, prompt_cache_mb=prompt_cache_mb)
        self.app = create_app(load_config(config_path), settings)
        svc = self.app.state.gateway.services
        svc.preprocess.workers.close()
        svc.preprocess.workers = InlineWorkers()
        rt = svc.registry.llm(model)
        self.backend = RecordingBackend(model, rt.tokenizer.eos_token_ids[0] + 1)
        svc.registry.llms[model] = dataclasses.replace(rt, backend=self.backend)

    async def call(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        import asyncio

        hdrs = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in headers.items())]
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": hdrs, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
                 "state": {}}
        pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)] or [b""]
        done = asyncio.Event()
        status = 0
        out: list[bytes] = []

        async def receive() -> dict[str, Any]:
            if pieces:
                piece = pieces.pop(0)
                return {"type": "http.request", "body": piece, "more_body": bool(pieces)}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                out.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        await self.app(scope, receive, send)
        return status, b"".join(out)


@dataclasses.dataclass
class _EncoderProxy:
    """A `PromptEncoder` whose `encode` is timed (its `plain` and the rest as they are)."""

    inner: Any
    encode: Callable[[str], list[int]]

    def plain(self, text: str) -> list[int]:
        return self.inner.plain(text)  # type: ignore[no-any-return]


def profile_top(prof: cProfile.Profile, n: int = 25) -> dict[str, list[dict[str, Any]]]:
    """The top functions of a cProfile run by own time and by cumulative time (ms), paths shortened."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_cc, ncalls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = file
        for anchor in ("openai_api/", "site-packages/", "lib/python3.11/", "bench/"):
            i = file.find(anchor)
            if i >= 0:
                short = file[i:]
                break
        rows.append({"function": f"{func} ({short}:{line})", "calls": ncalls, "own_ms": round(tt * 1e3, 2),
                     "cumulative_ms": round(ct * 1e3, 2)})
    own = sorted(rows, key=lambda r: -r["own_ms"])[:n]
    cum = sorted(rows, key=lambda r: -r["cumulative_ms"])[:n]
    return {"own": own, "cumulative": cum}
