"""Results as commit-friendly files: ``latest.json``, ``latest.md`` and a dated JSON in ``history/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def _verdict(row: dict[str, Any]) -> str:
    return {True: "**pass**", False: "**FAIL**", None: "-"}[row["pass"]]


def render_markdown(res: dict[str, Any]) -> str:
    meta = res.get("meta", {})
    out = [
        f"### Gateway benchmark ({meta.get('mode', '?')} run, {meta.get('started', '?')}, commit "
        f"{meta.get('git') or '?'})",
        "",
        f"{meta.get('cpus')} CPU cores shared by Triton, the gateway and the load generator; load average "
        f"{meta.get('loadavg_1m_at_start')} at start, {meta.get('loadavg_1m_at_end')} at end; run took "
        f"{meta.get('duration_s')} s.",
        "",
        "| check | gateway | baseline | gateway vs baseline | target | verdict |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in res.get("summary", []):
        base = f"{_fmt(row['baseline'])} ({row['baseline_name']})" if row["baseline"] is not None else "-"
        value = (
            "-"
            if row["value"] is None
            else (f"{row['value']:+.2f} ms" if row["unit"] == "ms" else f"{row['value']:.2f}x")
        )
        out.append(
            f"| {row['check']} | {_fmt(row['gateway'])} | {base} | {value} | {row['target']} | {_verdict(row)} |"
        )

    lat = res.get("latency")
    if lat:
        out += [
            "",
            "Non-streamed chat, 16 tokens (ms): the gateway vs the same gRPC stream sent directly, and "
            "vs a direct unary (`streaming=false`) request.",
            "",
            "| concurrency | path | p50 | p90 | p99 | req/s | gateway CPU % |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for key, cell in lat.items():
            for name in ("direct_stream", "gateway", "direct_unary"):
                r = cell[name]
                out.append(
                    f"| {key[1:]} | {name} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
                    f"{r['req_per_s']:.0f} | {r['cpu_pct']['gateway']} |"
                )
    relay = res.get("relay")
    if relay:
        out += [
            "",
            "Stream relay (512-token streams; tokens/s: medians of the runs; ratio: median of paired runs; "
            "CPU % of one core during the median gateway run):",
            "",
            "| concurrency | direct | gateway | ratio | gateway us CPU/token | CPU % gateway / Triton / load gen |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for key, cell in relay.items():
            runs = sorted(cell["gateway"]["runs"], key=lambda r: r["rate"])
            gw = runs[len(runs) // 2]
            cpu = gw["cpu_pct"]
            out.append(
                f"| {key[1:]} | {cell['direct']['tokens_per_s']:,.0f} | {cell['gateway']['tokens_per_s']:,.0f} | "
                f"{cell['ratio']:.2f} | {cell['gateway_cpu_us_per_token']} | "
                f"{cpu['gateway']} / {cpu['triton']} / {cpu['loadgen']} |"
            )
    ms = res.get("many_streams")
    if ms:
        out += [
            "",
            f"Many streams: {ms['open']} of {ms['streams']} streams open ({ms['errors']} errors), one token per "
            f"{ms['token_delay_ms']} ms each; gateway RSS {ms['rss_before_mib']} MiB idle, {ms['rss_held_mib']} MiB "
            f"held, {ms['rss_after_close_mib']} MiB after closing; {ms['gateway_cpu_pct_while_held']} % CPU "
            f"while relaying {ms['tokens_per_s_while_held']} tokens/s.",
        ]
    emb = res.get("embeddings")
    if emb and emb.get("infinity_error"):
        out += ["", f"Infinity baseline unavailable: `{emb['infinity_error'][:400]}`"]
    prof = res.get("profile")
    if prof:
        for name, p in prof.items():
            out += [
                "",
                f"Gateway profile, {name} case (py-spy, {p['samples']} samples; % of samples):",
                "",
                "| self time | % | inclusive (gateway code) | % |",
                "|---|---:|---|---:|",
            ]
            for i in range(max(len(p["self"]), len(p["gateway_inclusive"]))):
                s = p["self"][i] if i < len(p["self"]) else {"function": "", "pct": ""}
                g = p["gateway_inclusive"][i] if i < len(p["gateway_inclusive"]) else {"function": "", "pct": ""}
                out.append(f"| `{s['function']}` | {s['pct']} | `{g['function']}` | {g['pct']} |".replace("``", ""))
    if res.get("failures"):
        out += ["", "Failures:", ""] + [f"- {f['case']}: `{f['error'][:500]}`" for f in res["failures"]]
    return "\n".join(out) + "\n"


def write_results(res: dict[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history").mkdir(exist_ok=True)
    data = json.dumps(res, indent=1, sort_keys=False) + "\n"
    md = render_markdown(res)
    stamp = res.get("meta", {}).get("started", "unknown").replace(":", "").replace("+0000", "Z")[:15]
    paths = [
        folder / "latest.json",
        folder / "latest.md",
        folder / "history" / f"{stamp}-{res.get('meta', {}).get('mode', 'run')}.json",
    ]
    paths[0].write_text(data)
    paths[1].write_text(md)
    paths[2].write_text(data)
    return paths
