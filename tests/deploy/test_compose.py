"""docker/compose.yaml: a real Compose-spec parse (compose-spec, offline), `docker compose config`
where the compose plugin exists, and the wiring rules of this deployment."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from openai_api.config import load_config
from tests.deploy.helpers import (
    COMPOSE_FILE,
    COMPOSE_MODEL_CONFIG,
    DOCKER,
    REPO,
    find_tool,
    graceful_shutdown_seconds,
    localize_model_config,
)
from tests.helpers import requires_models

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's `${VAR}` / `${VAR:-default}` substitution (what `docker compose config` does first)."""
    env = env or {}
    return _VAR.sub(lambda m: env.get(m.group(1)) or m.group(2) or "", text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(interpolate(COMPOSE_FILE.read_text(encoding="utf-8")))
    assert isinstance(data, dict)
    return data


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# ---------------------------------------------------------------------------------------- validators
def test_compose_spec_parse() -> None:
    compose_spec = pytest.importorskip("compose_spec", reason="compose-spec (dev extra) not installed")
    text = interpolate(COMPOSE_FILE.read_text(encoding="utf-8"))
    parsed = compose_spec.PyOptions(apply_merge=True).from_yaml(text)  # raises ValueError with the field
    parsed.validate()  # networks/volumes/configs/secrets referenced are defined
    assert parsed.service_names() == ["prepare", "triton", "gateway", "redis"]


def test_redis_is_an_option_for_the_keys_counters(compose: dict[str, Any]) -> None:
    """Redis (issue #23) runs only with `--profile redis`, and the gateway reads its URL and the keys file
    from the environment (empty: off)."""
    redis = _services(compose)["redis"]
    assert redis["profiles"] == ["redis"] and "--appendonly" in redis["command"]
    assert redis["read_only"] is True and redis["cap_drop"] == ["ALL"]
    env = _services(compose)["gateway"]["environment"]
    assert {"OPENAI_API_REDIS_URL", "OPENAI_API_REDIS_FAIL_MODE", "OPENAI_API_KEYS_FILE"} <= set(env)
    assert not env["OPENAI_API_REDIS_URL"] and env["OPENAI_API_REDIS_FAIL_MODE"] in ("open", "closed")


def test_compose_spec_rejects_a_typo() -> None:
    # Guard that the validator above is strict (unknown keys, bad enum values are errors).
    compose_spec = pytest.importorskip("compose_spec", reason="compose-spec (dev extra) not installed")
    text = interpolate(COMPOSE_FILE.read_text(encoding="utf-8"))
    for bad in (text.replace("read_only:", "readonly:"), text.replace("service_healthy", "service_up")):
        with pytest.raises(ValueError):
            compose_spec.PyOptions(apply_merge=True).from_yaml(bad)


def test_docker_compose_config() -> None:
    docker = find_tool("docker")
    if docker is None:
        pytest.skip("docker CLI not installed")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        reason = (probe.stderr or probe.stdout).strip().splitlines()
        pytest.skip(f"the docker compose plugin is not installed ({reason[0] if reason else 'no output'})")
    # `config` needs only the CLI, no engine: it interpolates, merges and validates against the spec.
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEYS", "GATEWAY_PORT", "GATEWAY_BIND")}
    proc = subprocess.run([docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"], cwd=DOCKER, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------- wiring
def test_services_build_the_repo_dockerfiles(compose: dict[str, Any]) -> None:
    services = _services(compose)
    expected = {"prepare": "docker/triton.Dockerfile", "triton": "docker/triton.Dockerfile",
                "gateway": "docker/Dockerfile"}
    for name, dockerfile in expected.items():
        build = services[name]["build"]
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context == REPO, f"{name}: build context {context} is not the repository root"
        assert build["dockerfile"] == dockerfile and (context / dockerfile).is_file()
        assert not str(services[name]["image"]).endswith(":latest") and ":" in services[name]["image"]
    assert services["prepare"]["image"] == services["triton"]["image"]


def test_start_order_and_healthchecks(compose: dict[str, Any]) -> None:
    services = _services(compose)
    assert services["triton"]["depends_on"] == {"prepare": {"condition": "service_completed_successfully"}}
    assert services["gateway"]["depends_on"] == {"triton": {"condition": "service_healthy"}}
    triton_check = " ".join(services["triton"]["healthcheck"]["test"])
    assert "/v2/health/ready" in triton_check and ":8000/" in triton_check
    gateway_check = " ".join(services["gateway"]["healthcheck"]["test"])
    assert "/health'" in gateway_check and ":5100/" in gateway_check
    for name in ("triton", "gateway"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", f"{name}: exec-form healthcheck"
    assert "restart" in services["prepare"] and services["prepare"]["restart"] == "no"


def test_gateway_mounts(compose: dict[str, Any]) -> None:
    gateway = _services(compose)["gateway"]
    volumes = gateway["volumes"]
    config_mount = next(v for v in volumes if v.split(":")[1] == "/config/model_config.json")
    source, _, mode = config_mount.split(":")
    assert mode == "ro" and (COMPOSE_FILE.parent / source).resolve() == COMPOSE_MODEL_CONFIG
    assert "models:/models:ro" in volumes
    assert gateway["command"] == ["--config-file", "/config/model_config.json"]
    assert gateway["read_only"] is True and "/tmp" in gateway["tmpfs"]
    assert any(p.endswith(":5100") for p in gateway["ports"])
    assert "OPENAI_API_KEYS" in gateway["environment"]
    assert str(gateway["environment"]["OPENAI_API_WORKERS"]) == "1", "--workers: 1 unless exported"


def test_the_gateway_is_published_on_loopback_unless_opened_on_purpose() -> None:
    """Without a key every route is open, so Compose publishes the port on this host's loopback only; another
    interface takes GATEWAY_BIND, documented beside it as coming with a key."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    ports = yaml.safe_load(interpolate(text))["services"]["gateway"]["ports"]
    assert ports == ["127.0.0.1:5100:5100"]
    opened = yaml.safe_load(interpolate(text, {"GATEWAY_BIND": "0.0.0.0", "GATEWAY_PORT": "8080"}))
    assert opened["services"]["gateway"]["ports"] == ["0.0.0.0:8080:5100"]
    assert "set a key first" in text


def test_triton_reads_prepared_models(compose: dict[str, Any]) -> None:
    services = _services(compose)
    assert "models:/models" in services["prepare"]["volumes"]
    assert "--models-dir" in services["prepare"]["command"]
    assert "models:/models:ro" in services["triton"]["volumes"]
    assert services["triton"]["environment"]["OPENAI_API_MODELS_DIR"] == "/models"
    assert "--model-repository=/opt/triton_models" in services["triton"]["command"]
    assert "models" in compose["volumes"]


def test_gateway_grace_covers_graceful_shutdown(compose: dict[str, Any]) -> None:
    grace = _services(compose)["gateway"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match and int(match.group(1)) > graceful_shutdown_seconds()


# ---------------------------------------------------------------------------------------- model config
def _compose_config() -> dict[str, Any]:
    return json.loads(COMPOSE_MODEL_CONFIG.read_text(encoding="utf-8"))


def test_compose_model_config_points_at_the_triton_service() -> None:
    config = _compose_config()
    # dns:///: every container of the (scalable) triton service is a replica (docs/deployment/fleet.md)
    for entry in config["llm"]:
        assert entry["url"] == "dns:///triton:8001", "LLMs stream over gRPC"
    for kind in ("embedding", "rerank"):
        for entry in config[kind]:
            assert entry["url"] == "dns:///triton:8000", f"{kind} defaults to HTTP"
    served = {p.name for p in (REPO / "triton_models").iterdir() if (p / "config.pbtxt").is_file()}
    wanted = {entry.get("triton_model", entry["name"]) for kind in ("llm", "embedding", "rerank")
              for entry in config[kind]}
    assert wanted <= served, f"not in triton_models/: {wanted - served}"


def test_triton_loads_exactly_the_configured_models(compose: dict[str, Any]) -> None:
    command = _services(compose)["triton"]["command"]
    assert "--model-control-mode=explicit" in command
    loaded = {arg.split("=", 1)[1] for arg in command if arg.startswith("--load-model=")}
    config = _compose_config()
    wanted = {entry.get("triton_model", entry["name"]) for kind in ("llm", "embedding", "rerank")
              for entry in config[kind]}
    assert loaded == wanted


@requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")
def test_compose_model_config_loads(tmp_path: Path) -> None:
    # The gateway's own loader, with /models/... pointed at this checkout's prepared folders.
    config = localize_model_config(_compose_config(), REPO / "models")
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    loaded = load_config(path)
    assert sorted(m.name for m in loaded.all_models()) == ["all-minilm-l6-v2", "minilm-rerank",
                                                          "smollm2-135m-instruct"]
