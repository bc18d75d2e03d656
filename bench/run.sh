#!/usr/bin/env bash
# The one benchmark command: set up (scripts/setup.sh, idempotent) then run every case side by side.
#   bash bench/run.sh            full run (< 15 min on 2 cores), the numbers to commit
#   bash bench/run.sh --quick    smoke run (~5 min; first run also creates bench/.venv-{infinity,aiperf})
# Results: bench/results/latest.md, bench/results/latest.json, bench/results/history/<date>-<mode>.json
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# py-spy profiles the gateway (optional: the profile case reports a failure without it).
.venv/bin/python -c "import shutil, sys, pathlib; sys.exit(0 if (pathlib.Path(sys.executable).parent / 'py-spy').exists() else 1)" \
  || .venv/bin/python -m pip install -q py-spy || echo "bench: py-spy not installed; the profile case will be skipped"
exec .venv/bin/python -m bench.run "$@"
