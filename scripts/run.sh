#!/usr/bin/env bash
# The main job: set up if needed, then the gateway with an embedded tritonserver serving the
# reference models in triton_models/. Extra arguments go to the gateway (e.g. --port 8000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python openai_api_cli.py --embedded-triton "$@"
