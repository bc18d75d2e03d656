"""A/B of the chat stream's per-token Python cost between two checkouts, in-process, no sockets.

``.venv/bin/python bench/stream_cpu_ab.py --side base=/tmp/base --side head=/tmp/head [--reps 6]``

The relay case (``bench.relay_ab``) measures the gateway process whole, and on a shared 2-core box
its CPU per token moves with the neighbours (fewer tokens per wake-up: more system calls per token).
This isolates the part a code change moves: ``ChatService.create(stream=True)`` -> the chat dialect's
``encode`` (the service's own SSE bytes in checkouts before it) -> ``sse_stream``
(detokenizer, stop matcher, stream encoder, output parser when tools are offered, chunk bytes) over a
scripted backend that yields the synthetic model's 512 tokens one per chunk (the ids of " The quick
brown fox jumps over the lazy dog", cycled), with the model entry ``smollm2-135m-instruct`` of each
bundled ``openai_api/model_config.json`` (SmolLM2 tokenizer and template, tool parser hermes). No HTTP,
no gRPC, no metrics middleware. Each measurement is a fresh child process
(``python bench/stream_cpu_ab.py --child``, cwd and ``PYTHONPATH`` = the checkout, so it imports that
checkout's ``openai_api``; the path is recorded); the side that goes first alternates by repetition.
A child warms up, then times ``time.process_time()`` over ``--streams`` streams per case: ``plain``
(512 tokens: CPU per token, the request's own cost spread over them), ``short`` (16 tokens: mostly the
request's cost: prompt render, tokenization, validation), ``tools`` (512 tokens, one tool offered,
``tool_choice`` auto, the model answering in plain text) and ``unary`` (the 16-token chat not streamed:
CPU per request in ``cpu_us_per_stream``); the summary adds the marginal per-token
cost ((plain - short) / 496 per stream) and the request overhead. ``--profile DIR`` first runs one
cProfiled child per side (not counted): ``DIR/<side>-<case>.prof``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
SENTENCE = " The quick brown fox jumps over the lazy dog"
SHORT = 16  # tokens of the short plain stream: its CPU is mostly the per-request cost
MESSAGES = [{"role": "user", "content": "Tell me a long story about a quick brown fox."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def child(streams: int, tokens: int, profile: Path | None, cases: tuple[str, ...]) -> dict[str, Any]:
    """Runs in the checkout's interpreter: CPU per token of each case, as JSON."""
    import openai_api
    from openai_api.config import BUNDLED_CONFIG, load_config
    from openai_api.observability import Metrics
    from openai_api.schemas.openai import ChatCompletionRequest
    from openai_api.services.chat import ChatService
    from openai_api.services.preprocess import Preprocessor
    from openai_api.services.registry import ModelRegistry
    from openai_api.text.workers import CPUWorkers
    from openai_api.triton.client import TritonClientPool
    from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    entry = next(dict(e) for e in data["llm"] if e.get("name") == MODEL)
    entry["path"] = str((BUNDLED_CONFIG.parent / entry["path"]).resolve())
    entry["chat_template"] = str((BUNDLED_CONFIG.parent / entry["chat_template"]).resolve())
    infos = [i for i in data.get("model_infos", []) if i.get("name") == MODEL]
    folder = Path(tempfile.mkdtemp(prefix="stream-cpu-"))
    (folder / "model_config.json").write_text(json.dumps({"model_infos": infos, "llm": [entry]}))
    config = load_config(folder / "model_config.json")
    registry = ModelRegistry(config, TritonClientPool(), Metrics())
    rt0 = registry.llm(MODEL)
    ids = rt0.tokenizer.encode(SENTENCE * (tokens // 9 + 1))[:tokens]
    assert len(ids) == tokens

    class Scripted:
        model = MODEL
        protocol = "tensorrt_llm"
        guide_kinds = GUIDE_KINDS

        def supports(self, param: str) -> bool:
            return True

        async def check(self) -> None:
            return None

        async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
            for i in ids[: request.max_tokens]:  # as Triton honours request_output_len
                yield GenerationChunk(token_ids=[i])

    rt = dataclasses.replace(rt0, backend=Scripted())
    reg = copy.copy(registry)
    reg.llms = {rt.name: rt}
    svc = ChatService(reg, Preprocessor(CPUWorkers(1)))
    # The chat dialect encodes the service's prepared stream (checkouts from issue #37's last step on); before it,
    # the service answered the SSE bytes itself, with its encoder in `services.chat`.
    try:
        from openai_api.http.dialects.openai_chat import ChatStreamEncoder, encode
    except ImportError:
        from openai_api.services.chat import ChatStreamEncoder  # type: ignore[attr-defined,no-redef]

        encode = None  # type: ignore[assignment]
    fast_path: dict[str, bool] = {}  # per case: whether the stream encoder took the plain fast path
    current = [""]
    orig_init = ChatStreamEncoder.__init__

    def spy_init(self: Any, *a: Any, **kw: Any) -> None:
        orig_init(self, *a, **kw)
        fast_path[current[0]] = self.outputs is None

    ChatStreamEncoder.__init__ = spy_init  # type: ignore[method-assign]

    try:  # the explicit request context (checkouts from issue #37 on); a bare request id before it
        from openai_api.services.context import RequestContext
        ctx: Any = RequestContext("rid")
    except ImportError:
        ctx = "rid"

    async def one(body: dict[str, Any]) -> int:
        req = ChatCompletionRequest.model_validate(body)
        stream = await svc.create(req, ctx)
        if isinstance(stream, dict):  # a non-streamed answer
            return int(stream["usage"]["completion_tokens"])
        n = 0
        async for chunk in encode(stream) if encode is not None else stream:
            n += chunk.count(b'"delta":{"content":')
        return n

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for case, n, extra in (
            ("plain", tokens, {}),
            ("short", SHORT, {}),
            ("tools", tokens, {"tools": TOOLS}),
            ("unary", SHORT, {"stream": False}),
        ):
            if case not in cases:
                continue
            current[0] = case
            fast_path.setdefault(case, False)
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": n, "stream": True, **extra}
            for _ in range(5):
                got = await one(body)
            if got != n:
                raise RuntimeError(f"{case}: {got} content events for {n} tokens")
            prof = None
            if profile is not None:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            count = streams if n == tokens else streams * tokens // (4 * n)  # short streams: more of them
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(count):
                await one(body)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            if prof is not None:
                prof.disable()
                prof.dump_stats(f"{profile}-{case}.prof")
            out[case] = {
                "cpu_us_per_token": round(cpu * 1e6 / (count * n), 2),
                "cpu_us_per_stream": round(cpu * 1e6 / count, 1),
                "wall_us_per_token": round(wall * 1e6 / (count * n), 2),
                "fast_path": fast_path[case],  # unary: no stream encoder, False
                "count": count,
            }
        return out

    result = asyncio.run(run())
    # The parsers in force: the runtime's resolved ones where it has them (auto resolved), else the config's.
    parsers = {
        k: str(getattr(rt, k) if hasattr(rt, k) else getattr(rt.config, k)) for k in ("tool_parser", "reasoning_parser")
    }
    return {"openai_api": openai_api.__file__, "parsers": parsers, **result}


CASES = ("plain", "short", "tools", "unary")


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def _child_cmd(streams: int, tokens: int, cases: str) -> list[str]:
    me = str(Path(__file__).resolve())
    return [sys.executable, me, "--child", "--streams", str(streams), "--tokens", str(tokens), "--cases", cases]


def instructions(a: argparse.Namespace) -> int:
    """Machine instructions per token (per request for short and unary) of each side, load-independent:
    each case runs under callgrind with ``--streams`` and with 3x as many, and the difference in
    instructions is divided by the difference in tokens (requests), so imports and warm-up cancel out."""
    sides = {s.split("=", 1)[0]: Path(s.split("=", 1)[1]).resolve() for s in a.side}
    out: dict[str, Any] = {}
    for name, root in sides.items():
        env = {**os.environ, "PYTHONPATH": str(root), "LOG_LEVEL": "WARNING"}
        for case in a.cases.split(","):
            got = []
            for streams in (a.streams, 3 * a.streams):
                with tempfile.TemporaryDirectory() as tmp:
                    cmd = [
                        "valgrind",
                        "--tool=callgrind",
                        f"--callgrind-out-file={tmp}/cg.out",
                        *_child_cmd(streams, a.tokens, case),
                    ]
                    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{name} {case}: {done.stderr[-2000:]}")
                ir = int(next(ln for ln in done.stderr.splitlines() if "Collected :" in ln).split(":")[-1])
                r = json.loads(done.stdout.strip().splitlines()[-1])
                units = r[case]["count"] * (1 if case in ("short", "unary") else a.tokens)
                got.append((ir, units, r["openai_api"]))
            (ir1, u1, path), (ir2, u2, _) = got
            per = (ir2 - ir1) / (u2 - u1)
            out.setdefault(name, {"openai_api": path})[case] = round(per)
            unit = "request" if case in ("short", "unary") else "token"
            print(f"{name} {case}: {per:,.0f} instructions per {unit} ({path})", flush=True)
    print(json.dumps(out, indent=1))
    if a.out is not None:
        a.out.write_text(json.dumps({"instructions": out, "streams": a.streams, "tokens": a.tokens}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", action="append", default=[], help="name=checkout root (two or more)")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--streams", type=int, default=40)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--out", type=Path)
    p.add_argument("--profile", type=Path, help="folder for one cProfile per side and case")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--profile-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--cases", default=",".join(CASES), help="with --instructions: which cases (default all)")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="instead of timing: count instructions under valgrind (callgrind), per token / per request",
    )
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.streams, a.tokens, a.profile_file, tuple(a.cases.split(",")))))
        return 0
    if a.instructions:
        return instructions(a)
    sides = {s.split("=", 1)[0]: Path(s.split("=", 1)[1]).resolve() for s in a.side}
    names = list(sides)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    # Rep -1 (with --profile): one cProfiled child per side, not counted (cProfile slows it severalfold).
    for rep in ([-1] if a.profile is not None else []) + list(range(a.reps)):
        for name in names if rep % 2 == 0 else names[::-1]:
            root = sides[name]
            cmd = _child_cmd(a.streams, a.tokens, ",".join(CASES))
            if rep < 0:
                a.profile.mkdir(parents=True, exist_ok=True)
                cmd += ["--profile-file", str(a.profile / name)]
            env = {**os.environ, "PYTHONPATH": str(root), "LOG_LEVEL": "WARNING"}
            done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r["rep"], r["loadavg_1m"] = rep, round(os.getloadavg()[0], 2)
            if rep < 0:
                print(f"profiled {name}: {a.profile}/{name}-{{{','.join(CASES)}}}.prof", flush=True)
                continue
            runs[name].append(r)
            print(
                f"rep {rep} {name}: plain {r['plain']['cpu_us_per_token']} us/token, short "
                f"{r['short']['cpu_us_per_stream']} us/stream, unary {r['unary']['cpu_us_per_stream']} us/request, "
                f"tools "
                f"{r['tools']['cpu_us_per_token']} us/token ({r['openai_api']}, {r['parsers']}, "
                f"fast path plain={r['plain']['fast_path']} tools={r['tools']['fast_path']}, "
                f"load {r['loadavg_1m']})",
                flush=True,
            )
    # Per case: CPU per token for the streams, per request for the short and the unary chat.
    unit = {c: "cpu_us_per_stream" if c in ("short", "unary") else "cpu_us_per_token" for c in CASES}
    summary: dict[str, Any] = {
        n: {
            c: {
                unit[c].replace("stream", "request"): [r[c][unit[c]] for r in rs],
                "median": _median([r[c][unit[c]] for r in rs]),
                "lower_quartile": round(statistics.quantiles([r[c][unit[c]] for r in rs], n=4)[0], 2),
            }
            for c in CASES
        }
        for n, rs in runs.items()
    }
    if len(names) == 2:  # each repetition's two runs were back to back: their ratio saw the same neighbours
        a_, b_ = names
        for c in CASES:
            pairs = [rb[c][unit[c]] / ra[c][unit[c]] for ra, rb in zip(runs[a_], runs[b_], strict=True)]
            summary[f"{b_}_over_{a_}_{c}"] = {
                "paired": [round(x, 3) for x in pairs],
                "median": round(statistics.median(pairs), 3),
            }
    # Per token without the request's own cost: (512-token stream - 16-token stream) / 496, per run.
    for n, rs in runs.items():
        marg = [(r["plain"]["cpu_us_per_stream"] - r["short"]["cpu_us_per_stream"]) / (a.tokens - SHORT) for r in rs]
        summary[n]["plain_marginal_us_per_token"] = {"runs": [round(x, 2) for x in marg], "median": _median(marg)}
        req = [r["short"]["cpu_us_per_stream"] - SHORT * m for r, m in zip(rs, marg, strict=True)]
        summary[n]["request_overhead_us"] = {"runs": [round(x, 1) for x in req], "median": _median(req)}
    print(json.dumps(summary, indent=1))
    if a.out is not None:
        a.out.write_text(
            json.dumps({"summary": summary, "runs": runs, "streams": a.streams, "tokens": a.tokens}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
