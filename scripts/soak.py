"""Bounded soak: thousands of mixed requests (chat, streamed chat, embeddings, rerank) at high concurrency
on loopback; reports errors (must be 0) and the gateway's memory (must not keep growing).

    python scripts/soak.py                          # start Triton + the gateway CLI, 4,000 requests at 48
    python scripts/soak.py --url http://127.0.0.1:5100 --pid 1234 --api-key K   # an already running gateway
    python scripts/soak.py --triton 127.0.0.1:8001 127.0.0.1:8000               # a running Triton

The gateway runs as its own process (the CLI), so its resident memory is measured without the load
generator's. RSS is read after a warm-up (a tenth of the requests: allocator pools, tokenizer caches and
gRPC channels are filled by then) and at the end; the run fails when errors > 0 or the RSS grew by more
than `--max-growth-mib`. Exit code 0 = pass. `--json` prints the report as JSON.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LLM = "smollm2-135m-instruct"
EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
KINDS = ("chat", "stream", "embeddings", "rerank")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(folder: Path, grpc_url: str, http_url: str) -> Path:
    from openai_api.config import BUNDLED_CONFIG

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    wanted = {"llm": LLM, "embedding": EMBEDDING, "rerank": RERANK}
    for kind in ("llm", "embedding", "rerank"):
        data[kind] = [e for e in data.get(kind, []) if e["name"] == wanted[kind]]
        for entry in data[kind]:
            for key in ("path", "chat_template"):
                if entry.get(key):
                    entry[key] = str((BUNDLED_CONFIG.parent / entry[key]).resolve())
            entry["url"] = grpc_url if kind == "llm" else http_url
    path = folder / "model_config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


class Gateway:
    """The gateway CLI as a subprocess pointed at a running Triton."""

    def __init__(self, grpc_url: str, http_url: str, api_key: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="soak-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.folder / "gateway.log"
        config = write_config(self.folder, grpc_url, http_url)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "openai_api_cli.py", "--host", "127.0.0.1", "--port", str(self.port),
                 "--config-file", str(config), "--api-key", api_key, "--no-access-log",
                 "--uvicorn-log-level", "warning"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

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


def request_for(kind: str, i: int) -> tuple[str, dict[str, Any]]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    text = " ".join(random.choice(words) for _ in range(8)) + f" {i}"
    if kind in ("chat", "stream"):
        body: dict[str, Any] = {"model": LLM, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
                                "temperature": 0}
        if kind == "stream":
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body
    if kind == "embeddings":
        return "/v1/embeddings", {"model": EMBEDDING, "input": [text, text[::-1]]}
    return "/v1/rerank", {"model": RERANK, "query": text, "documents": [text, "unrelated words", text[:10]]}


def check(kind: str, status: int, payload: bytes) -> str | None:
    """None when the response is right; else a short reason."""
    if status != 200:
        return f"{kind}: HTTP {status} {payload[:200]!r}"
    if kind == "stream":
        events = [line[6:] for line in payload.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]" or any('"error"' in e for e in events):
            return f"stream: bad ending {events[-2:]!r}"
        return None
    body = json.loads(payload)
    if kind == "chat" and not body.get("choices"):
        return "chat: no choices"
    if kind == "embeddings" and len(body.get("data", [])) != 2:
        return "embeddings: wrong count"
    if kind == "rerank" and len(body.get("data", [])) != 3:
        return "rerank: wrong count"
    return None


async def run_load(url: str, api_key: str, count: int, concurrency: int, seed: int = 0,
                   on_progress: Any = None) -> dict[str, Any]:
    random.seed(seed)
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    random.shuffle(kinds)
    errors: list[str] = []
    done = {k: 0 for k in KINDS}
    next_index = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300,
                                 limits=limits) as client:

        async def worker() -> None:
            nonlocal next_index
            while next_index < count:
                i = next_index
                next_index += 1
                kind = kinds[i]
                path, body = request_for(kind, i)
                try:
                    r = await client.post(path, json=body)
                    problem = check(kind, r.status_code, r.content)
                except (httpx.HTTPError, ValueError) as e:
                    problem = f"{kind}: {type(e).__name__}: {e}"
                if problem:
                    errors.append(problem)
                done[kind] += 1
                if on_progress is not None:
                    on_progress(i)

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return {"requests": count, "concurrency": concurrency, "seconds": round(elapsed, 1),
            "per_second": round(count / elapsed, 1), "by_kind": done, "errors": len(errors),
            "error_samples": errors[:10]}


def soak(url: str, pid: int | None, api_key: str, count: int, concurrency: int,
         max_growth_mib: float) -> dict[str, Any]:
    warmup = max(concurrency, count // 10)
    report: dict[str, Any] = {"warmup": asyncio.run(run_load(url, api_key, warmup, concurrency, seed=1))}
    rss: dict[str, float] = {}
    if pid is not None:
        rss["after_warmup_mib"] = round(rss_mib(pid), 1)
        samples: list[float] = []
        step = max(1, count // 4)

        def sample(i: int) -> None:
            if i and i % step == 0:
                samples.append(round(rss_mib(pid), 1))

        report["soak"] = asyncio.run(run_load(url, api_key, count, concurrency, seed=2, on_progress=sample))
        rss["during_mib"] = samples  # type: ignore[assignment]
        rss["end_mib"] = round(rss_mib(pid), 1)
        rss["growth_mib"] = round(rss["end_mib"] - rss["after_warmup_mib"], 1)
    else:
        report["soak"] = asyncio.run(run_load(url, api_key, count, concurrency, seed=2))
    report["rss"] = rss
    errors = report["warmup"]["errors"] + report["soak"]["errors"]
    grew = rss.get("growth_mib", 0.0) > max_growth_mib
    report["errors"] = errors
    report["passed"] = errors == 0 and not grew
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--url", help="a running gateway (with --pid to measure its memory)")
    p.add_argument("--pid", type=int, help="the running gateway's process id")
    p.add_argument("--api-key", default="soak-key")
    p.add_argument("--triton", nargs=2, metavar=("GRPC_URL", "HTTP_URL"),
                   help="a running Triton with the bundled models: start only the gateway")
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
                triton = EmbeddedTriton(models=[LLM, EMBEDDING, RERANK]).start()
                grpc_url, http_url = triton.grpc_url, triton.http_url
            gateway = Gateway(grpc_url, http_url, args.api_key)
            gateway.wait_ready()
            url, pid = gateway.url, gateway.proc.pid
        report = soak(url, pid, args.api_key, args.requests, args.concurrency, args.max_growth_mib)
        if gateway is not None:
            report["gateway_exit_code"] = gateway.stop()
            report["passed"] = report["passed"] and report["gateway_exit_code"] == 0
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            s = report["soak"]
            print(f"soak: {s['requests']} requests at concurrency {s['concurrency']} in {s['seconds']} s "
                  f"({s['per_second']}/s) {s['by_kind']}")
            print(f"errors: {report['errors']} {report['soak']['error_samples'] or ''}")
            if report["rss"]:
                r = report["rss"]
                print(f"gateway RSS: {r['after_warmup_mib']} MiB after warm-up, {r['during_mib']} during, "
                      f"{r['end_mib']} MiB at the end (growth {r['growth_mib']:+} MiB)")
            print("PASS" if report["passed"] else "FAIL")
        return 0 if report["passed"] else 1
    finally:
        if gateway is not None:
            gateway.stop()
        if triton is not None:
            triton.stop()


if __name__ == "__main__":
    sys.exit(main())
