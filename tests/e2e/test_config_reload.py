"""Config reload end to end (#22 item 4): the real CLI in a subprocess with a config file, against the session's
Triton, with `--workers 1` and `--workers 2` (one gateway each). While streams run on the paced synthetic LLM
(a sleep per token, so they stay in flight for a known time whatever the load), the config is changed five
ways, each applied without a restart:

1. a model added (the file rewritten: the poll sees it);
2. a template changed (the template file's content, not the config: only SIGHUP applies it; with workers the
   supervisor passes it on);
3. replicas changed (the same Triton under a second address);
4. a broken config (rejected with one log line per process; the old config keeps serving);
5. the streaming model removed.

Each time every stream started before the change finishes in full on what it started with (the removed model's
too, and the old template's prompt), every process logs the swap, and /v1/models on fresh connections (spread
over the workers) shows the new config at once. The prompt-token oracle is the tokenizer file itself
(`tokenizers`), not the gateway."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.conftest import PACED
from tests.e2e.test_reliability_observability import metric
from tests.e2e.test_reliability_shutdown import AUTH, start_cli, stop, wait_healthy
from tests.helpers import MODELS, free_port, requires_models

pytestmark = requires_models("smollm2-135m-instruct")

SLOW = "paced-llm"  # the paced synthetic LLM (50 ms a token): its streams straddle a reload
FAST = "synthetic-llm"
ADDED = "added-llm"
FOLDER = MODELS / "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
STREAM_TOKENS = 50  # 2.5 s
PLAIN = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
         "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
MARKED_LINE = "<|im_start|>system\nReloaded.<|im_end|>\n"
MARKED = "{{- '" + MARKED_LINE.replace("\n", "\\n") + "' }}" + PLAIN
RELOADED = re.compile(r"(?:\[(\d+)\] )?openai_api\.reload: config reloaded: generation")
REFUSED = re.compile(r"(?:\[(\d+)\] )?openai_api\.reload: config not reloaded")


def entry(name: str, url: str | list[str], triton_model: str, template: Path) -> dict[str, Any]:
    return {"name": name, "url": url, "path": str(FOLDER), "triton_model": triton_model,
            "chat_template": str(template)}


class Gateway:
    def __init__(self, triton: EmbeddedTriton, folder: Path, workers: int) -> None:
        self.triton, self.folder, self.workers = triton, folder, workers
        self.config = folder / "model_config.json"
        self.template = folder / "chat.jinja"
        self.template.write_text(PLAIN, encoding="utf-8")
        self.log = folder / "cli.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def write(self, *, added: bool = False, replicas: bool = False, slow: bool = True) -> None:
        slow_url: str | list[str] = self.triton.grpc_url
        if replicas:  # the same Triton under a second address: a second replica as far as the gateway knows
            slow_url = [self.triton.grpc_url, f"localhost:{self.triton.grpc_port}"]
        llm = [entry(FAST, self.triton.grpc_url, FAST, self.template)]
        if slow:
            llm.append(entry(SLOW, slow_url, PACED, self.template))
        if added:
            llm.append(entry(ADDED, self.triton.grpc_url, FAST, self.template))
        # model_infos for the entries written only: one naming no llm entry is a config error.
        self.write_text(json.dumps({"model_infos": [{"name": e["name"], "end_id": -1, "max_len": 8192}
                                                    for e in llm], "llm": llm}))

    def write_text(self, text: str) -> None:
        tmp = self.config.with_suffix(".tmp")  # replaced at once, as a ConfigMap's symlink swap is
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.config)

    def start(self) -> Gateway:
        self.write()
        self.proc = start_cli(["--port", str(self.port), "--config-file", str(self.config), "--workers",
                               str(self.workers)], self.log)
        wait_healthy(self.proc, self.url, self.log, timeout=120)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self, pattern: re.Pattern[str], since: int) -> int:
        """How many processes logged `pattern` after log offset `since` (workers: distinct pids)."""
        found = pattern.findall(self.text()[since:])
        return len(set(found)) if self.workers > 1 else len(found)

    def until(self, pattern: re.Pattern[str], since: int, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.processes(pattern, since) < self.workers:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not in every process within {timeout:.0f} s:\n{self.text()[-4000:]}")
            time.sleep(0.05)

    def models(self) -> list[dict[str, Any]]:
        """/v1/models on a fresh connection (with workers, SO_REUSEPORT spreads new connections)."""
        r = httpx.get(f"{self.url}/v1/models", headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    def all_see(self, names: set[str]) -> list[dict[str, Any]]:
        cards: list[dict[str, Any]] = []
        for _ in range(4 * self.workers):
            cards = self.models()
            assert {c["id"] for c in cards} == names, (cards, self.text()[-3000:])
        return cards

    def chat(self, model: str, max_tokens: int = 4) -> httpx.Response:
        return httpx.post(f"{self.url}{CHAT}", headers=AUTH, timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens})


class Streams:
    """`n` streams on `model`, each on its own connection and thread: STREAM_TOKENS tokens each, usage at the end."""

    def __init__(self, gw: Gateway, model: str = SLOW, n: int = 3) -> None:
        self.started = [threading.Event() for _ in range(n)]
        self.done = [threading.Event() for _ in range(n)]
        self.results: list[dict[str, Any]] = [{} for _ in range(n)]
        self.threads = [threading.Thread(target=self._run, args=(gw, model, i), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()
        for e in self.started:
            assert e.wait(60), "a stream never started"

    def _run(self, gw: Gateway, model: str, i: int) -> None:
        out = self.results[i]
        try:
            with httpx.stream("POST", f"{gw.url}{CHAT}", headers=AUTH, timeout=120, json={
                    "model": model, "messages": [{"role": "user", "content": "Count to one hundred."}],
                    "stream": True, "max_tokens": STREAM_TOKENS, "min_tokens": STREAM_TOKENS,
                    "stream_options": {"include_usage": True}}) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    self.started[i].set()
                    event = json.loads(line[6:])
                    if "error" in event:
                        out["error"] = event
                    for choice in event.get("choices") or ():
                        out["finish"] = choice.get("finish_reason") or out.get("finish")
                    if event.get("usage"):
                        out["usage"] = event["usage"]
        except Exception as e:  # noqa: BLE001 - reported by check()
            out["error"] = repr(e)
        finally:
            self.started[i].set()
            self.done[i].set()

    def running(self) -> int:
        return sum(not d.is_set() for d in self.done)

    def check(self, prompt_tokens: int) -> None:
        for t in self.threads:
            t.join(120)
        for out in self.results:
            assert out.get("status") == 200 and "error" not in out, out
            assert out.get("finish") == "length", out
            assert out["usage"]["completion_tokens"] == STREAM_TOKENS, out
            assert out["usage"]["prompt_tokens"] == prompt_tokens, out


@pytest.fixture(scope="module", params=[1, 2], ids=["workers-1", "workers-2"])
def gateway(request: pytest.FixtureRequest, triton: EmbeddedTriton,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(triton, tmp_path_factory.mktemp(f"reload-{request.param}"), request.param)
    try:
        yield gw.start()
    finally:
        if gw.proc is not None:  # killed: its workers get SIGTERM from the kernel (PR_SET_PDEATHSIG) and drain
            stop(gw.proc)


def applied_during(gw: Gateway, streams: Streams, pattern: re.Pattern[str], since: int, what: str) -> None:
    """Every process logged `pattern` (a swap or a refusal) while at least one stream was still running."""
    gw.until(pattern, since, what)
    assert streams.running() > 0, f"{what}: the streams were over before it applied (make them longer)"


def test_reload_add_template_replicas_broken_remove_while_streams_run(gateway: Gateway) -> None:
    gw = gateway
    tok = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    prompt = "<|im_start|>user\nCount to one hundred.<|im_end|>\n<|im_start|>assistant\n"
    plain_tokens = len(tok.encode(prompt, add_special_tokens=False).ids)
    marked_tokens = len(tok.encode(MARKED_LINE + prompt, add_special_tokens=False).ids)
    assert marked_tokens > plain_tokens
    assert {c["id"] for c in gw.models()} == {FAST, SLOW}

    # 1. A model added: the file is rewritten, each process's poll sees it.
    streams, since = Streams(gw), len(gw.text())
    gw.write(added=True)
    applied_during(gw, streams, RELOADED, since, "add a model")
    gw.all_see({FAST, SLOW, ADDED})
    r = gw.chat(ADDED)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    streams.check(plain_tokens)

    # 2. The template file changed (the config did not): SIGHUP, to the supervisor with workers, applies it.
    streams, since = Streams(gw), len(gw.text())
    gw.template.write_text(MARKED, encoding="utf-8")
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    applied_during(gw, streams, RELOADED, since, "SIGHUP: a new template")
    streams.check(plain_tokens)  # started under the old template: rendered with it
    for _ in range(2 * gw.workers):
        r = gw.chat(SLOW)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(
            MARKED_LINE + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids)

    # 3. Replicas: the same Triton under a second address.
    streams, since = Streams(gw), len(gw.text())
    gw.write(added=True, replicas=True)
    applied_during(gw, streams, RELOADED, since, "replicas")
    cards = gw.all_see({FAST, SLOW, ADDED})
    slow = next(c for c in cards if c["id"] == SLOW)
    assert sorted(r["url"] for r in slow["replicas"]) == sorted(
        [gw.triton.grpc_url, f"localhost:{gw.triton.grpc_port}"]), slow
    for _ in range(4):
        assert gw.chat(SLOW).status_code == 200
    streams.check(marked_tokens)

    # 4. A broken config: refused by every process with one line, the old config keeps serving.
    streams, since = Streams(gw), len(gw.text())
    gw.write_text('{"llm": [{"name": "broken"')
    applied_during(gw, streams, REFUSED, since, "a broken config refused")
    assert len(REFUSED.findall(gw.text()[since:])) == gw.workers
    gw.all_see({FAST, SLOW, ADDED})
    assert gw.chat(ADDED).status_code == 200
    streams.check(marked_tokens)
    text = httpx.get(f"{gw.url}/metrics", headers=AUTH, timeout=30).text
    assert metric(text, "openai_api_config_reloads_total", result="refused") == gw.workers
    assert metric(text, "openai_api_config_reloads_total", result="ok") == 3 * gw.workers

    # 5. The streaming model removed while its streams run: they finish; new requests get 404.
    streams, since = Streams(gw), len(gw.text())
    gw.write(added=True, slow=False)
    applied_during(gw, streams, RELOADED, since, "remove a model")
    gw.all_see({FAST, ADDED})
    r = gw.chat(SLOW)
    assert r.status_code == 404, r.text
    streams.check(marked_tokens)
    assert gw.proc is not None and gw.proc.poll() is None
