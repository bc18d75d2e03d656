#!/usr/bin/env bash
# What the tests use beyond .venv, installed by the test command (scripts/test.sh runs this after
# scripts/setup.sh) so that pytest itself installs nothing:
#   * a Redis server (Debian's redis-server, or valkey-server): tests/e2e/test_keys_quotas.py;
#   * the npm clients locked in tests/e2e/node (`npm ci`; Node.js and npm from apt when missing):
#     tests/e2e/test_messages_clients.py, test_agent_requests.py, test_responses_agents.py;
#   * Prometheus (Debian's prometheus): tests/e2e/test_platform_metrics.py scrapes the gateway with it;
#   * Chromium (Debian's chromium, headless): tests/e2e/test_status_page.py opens /status and /docs in it.
# Idempotent (a second run checks and returns). What cannot be installed here (not root and no sudo, no
# apt-get, no registry) is said in one line and does not fail the run: those tests then skip, naming it.
# Each step is a function, so tests/unit/test_setup_tests.py can run it alone against stub commands.
set -euo pipefail

NODE_DIR="${NODE_DIR:-tests/e2e/node}"

# Run a command as root: directly when we are, else through sudo when it needs no password.
as_root() {
  if [ "$(id -u)" = "0" ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo -n "$@"
  else
    return 1
  fi
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

install_redis() {
  if command -v redis-server >/dev/null 2>&1 || command -v valkey-server >/dev/null 2>&1; then
    return 0
  fi
  echo "setup-tests: installing redis-server (tests/e2e/test_keys_quotas.py)"
  apt_install redis-server \
    || echo "setup-tests: redis-server could not be installed here (it needs apt-get and root): its tests will skip"
}

install_prometheus() {
  if command -v prometheus >/dev/null 2>&1; then
    return 0
  fi
  echo "setup-tests: installing prometheus (tests/e2e/test_platform_metrics.py)"
  # --no-install-recommends: the server alone (not the node exporter and its service)
  apt_install --no-install-recommends prometheus \
    || echo "setup-tests: prometheus could not be installed here (it needs apt-get and root): its tests will skip"
}

install_chromium() {
  if command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  echo "setup-tests: installing chromium (tests/e2e/test_status_page.py)"
  apt_install --no-install-recommends chromium \
    || echo "setup-tests: chromium could not be installed here (it needs apt-get and root): its tests will skip"
}

install_node_clients() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "setup-tests: installing Node.js and npm (tests/e2e/test_messages_clients.py)"
    if ! apt_install nodejs npm; then
      echo "setup-tests: Node.js and npm could not be installed here (they need apt-get and root): the npm client tests will skip"
      return 0
    fi
  fi
  local stamp="$NODE_DIR/node_modules/.setup-stamp" want
  want="$(sha256sum "$NODE_DIR/package-lock.json" | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "setup-tests: npm ci in $NODE_DIR (the Anthropic TypeScript SDK, the OpenAI Node SDK, Claude Code and Codex CLI, as locked)"
  if (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then
    echo "$want" > "$stamp"
  else
    echo "setup-tests: npm ci in $NODE_DIR failed (is the npm registry reachable?): the npm client tests will skip"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  cd "$(dirname "$0")/.."
  install_redis
  install_prometheus
  install_chromium
  install_node_clients
fi
