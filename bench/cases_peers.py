"""The cases of ``bench.run`` that bring in other tools: NVIDIA AIPerf against the gateway (``aiperf``),
NVIDIA perf_analyzer as a cross-check of the limit (run with ``relay``) and embeddings vs Infinity
(``embeddings``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import aiperf_runner, infinity
from bench.core import BenchCore, glibc_version
from bench.load import ConnectionPool, Counter, HTTPError, latencies, stream_timings, throughput
from bench.stack import EMBEDDING, SYNTHETIC

PERF_ANALYZER_GLIBC = (2, 38)  # the perf-analyzer wheel on PyPI is tagged manylinux_2_38


def perf_analyzer_status() -> tuple[bool, str]:
    """Whether NVIDIA's perf_analyzer can run here, and why not."""
    version = glibc_version()
    try:
        have = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        have = (0, 0)
    exe = shutil.which("perf_analyzer") or (
        str(Path(sys.executable).parent / "perf_analyzer")
        if (Path(sys.executable).parent / "perf_analyzer").is_file()
        else None
    )
    if have < PERF_ANALYZER_GLIBC:
        return False, (
            f"not run: the perf-analyzer wheel on PyPI (2.60.0) is tagged manylinux_2_38 (glibc >= 2.38) and this "
            f"machine has glibc {version} (ldd --version); pip here resolves only the 0.1.0 placeholder package, "
            "which has no binary"
        )
    if exe is None:
        return False, f"not run: glibc {version} would do, but no perf_analyzer binary is installed"
    return True, f"perf_analyzer at {exe}, glibc {version}"


