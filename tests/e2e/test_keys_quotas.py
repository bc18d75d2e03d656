"""Keys and quotas end to end (issue #23): a real Redis (Debian's redis-server, started and stopped here on a
free loopback port) shared by two real gateway processes (the CLI) in front of the session's Triton.

Proven here: requests and tokens per window hold within 1% of the configured limit under concurrent load
spread over both gateways; a token budget stops a key and still stops it after a gateway restart; a
concurrency limit holds with streams open; Redis killed mid-test: the fail-open gateway serves, the
fail-closed one answers 503, neither hangs, both share again once Redis is back; a key added, limited,
narrowed and removed in the keys file while both gateways run (one of them with two workers) is seen by
every process's next requests, and a bad file changes nothing; every route applies the model allow-list;
the rate-limit headers carry OpenAI's names and count down, the `openai` client reads them and retries a
429 after its Retry-After. Limits are per minute in the file, scaled to a 5 s window
(`window_seconds`) so a measurement takes seconds. The oracle for every count is what the test itself
sent and received.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from openai_api.config import BUNDLED_CONFIG, BUNDLED_TEMPLATES
from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.test_reliability_shutdown import KEY as CLI_KEY
from tests.e2e.test_reliability_shutdown import start_cli, stop, wait_healthy
from tests.helpers import MODELS, free_port, requires_models

pytestmark = requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")

LLM = "synthetic-llm"
SLOW = "smollm2-135m-instruct"
EMBED, RERANK = "all-minilm-l6-v2", "minilm-rerank"
WINDOW_S = 5.0
CHAT = "/v1/chat/completions"
USER_X = [{"role": "user", "content": "x"}]


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# --- Redis ---------------------------------------------------------------------------------------------------
def redis_binary() -> str:
    """Debian's redis-server (or valkey-server), which the test command installs (scripts/setup_tests.sh);
    without it these tests skip, saying so."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")  # Debian ships both; same protocol
    if found is None:
        pytest.skip("redis-server is not installed: the test command installs it (bash scripts/setup_tests.sh)")
    return found


class RedisServer:
    def __init__(self, folder: Path) -> None:
        self.binary = redis_binary()
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        # Persistence (appendonly) on, as budgets would want it in production; in its own folder.
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "yes", "--dir", str(self.folder), "--protected-mode", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import socket

                with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


# --- the gateways ------------------------------------------------------------------------------------------------
KEYS: list[dict[str, Any]] = [
    {"name": "rpm", "team": "t1", "secret_sha256": sha("sk-rpm"), "requests_per_minute": 2400},   # 200 / 5 s
    {"name": "tpm", "team": "t1", "secret_sha256": sha("sk-tpm"), "tokens_per_minute": 120_000},  # 10,000 / 5 s
    {"name": "budget", "team": "t2", "secret_sha256": sha("sk-budget"), "tokens_per_day": 400},
    {"name": "conc", "team": "t2", "secret_sha256": sha("sk-conc"), "max_concurrent": 2},
    {"name": "llm-only", "team": "t3", "secret_sha256": sha("sk-llm"), "models": ["synthetic-*"],
     "requests_per_minute": 100_000},
    {"name": "retry", "team": "t3", "secret_sha256": sha("sk-retry"), "requests_per_minute": 24},  # 2 / 5 s
    {"name": "admin", "secret_sha256": sha("sk-admin"), "admin": True},
]


def write_keys(folder: Path, keys: list[dict[str, Any]] = KEYS) -> Path:
    path = folder / "keys.json"
    path.write_text(json.dumps({"window_seconds": WINDOW_S, "keys": keys}), encoding="utf-8")
    return path


