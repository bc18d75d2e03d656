#!/usr/bin/env bash
# The test command: set up if needed (scripts/setup.sh, then scripts/setup_tests.sh for what only the tests
# use), lint (ruff) and type-check (mypy, strict on openai_api/), then every
# test tier (unit, then end-to-end against a real tritonserver that the tests start and stop themselves).
# Extra arguments go to pytest.
#
# pytest runs in TEST_WORKERS processes (pytest-xdist, default 2; 0 = in this process), each taking whole test
# files in the order collected (unit, deploy, then e2e, its longest files first: tests/e2e/conftest.py's
# LONGEST_FIRST; --dist loadfile --no-loadscope-reorder), so a module's
# gateway fixture stays in one process and each process's session tritonserver starts while its unit tests
# run. Most of the e2e tier waits (sockets, paced models, process starts): in one process the 2 cores were
# ~70% idle and pytest took 25.7 min here; in two, 15.6-23.6 min (the second session tritonserver starts only once
# the first is up: see tests/e2e/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh venv
# Then four independent steps side by side, each logging to a file printed once all are done: on a clean
# clone they are ~2 min of model preparation (one core: dequantising SmolLM2, training the LoRA adapters, building
# the family tokenizers), ~1 min of mypy with no cache (one core), the image's venv (.venv-image: the package
# installed as docker/Dockerfile installs it, network and disk) and the test services' installs (network and
# disk: apt, npm ci), ~4.5 min one after the other. The first failure fails the command after all have ended.
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# Whether the model preparation below builds SmolLM2 cold (a clean clone, as CI runs it): then that is the cold
# path run for real, and tests/unit/test_prepare.py does not build it a second time (~15 s of a CPU-bound run).
smol_marker="${OPENAI_API_MODELS_DIR:-models}/smollm2-135m-instruct/.prepared"
[ -e "$smol_marker" ] && built_cold=0 || built_cold=1
steps=(models image tests mypy)
bash scripts/setup.sh models >"$logs/models" 2>&1 &
pids=($!)
bash scripts/setup.sh image >"$logs/image" 2>&1 &
pids+=($!)
bash scripts/setup_tests.sh >"$logs/tests" 2>&1 &  # Redis, Prometheus, Chromium, the npm clients: pytest installs nothing
pids+=($!)
.venv/bin/python -m mypy >"$logs/mypy" 2>&1 &
pids+=($!)
.venv/bin/python -m ruff check .
failed=""
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then failed="$failed ${steps[$i]}"; fi
  cat "$logs/${steps[$i]}"
done
if [ -n "$failed" ]; then
  echo "test.sh: failed before pytest:$failed" >&2
  exit 1
fi
if [ "$built_cold" = 1 ] && [ -e "$smol_marker" ]; then export OPENAI_API_SETUP_BUILT_COLD=1; fi
workers="${TEST_WORKERS:-2}"
# Every run reports its 30 slowest tests (set-up, call and teardown each) and each process's time per file with
# the idle tail at the end (tests/file_times.py; `python scripts/test_times.py` prints the whole record), so where
# the minutes go stays visible (docs/contributing/testing.md keeps the last figures).
durations=(--durations=30 --durations-min=5)
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "${durations[@]}" "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "${durations[@]}" "$@"
