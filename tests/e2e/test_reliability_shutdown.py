"""Graceful shutdown of the real CLI in a subprocess: SIGTERM drains (new requests 503, streams in flight
finish), then the process exits 0; with --embedded-triton, its tritonserver is gone too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from openai_api.config import BUNDLED_CONFIG
from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.conftest import LLM
from tests.helpers import REPO, free_port

KEY = "shutdown-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def write_config(folder: Path, triton: EmbeddedTriton | None, kinds: tuple[str, ...]) -> Path:
    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    for kind in ("llm", "embedding", "rerank"):
        if kind not in kinds:
            data[kind] = []
        data[kind] = [e for e in data.get(kind, []) if kind != "llm" or e["name"] == LLM]
    data["model_infos"] = [i for i in data.get("model_infos", []) if i["name"] in {e["name"] for e in data["llm"]}]
    for kind in ("llm", "embedding", "rerank"):
        for entry in data.get(kind, []):
            for key in ("path", "chat_template"):
                if entry.get(key):
                    entry[key] = str((BUNDLED_CONFIG.parent / entry[key]).resolve())
            if triton is not None:
                entry["url"] = triton.grpc_url if kind == "llm" else triton.http_url
    path = folder / "model_config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def start_cli(args: list[str], log: Path, key: str = KEY) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "openai_api_cli.py", "--host", "127.0.0.1", "--api-key", key, *args],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the CLI exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"the CLI never became ready:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_sigterm_drains_streams_refuses_new_requests_and_exits_0(triton: EmbeddedTriton, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    proc = start_cli(["--port", str(port), "--config-file", str(write_config(tmp_path, triton, ("llm",))),
                      "--shutdown-grace", "60"], log)
    try:
        wait_healthy(proc, url, log, timeout=120)
        events: list[str] = []
        first = threading.Event()
        failure: list[BaseException] = []

        def stream() -> None:
            try:
                with httpx.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, timeout=120, json={
                        "model": LLM, "messages": [{"role": "user", "content": "Count to twenty."}], "stream": True,
                        "max_tokens": 16, "min_tokens": 16}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            first.set()
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                failure.append(e)
                first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(120), "no first chunk"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: new requests are refused with OpenAI's error shape, readiness fails, liveness holds.
        r = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=30, json={
            "model": LLM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        assert httpx.get(f"{url}/health/ready", timeout=30).status_code == 503
        t.join(120)
        assert not failure, failure
        assert events[-1] == "[DONE]", events[-3:]  # the stream in flight finished normally
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)
    finally:
        stop(proc)


def test_requests_still_running_when_the_grace_ends_get_a_clear_ending(triton: EmbeddedTriton,
                                                                         tmp_path: Path) -> None:
    """A stream cut at the end of the drain gets a final `shutting_down` error event (not a silent stop), a
    non-streamed request a 503 in OpenAI's shape; the process exits 0 and logs no traceback."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    proc = start_cli(["--port", str(port), "--config-file", str(write_config(tmp_path, triton, ("llm",))),
                      "--shutdown-grace", "2"], log)
    long = {"model": LLM, "messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 500,
            "min_tokens": 500, "temperature": 0}
    try:
        wait_healthy(proc, url, log, timeout=120)
        events: list[str] = []
        first = threading.Event()
        plain: list[httpx.Response] = []

        def stream() -> None:
            with httpx.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, timeout=120,
                              json={**long, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first.set()

        threads = [threading.Thread(target=stream),
                   threading.Thread(target=lambda: plain.append(
                       httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=120, json=long)))]
        for t in threads:
            t.start()
        assert first.wait(120), "no first chunk"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert time.monotonic() - t0 < 15
        last = json.loads(events[-1])
        assert last["error"]["code"] == "shutting_down" and last["error"]["type"] == "server_error", events[-3:]
        assert plain and plain[0].status_code == 503 and plain[0].json()["error"]["code"] == "shutting_down"
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]
        assert "requests still in flight are cut" in text
    finally:
        stop(proc)


def test_sigterm_with_embedded_triton_stops_tritonserver_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "cli.log"
    # Only the embedding model: the embedded Triton starts in seconds.
    proc = start_cli(["--port", str(port), "--embedded-triton",
                      "--config-file", str(write_config(tmp_path, None, ("embedding",)))], log)
    tritons: list[psutil.Process] = []
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log, timeout=240)
        tritons += [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "tritonserver"]
        assert len(tritons) == 1, [c.name() for c in psutil.Process(proc.pid).children(recursive=True)]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", headers=AUTH, timeout=60,
                       json={"model": "all-minilm-l6-v2", "input": "hello"})
        assert r.status_code == 200, r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        gone = psutil.wait_procs(tritons, timeout=10)[1] == []
        assert gone, "tritonserver outlived the gateway"
        assert "tritonserver (pid" in log.read_text()  # the launcher logged its stop
    finally:
        stop(proc)
        for t in tritons:  # only if the test failed: never leave a tritonserver behind
            if t.is_running():
                os.killpg(t.pid, signal.SIGKILL)