def write_config(folder: Path, triton: EmbeddedTriton) -> Path:
    """The synthetic LLM (exactly max_tokens tokens per answer, as fast as Triton takes them), an embedding
    and a rerank model."""
    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    encoders = {}
    for kind, name in (("embedding", EMBED), ("rerank", RERANK)):
        entry = next(e for e in data[kind] if e["name"] == name)
        entry["path"] = str((BUNDLED_CONFIG.parent / entry["path"]).resolve())
        entry["url"] = triton.http_url
        encoders[kind] = [entry]
    # The real SmolLM2 too: its streams last long enough to be held open.
    real = next(e for e in data["llm"] if e["name"] == SLOW)
    for key in ("path", "chat_template"):
        if real.get(key):
            real[key] = str((BUNDLED_CONFIG.parent / real[key]).resolve())
    real["url"] = triton.grpc_url
    path = folder / "model_config.json"
    path.write_text(json.dumps({
        "model_infos": [{"name": LLM, "end_id": -1, "max_len": 32768},
                        *(i for i in data.get("model_infos", []) if i.get("name") == SLOW)],
        "llm": [{"name": LLM, "url": triton.grpc_url, "path": str(MODELS / "smollm2-135m-instruct"),
                 "triton_model": LLM, "chat_template": str(BUNDLED_TEMPLATES / "smollm2.jinja")}, real],
        **encoders}), encoding="utf-8")
    return path


