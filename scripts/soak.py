"""Soak: mixed requests at high concurrency on loopback, ordinary and hostile; reports every unexpected
answer (must be 0) and the gateway's memory and file descriptors (must not keep growing).

    python scripts/soak.py                          # start Triton + the gateway CLI, 4,000 requests at 48
    python scripts/soak.py --duration 600           # ten minutes instead of a request count
    python scripts/soak.py --url http://127.0.0.1:5100 --pid 1234 --api-key K   # an already running gateway
    python scripts/soak.py --triton 127.0.0.1:8001 127.0.0.1:8000               # a running Triton

The mix: chat, streamed chat, Anthropic Messages plain and streamed, embeddings and rerank, a Responses
compaction (`/v1/responses/compact`) and one as Codex's remote compaction asks for it (a final
`compaction_trigger` input item on `/v1/responses`: exactly one `compaction` output item) and a two-turn Responses
WebSocket session (the second
turn continues the first with `previous_response_id`) (200 expected), and where the gateway serves `vision-vllm`
(the images reference model; the gateway this script starts does) a chat with a small data-URL PNG of a size and
colour of its own, whose answer must name both; plus the hostile kinds (`--mix ordinary` leaves them out):
completions that fan out within the per-model limit (200, or 429 when the model is full) and past it (400
too_many_sequences), a ~2 MB chat message, completions prompt and embedding input (400 context_length_exceeded),
reserved chat_template_kwargs (400), streams whose client disconnects after the first chunk, and (with
`vision-vllm`) a 12 KB PNG of 10,000 x 10,000 pixels (400 naming the part: the pixel cap, checked before
decoding). Every `--storm-every` seconds a storm of silent connections is opened and left alone: the gateway must
close each within its header timeout.

The gateway runs as its own process (the CLI), so its resident memory and open fds are measured without
the load generator's: after a warm-up (a tenth of the load: allocator pools, tokenizer caches and gRPC
channels are filled by then), every second during the run (peak) and at the end. The run fails when an
answer was unexpected or the RSS grew by more than `--max-growth-mib`. Exit code 0 = pass. `--json`
prints the report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import websockets

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.image_samples import data_url, png_bomb, solid  # noqa: E402 - after the checkout is on the path

LLM = "smollm2-135m-instruct"
EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
VISION = "vision-vllm"  # the images reference model (triton_models/vision-vllm): "image 1: WxH, colour."
KINDS = ("chat", "stream", "messages", "messages_stream", "embeddings", "rerank", "compact", "compact_trigger",
         "ws_session")
HOSTILE = ("fanout", "fanout_too_big", "big_chat", "big_prompt", "big_embedding", "reserved_kwargs",
           "disconnect")
IMAGE_KINDS = ("image",)  # in the mix where the gateway serves VISION
IMAGE_HOSTILE = ("image_bomb",)
# What each kind may answer; anything else is an error.
EXPECTED: dict[str, frozenset[int]] = {
    **{k: frozenset({200}) for k in (*KINDS, *IMAGE_KINDS)}, "fanout": frozenset({200, 429}),
    "fanout_too_big": frozenset({400}), "big_chat": frozenset({400}), "big_prompt": frozenset({400}),
    "big_embedding": frozenset({400}), "reserved_kwargs": frozenset({400}), "disconnect": frozenset({200}),
    "image_bomb": frozenset({400}),
}
COLOURS = ("red", "green", "blue")  # of tests/image_samples.py, each named as such by VISION
BIG = ("All work and no play makes Jack a dull boy. " * 48000)[:2_000_000]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(folder: Path, grpc_url: str, http_url: str, vision: bool = False) -> Path:
    """The bundled config's LLM, embedding and rerank models on this Triton; with `vision`, also VISION (which
    the Triton must serve), counting prompt tokens with the LLM's tokenizer as the image tests do."""
    from openai_api.config import BUNDLED_CONFIG

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    wanted = {"llm": LLM, "embedding": EMBEDDING, "rerank": RERANK}
    for kind in ("llm", "embedding", "rerank"):
        data[kind] = [e for e in data.get(kind, []) if e["name"] == wanted[kind]]
        data["model_infos"] = [i for i in data.get("model_infos", []) if i["name"] == LLM]  # those of llm kept only
        for entry in data[kind]:
            for key in ("path", "chat_template"):
                if entry.get(key):
                    entry[key] = str((BUNDLED_CONFIG.parent / entry[key]).resolve())
            entry["url"] = grpc_url if kind == "llm" else http_url
    if vision:
        data["llm"].append({"name": VISION, "url": grpc_url, "path": data["llm"][0]["path"], "image_tokens": 64,
                            "chat_template": str(BUNDLED_CONFIG.parent / "chat_templates" / "chatml-vision.jinja")})
    path = folder / "model_config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


