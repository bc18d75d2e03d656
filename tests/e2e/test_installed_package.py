"""The package as the image ships it, run as users run it (issue #34): a venv made the way docker/Dockerfile
makes /opt/venv (`pip install .` of this checkout, no extras, a venv of its own: never the development one),
its *installed* `openai-api` console script started as a subprocess outside the checkout on the seed-shaped
model config (tests/e2e/conftest.py `seed_shaped_config`), pointed at the session tritonserver, and a chat,
a streamed chat, embeddings (text, and OpenAI token ids read with the shipped cl100k_base vocabulary) and a
rerank sent through it with the `openai` client (rerank has none: raw HTTP, in the seed's body).

scripts/setup.sh makes the venv (`.venv-image`, with its dependencies from the package index); this test
installs nothing from the network: it builds a wheel of the files the Dockerfile's build stage copies, with
the development venv's setuptools, and re-installs that alone (`--no-deps`), so the venv runs the current
code. `pip check` then tells a venv whose dependencies no longer match pyproject.toml (run scripts/setup.sh).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from tests.deploy.helpers import GATEWAY_DOCKERFILE, Dockerfile
from tests.e2e.conftest import LLM, seed_shaped_config
from tests.e2e.test_reliability_shutdown import wait_healthy
from tests.helpers import REPO, free_port, requires_models

pytestmark = requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")

IMAGE_VENV = Path(os.environ.get("OPENAI_API_IMAGE_VENV", REPO / ".venv-image"))
EMBEDDING, RERANK = "all-minilm-l6-v2", "minilm-rerank"
# OpenAI's documented cl100k_base ids of "Hello world" (what LangChain's OpenAIEmbeddings sends for it).
HELLO_WORLD_CL100K = [9906, 1917]


def _build_context(dest: Path) -> None:
    """The files the Dockerfile's build stage COPYs into its WORKDIR, copied to `dest` (as .dockerignore
    leaves them: no caches)."""
    df = Dockerfile.parse(GATEWAY_DOCKERFILE)
    installs = [part.strip() for ins in df.all("RUN", 0) for part in re.split(r"&&|;", ins.args)
                if "pip install" in part]
    assert installs == ["/opt/venv/bin/pip install --no-cache-dir ."], f"the image installs otherwise now: {installs}"
    for ins in df.all("COPY", 0):
        *sources, target = ins.args.split()
        for src in sources:
            to = dest / target / Path(src).name if target.endswith("/") else dest / target
            if (REPO / src).is_dir():
                shutil.copytree(REPO / src, to, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / src, to)


def _run(*argv: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, env=env, cwd=cwd,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The image venv holding this checkout's code; returns the environment to run its commands in (no
    PYTHONPATH, its bin/ first on PATH), from a folder outside the checkout."""
    python = IMAGE_VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no image venv at {IMAGE_VENV}: scripts/setup.sh makes it (pip install . as the image does)")
    work = tmp_path_factory.mktemp("image-build")
    _build_context(work / "src")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", work / "dist", work / "src")
    (wheel,) = (work / "dist").glob("*.whl")
    _run(python, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", "--quiet",
         "--disable-pip-version-check", wheel)
    check = _run(python, "-m", "pip", "check", "--disable-pip-version-check", check=False)
    assert check.returncode == 0, f"{IMAGE_VENV} lacks what pyproject.toml declares now (run scripts/setup.sh):\n" \
                                  f"{check.stdout}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{IMAGE_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def config_file(triton: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("image-config") / "model_config.json"
    path.write_text(json.dumps(seed_shaped_config(triton), ensure_ascii=False, indent=2), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served(installed: dict[str, str], config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The installed console script serving the seed-shaped config (no API keys, as the seed system ran)."""
    cwd = tmp_path_factory.mktemp("image-run")
    port, log = free_port(), cwd / "gateway.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(IMAGE_VENV / "bin" / "openai-api"), "--host", "127.0.0.1", "--port", str(port),
                                 "--config-file", str(config_file)], cwd=cwd, env=installed, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log, timeout=180)
        print(f"installed gateway ready in {time.monotonic() - started:.1f} s")  # the tier's figure, with -s
        yield url
    finally:
        proc.terminate()
        try:
            assert proc.wait(30) == 0, log.read_text(encoding="utf-8")[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_the_venv_runs_the_installed_package_not_the_checkout(installed: dict[str, str],
                                                              tmp_path: Path) -> None:
    python = IMAGE_VENV / "bin" / "python"
    probe = ("import json, importlib.metadata as m, openai_api, openai_api.config as c, openai_api.text.cl100k as v; "
             "print(json.dumps([openai_api.__file__, c.BUNDLED_CONFIG.is_file(), "
             "(c.BUNDLED_TEMPLATES / 'smollm2.jinja').is_file(), v.decode([9906, 1917]), "
             "sorted(d.metadata['Name'].lower() for d in m.distributions())]))")
    where, config, template, text, dists = json.loads(_run(python, "-c", probe, env=installed, cwd=tmp_path).stdout)
    assert Path(where).is_relative_to(IMAGE_VENV) and not Path(where).is_relative_to(REPO / "openai_api")
    assert (config, template, text) == (True, True, "Hello world")  # default config, templates, vocabulary
    assert not set(dists) & {"litellm", "torch", "transformers", "nvidia-pytriton", "pytest"}, dists
    script = _run(IMAGE_VENV / "bin" / "openai-api", "--version", env=installed, cwd=tmp_path).stdout.strip()
    module = _run(python, "-m", "openai_api", "--version", env=installed, cwd=tmp_path).stdout.strip()
    assert script == module and re.fullmatch(r"openai-api \d+\.\d+\.\d+\S*", script), script


def test_check_config_probes_the_seed_shaped_config_on_triton(installed: dict[str, str], config_file: Path,
                                                             tmp_path: Path) -> None:
    ok = _run(IMAGE_VENV / "bin" / "openai-api", "check-config", config_file, "--probe", env=installed, cwd=tmp_path)
    assert ok.stdout.strip() == f"{config_file}: OK (3 models read, built and probed on Triton)", ok.stdout
    data = json.loads(config_file.read_text(encoding="utf-8"))
    data["llm"][0]["triton_model"] = "no-such-model"
    data["rerank"][0]["output_config"]["name"] = "scores"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    proc = _run(IMAGE_VENV / "bin" / "openai-api", "check-config", bad, "--probe", env=installed, cwd=tmp_path,
                check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines[:-1]] == ["llm[0].url", "rerank[0].url"], lines
    assert "no-such-model" in lines[0] and "'scores'" in lines[1] and lines[-1] == f"{bad}: 2 problems"


@pytest.fixture(scope="module")
def client(served: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_and_streamed_chat(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat.completions.create(model=LLM, messages=messages, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content and plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage is not None and 0 < plain.usage.completion_tokens <= 8
    parts, usage = [], None
    for chunk in client.chat.completions.create(model=LLM, messages=messages, max_tokens=8, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        parts += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(parts) == plain.choices[0].message.content  # greedy: the same answer, streamed
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens


def test_embeddings_of_text_and_of_cl100k_ids(client: openai.OpenAI) -> None:
    text = client.embeddings.create(model=EMBEDDING, input=["Hello world", "How do rivers form?"])
    assert [d.index for d in text.data] == [0, 1] and len(text.data[0].embedding) == 384
    # Token ids in OpenAI's tokenizer are read back to their text with the vocabulary the package ships.
    ids = client.embeddings.create(model=EMBEDDING, input=[HELLO_WORLD_CL100K], encoding_format="float")
    assert ids.data[0].embedding == pytest.approx(text.data[0].embedding, abs=1e-6)


def test_rerank_in_the_seed_body(served: str) -> None:
    body = {"model": RERANK, "query": "What do rivers carry to the sea?", "return_documents": True, "top_n": 2,
            "documents": ["Rivers carry water and sediment to the sea.", "The stock market closed higher.",
                          "Bread is baked in an oven."]}
    r = httpx.post(f"{served}/v1/rerank", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data][:1] == [0] and len(data) == 2
    assert data[0]["document"]["text"] == body["documents"][0] and data[0]["relevance_score"] >= data[1][
        "relevance_score"]
