"""``EmbeddedTriton(supervise=True)``: a crashed tritonserver is reaped with its whole process group and
restarted on the same ports with back-off; ``stop()`` at any moment leaves nothing behind.

Real tritonserver processes throughout.  Launcher-level tests load one tiny Python model from a private
repository (start-up takes seconds); the gateway test loads ``all-minilm-l6-v2`` and goes through a real
gateway.  Every process is found by the test's own temporary repository path (on the command lines of
tritonserver and of its stubs), so Tritons of other tests or sessions on the machine are never counted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.embedded.prepare import prepare_models
from tests.e2e.conftest import API_KEY, GatewayServer
from tests.helpers import requires_models, stop_now

LOGGER = "openai_api.embedded.launcher"
EMB = "all-minilm-l6-v2"

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }]
"""

ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests
        ]
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    (repo / "echo" / "1" / "model.py").write_text(ECHO)
    return repo


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def live_group(pgid: int) -> list[int]:
    """Live (non-zombie) members of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def live_using(path: Path) -> list[int]:
    """Live processes whose command line names ``path``: tritonserver (its repository) and its stubs (model.py)."""
    needle = str(path).encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = _stat(int(entry.name))
        if needle in cmdline and fields is not None and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def is_stub(pid: int) -> bool:
    try:
        return b"triton_python_backend_stub" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_for(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def messages(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and str(r.msg).startswith(start)]


def backoff_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [float(r.args[0]) for r in messages(caplog, "restarting tritonserver in")]  # type: ignore[index]


def echo(server: EmbeddedTriton, value: float) -> float:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [value]}]}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/echo/infer", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return float(json.loads(resp.read())["outputs"][0]["data"][0])


def model_ready(server: EmbeddedTriton, model: str = "echo") -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def kill9(server: EmbeddedTriton) -> int:
    """SIGKILL the tritonserver process only (not its group), as a crash or the OOM killer would."""
    pid = server.pid
    assert pid is not None and server.is_running()
    assert any(is_stub(p) for p in live_group(pid)), "the model's stub should be running before the crash"
    os.kill(pid, signal.SIGKILL)
    return pid


def shm_mapped_by(pids: list[int]) -> set[str]:
    regions = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        regions |= {line.split()[-1] for line in maps.splitlines() if "triton_python_backend_shm_region_" in line}
    return regions


@pytest.fixture
def supervised(repo: Path) -> Iterator[Callable[..., EmbeddedTriton]]:
    """``make(**kw)`` starts a supervised Triton serving ``echo``.  At teardown, after stop(): no process of
    the test is alive and none of the Python backend's /dev/shm files its processes mapped is left."""
    started: list[EmbeddedTriton] = []
    seen: set[str] = set()
    done = threading.Event()

    def sample() -> None:  # every Triton of the test, failed restart attempts included
        while not done.wait(0.1):
            seen.update(shm_mapped_by(live_using(repo)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def make(**kw: object) -> EmbeddedTriton:
        server = EmbeddedTriton(repo, models=["echo"], startup_timeout=120, supervise=True, **kw)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield make
    for server in started:
        server.stop()
    done.set()
    sampler.join()
    assert live_using(repo) == []
    assert seen, "the sampler saw no shared-memory region"
    assert [r for r in seen if os.path.exists(r)] == []


def test_kill9_reaps_the_group_and_restarts_on_the_same_ports(
        supervised: Callable[..., EmbeddedTriton], repo: Path, logs: pytest.LogCaptureFixture) -> None:
    server = supervised(restart_delay=0.5)
    ports = (server.grpc_url, server.http_url, server.metrics_url)
    assert echo(server, 1.5) == 1.5
    old = kill9(server)
    t0 = time.monotonic()
    # The orphaned stub is killed promptly, before the restart (and long before the gateway exits).
    wait_for(lambda: live_group(old) == [], 10, "the crashed Triton's group to empty")
    assert server.restarts == 0
    wait_for(lambda: server.restarts == 1, 60, "the restart")
    assert time.monotonic() - t0 >= 0.5  # the back-off delay was honoured
    assert server.pid not in (None, old) and server.is_running() and server.state == "ready"
    assert (server.grpc_url, server.http_url, server.metrics_url) == ports
    assert model_ready(server) and echo(server, 2.5) == 2.5
    assert any(is_stub(p) for p in live_group(server.pid))
    assert live_group(old) == []
    # Only the new Triton and its stub are alive.
    assert set(live_using(repo)) == set(live_group(server.pid))

    crash = messages(logs, "tritonserver (pid %d) %s after")
    assert len(crash) == 1 and crash[0].levelno == logging.ERROR
    text = crash[0].getMessage()
    assert f"pid {old}" in text and "killed by SIGKILL" in text and "leftover process" in text
    assert "Started HTTPService" in text  # the tail of Triton's own log
    assert backoff_delays(logs) == [0.5]
    assert len(messages(logs, "tritonserver restarted")) == 1
    with urllib.request.urlopen(server.metrics_url, timeout=5) as resp:
        assert resp.status == 200

    pid = server.pid
    server.stop()
    assert live_using(repo) == [] and live_group(pid) == [] and server.state == "stopped"
    assert len(messages(logs, "restarting tritonserver in")) == 1  # the deliberate stop was not restarted


def test_stop_during_backoff_leaves_nothing_and_never_restarts(
        supervised: Callable[..., EmbeddedTriton], repo: Path, logs: pytest.LogCaptureFixture) -> None:
    server = supervised(restart_delay=30.0)
    old = kill9(server)
    wait_for(lambda: messages(logs, "restarting tritonserver in"), 10, "the back-off to begin")
    assert server.state == "restarting" and server.pid is None and live_group(old) == []
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 5  # the 30 s back-off does not hold stop() up
    time.sleep(1.0)
    assert live_using(repo) == [] and server.state == "stopped" and server.restarts == 0
    assert messages(logs, "restart attempt") == []


def test_stop_during_a_restart_leaves_nothing_and_never_restarts(
        supervised: Callable[..., EmbeddedTriton], repo: Path, logs: pytest.LogCaptureFixture) -> None:
    server = supervised(restart_delay=0.1)
    old = kill9(server)
    # A new tritonserver is spawned and still loading its model.
    wait_for(lambda: server.pid not in (None, old), 20, "the restart to spawn", step=0.01)
    new = server.pid
    assert new is not None and server.state == "restarting"
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 10  # a loading Triton is killed, not waited for
    assert server.restarts == 0 and messages(logs, "tritonserver restarted") == []
    assert live_group(old) == [] and live_group(new) == []
    time.sleep(2.0)
    assert live_using(repo) == [] and server.pid is None and server.state == "stopped"
    assert len(messages(logs, "restarting tritonserver in")) == 1


def test_failed_restarts_back_off_until_the_port_is_free(
        supervised: Callable[..., EmbeddedTriton], repo: Path, logs: pytest.LogCaptureFixture) -> None:
    server = supervised(restart_delay=0.5, max_restart_delay=1.0)
    old = kill9(server)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Triton does: TIME_WAIT is no obstacle
    try:
        # Take Triton's gRPC port the moment the crashed process lets go of it: every restart fails to bind.
        deadline = time.monotonic() + 10
        while True:
            try:
                squatter.bind(("127.0.0.1", server.grpc_port))
                squatter.listen(1)
                break
            except OSError:
                assert time.monotonic() < deadline, "the crashed Triton's gRPC port was never released"
                time.sleep(0.01)
        assert not messages(logs, "restart attempt"), "the port must be taken before the first attempt"
        wait_for(lambda: len(messages(logs, "restart attempt %d failed")) >= 3, 60, "three failed restarts")
        failed = messages(logs, "restart attempt %d failed")
        assert all("already in use" in r.getMessage() for r in failed), failed[0].getMessage()
        assert server.restarts == 0 and server.state == "restarting"
    finally:
        squatter.close()
    wait_for(lambda: server.restarts == 1, 60, "a restart once the port is free")
    assert model_ready(server) and echo(server, 3.0) == 3.0
    delays = backoff_delays(logs)
    assert delays[:4] == [0.5, 1.0, 1.0, 1.0]  # doubling, capped at max_restart_delay
    # Failed attempts left no process behind: only the running Triton and its stub, in one group.
    assert live_group(old) == [] and set(live_using(repo)) == set(live_group(server.pid))


def test_crash_loop_backs_off_then_resets_after_a_stable_run(
        supervised: Callable[..., EmbeddedTriton], repo: Path, logs: pytest.LogCaptureFixture) -> None:
    server = supervised(restart_delay=0.5, max_restart_delay=1.0, stable_after=3.0)
    crashed_at: list[float] = []
    for n in range(1, 4):  # dies right after every restart
        kill9(server)
        crashed_at.append(time.monotonic())
        wait_for(lambda n=n: server.restarts == n, 60, f"restart {n}")
    assert backoff_delays(logs) == [0.5, 1.0, 1.0]
    spawns = [r.created for r in messages(logs, "restart attempt %d: tritonserver pid")]
    assert len(spawns) == 3
    for crash, spawn, delay in zip(crashed_at, spawns, [0.5, 1.0, 1.0], strict=True):
        assert spawn - crash >= delay  # each attempt waited its delay
    # Up longer than stable_after: the next crash starts from restart_delay again.
    time.sleep(3.5)
    kill9(server)
    wait_for(lambda: server.restarts == 4, 60, "restart 4")
    assert backoff_delays(logs) == [0.5, 1.0, 1.0, 0.5]
    # And stop() right after yet another crash still ends everything promptly.
    kill9(server)
    wait_for(lambda: len(backoff_delays(logs)) == 5, 10, "the fifth back-off")
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 5
    time.sleep(1.0)
    assert live_using(repo) == [] and server.restarts == 4


@requires_models(EMB)
def test_gateway_readiness_follows_a_crash_and_restart(tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    prepare_models()
    triton = EmbeddedTriton(models=[EMB], supervise=True, restart_delay=2.0).start()
    gateway = None
    try:
        config = load_config(BUNDLED_CONFIG)
        config.llm, config.rerank = [], []
        config.embedding = [m for m in config.embedding if m.name == EMB]
        config.with_triton_endpoint(triton.grpc_url, triton.http_url)
        gateway = GatewayServer(config, [API_KEY]).start()
        with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
            def embed() -> httpx.Response:
                return http.post("/v1/embeddings", json={"model": EMB, "input": "supervised restart",
                                                         "encoding_format": "float"})

            assert http.get("/health/ready").status_code == 200
            before = embed()
            assert before.status_code == 200, before.text
            old = kill9(triton)
            wait_for(lambda: http.get("/health/ready").status_code == 503, 10, "/health/ready to say 503")
            down = http.get("/health/ready")
            assert down.json()["models"][EMB] == "not ready"
            assert triton.restarts == 0
            wait_for(lambda: http.get("/health/ready").status_code == 200, 120, "/health/ready to be 200 again",
                     step=0.2)
            # Triton answers ready a moment before the launcher's own readiness poll counts the restart.
            wait_for(lambda: triton.restarts == 1, 5, "the launcher to count the restart")
            assert triton.pid != old and live_group(old) == []
            after = embed()  # same gateway, no restart of it
            assert after.status_code == 200, after.text
            assert after.json()["data"][0]["embedding"] == pytest.approx(before.json()["data"][0]["embedding"],
                                                                          abs=1e-5)
    finally:
        if gateway is not None:
            gateway.stop()
        pid = triton.pid
        stop_now(triton)  # what is tested is the restart, not the graceful exit (5 s of Triton's countdown)
    assert pid is None or live_group(pid) == []