class Gateway:
    """The gateway CLI as a subprocess pointed at a running Triton."""

    def __init__(self, grpc_url: str, http_url: str, api_key: str, extra_args: tuple[str, ...] = (),
                 vision: bool = False) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="soak-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.folder / "gateway.log"
        config = write_config(self.folder, grpc_url, http_url, vision)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "openai_api_cli.py", "--host", "127.0.0.1", "--port", str(self.port),
                 "--config-file", str(config), "--api-key", api_key, "--no-access-log",
                 "--uvicorn-log-level", "warning", *extra_args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health/ready", timeout=5).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"gateway not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


BOMB = data_url(png_bomb())  # ~12 KB: 10,000 x 10,000 pixels


def image_of(i: int) -> tuple[int, int, str]:
    """Request i's image: a size and colour of its own, so it is decoded for real (the cache rarely hits)."""
    return 8 + i % 97, 8 + i % 61, COLOURS[i % len(COLOURS)]


def request_for(kind: str, i: int) -> tuple[str, dict[str, Any]]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    text = " ".join(random.choice(words) for _ in range(8)) + f" {i}"
    chat = {"model": LLM, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0}
    if kind in ("chat", "stream"):
        body: dict[str, Any] = dict(chat)
        if kind == "stream":
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body
    if kind in ("messages", "messages_stream"):
        return "/v1/messages", {"model": LLM, "max_tokens": 1, "messages": [{"role": "user", "content": text}],
                                "stream": kind == "messages_stream"}
    if kind == "compact":  # Codex's compaction: the served model summarizes the conversation
        return "/v1/responses/compact", {"model": LLM, "max_output_tokens": 2, "input": [
            {"role": "user", "content": text}, {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "go on"}]}
    if kind == "compact_trigger":  # Codex's remote compaction v2: a final compaction_trigger item
        return "/v1/responses", {"model": LLM, "max_output_tokens": 2, "store": False, "input": [
            {"role": "user", "content": text}, {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "go on"}, {"type": "compaction_trigger"}]}
    if kind == "ws_session":  # two turns on one Responses WebSocket, the second continuing the first
        return "/v1/responses", {"model": LLM, "max_output_tokens": 1, "temperature": 0, "store": False,
                                 "input": text}
    if kind == "image":
        w, h, colour = image_of(i)
        parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": data_url(
            solid(w, h, colour))}}]
        return "/v1/chat/completions", {"model": VISION, "max_tokens": 32, "temperature": 0,
                                        "messages": [{"role": "user", "content": parts}]}
    if kind == "image_bomb":
        parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": BOMB}}]
        return "/v1/chat/completions", {"model": VISION, "max_tokens": 1,
                                        "messages": [{"role": "user", "content": parts}]}
    if kind == "embeddings":
        return "/v1/embeddings", {"model": EMBEDDING, "input": [text, text[::-1]]}
    if kind == "rerank":
        return "/v1/rerank", {"model": RERANK, "query": text, "documents": [text, "unrelated words", text[:10]]}
    if kind == "fanout":
        return "/v1/completions", {"model": LLM, "prompt": [text, text[::-1]], "n": 2, "max_tokens": 1}
    if kind == "fanout_too_big":
        return "/v1/completions", {"model": LLM, "prompt": [text] * 300, "n": 16, "max_tokens": 1}
    if kind == "big_chat":
        return "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": BIG}]}
    if kind == "big_prompt":
        return "/v1/completions", {"model": LLM, "prompt": BIG, "max_tokens": 1}
    if kind == "big_embedding":
        return "/v1/embeddings", {"model": EMBEDDING, "input": BIG}
    if kind == "reserved_kwargs":
        return "/v1/chat/completions", {**chat, "chat_template_kwargs": {"messages": []}}
    if kind == "disconnect":
        return "/v1/chat/completions", {**chat, "max_tokens": 64, "stream": True}
    raise ValueError(kind)


