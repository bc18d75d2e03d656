"""One command for every gateway benchmark: ``.venv/bin/python -m bench.run [--quick]``.

It starts one tritonserver (synthetic LLMs + all-minilm-l6-v2), the gateway as its own process and,
for embeddings, Infinity in its own venv; runs each case through the gateway and against its
baseline side by side; and writes ``bench/results/latest.{md,json}`` plus a dated JSON copy in
``bench/results/history/``. ``latest.json`` holds a ``summary`` object (the figures the issue's
targets are judged on; see ``bench.report.SUMMARY_KEYS``) from which the docs' table
(docs/performance/index.md) is rendered.
Nothing here asserts timings.

The limit (the direct side of every LLM case) is ``bench.limit``: the gateway's own Triton RPC code
as a bare client, in processes of its own. Cases (see bench/README.md): stream relay vs the limit
(c = 1, 16, 64), added latency of a short non-streamed chat (c = 1, 16) and of the first streamed
token, gateway CPU per token at 8,192 vs 64 output tokens, gateway RSS per open stream (1,000
streams), guided vs unguided decoding, ``--workers 2`` vs ``--workers 1``, AIPerf against the
gateway, py-spy profiles, embeddings vs Infinity.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import subprocess
import sys
import time

from bench.cases_board import BoardCases
from bench.cases_engine import EngineCases
from bench.cases_peers import PeerCases
from bench.cases_relay import RelayCases

# MESSAGES and SLOW_DELAY_MS are imported from here by bench.relay_ab and bench.agent_sessions.
from bench.core import MESSAGES as MESSAGES
from bench.core import RESULTS, glibc_version
from bench.core import SLOW_DELAY_MS as SLOW_DELAY_MS
from bench.report import TARGETS, build_summary
from bench.stack import REPO

ALL_CASES = ["relay", "latency", "long", "streams", "guided", "workers", "aiperf", "profile", "embeddings", "board"]


class Bench(RelayCases, EngineCases, PeerCases, BoardCases):
    """A whole run: set-up (``BenchCore``), the cases (the ``*Cases`` mixins) and the results files."""

    async def run(self) -> None:
        started = time.time()
        self.results["meta"] = {
            "mode": self.p.name,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
            "git": _git_commit(),
            "relay_tokens_per_request": self.p.relay_tokens,
            "latency_tokens": self.p.latency_tokens,
            "targets": TARGETS,
            "torch_threads": self.args.torch_threads,
            "glibc": glibc_version(),
            "cases": list(self.args.cases),
            "pinned": "gateway and LiteLLM on CPU 0, the rest on CPU 1" if self.args.pin else None,
        }
        try:
            self.start()
            await self.sanity()
        except Exception as e:  # noqa: BLE001
            self.fail("setup", e)
            if self.gateway is not None:
                print(self.gateway.log_tail(), file=sys.stderr)
            await self.stop()
            self.finish(started)
            return
        cases = {
            "relay": self.case_relay,
            "perf_analyzer": self.case_perf_analyzer,  # a cross-check of the limit, with the relay case
            "latency": self.case_latency,
            "long": self.case_long_outputs,
            "streams": self.case_many_streams,
            "guided": self.case_guided,
            "workers": self.case_workers,
            "aiperf": self.case_aiperf,
            "profile": self.case_profile,
            "embeddings": self.case_embeddings,
            "board": self.case_board,
        }
        try:
            for name, fn in cases.items():
                if name not in self.args.cases and not (name == "perf_analyzer" and "relay" in self.args.cases):
                    continue
                self.log(f"--- {name}")
                try:
                    await fn()
                except Exception as e:  # noqa: BLE001
                    self.fail(name, e)
                await self.check_alive(name)
        finally:
            await self.stop()
            self.finish(started)

    def finish(self, started: float) -> None:
        self.results["meta"]["duration_s"] = round(time.time() - started, 1)
        self.results["meta"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.results["summary"] = build_summary(self.results)
        from bench.report import write_results

        paths = write_results(self.results, RESULTS)
        self.log(f"wrote {', '.join(str(p.relative_to(REPO)) for p in paths)}")
        print((RESULTS / "latest.md").read_text())


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    all_cases = ALL_CASES
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (~5 min): same cases, smaller samples")
    p.add_argument("--cases", default=",".join(all_cases), help=f"comma-separated subset of {','.join(all_cases)}")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS for both embedding servers (Triton's MiniLM and Infinity); default 1",
    )
    p.add_argument("--skip-infinity", action="store_true", help="embeddings through the gateway only")
    p.add_argument(
        "--pin",
        action="store_true",
        help="as the public gateway board pins: the gateway (and LiteLLM) on CPU 0, everything else (Triton, "
        "the load generators, the stand-in) on CPU 1 (needs 2 CPUs; other jobs on the machine are not moved)",
    )
    p.add_argument(
        "--limit-procs",
        default="1,2",
        help="process counts the limit client is tried with at c > 1 (the faster counts); default 1,2",
    )
    p.add_argument(
        "--limit-pace-us",
        default="0,40",
        help="us of busy client work per token the one-process limit is also tried with (the fastest counts: "
        "Triton delivers more to a client that is not waiting on every message); default 0,40",
    )
    args = p.parse_args(argv)
    try:
        args.limit_pace_us = sorted({int(x) for x in args.limit_pace_us.split(",") if x.strip()} | {0})
    except ValueError:
        p.error("--limit-pace-us: comma-separated integers")
    try:
        args.limit_procs = sorted({int(x) for x in args.limit_procs.split(",") if x.strip()})
    except ValueError:
        p.error("--limit-procs: comma-separated integers")
    if not args.limit_procs or min(args.limit_procs) < 1:
        p.error("--limit-procs: at least one count, each >= 1")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(args.cases) - set(all_cases)
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    try:
        import uvloop

        uvloop.run(bench.run())
    except ImportError:
        asyncio.run(bench.run())
    return 1 if any(f["case"] == "setup" for f in bench.results["failures"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