class Gateway:
    def __init__(self, folder: Path, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.log = folder / f"gateway-{self.port}.log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Gateway:
        self.proc = start_cli(["--port", str(self.port), *self.args], self.log)
        wait_healthy(self.proc, self.url, self.log, timeout=120)
        return self

    def restart(self) -> None:
        assert self.proc is not None
        stop(self.proc)
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@pytest.fixture(scope="module")
def setup(triton: EmbeddedTriton, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Gateway, Gateway]]:
    folder = tmp_path_factory.mktemp("keys-e2e")
    common = ["--config-file", str(write_config(folder, triton)), "--keys-file", str(write_keys(folder)),
              "--redis-url", redis.url, "--max-in-flight", "4096", "--max-in-flight-per-model", "4096"]
    a = Gateway(folder, [*common, "--redis-fail-mode", "open"])
    # Two workers behind b: the concurrency, the reload and the fail modes hold in every worker process.
    b = Gateway(folder, [*common, "--redis-fail-mode", "closed", "--workers", "2"])
    threads = [threading.Thread(target=g.start) for g in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat_body(max_tokens: int = 20, **kw: Any) -> dict[str, Any]:
    return {"model": LLM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, **kw}


def hammer(urls: list[str], secret: str, path: str, body: dict[str, Any], clients: int
           ) -> tuple[list[tuple[float, int, dict[str, Any]]], float]:
    """`clients` threads (spread over `urls`, connections open before the start) send as fast as they can, from
    the first admitted request for 1.5 windows: the sliding window admits its limit at the start, and its limit
    again as those leave it one window later (refilled within a fraction of the second window); no third wave
    can start before the end. Every answer as (time since the first admission, status, body); the exact
    expected count is twice the limit. Also returns when the first admission came (load start to it)."""
    results: list[tuple[float, int, dict[str, Any]]] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    first: list[float] = []
    start = 0.0

    def run(i: int) -> None:
        with httpx.Client(base_url=urls[i % len(urls)], headers=auth(secret), timeout=30) as c:
            c.get("/health")  # the connection, open before the load starts
            ready.wait()
            while not first or time.monotonic() < first[0] + 1.5 * WINDOW_S:
                r = c.post(path, json=body)
                now = time.monotonic()
                with lock:
                    if r.status_code == 200 and not first:
                        first.append(now)
                    results.append((now, r.status_code, r.json() if r.status_code == 200 else {}))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    t0 = first[0]
    kept = [(t - t0, status, b) for t, status, b in results if t <= t0 + 1.5 * WINDOW_S]
    return kept, t0 - start


# --- accuracy --------------------------------------------------------------------------------------------------
def test_requests_per_window_hold_within_1pct_across_two_gateways(setup: tuple[Gateway, Gateway]) -> None:
    a, b = setup
    limit = 200  # 2400 per minute over a 5 s window
    results, _ = hammer([a.url, b.url], "sk-rpm", "/tokenize", {"model": LLM, "prompt": "Hi"}, 12)
    ok = [t for t, status, _ in results if status == 200]
    refused = [s for _, s, _ in results if s != 200]
    assert set(refused) <= {429}, set(refused)
    assert len(refused) > len(ok), "the load did not saturate the limit"
    expected = 2 * limit
    print(f"requests admitted over 1.5 windows: {len(ok)} (exact: {expected})")
    assert abs(len(ok) - expected) <= 0.01 * expected, (len(ok), expected)
    # The second wave came only once the first left the window.
    assert all(t < 2.0 or t >= WINDOW_S - 0.5 for t in ok)


def test_tokens_per_window_hold_within_1pct_across_two_gateways(setup: tuple[Gateway, Gateway]) -> None:
    a, b = setup
    limit = 10_000
    results, _ = hammer([a.url, b.url], "sk-tpm", CHAT, chat_body(max_tokens=20), 12)
    used = sum(body["usage"]["total_tokens"] for _, status, body in results if status == 200)
    assert {s for _, s, _ in results} <= {200, 429}
    assert all(body["usage"]["completion_tokens"] == 20 for _, s, body in results if s == 200)
    expected = 2 * limit
    print(f"tokens used over 1.5 windows: {used} (exact: {expected})")
    assert abs(used - expected) <= 0.01 * expected, (used, expected)


# --- budgets, concurrency, headers ----------------------------------------------------------------------------------
def test_a_budget_stops_the_key_on_both_gateways_and_survives_a_restart(setup: tuple[Gateway, Gateway]) -> None:
    a, b = setup
    spent = 0
    for _ in range(40):
        r = httpx.post(f"{a.url}{CHAT}", json=chat_body(max_tokens=20), headers=auth("sk-budget"), timeout=30)
        if r.status_code != 200:
            break
        spent += r.json()["usage"]["total_tokens"]
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
    assert spent <= 400
    r = httpx.post(f"{b.url}{CHAT}", json=chat_body(max_tokens=20), headers=auth("sk-budget"), timeout=30)
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    a.restart()
    r = httpx.post(f"{a.url}{CHAT}", json=chat_body(max_tokens=20), headers=auth("sk-budget"), timeout=30)
    assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
    usage = httpx.get(f"{a.url}/v1/admin/usage", headers=auth("sk-admin"), timeout=30).json()["data"]
    budget = next(k for k in usage if k["name"] == "budget")
    assert budget["usage"]["tokens_today"] == spent and budget["remaining"]["tokens_today"] == 400 - spent


def test_concurrency_limit_holds_with_streams_open_across_gateways(setup: tuple[Gateway, Gateway]) -> None:
    a, b = setup
    with httpx.Client(timeout=60) as c1, httpx.Client(timeout=60) as c2:
        body = {**chat_body(max_tokens=400, stream=True), "model": SLOW, "min_tokens": 400}  # long enough to hold
        with c1.stream("POST", f"{a.url}{CHAT}", json=body, headers=auth("sk-conc")) as s1, \
                c2.stream("POST", f"{b.url}{CHAT}", json=body, headers=auth("sk-conc")) as s2:
            assert s1.status_code == 200 and s2.status_code == 200
            # Each stream's iterator is kept: a dropped one (`next(s.iter_raw())`) is closed when it is collected,
            # which closes the connection, and the gateway rightly gives that stream's slot back at once.
            chunks1, chunks2 = s1.iter_raw(), s2.iter_raw()
            assert next(chunks1) and next(chunks2)
            r = httpx.post(f"{a.url}{CHAT}", json=chat_body(), headers=auth("sk-conc"), timeout=30)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert int(r.headers["retry-after"]) >= 1
    deadline = time.monotonic() + 10  # the streams' slots come back when the gateways see them closed
    while True:
        r = httpx.post(f"{b.url}{CHAT}", json=chat_body(), headers=auth("sk-conc"), timeout=30)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text


def test_headers_have_openais_names_and_count_down_and_the_openai_client_reads_them(
        setup: tuple[Gateway, Gateway]) -> None:
    a, _b = setup
    client = openai.OpenAI(base_url=f"{a.url}/v1", api_key="sk-llm", max_retries=0)
    seen = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(model=LLM, messages=[{"role": "user", "content": "x"}],
                                                               max_tokens=2)
        assert raw.parse().choices[0].message.content is not None
        seen.append(int(raw.headers["x-ratelimit-remaining-requests"]))
        assert raw.headers["x-ratelimit-limit-requests"] == str(round(100_000 * WINDOW_S / 60))
        assert raw.headers["x-ratelimit-reset-requests"].endswith(("s", "ms"))
        assert "x-ratelimit-limit-tokens" not in raw.headers  # no token limit on this key
    assert seen[0] > seen[1] > seen[2]


def test_the_openai_client_retries_a_429_after_its_retry_after(setup: tuple[Gateway, Gateway]) -> None:
    a, _ = setup
    sent: list[float] = []
    http = httpx.Client(event_hooks={"request": [lambda req: sent.append(time.monotonic())]})
    client = openai.OpenAI(base_url=f"{a.url}/v1", api_key="sk-retry", max_retries=3, http_client=http)
    for _ in range(2):  # the window's two requests
        client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    sent.clear()
    out = client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert out.choices, "answered after retries"
    assert len(sent) >= 2, "the client retried"
    # It waited what Retry-After said (up to the 5 s window) before the attempt that passed, not its own backoff.
    assert sent[-1] - sent[0] >= 1.0


# --- allow-lists -------------------------------------------------------------------------------------------------
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/embeddings", {"model": EMBED, "input": "hi"}),
    ("/v1/rerank", {"model": RERANK, "query": "q", "documents": ["a", "b"]}),
    ("/v2/rerank", {"model": RERANK, "query": "q", "documents": ["a", "b"]}),
    ("/v1/ranking", {"model": RERANK, "query": {"text": "q"}, "passages": [{"text": "a"}]}),
    ("/rerank", {"model": RERANK, "query": "q", "texts": ["a", "b"]}),
    ("/embed", {"model": EMBED, "inputs": "hi"}),
    ("/tokenize", {"model": EMBED, "prompt": "hi"}),
    (CHAT, {**chat_body(max_tokens=2), "model": SLOW}),
    ("/v1/completions", {"model": SLOW, "prompt": "x", "max_tokens": 2}),
    ("/v1/responses", {"model": SLOW, "input": "x", "max_output_tokens": 2}),
]


