"""The arithmetic of ``bench.client_alternatives``: CPU per token, medians over repetitions, paired ratios
to our client and what a switch would save of the gateway's CPU per token (unit-tested in
``tests/unit/test_bench_client_alternatives.py``)."""

from __future__ import annotations

import statistics
from typing import Any


def per_token_us(cpu_s: float, tokens: int) -> float | None:
    """CPU microseconds per token over a window (None when no token arrived)."""
    return round(cpu_s * 1e6 / tokens, 2) if tokens > 0 else None


def summarise(runs: list[dict[str, Any]], baseline: str = "rpc", gateway: str = "gateway") -> dict[str, Any]:
    """Per (concurrency, client): medians, min and max over repetitions of the client's CPU per token,
    Triton's CPU per token and tokens/s, and the paired ratio to ``baseline`` (same concurrency and
    repetition); per concurrency, what switching ``baseline`` for each client would save of the
    gateway's CPU per token (``saved_us`` = baseline median - client median; ``share_of_gateway`` =
    saved_us / the gateway's median CPU per token).

    ``runs``: dicts with ``client``, ``concurrency``, ``rep``, ``tokens``, ``client_cpu_s``, ``triton_cpu_s``,
    ``seconds``, ``errors`` and, for the gateway client, ``gateway_cpu_s``."""
    cells: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        cells.setdefault(int(r["concurrency"]), {}).setdefault(r["client"], []).append(r)
    out: dict[str, Any] = {}
    for c, by_client in sorted(cells.items()):
        base = {r["rep"]: per_token_us(r["client_cpu_s"], r["tokens"]) for r in by_client.get(baseline, [])}
        rows: dict[str, Any] = {}
        for client, rs in by_client.items():
            cpu = [v for r in rs if (v := per_token_us(r["client_cpu_s"], r["tokens"])) is not None]
            tri = [v for r in rs if (v := per_token_us(r["triton_cpu_s"], r["tokens"])) is not None]
            rate = [r["tokens"] / r["seconds"] for r in rs if r["seconds"] > 0]
            ratios = []
            for r in rs:
                b, v = base.get(r["rep"]), per_token_us(r["client_cpu_s"], r["tokens"])
                if b and v is not None:
                    ratios.append(v / b)
            row: dict[str, Any] = {
                "reps": len(rs),
                "client_cpu_us_per_token": _spread(cpu),
                "triton_cpu_us_per_token": _spread(tri),
                "tokens_per_s": _spread(rate),
                "ratio_to_" + baseline: round(statistics.median(ratios), 3) if ratios else None,
                "errors": sum(int(r.get("errors", 0)) for r in rs),
            }
            if any("gateway_cpu_s" in r for r in rs):
                gw = [v for r in rs if (v := per_token_us(r.get("gateway_cpu_s", 0.0), r["tokens"])) is not None]
                row["gateway_cpu_us_per_token"] = _spread(gw)
            rows[client] = row
        gw_med = (rows.get(gateway) or {}).get("gateway_cpu_us_per_token", {}).get("median")
        base_med = (rows.get(baseline) or {}).get("client_cpu_us_per_token", {}).get("median")
        for client, row in rows.items():
            if client in (baseline, gateway) or base_med is None:
                continue
            med = row["client_cpu_us_per_token"]["median"]
            if med is None:
                continue
            saved = round(base_med - med, 2)
            row["saved_us_per_token"] = saved
            row["share_of_gateway"] = round(saved / gw_med, 3) if gw_med else None
        out[f"c{c}"] = rows
    return out


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def cheapest(summary: dict[str, Any], exclude: tuple[str, ...] = ("gateway",)) -> dict[str, str | None]:
    """Per concurrency, the client with the lowest median client CPU per token."""
    best: dict[str, str | None] = {}
    for cell, rows in summary.items():
        cands = [
            (row["client_cpu_us_per_token"]["median"], client)
            for client, row in rows.items()
            if client not in exclude and row["client_cpu_us_per_token"]["median"] is not None
        ]
        best[cell] = min(cands)[1] if cands else None
    return best
