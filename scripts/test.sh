#!/usr/bin/env bash
# The test command: set up if needed, lint (ruff) and type-check (mypy, strict on openai_api/), then every
# test tier (unit, then end-to-end against a real tritonserver that the tests start and stop themselves).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
