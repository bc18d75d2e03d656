"""deploy/kubernetes/: every manifest against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict, offline), then the rules that tie the manifests to the image and the gateway's behaviour."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from openai_api.cli import parse_args
from openai_api.config import load_config
from openai_api.settings import Settings
from tests.deploy.helpers import (
    GATEWAY_DOCKERFILE,
    K8S,
    REPO,
    Dockerfile,
    graceful_shutdown_seconds,
    localize_model_config,
)
from tests.helpers import requires_models

MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# The oldest Kubernetes minor still commonly offered by managed services, and the newest schema shipped.
K8S_VERSIONS = ["1.30.0", "latest"]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


@pytest.fixture(scope="module")
def resources() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in MANIFESTS:
        for doc in _docs(path):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.fixture(scope="module")
def pod(resources: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return resources[("Deployment", "openai-api")]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod: dict[str, Any]) -> dict[str, Any]:
    (gateway,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    return gateway


# ---------------------------------------------------------------------------------------- schema
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_kubernetes_schema(path: Path, version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) not installed")
    if version == "latest":
        version = kv.latest_version()
    docs = _docs(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{path.name} ({doc.get('kind')}) against Kubernetes {version}: {exc}")


def test_strict_schema_rejects_unknown_fields(container: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) not installed")
    doc = _docs(K8S / "deployment.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/", "port": 1}}
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, kv.latest_version(), strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization lists missing {name}"
    expected = sorted(p.name for p in MANIFESTS if ".example." not in p.name)
    assert sorted(listed) == expected, "every manifest except *.example.yaml belongs in kustomization.yaml"
    assert "secret.example.yaml" not in listed, "keys do not belong in git"


# ---------------------------------------------------------------------------------------- deployment
def test_probes(container: dict[str, Any]) -> None:
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "http"


def test_graceful_shutdown_fits_in_the_grace_period(pod: dict[str, Any], container: dict[str, Any]) -> None:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and command[1].isdigit(), "preStop should be a plain sleep"
    pre_stop = int(command[1])
    assert pre_stop >= 3, "give endpoint removal a few seconds before SIGTERM"
    drain = graceful_shutdown_seconds()
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain, (
        f"grace {pod['terminationGracePeriodSeconds']} s < preStop {pre_stop} s + graceful shutdown {drain:g} s"
    )


def test_security_context(pod: dict[str, Any], container: dict[str, Any]) -> None:
    user = Dockerfile.parse(GATEWAY_DOCKERFILE).all("USER")[-1].args.split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == user, "runAsUser should be the image's USER"
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "/tmp must be writable with a read-only root"


def test_resources(container: dict[str, Any]) -> None:
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"missing {kind}"


def test_config_and_keys(pod: dict[str, Any], container: dict[str, Any],
                         resources: dict[tuple[str, str], dict[str, Any]]) -> None:
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    config_volume = volumes[mounts["/config"]["name"]]
    assert mounts["/config"].get("readOnly") is True and "subPath" not in mounts["/config"]
    configmap = resources[("ConfigMap", config_volume["configMap"]["name"])]
    assert "model_config.json" in configmap["data"]
    # Image ENTRYPOINT + the container's args = the command line the gateway gets.
    entrypoint = Dockerfile.parse(GATEWAY_DOCKERFILE).entrypoint()
    assert "command" not in container, "keep the image ENTRYPOINT"
    args = Settings.from_args(parse_args(entrypoint[1:] + container["args"]), {})
    assert (args.host, str(args.config_file)) == ("0.0.0.0", "/config/model_config.json")
    assert container["ports"][0]["containerPort"] == args.port
    env = {e["name"]: e for e in container["env"]}
    ref = env["OPENAI_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == "OPENAI_API_KEYS" and ref.get("optional") in (None, False)
    example = _docs(K8S / "secret.example.yaml")[0]
    assert example["metadata"]["name"] == ref["name"] and ref["key"] in example["stringData"]
    tokenizers = volumes[mounts["/models"]["name"]]
    assert mounts["/models"]["readOnly"] is True
    assert (("PersistentVolumeClaim", tokenizers["persistentVolumeClaim"]["claimName"]) in resources)


def test_service_and_hpa(resources: dict[tuple[str, str], dict[str, Any]], container: dict[str, Any]) -> None:
    deployment = resources[("Deployment", "openai-api")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = resources[("Service", "openai-api")]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", container["ports"][0]["containerPort"])
    hpa = resources[("HorizontalPodAutoscaler", "openai-api")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "openai-api")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    # CPU utilisation is measured against the request: without one the HPA cannot act.
    assert "cpu" in container["resources"]["requests"]
    # Triton's Service is headless, so the gateway's dns:/// urls see every pod (a ClusterIP pins gRPC to one).
    triton = resources[("Service", "triton")]
    assert triton["spec"]["clusterIP"] == "None" and {p["port"] for p in triton["spec"]["ports"]} >= {8000, 8001}
    pdb = resources[("PodDisruptionBudget", "openai-api")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a PDB must not block node drains"


# ---------------------------------------------------------------------------------------- model config
def _configmap_model_config() -> dict[str, Any]:
    doc = _docs(K8S / "configmap.yaml")[0]
    return json.loads(doc["data"]["model_config.json"])


def test_configmap_matches_compose_config() -> None:
    compose = json.loads((REPO / "docker" / "model_config.compose.json").read_text(encoding="utf-8"))
    assert _configmap_model_config() == compose, "the Kubernetes and Compose model configs drifted apart"


@requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")
def test_configmap_model_config_loads(tmp_path: Path) -> None:
    config = localize_model_config(_configmap_model_config(), REPO / "models")
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    loaded = load_config(path)
    assert {m.name for m in loaded.all_models()} == {"smollm2-135m-instruct", "all-minilm-l6-v2", "minilm-rerank"}
    for m in loaded.all_models():
        assert isinstance(m.url, str) and re.fullmatch(r"dns:///triton:800[01]", m.url)


def test_workers_are_set_and_fit_the_cpu_limit(container: dict[str, Any]) -> None:
    """--workers through OPENAI_API_WORKERS: a number the settings accept, not more than the CPUs the pod may
    use (`auto` would count the node's)."""
    env = {e["name"]: e for e in container["env"]}
    value = env["OPENAI_API_WORKERS"]["value"]
    workers = Settings.from_args(parse_args([]), {"OPENAI_API_WORKERS": value}).workers
    cpu = str(container["resources"]["limits"]["cpu"])
    cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    assert value != "auto" and 1 <= workers <= max(cores, 1)


def test_redis_is_an_option_for_the_keys_counters(container: dict[str, Any]) -> None:
    """The Deployment names the Redis settings (empty: off); the optional Redis manifest is not applied by
    kustomize and its Service is the one the comment's URL names (issue #23)."""
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OPENAI_API_REDIS_URL"] == "" and env["OPENAI_API_REDIS_FAIL_MODE"] in ("open", "closed")
    docs = _docs(K8S / "redis.example.yaml")
    service = next(d for d in docs if d["kind"] == "Service")
    assert "redis://" + service["metadata"]["name"] + ":6379" in (K8S / "redis.example.yaml").read_text()
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    assert "redis.example.yaml" not in listed
