"""The status page's HTML (`GET /status`): one server-rendered document, its style inline, no script, no image,
no font and no link to anything outside it, so it loads on an offline cluster and its Content-Security-Policy can
forbid every fetch. It refreshes itself (`<meta http-equiv="refresh">`, every `refresh` seconds; 0 = never).
Every value from the report is HTML-escaped: model and adapter names reach it as configured (or loaded at run
time), key names as the keys file gives them.

Stable hooks for tests and scripts: each model row is `<tr data-model="NAME">`, each replica row
`<tr data-model="MODEL" data-replica="URL" data-state="up|down">`, each key row `<tr data-key="NAME">`.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable
from typing import Any

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1b1b;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;background:#fff;min-width:40%}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#0a6b2d;font-weight:600}.bad{color:#b00020;font-weight:600}.muted{color:#666}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if digits else f"{value:,.0f}"


def _state(ok: bool, yes: str = "ready", no: str = "not ready") -> str:
    return f'<span class="{"ok" if ok else "bad"}">{yes if ok else no}</span>'


def _rate(errors: float, requests: float) -> str:
    return "-" if requests <= 0 else f"{errors / requests:.1%}"


def _kv(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def _table(head: Iterable[str], rows: Iterable[str], empty: str) -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="muted">{_e(empty)}</p>'
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" + body + "</table>"


def render(report: dict[str, Any], refresh: int) -> str:
    """The page for `report` (`services.status.StatusService.report`)."""
    window = max(report.get("window_s", 0.0), 0.0)
    models = [
        f'<tr data-model="{_e(m["name"])}"><td>{_e(m["name"])}</td><td>{_e(m["kind"] or "")}'
        f'{" (adapter of " + _e(m["base"]) + ")" if m["base"] else ""}</td><td>{_state(m["ready"])}</td>'
        f'<td class="n">{_num(m["in_flight"])}</td><td class="n">{_num(m["waiting"])}</td>'
        f'<td class="n">{_num(m["running"])}</td><td class="n">{_num(m["requests"])}</td>'
        f'<td class="n">{_rate(m["client_errors"], m["requests"])}</td>'
        f'<td class="n">{_rate(m["server_errors"], m["requests"])}</td></tr>'
        for m in report["models"]]
    replicas = [
        f'<tr data-model="{_e(model)}" data-replica="{_e(r["url"])}" '
        f'data-state="{"up" if r["probe"] == "ready" else "down"}"><td>{_e(model)}</td><td>{_e(r["url"])}</td>'
        f'<td>{_state(r["probe"] == "ready", "up", "down")}</td>'
        f'<td>{_state(r["healthy"], "healthy", "marked down")}</td><td class="n">{_num(r["outstanding"])}</td>'
        f'<td class="n">{_num(r.get("load"), 2)}</td>'
        f'<td class="n">{_kv(r.get("kv_cache_fraction"))}</td>'
        f'<td class="n">{_num(r["requests"])}</td></tr>'
        for model, rs in report["replicas"].items() for r in rs]
    adapters = [f'<tr data-model="{_e(base)}"><td>{_e(base)}</td><td>{_e(", ".join(names))}</td></tr>'
                for base, names in report["adapters"].items()]
    keys = report.get("keys")
    key_rows = [
        f'<tr data-key="{_e(k["name"])}"><td>{_e(k["name"])}</td><td>{_e(k.get("team", ""))}</td>'
        f'<td class="n">{_num(k["usage"].get("requests_in_window"))}</td>'
        f'<td class="n">{_num(k["usage"].get("tokens_in_window"))}</td>'
        f'<td class="n">{_num(k["usage"].get("concurrent"))}</td>'
        f'<td class="n">{_num(k["usage"].get("tokens_today"))}</td>'
        f'<td class="n">{_num(k["usage"].get("tokens_this_month"))}</td>'
        f'<td>{"admin" if k["limits"].get("admin") else ""}</td></tr>' for k in keys or []]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.get("time", time.time())))
    refresh_tag = f'<meta http-equiv="refresh" content="{refresh}">' if refresh > 0 else ""
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width,initial-scale=1">', refresh_tag,
        "<title>Gateway status</title><style>", _STYLE, "</style></head><body>",
        f"<h1>Gateway status</h1><p>{_state(bool(report['ready']), 'serving', 'not ready')} "
        f'<span class="muted">at {_e(stamp)}'
        f'{f", refreshed every {refresh} s" if refresh > 0 else ""}</span></p>',
        "<h2>Models</h2>",
        _table(["model", "kind", "Triton", "in flight", "waiting", "running", f"requests ({window:.0f} s)",
                "4xx", "5xx"], models, "No model is configured."),
        "<h2>Replicas</h2>",
        _table(["model", "replica", "probe", "routing", "in flight here", "load", "KV cache", "requests"], replicas,
               "No model has several replicas or a scraped Triton."),
        "<h2>LoRA adapters</h2>", _table(["base model", "adapters"], adapters, "No adapter is served."),
    ]
    if keys is not None:
        parts += ["<h2>Keys</h2>", _table(["key", "team", "requests in window", "tokens in window", "in flight",
                                          "tokens today", "tokens this month", ""], key_rows,
                                         "The keys file lists no key.")]
    parts.append("</body></html>")
    return "".join(parts)