def check(kind: str, status: int, payload: bytes, i: int = 0) -> str | None:
    """None when the response to request `i` of `kind` is right; else a short reason."""
    if status not in EXPECTED[kind]:
        return f"{kind}: HTTP {status} {payload[:200]!r}"
    if status != 200:
        err = json.loads(payload).get("error", {})
        if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"}:
            return f"{kind}: HTTP {status} without OpenAI's error shape {payload[:200]!r}"
        if kind == "image_bomb" and (err["param"] != "messages[0].content[1]" or "too_many_pixels" not in
                                     err["message"]):
            return f"image_bomb: not the pixel cap naming the part {payload[:300]!r}"
        return None
    if kind == "disconnect":
        return None
    if kind == "stream":
        events = [line[6:] for line in payload.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]" or any('"error"' in e for e in events):
            return f"stream: bad ending {events[-2:]!r}"
        return None
    if kind == "compact":
        body = json.loads(payload)
        items = body.get("output") or [{}]
        if body.get("object") != "response.compaction" or items[-1].get("type") != "compaction":
            return f"compact: not a compaction {payload[:200]!r}"
        return None
    if kind == "compact_trigger":
        body = json.loads(payload)
        items = body.get("output") or []
        if body.get("object") != "response" or [i.get("type") for i in items] != ["compaction"]:
            return f"compact_trigger: not one compaction item {payload[:200]!r}"
        return None
    if kind == "ws_session":
        ends = json.loads(payload)
        # max_output_tokens 1: a turn usually ends incomplete (reason max_output_tokens), as OpenAI's would
        if len(ends) != 2 or not set(ends) <= {"response.completed", "response.incomplete"}:
            return f"ws_session: turns ended {ends!r}"
        return None
    if kind == "messages_stream":
        names = [line[7:] for line in payload.decode().splitlines() if line.startswith("event: ")]
        if names[:1] != ["message_start"] or names[-1:] != ["message_stop"] or "error" in names:
            return f"messages_stream: events {names[:2]!r} ... {names[-2:]!r}"
        return None
    body = json.loads(payload)
    # One token may decode to no text (a special token, or half of a UTF-8 character the cut leaves
    # incomplete): Anthropic's content is then an empty list, so only the shape is checked.
    if kind == "messages" and (body.get("type") != "message" or not isinstance(body.get("content"), list)
                               or body.get("stop_reason") not in ("max_tokens", "end_turn")):
        return f"messages: not a message {payload[:200]!r}"
    if kind == "image":
        w, h, colour = image_of(i)
        answer = body["choices"][0]["message"]["content"] if body.get("choices") else None
        if answer != f"image 1: {w}x{h}, {colour}.":
            return f"image: {answer!r} for a {w}x{h} {colour} PNG"
    if kind in ("chat", "fanout") and not body.get("choices"):
        return f"{kind}: no choices"
    if kind == "embeddings" and len(body.get("data", [])) != 2:
        return "embeddings: wrong count"
    if kind == "rerank" and len(body.get("data", [])) != 3:
        return "rerank: wrong count"
    return None


async def ws_session(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """Two `response.create`s on one WebSocket (the second names the first with `previous_response_id`): 200 and
    the type of each turn's last event, or an error event's status."""
    url = str(client.base_url.copy_with(scheme="ws" if client.base_url.scheme == "http" else "wss", path=path))
    ends: list[str] = []
    async with websockets.connect(url, additional_headers={"Authorization": client.headers["Authorization"]},
                                  open_timeout=60, max_size=2**24) as ws:
        previous = None
        for turn in (body, {**body, "input": "and again"}):
            await ws.send(json.dumps({"type": "response.create", **turn,
                                      **({"previous_response_id": previous} if previous else {})}))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 300))
                if event.get("type") == "error":
                    return int(event.get("status", 500)), json.dumps(event).encode()
                if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                    previous = event["response"]["id"]
                    ends.append(event["type"])
                    break
    return 200, json.dumps(ends).encode()


