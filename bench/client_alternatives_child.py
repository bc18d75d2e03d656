"""The child side of ``bench.client_alternatives`` (``python -m bench.client_alternatives --child ...``): one
Triton client per process - the sync gRPC and tritonclient workers, Triton's HTTP ``generate_stream`` with
aiohttp or httpx, the gateway's streamed chat - connected, told when to start, and its tokens and own CPU
over the window written to stdout as one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


class SyncGrpcLLM:
    """grpc's blocking API: one open ``ModelStreamInfer`` call per thread, requests written through a
    queue that the call's request iterator reads, responses read until Triton's final flag."""

    def __init__(self, url: str, request_pb: Any) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        self.channel = grpc.insecure_channel(url)
        self.call = self.channel.stream_stream(
            _STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        request_pb.parameters["triton_enable_empty_final_response"].bool_param = True
        self.request_pb = request_pb

    def worker(self) -> SyncGrpcWorker:
        return SyncGrpcWorker(self)

    def close(self) -> None:
        self.channel.close()


class SyncGrpcWorker:
    def __init__(self, llm: SyncGrpcLLM) -> None:
        from openai_api.triton.wire import raw_output

        self._raw_output = raw_output
        self.llm = llm
        self.q: queue.Queue[Any] = queue.Queue()
        self.responses = llm.call(iter(self.q.get, None))

    def generate(self, on_count: Any) -> int:
        self.q.put(self.llm.request_pb)
        total = 0
        for resp in self.responses:
            if resp.error_message:
                raise RuntimeError(resp.error_message)
            raw = self._raw_output(resp.infer_response, "output_ids")
            k = len(raw) // 4 if raw else 0
            if k:
                total += k
                on_count(k)
            params = resp.infer_response.parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                return total
        raise RuntimeError("stream ended before the final response")

    def close(self) -> None:
        self.q.put(None)  # half-close: Triton ends the call, no cancellation burst
        for _ in self.responses:
            pass


class SyncTritonClientWorker:
    """``tritonclient.grpc``: one client, one callback stream; requests wait for their final response."""

    def __init__(self, url: str, model: str, inputs: list[Any], outputs: list[Any]) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.model, self.inputs, self.outputs = model, inputs, outputs
        self.results: queue.Queue[Any] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def generate(self, on_count: Any) -> int:
        self.client.async_stream_infer(self.model, self.inputs, outputs=self.outputs, enable_empty_final_response=True)
        total = 0
        while True:
            result, error = self.results.get()
            if error is not None:
                raise RuntimeError(str(error))
            k = 0
            arr = result.as_numpy("output_ids")
            if arr is not None:
                k = int(arr.size)
            if k:
                total += k
                on_count(k)
            resp = result.get_response()
            if resp.parameters["triton_final_response"].bool_param:
                return total

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class HTTPGenerateLLM:
    """Triton's ``generate_stream`` over HTTP/1.1 keep-alive (aiohttp or httpx), SSE parsed per event."""

    def __init__(self, http_url: str, model: str, body: dict[str, Any], lib: str, concurrency: int) -> None:
        import orjson

        self.url = f"http://{http_url}/v2/models/{model}/generate_stream"
        self.body = orjson.dumps(body)
        self.loads = orjson.loads
        self.lib = lib
        self.concurrency = concurrency
        self.session: Any = None

    async def open(self) -> None:
        if self.lib == "aiohttp":
            import aiohttp

            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency + 4), timeout=aiohttp.ClientTimeout(total=None)
            )
        else:
            import httpx

            self.session = httpx.AsyncClient(
                timeout=None, limits=httpx.Limits(max_connections=self.concurrency + 4, max_keepalive_connections=None)
            )

    def _count(self, line: bytes) -> int:
        if not line.startswith(b"data:"):
            return 0
        event = self.loads(line[5:])
        if "error" in event:
            raise RuntimeError(f"generate_stream error: {event['error']}")
        ids = event.get("output_ids")
        return len(ids) if isinstance(ids, list) else (0 if ids is None else 1)

    async def generate(self, max_tokens: int, on_count: Any = None, streaming: bool = True) -> int:
        total = 0
        headers = {"Content-Type": "application/json"}
        if self.lib == "aiohttp":
            async with self.session.post(self.url, data=self.body, headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
                async for line in resp.content:
                    k = self._count(line)
                    if k:
                        total += k
                        if on_count is not None:
                            on_count(k)
        else:
            async with self.session.stream("POST", self.url, content=self.body, headers=headers) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
                async for text in resp.aiter_lines():
                    k = self._count(text.encode())
                    if k:
                        total += k
                        if on_count is not None:
                            on_count(k)
        return total

    async def close(self) -> None:
        if self.session is not None:
            await (self.session.close() if self.lib == "aiohttp" else self.session.aclose())


class GatewayChat:
    """Streamed chats through the gateway, counted from the raw SSE bytes (``bench.load``)."""

    def __init__(self, gateway_url: str, model: str) -> None:
        from bench.load import ConnectionPool

        host, port = gateway_url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.pool = ConnectionPool(host, int(port))
        self.model = model

    async def generate(self, max_tokens: int, on_count: Any = None, streaming: bool = True) -> int:
        from bench.board import MESSAGES
        from bench.load import CONTENT_MARKER

        payload = {"model": self.model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
        async with self.pool.connection() as conn:
            return await conn.post_stream("/v1/chat/completions", payload, on_count or (lambda k: None), CONTENT_MARKER)

    async def close(self) -> None:
        self.pool.close()


def _http_body(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    """The TensorRT-LLM inputs as generate-extension JSON fields (a list is a tensor of that length;
    Triton adds the batch dimension of this batched model)."""
    return {
        "input_ids": prompt_ids,
        "input_lengths": [len(prompt_ids)],
        "request_output_len": [a.tokens],
        "end_id": [a.end_id],
        "pad_id": [a.pad_id],
        "streaming": [True],
    }


def _tritonclient_io(a: argparse.Namespace, prompt_ids: list[int]) -> tuple[list[Any], list[Any]]:
    from bench.limit import TritonClientLLM

    llm = TritonClientLLM.__new__(TritonClientLLM)  # its payload builder only, no client
    llm.model, llm.prompt_ids, llm.end_id, llm.pad_id = a.model, prompt_ids, a.end_id, a.pad_id
    p = llm.payload(a.tokens, True)
    return p["inputs"], p["outputs"]


def _relay_threads(workers: list[Any], a: argparse.Namespace, start: float) -> dict[str, Any]:
    """The sync clients' relay: a thread per stream, counts per thread (no lock on the hot path)."""
    counts = [0] * len(workers)
    errors: list[str] = []
    stop = threading.Event()

    def loop(i: int) -> None:
        def add(k: int) -> None:
            counts[i] += k

        while not stop.is_set():
            try:
                workers[i].generate(add)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                errors.append(f"{type(e).__name__}: {e}"[:300])
                time.sleep(0.05)

    _sleep_until_sync(start)
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    _sleep_until_sync(start + a.warmup)
    v0, t0, c0 = sum(counts), time.perf_counter(), time.process_time()
    _sleep_until_sync(start + a.warmup + a.measure)
    v1, t1, c1 = sum(counts), time.perf_counter(), time.process_time()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    return {"units": v1 - v0, "seconds": t1 - t0, "cpu_s": c1 - c0, "errors": len(errors), "first_errors": errors[:3]}


def _sleep_until_sync(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def _child_sync(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    workers: list[Any] = []
    shared: Any = None
    if a.client == "grpc_sync":
        from bench.limit import RpcLLM

        req = RpcLLM.__new__(RpcLLM)  # its request builder only, no channel
        req.model, req.prompt_ids, req.end_id, req.pad_id, req._requests = (a.model, prompt_ids, a.end_id, a.pad_id, {})
        shared = SyncGrpcLLM(a.url, req.request(a.tokens, True).pb)
        workers = [shared.worker() for _ in range(a.concurrency)]
    else:
        inputs, outputs = _tritonclient_io(a, prompt_ids)
        workers = [SyncTritonClientWorker(a.url, a.model, inputs, outputs) for _ in range(a.concurrency)]
    try:
        # Connect every stream before saying ready, all at once (one after another, 16 paced 64-token
        # requests took ~20 s).
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(lambda w: w.generate(lambda k: None), workers))
        print("ready", flush=True)
        line = sys.stdin.readline().strip()
        return _relay_threads(workers, a, float(line) if line else time.time())
    finally:
        for w in workers:
            w.close()
        if shared is not None:
            shared.close()


async def _child_async(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    from bench.limit import RpcLLM, TritonClientLLM, _relay

    llm: Any
    if a.client == "rpc":
        llm = RpcLLM(a.url, a.model, prompt_ids, a.end_id, a.pad_id)
    elif a.client == "tritonclient_aio":
        llm = TritonClientLLM(a.url, a.model, prompt_ids, a.end_id, a.pad_id)
    elif a.client == "gateway":
        llm = GatewayChat(a.gateway_url, a.model)
    else:
        llm = HTTPGenerateLLM(a.http_url, a.model, _http_body(a, prompt_ids), a.client.split("_", 1)[1], a.concurrency)
        await llm.open()
    try:
        got = await asyncio.gather(*(llm.generate(a.tokens) for _ in range(a.concurrency)))
        if any(g != a.tokens for g in got):
            raise RuntimeError(f"{a.client}: {got} tokens, wanted {a.tokens}")
        print("ready", flush=True)
        line = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
        a.pace_us = 0.0
        return await _relay(llm, a, float(line) if line else time.time())
    finally:
        await llm.close()


def child_main(a: argparse.Namespace) -> int:
    prompt_ids = [int(x) for x in a.prompt_ids.split(",")]
    a.concurrency = int(a.concurrency)  # one level per child (the parent's flag is a list)
    if a.client in ("grpc_sync", "tritonclient_sync"):
        out = _child_sync(a, prompt_ids)
    else:
        import uvloop

        out = uvloop.run(_child_async(a, prompt_ids))
    out.update(client=a.client, concurrency=a.concurrency)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0