def test_allow_lists_on_every_route(setup: tuple[Gateway, Gateway]) -> None:
    a, _ = setup
    with httpx.Client(base_url=a.url, timeout=30) as c:
        for path, body in ROUTES:
            r = c.post(path, json=body, headers=auth("sk-llm"))
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["code"] == "model_not_found", (path, r.text)
            assert c.post(path, json=body, headers=auth("sk-admin")).status_code == 200, path
        for path, body in [(CHAT, chat_body(max_tokens=2)),
                           ("/v1/completions", {"model": LLM, "prompt": "x", "max_tokens": 2}),
                           ("/v1/responses", {"model": LLM, "input": "x", "max_output_tokens": 2}),
                           ("/v1/messages", {"model": LLM, "max_tokens": 2, "messages": USER_X}),
                           ("/tokenize", {"model": LLM, "prompt": "hi"})]:
            assert c.post(path, json=body, headers=auth("sk-llm")).status_code == 200, path
        ids = [m["id"] for m in c.get("/v1/models", headers=auth("sk-llm")).json()["data"]]
        assert ids == [LLM]
        r = c.post("/v1/messages", json={"model": SLOW, "max_tokens": 2, "messages": USER_X}, headers=auth("sk-llm"))
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"  # Anthropic's shape
        assert c.get(f"/v1/models/{EMBED}", headers=auth("sk-llm")).status_code == 404
        assert {m["id"] for m in c.get("/v1/models", headers=auth("sk-admin")).json()["data"]} == \
            {LLM, SLOW, EMBED, RERANK}


