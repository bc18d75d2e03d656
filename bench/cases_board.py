"""The ``board`` case of ``bench.run``: the board's metrics (``bench.board``) for the bare client, the
gateway (1 and 2 workers), the paced stand-in and LiteLLM's proxy in front of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psutil

from bench.core import BenchCore
from bench.stack import REPO, SYNTHETIC_PACED, Gateway, free_port, gateway_config, has_flag, wait_http

# A token event in LiteLLM's stream chunks (and the stand-in's, its bare side): its first delta puts
# "role" before "content", so the gateway's marker would miss the first token.
LITELLM_MARKER = '"content":"'


class BoardCases(BenchCore):
    """``bench.run``'s board case."""

    async def case_board(self) -> None:
        """The board's metrics (``bench.board``) for five sides, one after another, on 20 ms pacing:
        the bare client on Triton's ``synthetic-llm-paced`` (gRPC, the gateway's own client code), the
        gateway with 1 worker and with 2 (stall-free streams only) on that model, the paced stand-in
        (``bench.paced_upstream``) called directly and LiteLLM's proxy in front of it."""
        from bench import board

        assert self.triton is not None and self.gateway is not None
        sizes = board.Sizes(self.args.quick)
        cwd = str(REPO)
        out: dict[str, Any] = {
            "pacing_ms": board.PACING_MS,
            "stream_tokens": board.STREAM_TOKENS,
            "stall_factor": board.STALL_FACTOR,
            "ladder": list(sizes.ladder),
            "sides": {},
        }
        self.results["board"] = out

        def triton_cpu() -> float:
            return self.cpu_s(self.triton_procs())

        http = ["--target", "http", "--host", "127.0.0.1"]
        grpc_flags = [
            "--target",
            "grpc",
            "--url",
            self.triton.grpc_url,
            "--model",
            SYNTHETIC_PACED,
            "--prompt-ids",
            ",".join(map(str, self.prompt_ids)),
            "--end-id",
            str(self.end_id),
            "--pad-id",
            str(self.pad_id),
        ]

        def keep(name: str, r: dict[str, Any]) -> None:
            out["sides"][name] = r

        try:
            await self._board_sides(out, sizes, keep, triton_cpu, http, grpc_flags, cwd)
        finally:
            for r in out["sides"].values():
                for cell in r.values():  # the raw samples stay out of latest.json
                    if isinstance(cell, dict):
                        cell.pop("samples_ms", None)
                        cell.pop("gaps_ms", None)

    async def _board_sides(
        self,
        out: dict[str, Any],
        sizes: Any,
        keep: Callable[[str, dict[str, Any]], None],
        triton_cpu: Callable[[], float],
        http: list[str],
        grpc_flags: list[str],
        cwd: str,
    ) -> None:
        from bench import board, litellm_peer

        assert self.triton is not None and self.gateway is not None
        bare = await board.measure_side(
            board.Side("bare", grpc_flags, None, lambda: {"upstream": triton_cpu()}), sizes, cwd, self.log
        )
        gw = self.gateway
        gw_side = board.Side(
            "gateway",
            [*http, "--port", str(gw.port), "--model", SYNTHETIC_PACED],
            "gateway",
            lambda: {"gateway": self.cpu_s(gw.processes()), "upstream": triton_cpu()},
        )
        ours = await board.measure_side(gw_side, sizes, cwd, self.log)
        out["gateway_added"] = self._board_added(ours, bare)
        keep("bare", bare)
        keep("gateway", ours)
        if has_flag("--workers"):
            w2 = Gateway(
                gateway_config(self.triton.grpc_url, self.triton.http_url),
                self.workdir,
                extra_args=["--workers", "2"],
                name="gateway-board-w2",
            )
            try:
                await asyncio.to_thread(w2.start, self.gateway_prefix)
                await asyncio.sleep(1.0)
                procs = w2.processes()
                side = board.Side(
                    "gateway_w2",
                    [*http, "--port", str(w2.port), "--model", SYNTHETIC_PACED],
                    "gateway",
                    lambda: {"gateway": self.cpu_s(procs), "upstream": triton_cpu()},
                )
                keep("gateway_w2", await board.measure_side(side, sizes, cwd, self.log, only_streams=True))
            finally:
                w2.stop()
        else:
            out["gateway_w2"] = {"skipped": "the gateway has no --workers flag"}
        # LiteLLM, in front of the paced stand-in; the stand-in called directly is its bare side.
        upstream_port = free_port()
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.paced_upstream",
                "--port",
                str(upstream_port),
                "--delay-ms",
                str(board.PACING_MS),
            ],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proxy: litellm_peer.LiteLLMProxy | None = None
        try:
            await asyncio.to_thread(wait_http, f"http://127.0.0.1:{upstream_port}/health", 30, upstream)
            up = psutil.Process(upstream.pid)

            def up_cpu() -> float:
                return self.cpu_s([up])

            standin = await board.measure_side(
                board.Side(
                    "standin",
                    [*http, "--port", str(upstream_port), "--model", "paced", "--marker", LITELLM_MARKER],
                    None,
                    lambda: {"upstream": up_cpu()},
                ),
                sizes,
                cwd,
                self.log,
            )
            keep("standin", standin)
            try:
                await asyncio.to_thread(litellm_peer.ensure_venv, self.workdir / "litellm-pip.log")
                proxy = litellm_peer.LiteLLMProxy(self.workdir, f"http://127.0.0.1:{upstream_port}/v1")
                await asyncio.to_thread(proxy.start, 180.0, self.gateway_prefix)
            except Exception as e:  # noqa: BLE001 - the rest of the run stands
                out["litellm_error"] = f"{type(e).__name__}: {e}"[:2000]
                self.fail("board/litellm", e)
                return
            out["litellm_version"] = litellm_peer.installed_version()
            self.results["meta"]["litellm_version"] = out["litellm_version"]
            root = psutil.Process(proxy.pid)
            lite_procs = [root, *root.children(recursive=True)]
            lite = await board.measure_side(
                board.Side(
                    "litellm",
                    [*http, "--port", str(proxy.port), "--model", litellm_peer.SERVED_NAME, "--marker", LITELLM_MARKER],
                    "litellm",
                    lambda: {"litellm": self.cpu_s(lite_procs), "upstream": up_cpu()},
                ),
                sizes,
                cwd,
                self.log,
            )
            out["litellm_added"] = self._board_added(lite, standin)
            keep("litellm", lite)
        finally:
            if proxy is not None:
                proxy.stop()
            upstream.terminate()
            upstream.wait(timeout=10)

    @staticmethod
    def _board_added(side: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
        """What ``side`` adds to ``bare``: non-streamed latency, TTFT and inter-token gaps (p50, p99)."""
        from bench.board_metrics import added_ms

        added: dict[str, Any] = {
            k: added_ms(side[k]["samples_ms"], bare[k]["samples_ms"]) for k in ("nonstream", "ttft")
        }
        added["itl"] = added_ms(side["itl"]["gaps_ms"], bare["itl"]["gaps_ms"])
        b, s = bare["streams"]["stall_free"], side["streams"]["stall_free"]
        added["stall_free_ratio"] = round(s / b, 3) if b else None
        return added
