"""End-to-end fixtures: one real tritonserver (from the launcher) and one real gateway (uvicorn in a
thread on a free port) for the whole session, the way a user runs them. The test command runs two pytest
processes (scripts/test.sh, pytest-xdist): each has its own session tritonserver and takes whole test files."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, BUNDLED_TEMPLATES, GatewayConfig, LLMModel, load_config
from openai_api.embedded.launcher import EmbeddedTriton, TritonLaunchError
from openai_api.embedded.prepare import prepare_models
from openai_api.server import uvicorn_config
from openai_api.settings import Settings
from tests.helpers import MODELS, REPO, derived_model, free_port, stop_now

API_KEY = "test-key"
LLM = "smollm2-135m-instruct"
# A reasoning model: the synthetic LLM with its thinking section on (derived into a temporary repository).
REASONING = "synthetic-reasoning"
# A paced copy of the synthetic LLM (a 50 ms sleep per token, no CPU): streams that stay in flight for a known time
# whatever the machine's load (tests/e2e/test_config_reload.py). It declares Triton priority levels (the dynamic
# batcher's priority queue, `PRIORITY_LEVELS`), so the gateway sends it each request's class as Triton's `priority`
# (tests/e2e/test_batches.py reads what Triton took).
PACED = "synthetic-llm-paced"
PRIORITY_LEVELS = "\ndynamic_batching {\n  priority_levels: 3\n  default_priority_level: 2\n}\n"
# The replay models stream the golden corpus's recorded completions (tests/e2e/test_families.py).
REPLAY_MODELS = ["replay-llm", "replay-llm-vllm"]
# Vision: the vLLM interface with its image input (decodes every image, answers with facts from the pixels),
# and a copy whose prompt placeholder is "<image>" (served with a string template and image_placeholder).
VISION, VISION_PLACEHOLDER = "vision-vllm", "vision-vllm-placeholder"
# The same facts behind TensorRT-LLM's multimodal ensemble interface (image_url_input, "<|image|>" markers), and a
# copy declaring image_bytes_input only (pixels; KV reuse off).
VISION_TRTLLM, VISION_TRTLLM_PIXELS = "vision-trtllm", "vision-trtllm-pixels"
TRITON_MODELS = ["smollm2-135m-instruct", "smollm2-vllm", "smollm2-ft", "smollm2-ensemble", "smollm2-text",
                 "all-minilm-l6-v2", "minilm-rerank", "synthetic-llm", REASONING, *REPLAY_MODELS, VISION,
                 VISION_PLACEHOLDER, VISION_TRTLLM, VISION_TRTLLM_PIXELS]


class GatewayServer:
    """A real uvicorn server in a background thread (as httpx's own tests do): real sockets, real
    streaming and disconnects, without a subprocess per test."""

    def __init__(self, config: GatewayConfig, api_keys: list[str], settings: Settings | None = None) -> None:
        self.port = free_port()
        if settings is None:
            settings = Settings(config_file=config.source or Path("."), api_keys=api_keys)
        app = create_app(config, settings)
        self.app = app
        self.server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


STATS_ENV = "OPENAI_API_REF_STATS_DIR"


class _SessionTriton:
    """The session's one tritonserver (per pytest process), started on a thread of its own as soon as
    collection shows a test that wants it (`pytest_collection_finish`), so its start - a minute or more for
    ~20 Python-backend models on 2 cores - overlaps the unit tier, which runs first (pyproject's `testpaths`),
    instead of adding to the e2e tier. The launcher forks Triton from a long-lived spawner thread (`_Spawner`),
    so this thread may end. The `triton` fixture waits for the start and re-raises whatever it failed with."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.thread: threading.Thread | None = None
        self.server: EmbeddedTriton | None = None
        self.error: BaseException | None = None

    @property
    def stats_dir(self) -> Path:
        """Where the reference LLM writes its counters, set in the environment before any Triton starts."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="e2e-session-"))
            (self.folder / "ref-stats").mkdir()
            os.environ[STATS_ENV] = str(self.folder / "ref-stats")
        return self.folder / "ref-stats"

    def begin(self) -> None:
        if self.thread is None:
            stats = self.stats_dir
            assert self.folder is not None and stats.is_dir()
            self.thread = threading.Thread(target=self._start, args=(self.folder / "derived-models",),
                                           name="session-triton", daemon=True)
            self.thread.start()

    def _start(self, extra: Path) -> None:
        try:
            prepare_models()
            extra.mkdir()
            derived_model(extra, "synthetic-llm", REASONING, {"reasoning": "1"})
            paced = derived_model(extra, "synthetic-llm", PACED, {"delay_ms": "50"}) / "config.pbtxt"
            paced.write_text(paced.read_text(encoding="utf-8") + PRIORITY_LEVELS, encoding="utf-8")
            derived_model(extra, VISION, VISION_PLACEHOLDER, {"image_placeholder": "<image>"})
            pixels = derived_model(extra, VISION_TRTLLM, VISION_TRTLLM_PIXELS, {
                "enable_kv_cache_reuse": "false",
                "vision_vllm_model": str(REPO / "triton_models" / VISION / "1" / "model.py")}) / "config.pbtxt"
            pixels.write_text("".join(line for line in pixels.read_text(encoding="utf-8").splitlines(keepends=True)
                                      if '"image_url_input"' not in line), encoding="utf-8")
            aborts = hangs = 0
            while True:
                try:
                    with _one_start_at_a_time():
                        # startup_timeout: ~20 Python-backend models load in one to three minutes on a 2-core box;
                        # the limit only bounds a start that hangs (below). stall_timeout arms the launcher's hang
                        # watch: a log silent 20 s with idle processes has its hung loads ended and loaded again
                        # (openai_api/embedded/load_watch.py), and a log silent 150 s gives the start up.
                        self.server = EmbeddedTriton(models=[*TRITON_MODELS, PACED],
                                                     extra_args=[f"--model-repository={extra}"],
                                                     startup_timeout=480, stall_timeout=150).start()
                    return
                except TritonLaunchError as e:
                    # Triton's Python backend waits for each stub's initialization in 1 s windows in which the
                    # stub's health thread must answer; a CPU-starved stub misses one, the launch fails, and
                    # Triton then waits forever for that stub to exit, or aborts with
                    # boost::interprocess::lock_exception (python_backend stub_launcher.cc,
                    # ReceiveMessageFromStub; seen here with gdb: a load thread in wait4() on a live, idle
                    # stub). Starts are therefore one at a time across the test processes, and one that crashes
                    # anyway is tried again - up to 4 times in all: an abort comes within seconds of the start,
                    # and came three times in a row once, on a quiet machine - and one that hangs once more; a
                    # model that fails to load is not.
                    aborted, hung = "killed by SIG" in str(e), "not ready after" in str(e)
                    aborts, hangs = aborts + aborted, hangs + hung
                    if not ((aborted and aborts < 4) or (hung and hangs < 2)):
                        raise
                    logging.getLogger(__name__).warning("the session tritonserver did not start; starting it "
                                                        "again: %s", str(e)[-2000:])
        except BaseException as e:  # noqa: BLE001 - re-raised by the fixture, in the test that wants it
            self.error = e

    def wait(self) -> EmbeddedTriton:
        self.begin()
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.server is not None
        return self.server

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.server is not None:
            stop_now(self.server)  # the run's last seconds: no graceful unload of ~20 models to wait for
            self.server = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Held while a session tritonserver starts: the test command's pytest processes (pytest-xdist workers of
    one run share PYTEST_XDIST_TESTRUNUID) start theirs one after the other, so that ~20 models do not load
    twice over at once on 2 cores (see `_SessionTriton._start`). A no-op in a single pytest process."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"e2e-triton-start-{run}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_SESSION_TRITON = _SessionTriton()

# The end-to-end files that take longest, run first in this order, the rest after them as collected. pytest-xdist
# hands whole files to its two processes in collection order (scripts/test.sh), so the run ends when the process
# with the last long file ends, the other core idle meanwhile: alphabetically, test_structured_outputs.py (~2 min
# of real SmolLM2 decoding) and test_workers.py (~45 s) came last but a few. Longest first leaves short files to
# even out the end. Files that start tritonservers of their own come after the first few, by when both processes'
# session tritonservers are up (two loads at once starve Triton's stubs: `_SessionTriton._start`). The figures:
# every run's per-file record (tests/file_times.py, `python scripts/test_times.py`).
LONGEST_FIRST = ("test_structured_outputs.py", "test_platform_metrics.py", "test_reliability_soak.py",
                 "test_guided_reference.py", "test_replicas.py", "test_lora.py", "test_launcher_supervision.py",
                 "test_config_reload.py", "test_workers.py", "test_reliability_faults.py",
                 # Last alphabetically and ~20 s: it was the run's tail, one process alone after the other's end.
                 "test_triton_llm.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        if item.path.parent != here:
            return -1  # unit and deploy tiers first, as collected (pyproject's testpaths)
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: files keep their tests' order, the others the order collected


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return  # nothing runs: no tritonserver to start (and to wait for at the end)
    here = Path(__file__).parent
    if any(here in item.path.parents and "triton" in getattr(item, "fixturenames", ()) for item in session.items):
        _SESSION_TRITON.begin()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SESSION_TRITON.close()


@pytest.fixture(scope="session")
def ref_stats_dir() -> Path:
    """Where the reference LLM writes its counters (set before any Triton of the session starts)."""
    return _SESSION_TRITON.stats_dir


def read_ref_stats(folder: Path, model: str = LLM) -> dict[str, Any]:
    """The reference model's own counters: started, completed, cancelled, errors, tokens_generated, active."""
    path = folder / f"{model}.json"
    for _ in range(20):  # the model rewrites the file; a read can race a write
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            time.sleep(0.02)
    raise AssertionError(f"no readable stats at {path}")


@pytest.fixture(scope="session")
def ref_stats(ref_stats_dir: Path) -> Callable[[], dict[str, Any]]:
    """`ref_stats()` -> the session Triton's reference LLM counters (proof from the model's side)."""
    return lambda: read_ref_stats(ref_stats_dir)


@pytest.fixture(scope="session")
def triton(ref_stats_dir: Path) -> EmbeddedTriton:
    """The session Triton (see `_SessionTriton`); stopped when the session ends."""
    return _SESSION_TRITON.wait()


def gateway_config(triton: EmbeddedTriton) -> GatewayConfig:
    config = load_config(BUNDLED_CONFIG)
    # The vision stand-ins count prompt tokens with SmolLM2's tokenizer.
    smollm2 = next(m.path for m in config.llm if m.name == LLM)
    config.llm += [
        LLMModel(name=VISION, url=triton.grpc_url, path=smollm2, image_tokens=64,
                 chat_template=BUNDLED_TEMPLATES / "chatml-vision.jinja"),
        LLMModel(name=VISION_PLACEHOLDER, url=triton.grpc_url, path=smollm2, image_placeholder="<image>",
                 chat_template=BUNDLED_TEMPLATES / "smollm2.jinja"),
        *(LLMModel(name=name, url=triton.grpc_url, path=smollm2, image_placeholder="<|image|>",
                   chat_template=BUNDLED_TEMPLATES / "smollm2.jinja")
          for name in (VISION_TRTLLM, VISION_TRTLLM_PIXELS))]
    return config.with_triton_endpoint(triton.grpc_url, triton.http_url)


def seed_shaped_config(triton: EmbeddedTriton, names: dict[str, str] | None = None) -> dict[str, Any]:
    """The example config of the seed system's manual (shared/seeds/002, "3.3 配置文件"): its four arrays, its
    keys and its values (model_infos' start/end ids, max_len, bad and stop words by token id, temperature,
    repetition_penalty, mask_positions; the rerank input/output config), with the url and path of each entry
    pointing at this Triton and the prepared reference models. An entry is named as its Triton model (the seed
    format has no `triton_model`), unless `names` maps kind -> another name for it (then `triton_model` keeps
    it on the reference model). SmolLM2's id 2 is its end token, as ChatGLM2's is; the bad words are the seed's."""
    names = names or {}
    models = [("llm", LLM, "smollm2-135m-instruct", "grpc"), ("embedding", "all-minilm-l6-v2", "all-minilm-l6-v2",
              "http"), ("rerank", "minilm-rerank", "all-minilm-l6-v2", "http")]
    entries: dict[str, dict[str, Any]] = {}
    for kind, triton_model, folder, transport in models:
        entry: dict[str, Any] = {"name": names.get(kind, triton_model),
                                 "url": triton.grpc_url if transport == "grpc" else triton.http_url,
                                 "path": str(MODELS / folder)}
        if entry["name"] != triton_model:
            entry["triton_model"] = triton_model
        entries[kind] = entry
    entries["llm"]["chat_template"] = "smollm2.jinja"  # a bare name, as the seed's "chatglm2.jinja"
    entries["embedding"]["max_tokens"] = 512
    entries["rerank"].update(max_tokens=512,
                             input_config={"input_ids": "input_ids", "attention_mask": "attention_mask"},
                             output_config={"name": "logits", "process": "normalize"})
    info = {"name": entries["llm"]["name"], "start_id": -1, "end_id": -2, "max_len": 2048,
            "bad_words": [[7768, 3908], [1, 2]], "stop_words": [[2], [2]], "temperature": 1, "repetition_penalty": 1,
            "mask_positions": 1}
    return {"model_infos": [info], "llm": [entries["llm"]], "embedding": [entries["embedding"]],
            "rerank": [entries["rerank"]]}


@pytest.fixture(scope="session")
def gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_config(triton), [API_KEY]).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http(gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c
