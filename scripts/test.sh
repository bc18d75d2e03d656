#!/usr/bin/env bash
# The test command: set up if needed, lint, then every test tier (unit, then end-to-end against a real
# tritonserver that the tests start and stop themselves). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check .
exec .venv/bin/python -m pytest "$@"