async def send(client: httpx.AsyncClient, kind: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    if kind == "ws_session":
        return await ws_session(client, path, body)
    if kind != "disconnect":
        r = await client.post(path, json=body)
        return r.status_code, r.content
    async with client.stream("POST", path, json=body) as r:  # leave after the first chunk: a client gone
        async for _ in r.aiter_bytes():
            break
        return r.status_code, b""


async def storm(host: str, port: int, size: int, every: float, close_within: float, stop: asyncio.Event,
                out: dict[str, int]) -> None:
    """Every `every` s: `size` connections that send nothing; each must be closed by the gateway in time."""

    async def silent() -> bool:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return True  # refused at the cap: also fine
        try:
            return await asyncio.wait_for(reader.read(1), close_within) == b""
        except (TimeoutError, ConnectionError):
            return False
        finally:
            writer.close()

    while not stop.is_set():
        results = await asyncio.gather(*(silent() for _ in range(size)))
        out["opened"] += size
        out["not_closed"] += results.count(False)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def run_load(url: str, api_key: str, count: int, concurrency: int, seed: int = 0,
                   on_progress: Any = None, kinds_mix: tuple[str, ...] = KINDS,
                   duration: float | None = None) -> dict[str, Any]:
    random.seed(seed)
    kinds = [kinds_mix[i % len(kinds_mix)] for i in range(max(count, len(kinds_mix)))]
    random.shuffle(kinds)
    errors: list[str] = []
    done = {k: 0 for k in kinds_mix}
    statuses: dict[str, int] = {}
    next_index = 0
    deadline = time.monotonic() + duration if duration else None
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300,
                                 limits=limits) as client:

        async def worker() -> None:
            nonlocal next_index
            while (next_index < count) if deadline is None else (time.monotonic() < deadline):
                i = next_index
                next_index += 1
                kind = kinds[i % len(kinds)]
                path, body = request_for(kind, i)
                try:
                    status, payload = await send(client, kind, path, body)
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
                    problem = check(kind, status, payload, i)
                except (TimeoutError, httpx.HTTPError, ValueError, OSError, websockets.WebSocketException) as e:
                    problem = f"{kind}: {type(e).__name__}: {e}"
                if problem:
                    errors.append(problem)
                done[kind] += 1
                if on_progress is not None:
                    on_progress(i)

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    total = sum(done.values())
    return {"requests": total, "concurrency": concurrency, "seconds": round(elapsed, 1),
            "per_second": round(total / elapsed, 1), "by_kind": done, "by_status": dict(sorted(statuses.items())),
            "errors": len(errors), "error_samples": errors[:10]}