class PeerCases(BenchCore):
    """``bench.run``'s aiperf, perf_analyzer and embeddings cases."""

    async def case_aiperf(self) -> None:
        """NVIDIA AIPerf against the gateway (streamed chat at c = 16, 512 tokens; embeddings, 1 text per
        request at c = 32), each beside this bench's own load generator on the same load."""
        assert self.gateway is not None
        gw = self.gateway
        out: dict[str, Any] = {}
        await asyncio.to_thread(aiperf_runner.ensure_venv, self.workdir / "aiperf-install.log")
        c, n = self.p.aiperf_concurrency, self.p.relay_tokens
        pool = ConnectionPool("127.0.0.1", gw.port)
        ours = await stream_timings(
            pool,
            "/v1/chat/completions",
            self.chat_payload(n, True),
            c,
            self.p.aiperf_warmup_s,
            self.p.aiperf_duration_s,
        )
        pool.close()
        ours.pop("window", None)
        out["chat"] = {"concurrency": c, "output_tokens": n, "loadgen": ours}
        self.log(
            f"aiperf chat: our load generator {ours['rate']:.0f} tokens/s, TTFT p50 {ours['ttft']['p50_ms']:.2f} ms, "
            f"ITL p50 {ours['itl']['p50_ms']:.3f} ms"
        )
        data = await asyncio.to_thread(
            aiperf_runner.profile,
            gw.url,
            model=SYNTHETIC,
            endpoint_type="chat",
            concurrency=c,
            duration_s=self.p.aiperf_duration_s,
            warmup_s=self.p.aiperf_warmup_s,
            input_tokens=32,
            output_tokens=n,
            streaming=True,
            workdir=self.workdir,
            name="chat",
        )
        m = aiperf_runner.metric
        out["version"] = data.get("aiperf_version")
        out["chat"]["aiperf"] = {
            "ttft_p50_ms": m(data, "time_to_first_token", "p50"),
            "ttft_p99_ms": m(data, "time_to_first_token", "p99"),
            "itl_p50_ms": m(data, "inter_token_latency", "p50"),
            "itl_p99_ms": m(data, "inter_token_latency", "p99"),
            "output_tokens_per_s": m(data, "output_token_throughput"),
            "requests_per_s": m(data, "request_throughput"),
            "request_latency_p50_ms": m(data, "request_latency", "p50"),
            "output_sequence_length_avg": m(data, "output_sequence_length"),
            "requests": m(data, "request_count"),
            "errors": data.get("error_summary"),
            "command": data["command"],
        }
        self.log(f"aiperf chat: {out['chat']['aiperf']}")
        if self.embeddings:  # Triton loads MiniLM whenever the embeddings or aiperf case runs
            ce = self.p.aiperf_embed_concurrency
            texts = [f"The quick brown fox number {i} jumps over the lazy dog near the river." for i in range(512)]
            it = {"i": 0}
            epool = ConnectionPool("127.0.0.1", gw.port)

            async def embed_one() -> None:
                it["i"] = (it["i"] + 1) % len(texts)
                async with epool.connection() as conn:
                    status, body = await conn.post_json("/v1/embeddings", {"model": EMBEDDING, "input": texts[it["i"]]})
                if status != 200:
                    raise HTTPError(f"HTTP {status}: {body[:200]!r}")

            per_worker = max(4, int(self.p.aiperf_duration_s * 4))
            mine = await latencies(embed_one, ce, per_worker, warmup=2)
            epool.close()
            out["embeddings"] = {"concurrency": ce, "loadgen": mine}
            data = await asyncio.to_thread(
                aiperf_runner.profile,
                gw.url,
                model=EMBEDDING,
                endpoint_type="embeddings",
                concurrency=ce,
                duration_s=self.p.aiperf_duration_s,
                warmup_s=self.p.aiperf_warmup_s,
                input_tokens=16,
                output_tokens=None,
                streaming=False,
                workdir=self.workdir,
                name="embeddings",
            )
            out["embeddings"]["aiperf"] = {
                "requests_per_s": m(data, "request_throughput"),
                "request_latency_p50_ms": m(data, "request_latency", "p50"),
                "request_latency_p99_ms": m(data, "request_latency", "p99"),
                "requests": m(data, "request_count"),
                "errors": data.get("error_summary"),
                "command": data["command"],
            }
            self.log(f"aiperf embeddings: ours {mine['req_per_s']:.1f} req/s; aiperf {out['embeddings']['aiperf']}")
        self.results["aiperf"] = out

    async def case_perf_analyzer(self) -> None:
        """NVIDIA's perf_analyzer as a cross-check of the limit, where it can run (see perf_analyzer_status)."""
        ok, reason = perf_analyzer_status()
        if not ok:
            self.results["perf_analyzer"] = {"ran": False, "reason": reason}
            self.log(f"perf_analyzer: {reason}")
            return
        assert self.triton is not None
        exe = shutil.which("perf_analyzer") or str(Path(sys.executable).parent / "perf_analyzer")
        data = self.workdir / "pa-input.json"
        data.write_text(
            json.dumps(
                {
                    "data": [
                        {
                            "input_ids": {"content": self.prompt_ids, "shape": [len(self.prompt_ids)]},
                            "input_lengths": [len(self.prompt_ids)],
                            "request_output_len": [self.p.relay_tokens],
                            "streaming": [True],
                        }
                    ]
                }
            )
        )
        out: dict[str, Any] = {"ran": True, "runs": {}}
        for c in self.p.relay_concurrency:
            cmd = [
                exe,
                "-m",
                SYNTHETIC,
                "-u",
                self.triton.grpc_url,
                "-i",
                "grpc",
                "--streaming",
                "--input-data",
                str(data),
                "--concurrency-range",
                str(c),
                "--measurement-interval",
                str(int(self.p.relay_measure_s * 1000)),
            ]
            proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=300)
            text = proc.stdout + proc.stderr
            rate = None
            for line in text.splitlines():  # "Response Throughput: N infer/sec" (decoupled models)
                if "Response Throughput" in line:
                    with contextlib.suppress(ValueError, IndexError):
                        rate = float(line.split(":", 1)[1].split()[0])
            out["runs"][f"c{c}"] = {"returncode": proc.returncode, "responses_per_s": rate, "tail": text[-800:]}
            self.log(f"perf_analyzer c={c}: {rate} responses/s (exit {proc.returncode})")
        self.results["perf_analyzer"] = out

    async def case_embeddings(self) -> None:
        rng = random.Random(7)
        words = (
            "the quick brown fox jumps over a lazy dog while data centers hum with servers that answer "
            "questions about finance law medicine travel weather music history science cooking sport "
            "markets rivers mountains cities languages systems networks memory latency throughput"
        ).split()
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 24))).capitalize() + "." for _ in range(4096)]
        it = {"i": 0}

        def take(k: int) -> list[str]:
            i = it["i"]
            it["i"] = (i + k) % (len(texts) - k)
            return texts[i : i + k]

        def worker(port: int, path: str, model: str, batch: int) -> Callable[[Counter], Awaitable[Any]]:
            pool = ConnectionPool("127.0.0.1", port)

            async def run(counter: Counter) -> None:
                inp: Any = take(batch) if batch > 1 else take(1)[0]
                async with pool.connection() as conn:
                    status, body = await conn.post_json(path, {"model": model, "input": inp})
                if status != 200:
                    raise HTTPError(f"HTTP {status}: {body[:200]!r}")
                counter.add(batch)

            return run

        cases = {"single_c32": (1, 32), "batch32_c4": (32, 4)}
        out: dict[str, Any] = {k: {"batch": b, "concurrency": c} for k, (b, c) in cases.items()}
        assert self.gateway is not None
        for key, (batch, c) in cases.items():
            r = await self.measured(
                lambda batch=batch, c=c: throughput(
                    worker(self.gateway.port, "/v1/embeddings", EMBEDDING, batch),
                    c,
                    self.p.embed_warmup_s,
                    self.p.embed_measure_s,
                )
            )
            out[key]["gateway"] = r
            self.log(
                f"embeddings {key} gateway+triton: {r['rate']:.0f} texts/s, cpu {r['cpu_pct']}, errors {r['errors']}"
            )
        self.results["embeddings"] = out
        if self.args.skip_infinity:
            out["infinity_error"] = "skipped (--skip-infinity)"
            return
        server = None
        try:
            self.log("setting up Infinity (first run: creates bench/.venv-infinity, a few minutes)")
            await asyncio.to_thread(infinity.ensure_venv, self.workdir / "infinity-install.log")
            server = await asyncio.to_thread(infinity.InfinityServer(self.workdir).start)
            self.log(f"Infinity on {server.url}")
            for key, (batch, c) in cases.items():
                r = await throughput(
                    worker(server.port, "/embeddings", infinity.SERVED_NAME, batch),
                    c,
                    self.p.embed_warmup_s,
                    self.p.embed_measure_s,
                )
                r["loadavg_1m"] = round(os.getloadavg()[0], 2)
                out[key]["infinity"] = r
                out[key]["ratio"] = round(out[key]["gateway"]["rate"] / max(r["rate"], 1e-9), 3)
                self.log(f"embeddings {key} infinity: {r['rate']:.0f} texts/s, errors {r['errors']}")
        except Exception as e:  # noqa: BLE001 - reported in the results, the rest of the run stands
            out["infinity_error"] = f"{type(e).__name__}: {e}"[:2000]
            self.fail("embeddings/infinity", e)
        finally:
            if server is not None:
                server.stop()
