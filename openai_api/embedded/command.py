"""The tritonserver command the launcher runs: the binary the nvidia-pytriton wheel ships, a private backends folder
with the Python-backend stub for this interpreter, the child's environment (this interpreter's libpython and
packages, the prepared models' folder) and its command line. Apart from the launcher, which starts, watches and
stops what is described here; `TritonLaunchError`, the error of every failed start, is defined here, where the first
one can be raised (no tritonserver binary, no stub)."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "triton_models"


class TritonLaunchError(RuntimeError):
    """Triton failed to start or a model failed to load; the message carries Triton's reason."""


def pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonLaunchError("nvidia-pytriton is not installed")
    root = Path(spec.origin).parent / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonLaunchError(f"no tritonserver binary under {root}")
    return root


class TritonSpec(Protocol):
    """What the command line is made of: the settings of the server that runs it (`launcher.EmbeddedTriton`)."""

    model_repository: Path
    models: list[str] | None
    grpc_port: int
    http_port: int
    metrics_port: int
    log_verbose: int
    auto_complete: bool
    extra_args: list[str]


def assemble_backends(root: Path, workdir: Path) -> Path:
    # The wheel's backends/python lacks the stub; build a private backends dir with the stub for
    # this interpreter's version next to libtriton_python.so (where the backend looks for it).
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonLaunchError(f"no Python backend stub for Python {version} in {stub.parent.parent}")
    backends = workdir / "backends"
    py = backends / "python"
    py.mkdir(parents=True)
    for src in (root / "backends" / "python").iterdir():
        if src.is_file():
            shutil.copy2(src, py / src.name)
    shutil.copy2(stub, py / stub.name)
    return backends


def child_env(root: Path, models_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    wheel_libs = root.parent.parent / "nvidia_pytriton.libs"
    ld = [p for p in (libdir, str(wheel_libs), env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = ":".join(ld)
    paths = [str(REPO_ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = ":".join(dict.fromkeys(paths))
    # The stub's embedded interpreter ignores PYTHONPATH for its prefix: it takes sys.prefix from the
    # first `python3` on PATH. Without this, a gateway started as `.venv/bin/python ...` from a shell
    # with no activated environment gives the models the system interpreter (no torch).
    bindir = str(Path(sys.executable).parent)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *rest])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env["OPENAI_API_MODELS_DIR"] = str(models_dir)
    return env


def command_line(server: TritonSpec, root: Path, backends: Path) -> list[str]:
    cmd = [
        str(root / "bin" / "tritonserver"),
        f"--model-repository={server.model_repository}",
        f"--backend-directory={backends}",
        "--model-control-mode=explicit",
        "--http-address=127.0.0.1",
        f"--http-port={server.http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={server.grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={server.metrics_port}",
        "--allow-gpu-metrics=false",
        # CPU-only models; skips the pinned-pool warning on machines without a CUDA driver.
        "--pinned-memory-pool-byte-size=0",
        # Keep serving when a model fails so the repository index can tell us why.
        "--exit-on-error=false",
        "--exit-timeout-secs=5",
        f"--log-verbose={server.log_verbose}",
    ]
    if not server.auto_complete:
        cmd.append("--disable-auto-complete-config")
    if server.models is None:
        cmd.append("--load-model=*")
    else:
        cmd += [f"--load-model={name}" for name in server.models]
    return cmd + server.extra_args