class Sampler:
    """The gateway's RSS and open fds, once a second while a run goes on (start, peak, end)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = [rss_mib(pid)]
        self.fds = [open_fds(pid)]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            self.sample()

    def sample(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.rss.append(rss_mib(self.pid))
            self.fds.append(open_fds(self.pid))

    def report(self) -> dict[str, Any]:
        return {"start_mib": round(self.rss[0], 1), "peak_mib": round(max(self.rss), 1),
                "end_mib": round(self.rss[-1], 1), "growth_mib": round(self.rss[-1] - self.rss[0], 1),
                "fds_start": self.fds[0], "fds_peak": max(self.fds), "fds_end": self.fds[-1]}


async def measured(url: str, pid: int | None, api_key: str, count: int, concurrency: int, seed: int,
                   kinds_mix: tuple[str, ...], duration: float | None, storm_every: float | None,
                   storm_size: int, storm_close_within: float) -> tuple[dict[str, Any], dict[str, Any]]:
    stop = asyncio.Event()
    sampler = Sampler(pid) if pid is not None else None
    storms = {"opened": 0, "not_closed": 0}
    side = []
    if sampler is not None:
        side.append(asyncio.create_task(sampler.run(stop)))
    if storm_every:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        side.append(asyncio.create_task(storm(host, int(port), storm_size, storm_every, storm_close_within, stop,
                                              storms)))
    try:
        load = await run_load(url, api_key, count, concurrency, seed=seed, kinds_mix=kinds_mix, duration=duration)
    finally:
        stop.set()
        await asyncio.gather(*side)
    if sampler is not None:
        await asyncio.sleep(1.0)  # the end: after the last storm's connections are gone
        sampler.sample()
    if storm_every:
        load["silent_connections"] = storms
        if storms["not_closed"]:
            load["errors"] += storms["not_closed"]
            load["error_samples"].append(f"{storms['not_closed']} silent connections were not closed in time")
    return load, (sampler.report() if sampler is not None else {})


def serves_vision(url: str, api_key: str) -> bool:
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    return VISION in {m["id"] for m in r.json()["data"]}


def mix_of(mix: str, vision: bool) -> tuple[str, ...]:
    """The kinds a run sends, in a fixed order (run_load shuffles the requests, not the kinds)."""
    kinds = KINDS + (IMAGE_KINDS if vision else ())
    return kinds + HOSTILE + (IMAGE_HOSTILE if vision else ()) if mix == "hostile" else kinds


def soak(url: str, pid: int | None, api_key: str, count: int, concurrency: int, max_growth_mib: float,
         mix: str = "hostile", duration: float | None = None, storm_every: float | None = None,
         storm_size: int = 200, storm_close_within: float = 15.0) -> dict[str, Any]:
    kinds = mix_of(mix, serves_vision(url, api_key))
    warmup_count = max(concurrency, count // 10)
    report: dict[str, Any] = {
        "warmup": asyncio.run(run_load(url, api_key, warmup_count, concurrency, seed=1, kinds_mix=kinds,
                                       duration=duration / 10 if duration else None))}
    load, memory = asyncio.run(measured(url, pid, api_key, count, concurrency, 2, kinds, duration, storm_every,
                                        storm_size, storm_close_within))
    report["soak"] = load
    report["rss"] = memory
    errors = report["warmup"]["errors"] + load["errors"]
    grew = memory.get("growth_mib", 0.0) > max_growth_mib
    report["errors"] = errors
    report["passed"] = errors == 0 and not grew
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--duration", type=float, help="run this many seconds instead of --requests")
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--mix", choices=["hostile", "ordinary"], default="hostile",
                   help="hostile (default): ordinary requests plus fan-out, big inputs, bad kwargs, disconnects")
    p.add_argument("--storm-every", type=float, default=15.0, metavar="SECONDS",
                   help="open a storm of silent connections this often (0: never; default 15)")
    p.add_argument("--storm-size", type=int, default=200, help="silent connections per storm (default 200)")
    p.add_argument("--url", help="a running gateway (with --pid to measure its memory)")
    p.add_argument("--pid", type=int, help="the running gateway's process id")
    p.add_argument("--api-key", default="soak-key")
    p.add_argument("--triton", nargs=2, metavar=("GRPC_URL", "HTTP_URL"),
                   help="a running Triton with the bundled models: start only the gateway")
    p.add_argument("--vision", action="store_true",
                   help=f"with --triton: it serves {VISION} too (images join the mix)")
    p.add_argument("--max-growth-mib", type=float, default=48.0,
                   help="fail when the gateway's RSS grows more than this after the warm-up (default 48)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)

    triton = gateway = None
    try:
        url, pid = args.url, args.pid
        if url is None:
            if args.triton:
                grpc_url, http_url = args.triton
            else:
                from openai_api.embedded.launcher import EmbeddedTriton
                from openai_api.embedded.prepare import prepare_models

                prepare_models()
                triton = EmbeddedTriton(models=[LLM, EMBEDDING, RERANK, VISION]).start()
                grpc_url, http_url = triton.grpc_url, triton.http_url
            gateway = Gateway(grpc_url, http_url, args.api_key, vision=args.triton is None or args.vision)
            gateway.wait_ready()
            url, pid = gateway.url, gateway.proc.pid
        report = soak(url, pid, args.api_key, args.requests, args.concurrency, args.max_growth_mib, args.mix,
                      args.duration, args.storm_every or None, args.storm_size)
        if gateway is not None:
            report["gateway_exit_code"] = gateway.stop()
            report["passed"] = report["passed"] and report["gateway_exit_code"] == 0
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            s = report["soak"]
            print(f"soak: {s['requests']} requests at concurrency {s['concurrency']} in {s['seconds']} s "
                  f"({s['per_second']}/s) {s['by_kind']}")
            print(f"answers by status: {s['by_status']}; silent connections: {s.get('silent_connections')}")
            print(f"errors: {report['errors']} {report['soak']['error_samples'] or ''}")
            if report["rss"]:
                r = report["rss"]
                print(f"gateway RSS: {r['start_mib']} MiB after warm-up, peak {r['peak_mib']}, end {r['end_mib']} "
                      f"(growth {r['growth_mib']:+} MiB); open fds {r['fds_start']} / peak {r['fds_peak']} / "
                      f"end {r['fds_end']}")
            print("PASS" if report["passed"] else "FAIL")
        return 0 if report["passed"] else 1
    finally:
        if gateway is not None:
            gateway.stop()
        if triton is not None:
            triton.stop()


if __name__ == "__main__":
    sys.exit(main())