# --- hot reload ------------------------------------------------------------------------------------------------------
def replace_keys(path: Path, keys: list[dict[str, Any]] | str) -> None:
    """Write the keys file as an operator's tool would: whole, then renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(keys if isinstance(keys, str) else json.dumps({"window_seconds": WINDOW_S, "keys": keys}),
                   encoding="utf-8")
    os.replace(tmp, path)


def every_process_answers(urls: list[str], secret: str, ok: Any, timeout: float = 10.0) -> httpx.Response:
    """Until `ok(response)` holds for 4 requests in a row to each url, each on a new connection (so that the
    kernel spreads them over a gateway's workers); the last response. The file is polled every second."""
    deadline = time.monotonic() + timeout
    while True:
        answers = [httpx.post(f"{url}{CHAT}", json=chat_body(max_tokens=2), headers=auth(secret), timeout=30)
                   for url in urls for _ in range(4)]
        bad = [r for r in answers if not ok(r)]
        if not bad:
            return answers[-1]
        assert time.monotonic() < deadline, (bad[0].status_code, bad[0].headers, bad[0].text)
        time.sleep(0.3)


def test_keys_file_hot_reload_adds_limits_and_removes_a_key_on_every_process(setup: tuple[Gateway, Gateway]
                                                                              ) -> None:
    a, b = setup
    path, urls = a.folder / "keys.json", [a.url, b.url]
    late = {"name": "late", "team": "t4", "secret_sha256": sha("sk-late")}
    assert httpx.post(f"{a.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth("sk-late"),
                      timeout=30).status_code == 401
    try:
        replace_keys(path, [*KEYS, late])  # added, no limits
        every_process_answers(urls, "sk-late", lambda r: r.status_code == 200)
        # Limited while the gateways run: 12 per minute is 1 per 5 s window; the next requests say so.
        replace_keys(path, [*KEYS, {**late, "requests_per_minute": 12}])
        every_process_answers(urls, "sk-late", lambda r: r.status_code in (200, 429)
                              and r.headers.get("x-ratelimit-limit-requests") == "1")
        r = httpx.post(f"{b.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth("sk-late"), timeout=30)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        # Its models narrowed: the chat model is no longer there for it.
        replace_keys(path, [*KEYS, {**late, "models": [EMBED]}])
        every_process_answers(urls, "sk-late", lambda r: r.status_code == 404)
        # Four requests may all reach one of a gateway's two workers: the other's once-a-second poll must have read
        # that file too before it is broken (once, under load, a worker still on the file before answered 429).
        time.sleep(2.5)
        # A bad file is refused and the previous keys stay.
        replace_keys(path, "{not json")
        time.sleep(1.5)
        every_process_answers(urls, "sk-late", lambda r: r.status_code == 404, timeout=0)
        assert "keys file not reloaded" in a.log.read_text(errors="replace")
        # Revoked: removed from the file, refused everywhere.
        replace_keys(path, KEYS)
        every_process_answers(urls, "sk-late", lambda r: r.status_code == 401)
    finally:
        replace_keys(path, KEYS)
    every_process_answers(urls, "sk-llm", lambda r: r.status_code == 200)


# --- Redis gone ------------------------------------------------------------------------------------------------------
def test_redis_killed_open_serves_closed_refuses_neither_hangs_and_both_recover(
        setup: tuple[Gateway, Gateway], redis: RedisServer) -> None:
    a, b = setup
    redis.kill()
    try:
        for _ in range(3):
            t0 = time.monotonic()
            ra = httpx.post(f"{a.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth("sk-llm"), timeout=30)
            rb = httpx.post(f"{b.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth("sk-llm"), timeout=30)
            assert time.monotonic() - t0 < 3.0, "a gateway waited on the dead Redis"
            assert ra.status_code == 200, ra.text
            assert ra.headers["x-ratelimit-limit-requests"]  # counted locally meanwhile
            assert rb.status_code == 503 and rb.json()["error"]["code"] == "quota_store_unavailable", rb.text
        # A key without limits (the CLI's `--api-key`, see `start_cli`) does not need Redis on either gateway.
        assert httpx.post(f"{b.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth(CLI_KEY),
                          timeout=30).status_code == 200
        assert "Redis unreachable" in a.log.read_text(errors="replace")
    finally:
        redis.start()
    deadline = time.monotonic() + 10
    while True:
        rb = httpx.post(f"{b.url}{CHAT}", json=chat_body(max_tokens=2), headers=auth("sk-llm"), timeout=30)
        if rb.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert rb.status_code == 200, rb.text
